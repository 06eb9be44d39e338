"""Two plans compared leaf by leaf: what `shardrules diff` and
`assert_plan_matches` report.

A leaf in both plans is *changed* when its shape, dtype or spec differs, or
when a mesh axis its spec names (in either plan) has another size in the other
plan's mesh: its shards are then cut differently. Changing the rule that
decides a leaf (its `file:line`) without changing its layout is no change.

Bytes to move: what each device of the second plan's mesh must receive, the
part of its new shard it does not hold under the first plan (see `_transfer`:
devices are matched by their position in mesh order). A leaf whose shape or
dtype changed, or whose old layout is unknown, is received in full; an
unchanged leaf on another mesh (more devices, or its axes in another order) is
counted too. Leaves in only one plan are not counted.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Any

import numpy as np

from .._planning._blocks import UNCONSTRAINED, entry_axes
from .._planning._plan import format_bytes, plural
from ._dump import Entry, Kind, Table
from ._transfer import to_receive

EXAMPLES = 3  # paths shown per group of changed leaves


@dataclasses.dataclass(frozen=True)
class Change:
    """Changed leaves with the same old spec, new spec and (new) rule."""

    old: str  # the old spec as printed (`P('fsdp', None)`), with shape and dtype if they changed
    new: str
    old_spec: tuple[Entry, ...] | None
    new_spec: tuple[Entry, ...] | None
    rule: str
    count: int
    paths: tuple[str, ...]  # the first few, sorted
    bytes_per_device: int  # the most any device of the new mesh receives for these leaves


@dataclasses.dataclass(frozen=True)
class PlanDiff:
    """What differs between plan `a` and plan `b` (see the module's docstring)."""

    a: Table
    b: Table
    changes: tuple[Change, ...]
    unchanged: int
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]
    moved_per_device: int
    moved_total: int

    @property
    def equal(self) -> bool:
        return not self.changes and not self.only_a and not self.only_b

    @property
    def changed(self) -> int:
        return sum(c.count for c in self.changes)

    def as_json(self) -> dict[str, Any]:
        return {
            "a": _side(self.a),
            "b": _side(self.b),
            "equal": self.equal,
            "changed": [
                {
                    "from": _listed(c.old_spec),
                    "to": _listed(c.new_spec),
                    "from_text": c.old,
                    "to_text": c.new,
                    "rule": c.rule,
                    "count": c.count,
                    "paths": list(c.paths),
                    "bytes_per_device": c.bytes_per_device,
                }
                for c in self.changes
            ],
            "unchanged": self.unchanged,
            "only_a": {"count": len(self.only_a), "paths": list(self.only_a)},
            "only_b": {"count": len(self.only_b), "paths": list(self.only_b)},
            "move": {"bytes_per_device": self.moved_per_device, "total_bytes": self.moved_total},
            "memory_per_device": {"a": self.a.bytes_per_device, "b": self.b.bytes_per_device},
        }

    def text(self, names: tuple[str, str] = ("A", "B")) -> str:
        lines = [f"{names[0]}: {_title(self.a)}", f"{names[1]}: {_title(self.b)}"]
        types_a, types_b = _types(self.a), _types(self.b)
        if types_a is not None and types_b is not None and types_a != types_b:
            lines.append(f"mesh axis types: {types_a} -> {types_b} (the layouts do not depend on them)")
        if self.equal:
            lines.append(f"no changes: {plural(self.unchanged, 'leaf', 'leaves')} laid out the same")
        else:
            lines.append(f"changed: {plural(self.changed, 'leaf', 'leaves')}")
            for c in self.changes:
                more = c.count - len(c.paths)
                shown = ", ".join(c.paths) + (f", and {more} more" if more else "")
                lines.append(
                    f"  {c.old} -> {c.new}  ({c.rule}): {plural(c.count, 'leaf', 'leaves')}, "
                    f"{format_bytes(c.bytes_per_device)} per device"
                )
                lines.append(f"    {shown}")
            lines.append(f"unchanged: {plural(self.unchanged, 'leaf', 'leaves')}")
            for side, paths in ((names[0], self.only_a), (names[1], self.only_b)):
                if paths:
                    more = len(paths) - EXAMPLES
                    listed = ", ".join(paths[:EXAMPLES]) + (f", and {more} more" if more > 0 else "")
                    lines.append(f"only in {side}: {plural(len(paths), 'leaf', 'leaves')}: {listed}")
        lines.append(
            f"to move: {format_bytes(self.moved_per_device)} per device, "
            f"{format_bytes(self.moved_total)} in all"
        )
        lines.append(
            f"memory per device: {format_bytes(self.a.bytes_per_device)} -> "
            f"{format_bytes(self.b.bytes_per_device)}"
        )
        return "\n".join(lines)


