"""A rule's spec × an array's shape × the mesh's sizes → `PartitionSpec`.

`...` is expanded, aliases with alternatives are settled (`_choice`), optional
axes (`model?`) that do not divide their dimension are dropped, `auto` picks
the largest dimension that divides, and every sharded dimension is checked to
divide by the product of its mesh axes.
Problems are raised as `LeafError`s, which the compiler turns into
diagnostics for the leaf's path and the rule's line.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from jax.sharding import PartitionSpec

from .._errors import Span
from .._interop._paths import LeafInfo
from .._language._format import spec_text
from .._language._rules import ResolvedEntry, Rule, RuleSet
from . import _choice
from ._blocks import entry_axes
from ._mesh import absent_axes
from ._plan import plural

SpecEntry = Any  # None | str | tuple[str, ...]


class LeafError(Exception):
    """A problem with one leaf. `cause`: the message without the leaf (its path
    and shape), the same for every leaf with this problem (default: `message`)."""

    def __init__(self, code: str, message: str, span: Span | None, hint: str = "", cause: str = ""):
        self.code, self.message, self.span, self.hint = code, message, span, hint
        self.cause = cause or message


def leaf_spec(rule: Rule, info: LeafInfo, sizes: dict[str, int] | None, rules: RuleSet) -> PartitionSpec:
    """The `PartitionSpec` `rule` gives the array `info`, or a `LeafError`."""
    assert info.shape is not None
    shape = info.shape
    spec = rule.spec
    if spec.kind == "replicated":
        return PartitionSpec(*([None] * len(shape)))
    if spec.kind == "logical":  # resolved by `_logical.resolve` for leaves that carry names
        raise LeafError(
            "SR113",
            f"`{info.path}` (shape {shape}) has no logical axis names for `logical` to use",
            spec.span,
            "add a rule above this one for this path",
            "no logical axis names",
        )
    if spec.needs_sizes and sizes is None:
        raise LeafError(
            "SR108",
            f"`{spec_text(rule.written)}` needs the mesh's axis sizes, and no mesh is known",
            spec.span,
            "pass mesh=, run inside `with jax.set_mesh(mesh):`, or give sizes in the rule file's mesh line",
        )
    absent = absent_axes(rules, sizes)  # `mesh ..., model?` on a mesh without `model`: size 1
    if spec.kind == "auto":
        assert sizes is not None
        return _auto(tuple(a for a in spec.auto_axes if a not in absent), spec.min_bytes, info, sizes)
    entries = _without(list(spec.entries), absent)
    written = [e for e in entries if e.kind != "ellipsis"]
    has_ellipsis = len(written) != len(entries)
    if len(written) != len(shape) and not (has_ellipsis and len(written) <= len(shape)):
        shown = spec_text(rule.written)
        raise LeafError(
            "SR103",
            f"spec {shown} has {plural(len(written), 'entry', 'entries')} but "
            f"`{info.path}` has {plural(len(shape), 'dimension')} (shape {shape})",
            spec.span,
            "write one entry per dimension, start the spec with `...` to leave leading dimensions "
            "unsharded, or add an earlier rule that matches this path",
            f"{len(written)} entries for {len(shape)} dimensions",
        )
    if has_ellipsis:
        at = next(i for i, e in enumerate(entries) if e.kind == "ellipsis")
        filler = [ResolvedEntry("unsharded")] * (len(shape) - len(written))
        entries = entries[:at] + filler + entries[at + 1 :]
    entries, unsettled = _choice.settle(entries, sizes, rules)  # aliases with alternatives
    if unsettled is not None:
        raise LeafError(*_choice.describe(unsettled, info, rules))
    taken = tuple(a for e in entries for a in e.axes)  # an axis another entry uses is no way out
    return PartitionSpec(
        *(_dim(e, dim, d, info, sizes, taken) for d, (e, dim) in enumerate(zip(entries, shape, strict=True)))
    )


def _without(entries: list[ResolvedEntry], absent: frozenset[str]) -> list[ResolvedEntry]:
    """`entries` without the mesh axes in `absent` (axes of size 1 the mesh
    lacks): a dimension left with none is unsharded, an alternative of an
    alias left with none stands for `_`."""
    if not absent:
        return entries
    out = []
    for entry in entries:
        groups = []
        for g in entry.groups:
            if g.alternatives:
                alternatives = tuple(tuple(a for a in alt if a not in absent) for alt in g.alternatives)
                groups.append(dataclasses.replace(g, alternatives=alternatives))
            elif any(a not in absent for a in g.axes):
                groups.append(dataclasses.replace(g, axes=tuple(a for a in g.axes if a not in absent)))
        if entry.kind != "axes" or groups:
            out.append(dataclasses.replace(entry, groups=tuple(groups)))
        else:
            out.append(ResolvedEntry("unsharded", span=entry.span))
    return out


def _dim(
    entry: ResolvedEntry,
    dim: int,
    index: int,
    info: LeafInfo,
    sizes: dict[str, int] | None,
    taken: tuple[str, ...] = (),
) -> SpecEntry:
    if entry.kind == "unconstrained":  # the compiler chooses (activations); placing refuses it: SR120
        return PartitionSpec.UNCONSTRAINED
    if entry.kind != "axes":
        return None
    kept: list[str] = []
    product = 1
    for group in entry.groups:
        if sizes is None:
            kept.extend(group.axes)
            continue
        size = math.prod(sizes[a] for a in group.axes)
        if dim % (product * size) == 0:
            kept.extend(group.axes)
            product *= size
        elif not group.optional:
            raise _not_divisible(
                group.written or group.axes[0],
                group.span or entry.span,
                dim,
                index,
                info,
                [*kept, *group.axes],
                sizes,
                [a for a in taken if a not in entry.axes],
            )
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else tuple(kept)


def _not_divisible(
    written: str,
    span: Span | None,
    dim: int,
    index: int,
    info: LeafInfo,
    axes: list[str],
    sizes: dict[str, int],
    elsewhere: list[str] | None = None,
) -> LeafError:
    by = math.prod(sizes[a] for a in axes)
    # Axes other entries of the spec use are not offered: one axis shards one dimension.
    dividing = [
        f"`{a}`={s}" for a, s in sizes.items() if s > 1 and dim % s == 0 and a not in (elsewhere or ())
    ]
    options = f"{dim} divides by {', '.join(dividing)}; " if dividing else ""
    product = " × ".join(f"`{a}`={sizes[a]}" for a in axes)
    if written not in axes and not written.startswith("("):  # an alias: say what it stands for
        product = f"`{written}` → {product}"
    return LeafError(
        "SR104",
        f"dimension {index} of `{info.path}` (shape {info.shape}) has size {dim}, "
        f"which does not divide by {by} ({product})",
        span,
        f"{options}write `{written}?` to leave the dimension unsharded where it does not divide, "
        f"or pad it to a multiple of {by}",
        f"dimension {index} of size {dim} does not divide by {by} ({product})",
    )


def _auto(axes: tuple[str, ...], min_bytes: int, info: LeafInfo, sizes: dict[str, int]) -> PartitionSpec:
    assert info.shape is not None
    unsharded: list[SpecEntry] = [None] * len(info.shape)
    if info.nbytes < min_bytes or not axes:
        return PartitionSpec(*unsharded)
    by = math.prod(sizes[a] for a in axes)
    best = None
    for i, dim in enumerate(info.shape):
        if dim >= by and dim % by == 0 and (best is None or dim > info.shape[best]):
            best = i
    if best is not None:
        unsharded[best] = axes[0] if len(axes) == 1 else tuple(axes)
    return PartitionSpec(*unsharded)


def shard_bytes(info: LeafInfo, spec: PartitionSpec, sizes: dict[str, int] | None) -> int:
    """Bytes of the largest shard of `info` under `spec` (the whole array without sizes)."""
    assert info.shape is not None and info.dtype is not None
    if sizes is None:
        return info.nbytes
    count = 1
    for dim, entry in zip(info.shape, spec, strict=True):
        count *= -(-dim // math.prod(sizes[a] for a in entry_axes(entry)))  # `unconstrained`: unsharded
    return count * info.dtype.itemsize
