"""Quantized parameters laid out by their float parameter's rule.

A rule written for a float parameter's path (`mlp/up/kernel`) also matches
the leaves that quantizing it made (`_interop/_quantized.py`: qwix's
`kernel/array/qvalue` and `kernel/array/scale`, AQT's `kernel/qvalue` and
`kernel/scale/0`), the earlier of the rules matching either path winning. The
values (`qvalue`, the kernel's shape) take the rule's spec as the kernel
would. A companion (a scale, zero point, bias or mask) is laid out along the
dimensions it shares with the values (`companion_spec`):

- a dimension of the values' size takes the values' mesh axes;
- a dimension of size 1 (one scale for the whole dimension) is unsplit;
- a dimension of `k` blocks where the values have `n = k * b` (block-wise or
  sub-channel scales) takes the values' axes only where their size `m`
  divides `k`: then each device's `k / m` scales are exactly those of its
  `n / m` values. Otherwise (or with the axis sizes unknown) it is unsplit,
  and an SR303 note says which dimension and why.

A companion whose rank is not the values' is replicated, with the same note.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from jax.sharding import PartitionSpec

from .._errors import Diagnostic
from .._interop._paths import LeafInfo
from .._interop._quantized import Quantized
from .._language._rules import Rule
from .._pspec import entries, with_entries
from ._spec import shard_bytes


def _axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    if isinstance(entry, tuple):
        return tuple(a for a in entry if isinstance(a, str))
    return ()  # PartitionSpec.UNCONSTRAINED


def companion_spec(
    values_spec: PartitionSpec,
    values_shape: tuple[int, ...],
    shape: tuple[int, ...],
    sizes: dict[str, int] | None,
) -> tuple[PartitionSpec, list[tuple[int, str]]]:
    """The spec of a companion of `shape` to values of `values_shape` laid out
    by `values_spec`, and each dimension the values split that it leaves
    unsplit where it is more than one element, with why (empty: none)."""
    have = entries(values_spec)
    have = have + (None,) * (len(values_shape) - len(have))
    if len(shape) != len(values_shape):
        split = any(_axes(e) for e in have) and math.prod(shape) > 1
        why = f"its rank ({len(shape)}) is not the values' ({len(values_shape)})"
        return PartitionSpec(*([None] * len(shape))), [(0, why)] if split else []
    out: list[Any] = []
    kept: list[tuple[int, str]] = []
    for d, (entry, n, k) in enumerate(zip(have, values_shape, shape, strict=True)):
        axes = _axes(entry)
        if k == n:
            out.append(entry)
        elif k == 1 or not axes:
            out.append(None)
        else:
            out.append(None)
            names = ", ".join(axes)
            if sizes is None:
                kept.append(
                    (d, f"the mesh's axis sizes are unknown, so `{names}` may not keep its blocks whole")
                )
                continue
            m = math.prod(sizes.get(a, 1) for a in axes)
            if n % k:
                kept.append((d, f"its {k} scales do not divide the values' {n} into equal blocks"))
            elif k % m:
                kept.append(
                    (
                        d,
                        f"its {k} blocks of {n // k} do not divide over `{names}` ({m}): a device's values would "
                        "need scales of another device",
                    )
                )
            else:
                out[-1] = entry
    return with_entries(values_spec, out), kept


def kept_whole(
    rule: Rule | None, found: list[tuple[str, tuple[int, ...], str, tuple[int, ...], list[tuple[int, str]]]]
) -> Diagnostic:
    """SR303 (a note): companions of quantized values that `rule` splits, kept
    whole along a dimension; `found` is (path, shape, values' path, values'
    shape, dimensions kept with why) for each, the first named."""
    path, shape, values, values_shape, dims = found[0]
    said = "; ".join(f"dimension {d}: {why}" for d, why in dims)
    cause = "is a quantization companion kept whole along a dimension its values split"
    return Diagnostic(
        "SR303",
        "note",
        f"`{path}` (shape {shape}) {cause} (`{values}`, shape {values_shape}): {said}",
        None if rule is None else rule.span,
        path,
        "nothing to do where the scales are small; to split them too, quantize with blocks whose count "
        "divides by the mesh axes' sizes",
        tuple((p, s) for p, s, *_ in found),
        cause,
    )


Planned = tuple[PartitionSpec | None, int, str] | None  # `_compile._plan_one`'s answer
Kept = tuple[str, tuple[int, ...], str, tuple[int, ...], list[tuple[int, str]]]


def _earlier(a: Rule | None, b: Rule | None) -> Rule | None:
    """Of two rules found for one leaf (each a pattern rule, the `default` or
    `None`), the one that wins: a pattern rule over the default, the first in
    file order of two."""
    if a is None or (a.is_default and b is not None):
        return b
    if b is None or b.is_default:
        return a
    return a if a.index <= b.index else b


def plan(
    found: dict[int, Quantized],
    paths: list[str],
    signatures: list[Any],
    fitting: Callable[[str, tuple[int, ...], Any], Rule | None],
    plan_one: Callable[[Rule | None, str, tuple[int, ...], Any], Planned],
    sizes: dict[str, int] | None,
    kinds: list[int],
    parts: list[tuple[Any, ...]],
) -> tuple[list[LeafInfo], list[Diagnostic]]:
    """Plan the leaves of quantized containers (`found`, by position), which
    the planner's loop left as "not an array": each its kind in `kinds` (new
    ones added to `parts`). `fitting(path, shape, dtype)` is the rule (or
    default) the group gives a path; `plan_one(rule, path, shape, dtype)` an
    array's spec, bytes per device and why (`None`: unmatched). Returns the
    leaves no rule matched, and the SR303 notes."""
    unmatched: list[LeafInfo] = []
    made: dict[tuple[Any, ...], int] = {}
    rule_of: dict[int, Rule | None] = {}  # values' position → their rule
    kept: dict[int, tuple[Rule | None, list[Kept]]] = {}

    def values_rule(i: int) -> Rule | None:
        if i not in rule_of:
            shape, dtype = signatures[i]
            rule_of[i] = _earlier(fitting(paths[i], shape, dtype), fitting(found[i].parameter, shape, dtype))
        return rule_of[i]

    def kind_for(key: tuple[Any, ...], part: tuple[Any, ...]) -> int:
        """The kind of leaf `part` is, added to `parts` if new (`key` tells kinds apart)."""
        kind = made.get(key)
        if kind is None:
            kind = made[key] = len(parts)
            parts.append(part)
        return kind

    def none_matched(i: int, path: str, shape: tuple[int, ...], dtype: Any) -> None:
        unmatched.append(LeafInfo(path, shape, dtype))
        kinds[i] = kind_for(("none", shape, dtype), (shape, dtype, None, None, 0, "unmatched"))

    for i, part in found.items():
        path = paths[i]
        shape, dtype = signatures[i]
        rule = values_rule(part.values)
        if part.companion:
            own = fitting(path, shape, dtype)
            if own is not None and own is not rule and not own.is_default and _earlier(own, rule) is own:
                # a rule written for the companion's own path: planned as any array
                done = plan_one(own, path, shape, dtype)
                if done is None:
                    none_matched(i, path, shape, dtype)
                else:
                    kinds[i] = kind_for(("own", id(own), shape, dtype), (shape, dtype, own, *done))
                continue
            if math.prod(shape) <= 1:  # replicated, as any size-1 array
                small = plan_one(rule, path, shape, dtype)
                assert small is not None  # size 1: replicated, with or without a rule
                kinds[i] = kind_for(("small", id(rule), shape, dtype), (shape, dtype, rule, *small))
                continue
            values_shape, values_dtype = signatures[part.values]
            done = plan_one(rule, paths[part.values], values_shape, values_dtype)
            if done is None or done[0] is None:  # unmatched, or an error (reported at the values)
                if done is None:
                    unmatched.append(LeafInfo(path, shape, dtype))
                why = "unmatched" if done is None else "error"
                kinds[i] = kind_for((why, id(rule), shape, dtype), (shape, dtype, rule, None, 0, why))
                continue
            spec, dims = companion_spec(done[0], values_shape, shape, sizes)
            if dims:
                kept.setdefault(id(rule), (rule, []))[1].append(
                    (path, shape, paths[part.values], values_shape, dims)
                )
            per_device = shard_bytes(LeafInfo(path, shape, dtype), spec, sizes)
            kinds[i] = kind_for(
                ("companion", id(rule), shape, dtype, spec),
                (shape, dtype, rule, spec, per_device, done[2]),
            )
            continue
        done = plan_one(rule, path, shape, dtype)
        if done is None:
            none_matched(i, path, shape, dtype)
        else:
            kinds[i] = kind_for(("values", id(rule), shape, dtype), (shape, dtype, rule, *done))
    return unmatched, [kept_whole(rule, leaves) for rule, leaves in kept.values()]