def _side(table: Table) -> dict[str, Any]:
    mesh = None if table.mesh is None else [{"name": n, "size": s, "type": t} for n, s, t in table.mesh]
    return {"rules": table.rules, "group": table.group, "mesh": mesh, "leaves": len(table.paths)}


def _title(table: Table) -> str:
    mesh = "no mesh" if table.mesh is None else ", ".join(f"{n}={s}" for n, s, _ in table.mesh)
    return f"{table.rules} ({table.group}) on {mesh}"


def _types(table: Table) -> str | None:
    """`explicit, explicit` (`unknown` for a mesh given as sizes), or `None` with no mesh."""
    return None if table.mesh is None else ", ".join(t for _, _, t in table.mesh)


def _listed(spec: tuple[Entry, ...] | None) -> list[Any] | None:
    return None if spec is None else [list(e) if isinstance(e, tuple) else e for e in spec]


def spec_text(spec: tuple[Entry, ...] | None) -> str:
    """`P('fsdp', None)`, as `Plan.table` prints a spec; `-` for none."""
    if spec is None:
        return "-"
    return "P(" + ", ".join(UNCONSTRAINED if e == UNCONSTRAINED else repr(e) for e in spec) + ")"


def _axes(spec: tuple[Entry, ...] | None) -> set[str]:
    return {a for entry in spec or () for a in entry_axes(entry)}


def _labels(old: Kind, new: Kind, sizes_a: dict[str, int], sizes_b: dict[str, int]) -> tuple[str, str]:
    """The old and new layout as printed: the specs, with the shapes and dtypes
    when they differ, and the axes' sizes when only those differ."""
    a, b = spec_text(old[2]), spec_text(new[2])
    if old[0] != new[0] or old[1] != new[1]:
        a += f" {_shape(old)}"
        b += f" {_shape(new)}"
    elif a == b:
        axes = sorted(_axes(old[2]))
        a += " with " + ", ".join(f"{n}={sizes_a.get(n, '?')}" for n in axes)
        b += " with " + ", ".join(f"{n}={sizes_b.get(n, '?')}" for n in axes)
    return a, b


def _shape(kind: Kind) -> str:
    return "not an array" if kind[0] is None else f"{kind[0]} {kind[1]}"


def _received(old: Kind, new: Kind, a: Table, b: Table, devices: int) -> np.ndarray:
    """The bytes each device of `b`'s mesh receives for one leaf going from
    layout `old` to `new`."""
    shard = new[4]
    if old[:2] != new[:2] or old[2] is None or new[2] is None or a.mesh is None or b.mesh is None:
        return np.full(devices, shard, dtype=np.int64)  # nothing of it can be reused
    sizes_a, sizes_b = a.sizes, b.sizes
    if not (_axes(old[2]) <= sizes_a.keys() and _axes(new[2]) <= sizes_b.keys()):
        return np.full(devices, shard, dtype=np.int64)
    rank = len(new[0] or ())
    return to_receive(shard, old[2], tuple(sizes_a.items()), new[2], tuple(sizes_b.items()), rank)


