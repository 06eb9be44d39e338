"""SR220 (warning): a layout whose slices are many small byte runs in a checkpoint.

A tensor is stored in C order, so a slice that splits an inner dimension is
not one range of the file but one run per index of the dimensions before it:
`(_, model)` on a `(4096, 4096)` kernel makes 4096 runs per slice, `(model,
_)` one. Reading such a slice takes one read per run, or reading whole rows
and cutting the slice out in memory (what `load_checkpoint` does where that
costs less: more bytes read, and on several hosts, bytes other hosts need).

Reported, once per rule with its leaves, where the reader's reads of a leaf's
distinct slices on a host are more than `RATIO` times as many as the slices
(one read each, were each slice one range of the file), or ask for more than
`RATIO` times their bytes (reading whole rows); the hint names the outer
dimension the same mesh axes divide, where there is one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .._errors import Diagnostic
from .._pspec import entries
from ._blocks import entry_axes
from ._loadcost import leaf_reads
from ._plan import LeafPlan, Plan, format_bytes, plural
from ._ranges import ReadPlan

RATIO = 10
"""More reads than this many per distinct slice on a host, or more than this
many times the slices' bytes read, is SR220."""


def slow_read_warnings(plan: Plan, sizes: Mapping[str, int], hosts: int, cache: dict) -> list[Diagnostic]:
    """SR220 for each rule of `plan` with leaves whose slices on some host
    take more than `RATIO` reads per slice, or more than `RATIO` times their
    bytes, to read; the worst leaf named first. Warnings a `# noqa: SR220`
    acknowledges are left out.

    **Arguments:**

    - `plan`: the plan (its leaves and rules).
    - `sizes`: the mesh's axis sizes, in mesh order.
    - `hosts`: how many hosts share the devices.
    - `cache`: `leaf_reads`'s cache, shared with the cost.

    **Returns:** a list of warnings, one per rule.

    ```python
    slow_read_warnings(plan, {"model": 8}, 1, {})
    ```
    """
    found: dict[int, list[tuple[float, LeafPlan, int, ReadPlan]]] = {}
    rules: dict[int, Any] = {}
    for leaf in plan.leaves:
        if leaf.rule is None or leaf.why not in ("rule", "default"):
            continue
        reads = leaf_reads(leaf, sizes, hosts, cache)
        if not reads:
            continue
        per_host = reads
        worst = max(range(hosts), key=lambda h: _ratio(per_host[h]))
        ratio = _ratio(reads[worst])
        if ratio > RATIO:
            found.setdefault(id(leaf.rule), []).append((ratio, leaf, worst, reads[worst]))
            rules[id(leaf.rule)] = leaf.rule
    out = []
    for key, leaves in found.items():
        leaves.sort(key=lambda item: (-item[0], -item[1].nbytes))
        out.append(_diagnostic(rules[key], leaves, sizes, hosts))
    return plan.rules.kept(out)


def _slices(read: ReadPlan) -> int:
    return sum(r.count > 0 for r in read.runs)


def _ratio(read: ReadPlan) -> float:
    """How many times the reads, or the bytes, of the same slices stored
    contiguously (one read each) the reader's reads are: the larger."""
    slices = _slices(read)
    needed = sum(r.nbytes for r in read.runs)
    return max(read.reads / slices, read.nbytes / needed) if slices and needed else 0.0


def entry_text(entry: Any) -> str:
    """One spec entry as a rule writes it: `_`, `model`, `(fsdp, model)`."""
    axes = entry_axes(entry)
    return "_" if not axes else axes[0] if len(axes) == 1 else "(" + ", ".join(axes) + ")"


def better_spec(
    shape: tuple[int, ...], spec: tuple[Any, ...], sizes: Mapping[str, int]
) -> tuple[Any, ...] | None:
    """The spec with the axes of the innermost split dimension moved to the
    outermost dimension before it that they divide: an unsharded one, else
    added after the axes of a sharded one that still divides; `None` when no
    outer dimension does.

    ```python
    better_spec((4096, 4096), (None, "model"), {"model": 8})  # ("model", None)
    ```
    """
    spec = tuple(spec) + (None,) * (len(shape) - len(spec))
    split = [d for d, e in enumerate(spec) if math.prod(sizes[a] for a in entry_axes(e)) > 1]
    if not split:
        return None
    k = split[-1]
    moved = entry_axes(spec[k])
    factor = math.prod(sizes[a] for a in moved)
    for wanted_free in (True, False):
        for d in range(k):
            have = entry_axes(spec[d])
            if bool(have) == wanted_free:
                continue
            if shape[d] % (factor * math.prod(sizes[a] for a in have)):
                continue
            new = list(spec)
            axes = (*have, *moved)
            new[d], new[k] = (axes[0] if len(axes) == 1 else axes), None
            return tuple(new)
    return None


def _diagnostic(
    rule: Any, leaves: list[tuple[float, LeafPlan, int, ReadPlan]], sizes: Mapping[str, int], hosts: int
) -> Diagnostic:
    _, leaf, host, read = leaves[0]
    assert leaf.shape is not None and leaf.spec is not None
    slices = _slices(read)
    per_slice = read.run_count // slices
    length = next(r.length for r in read.runs if r.count)
    on = f"host {host}" if hosts > 1 else "the host"
    needed = sum(r.nbytes for r in read.runs)
    if read.mode == "blocks":
        how = (
            f"so load_checkpoint reads whole rows, {format_bytes(read.nbytes)} in {plural(read.reads, 'read')}, "
            f"for their {format_bytes(needed)} ({read.nbytes / needed:.1f}x the bytes)"
        )
    else:
        how = f"so load_checkpoint issues {read.reads:,} reads, one per run, where one per slice would do"
    spec = tuple(entries(leaf.spec))
    current = "(" + ", ".join(entry_text(e) for e in spec + (None,) * (len(leaf.shape) - len(spec))) + ")"
    better = better_spec(leaf.shape, spec, sizes)
    if better is None:
        fix = (
            f"no outer dimension of {leaf.shape} divides by the same mesh axes, so the split of {current} "
            "cannot move outward; save the checkpoint in the layout it is loaded in"
        )
    else:
        text = "(" + ", ".join(entry_text(e) for e in better) + ")"
        gain = " (each slice one range of the file)" if _is_one_run(leaf.shape, better, sizes) else ""
        fix = f"split an outer dimension instead: `-> {text}` rather than `{current}`{gain}"
    return Diagnostic(
        "SR220",
        "warning",
        f"`{leaf.path}` {leaf.shape} {leaf.dtype}: its {plural(slices, 'distinct slice')} on {on} {'is' if slices == 1 else 'are'} "
        f"{read.run_count:,} separate byte runs in the checkpoint ({per_slice:,} per slice, "
        f"{format_bytes(length)} each), {how}",
        rule.spec.span or rule.span,
        path=leaf.path,
        hint=f"{fix}; or, where this layout is meant, acknowledge it at the end of the rule's line: `# noqa: SR220`",
        paths=tuple((item[1].path, item[1].shape) for item in leaves),
        cause=f"SR220 {rule.location}",  # one finding per rule
    )


def _is_one_run(shape: tuple[int, ...], spec: tuple[Any, ...], sizes: Mapping[str, int]) -> bool:
    """Whether every slice of `spec` is one run: at most one dimension split,
    with only dimensions of size 1 before it."""
    split = [d for d, e in enumerate(spec) if math.prod(sizes[a] for a in entry_axes(e)) > 1]
    return not split or (len(split) == 1 and all(n == 1 for n in shape[: split[0]]))
