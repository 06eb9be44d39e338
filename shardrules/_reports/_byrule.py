"""A step's collectives by the rule line and by the array they are for, as
reports show them: `explain --step --cost --by rule|array` and the HTML
report's table grouped by rule.

Like the rest of reports, this reads the plain data of `StepCost.to_json()`
(its `collectives`, `by_rule` and `by_array`), never a `StepCost`. A rule
line's `FILE:LINE` is shown relative to the working directory when the file
is inside it. Each kind of collective is one cell, `COUNT / BYTES`: the
runs one call of the step makes and their bytes per device. A combined
collective (the CPU compiler sums many gradients in one all-reduce) counts
once under each rule line whose arrays it carries, so the counts of the rows
may add up to more than the step's; the bytes add up exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from .._planning._units import format_bytes, shown_location
from ._costfile import KINDS

ARRAYS_SHOWN = 5
"""How many arrays `explain --by rule` lists under each rule line (most bytes first)."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of a table: `name` (a rule's shown `FILE:LINE`, `inferred`,
    `the model's code`, or an array), `text` (the rule as written; for an
    array, its rule's shown `FILE:LINE`), its bytes per device per step, and a
    `COUNT / BYTES` cell per kind of the step (`-` for a kind it has none of)."""

    name: str
    text: str
    bytes_per_device: int
    cells: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Group:
    """A rule line (`rule`) and every array its collectives are for, most bytes first."""

    rule: Row
    arrays: tuple[Row, ...]


def kinds(cost: Mapping[str, Any]) -> tuple[str, ...]:
    """The kinds of collective the step runs, in the order of `KINDS`."""
    found = {c["kind"] for c in cost.get("collectives") or ()}
    return tuple(k for k in KINDS if k in found)


def _cells(shares: Sequence[Mapping[str, Any]], shown: Sequence[str]) -> tuple[str, ...]:
    by_kind = {s["kind"]: s for s in shares}
    return tuple(
        f"{by_kind[k]['count']} / {format_bytes(by_kind[k]['bytes_per_device'])}" if k in by_kind else "-"
        for k in shown
    )


def _bytes(shares: Sequence[Mapping[str, Any]]) -> int:
    return sum(int(s["bytes_per_device"]) for s in shares)


def total(cost: Mapping[str, Any]) -> Row:
    """The step's own figures: every collective, per kind (what the rows add up to)."""
    collectives = cost.get("collectives") or ()
    return Row("total", "", _bytes(collectives), _cells(collectives, kinds(cost)))


def groups(cost: Mapping[str, Any]) -> list[Group]:
    """A `Group` per rule line of `by_rule`, most bytes first, each with its
    arrays from `by_array` (an array `by_array` does not hold: its name, no figures)."""
    shown = kinds(cost)
    arrays = {(a["array"], a["rule"]): a for a in cost.get("by_array") or ()}
    out = []
    for r in cost.get("by_rule") or ():
        if not _bytes(r["collectives"]):  # a rule line that owns matrix products and no collective
            continue
        rows = []
        for name in r.get("arrays") or ():
            a = arrays.get((name, r["rule"]))
            shares = a["collectives"] if a is not None else ()
            rows.append(Row(name, "", _bytes(shares), _cells(shares, shown)))
        rule = Row(
            shown_location(r["rule"]),
            r.get("text", ""),
            _bytes(r["collectives"]),
            _cells(r["collectives"], shown),
        )
        out.append(Group(rule, tuple(rows)))
    return out


def array_rows(cost: Mapping[str, Any]) -> list[Row]:
    """A `Row` per array of `by_array`, most bytes first, its rule's shown
    `FILE:LINE` (or `inferred`, `the model's code`) as its `text`."""
    shown = kinds(cost)
    return [
        Row(a["array"], shown_location(a["rule"]), _bytes(a["collectives"]), _cells(a["collectives"], shown))
        for a in cost.get("by_array") or ()
    ]


RULE_HEADER = ("rule", "written as", "bytes per device")
ARRAY_HEADER = ("array", "rule", "bytes per device")


def rule_table(cost: Mapping[str, Any], arrays_shown: int = ARRAYS_SHOWN) -> list[tuple[str, ...]]:
    """`explain --by rule`'s rows: each rule line, its `arrays_shown` arrays
    that move the most (indented), `... and K more` with their bytes where it
    has more, and the total row; the header is `RULE_HEADER` and `kinds`."""
    rows: list[tuple[str, ...]] = []
    for group in groups(cost):
        rule = group.rule
        rows.append((rule.name, rule.text, format_bytes(rule.bytes_per_device), *rule.cells))
        for a in group.arrays[:arrays_shown]:
            rows.append((f"  {a.name}", "", format_bytes(a.bytes_per_device), *a.cells))
        rest = group.arrays[arrays_shown:]
        if rest:
            more = sum(a.bytes_per_device for a in rest)
            rows.append((f"  ... and {len(rest)} more", "", format_bytes(more), *("",) * len(rule.cells)))
    whole = total(cost)
    rows.append((whole.name, "", format_bytes(whole.bytes_per_device), *whole.cells))
    return rows


def array_table(cost: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """`explain --by array`'s rows: each array, its rule, bytes and kinds, then the total row."""
    rows = [(a.name, a.text, format_bytes(a.bytes_per_device), *a.cells) for a in array_rows(cost)]
    whole = total(cost)
    rows.append((whole.name, "", format_bytes(whole.bytes_per_device), *whole.cells))
    return rows