def _add(total: np.ndarray, count: int, vector: np.ndarray) -> np.ndarray:
    """`total + count * vector`, exactly: in 64-bit integers while no element
    can overflow them, in Python integers beyond (a plan file's leaves may
    add up to more than 2**63 bytes)."""
    if total.dtype != object:
        peak = int(np.abs(total).max(initial=0)) + count * int(np.abs(vector).max(initial=0))
        if peak < 2**62:
            return total + count * vector
    return total.astype(object) + count * vector.astype(object)


def _sum(values: np.ndarray) -> int:
    """The sum of `values` as a Python integer (no 64-bit overflow)."""
    if values.dtype != object and int(np.abs(values).max(initial=0)) * len(values) < 2**62:
        return int(values.sum())
    return sum(int(v) for v in values.flat)


def compare(a: Table, b: Table) -> PlanDiff:
    """The `PlanDiff` of plan `a` to plan `b`."""
    sizes_a, sizes_b = a.sizes, b.sizes
    devices_b = math.prod(sizes_b.values()) if b.mesh is not None else 1
    resized = {n for n in sizes_a.keys() | sizes_b.keys() if sizes_a.get(n) != sizes_b.get(n)}
    kind_b = b.kind_of()
    verdict: dict[tuple[int, int], tuple[str, str, str] | None] = {}
    counts: dict[tuple[int, int], int] = {}
    same_counts: dict[tuple[int, int], int] = {}
    groups: dict[tuple[str, str, str], list[Any]] = {}
    unchanged = 0
    only_a: list[str] = []
    for path, ka in zip(a.paths, a.kinds, strict=True):
        kb = kind_b.get(path)
        if kb is None:
            only_a.append(path)
            continue
        pair = (ka, kb)
        if pair in verdict:
            key = verdict[pair]
        else:
            old, new = a.parts[ka], b.parts[kb]
            same = old[:3] == new[:3] and not (resized & (_axes(old[2]) | _axes(new[2])))
            key = None if same else (*_labels(old, new, sizes_a, sizes_b), new[3])
            verdict[pair] = key
        if key is None:
            unchanged += 1
            same_counts[pair] = same_counts.get(pair, 0) + 1
            continue
        counts[pair] = counts.get(pair, 0) + 1
        group = groups.get(key)
        if group is None:
            group = groups[key] = [a.parts[ka][2], b.parts[kb][2], [], []]
        group[2].append(path)
    for (ka, kb), key in verdict.items():
        if key is not None:
            groups[key][3].append((ka, kb))
    # One group's bytes per device at a time: memory for two numbers per device, however many groups.
    received = np.zeros(devices_b, dtype=np.int64)
    moved: dict[tuple[str, str, str], int] = {}
    for key, (_, _, _, pairs) in groups.items():
        group_received = np.zeros(devices_b, dtype=np.int64)
        for ka, kb in pairs:
            group_received = _add(
                group_received, counts[ka, kb], _received(a.parts[ka], b.parts[kb], a, b, devices_b)
            )
        moved[key] = int(group_received.max(initial=0))
        received = _add(received, 1, group_received)
    if a.mesh is not None and b.mesh is not None and list(sizes_a.items()) != list(sizes_b.items()):
        # the same layout on another mesh: devices at new positions (or holding other blocks) receive it
        for (ka, kb), key in verdict.items():
            if key is None:
                vector = _received(a.parts[ka], b.parts[kb], a, b, devices_b)
                received = _add(received, same_counts[ka, kb], vector)
    kind_a = a.kind_of()
    only_b = [path for path in b.paths if path not in kind_a]
    changes = [
        Change(
            old,
            new,
            spec_a,
            spec_b,
            rule,
            len(paths),
            tuple(heapq.nsmallest(EXAMPLES, paths)),
            moved[old, new, rule],
        )
        for (old, new, rule), (spec_a, spec_b, paths, _) in groups.items()
    ]
    changes.sort(key=lambda c: (-c.count, c.old, c.new, c.rule))
    return PlanDiff(
        a, b, tuple(changes), unchanged, tuple(sorted(only_a)), tuple(sorted(only_b)),
        int(received.max(initial=0)), _sum(received),
    )  # fmt: skip
