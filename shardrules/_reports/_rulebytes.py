"""A step's collectives per rule line in a plan file (version 4's `by_rule`
in `step_cost`), and two steps' per rule line compared.

`StepCost.by_rule` says how many bytes each rule line's arrays make the
step's collectives move (`_costs/_attribute.py`). `dump --step` records it,
one line per rule line, its file relative to the rule file's folder as a
leaf's `rule` is, so that a golden plan or a CI baseline can later say which
rule line a change of communication came from. Two records are matched rule
line by rule line: by the rule's text, then (for a rule whose layout was
edited) its pattern, then its line; `inferred` and `the model's code` with
themselves.

Here as plain data (the dicts `StepCost.to_json()` gives), so that reports
import nothing of `_costs`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

from .._planning._units import format_bytes
from ._refuse import cost_fail, exact_keys, figure, shown

VERSION_WITH_RULES = 4
"""The file's version whose `step_cost` holds `by_rule` (with or without a target's keys)."""
RULE_KEYS = ("rule", "text", "bytes_per_device", "collectives", "matmul_flops_per_device")
SHARE_KEYS = ("kind", "count", "bytes_per_device")


def _relative(rule: str, folder: str) -> str:
    """`FILE:LINE` with the file relative to `folder` (as a leaf's rule is
    written, `_dump.rule_label`); an owner that is no rule line as it is."""
    file, sep, line = rule.rpartition(":")
    if not sep or not file or not line.isdigit():
        return rule
    if os.path.isabs(file) or folder:
        relative = os.path.relpath(file, folder or ".")
        file = file if relative.startswith("..") else relative
    return f"{file.replace(os.sep, '/')}:{line}"


def recorded_rules(data: dict[str, Any], folder: str | None = None) -> list[dict[str, Any]] | None:
    """`by_rule` as the file holds it, from a `StepCost.to_json()` dict (or a
    file's `step_cost`): each rule line's `rule` (its file relative to
    `folder`, when given), `text`, bytes per device, a share per kind and
    the FLOPs of the matrix products it owns;
    `None` when the cost has none (a step with no collectives, or a cost
    not attributed)."""
    rows = data.get("by_rule") or ()
    out = []
    for r in rows:
        rule = str(r["rule"])
        out.append(
            {
                "rule": rule if folder is None else _relative(rule, folder),
                "text": str(r.get("text", "")),
                "bytes_per_device": int(r["bytes_per_device"]),
                "collectives": [{key: s[key] for key in SHARE_KEYS} for s in r["collectives"]],
                "matmul_flops_per_device": float(r.get("matmul_flops_per_device", 0.0)),
            }
        )
    return out or None


def rules_text(rows: Sequence[dict[str, Any]]) -> str:
    """`"by_rule"`'s lines in the file: one rule line each, keys in a fixed order."""
    lines = [
        "      " + json.dumps({key: r[key] for key in RULE_KEYS}, ensure_ascii=True, separators=(", ", ": "))
        for r in rows
    ]
    return '    "by_rule": [\n' + ",\n".join(lines) + "\n    ]"


def read_rules(value: Any, where: str, kinds: Sequence[str], total: int) -> None:
    """Check a file's `by_rule`: rows of `RULE_KEYS`, each rule's bytes the
    sum of its shares (one per kind, in the order of `kinds`), all of them
    the step's collective bytes (`total`). SR124 otherwise."""
    where = f'{where}: "by_rule"'
    if not isinstance(value, list) or not value:
        raise cost_fail(f"{where} is a list of one object per rule line, not {shown(value)}")
    seen = 0
    for i, row in enumerate(value):
        row = exact_keys(row, RULE_KEYS, f"{where} {i}")
        if not isinstance(row["rule"], str) or not row["rule"] or not isinstance(row["text"], str):
            raise cost_fail(
                f'{where} {i}: "rule" is a rule\'s FILE:LINE and "text" its text, not {shown(row)}'
            )
        nbytes = figure(row["bytes_per_device"], f'{where} {i}: "bytes_per_device"', whole=True)
        if not isinstance(row["collectives"], list):
            raise cost_fail(f'{where} {i}: "collectives" is a list, not {shown(row["collectives"])}')
        order, summed = -1, 0
        for share in row["collectives"]:
            share = exact_keys(share, SHARE_KEYS, f"{where} {i}: a collective")
            kind = share["kind"]
            if not isinstance(kind, str) or kind not in kinds or kinds.index(kind) <= order:
                raise cost_fail(
                    f"{where} {i}: the kind {shown(kind)} is unknown, listed twice or out of order "
                    f"(the order is {', '.join(kinds)})"
                )
            order = kinds.index(kind)
            figure(share["count"], f"{where} {i}: the count of {kind}", whole=True, least=1)
            summed += figure(share["bytes_per_device"], f"{where} {i}: the bytes of {kind}", whole=True)
        if summed != nbytes:
            raise cost_fail(f"{where} {i}: its collectives add up to {summed} bytes, not {nbytes}")
        figure(row["matmul_flops_per_device"], f'{where} {i}: "matmul_flops_per_device"')
        seen += nbytes
    if seen != total:
        raise cost_fail(f"{where}: the rule lines add up to {seen} bytes, but the collectives to {total}")


def collective_bytes(cost: dict[str, Any]) -> int:
    """A recorded cost's collective bytes per device per step, over every kind."""
    return sum(int(c["bytes_per_device"]) for c in cost.get("collectives") or ())


def has_rules(cost: dict[str, Any]) -> bool:
    """Whether a recorded cost says which rule line each collective byte is
    for: it records `by_rule`, or it has no collectives to say it of."""
    return bool(cost.get("by_rule")) or collective_bytes(cost) == 0


@dataclasses.dataclass(frozen=True)
class Move:
    """One rule line's collective bytes in two costs (`None`: not in that one)."""

    before: dict[str, Any] | None
    after: dict[str, Any] | None

    @property
    def change(self) -> int:
        return self.after_bytes - self.before_bytes

    @property
    def before_bytes(self) -> int:
        return 0 if self.before is None else int(self.before["bytes_per_device"])

    @property
    def after_bytes(self) -> int:
        return 0 if self.after is None else int(self.after["bytes_per_device"])

    def flops(self, side: str) -> float:
        """The FLOPs of the matrix products the rule line owns in `side`'s cost (`"a"`, `"b"`)."""
        row = self.before if side == "a" else self.after
        return 0.0 if row is None else float(row.get("matmul_flops_per_device", 0.0))

    def text(self) -> str:
        """`FILE:LINE `rule`: before -> after (+change)`, saying what it was where it changed."""
        row = self.after if self.after is not None else self.before
        assert row is not None
        name = f"{row['rule']} `{row['text']}`" if row["text"] else row["rule"]
        sign = "+" if self.change >= 0 else "-"
        said = (
            f"{name}: {format_bytes(self.before_bytes)} -> {format_bytes(self.after_bytes)} "
            f"({sign}{format_bytes(abs(self.change))}"
        )
        if self.before is None:
            return said + "; a rule line new since)"
        if self.after is None:
            return said + "; a rule line gone since)"
        was = []
        if self.before["text"] != self.after["text"]:
            was.append(f"`{self.before['text']}`")
        if _line(self.before["rule"]) != _line(self.after["rule"]):  # files as each cost names them
            was.append(f"at line {_line(self.before['rule'])}")
        return said + (f"; was {' '.join(was)})" if was else ")")


def _line(rule: str) -> str | None:
    file, sep, line = rule.rpartition(":")
    return line if sep and file and line.isdigit() else None


def _pattern(text: str) -> str:
    return text.split(" -> ", 1)[0].strip()


def _keys(row: dict[str, Any]) -> tuple[Any, ...]:
    """What a row is matched by, in turn: its text, its pattern, its line
    (an owner that is no rule line, `inferred`, by itself alone)."""
    if _line(row["rule"]) is None or not row["text"]:
        return (("owner", row["rule"]), None, None)
    line = _line(row["rule"])
    return (("text", row["text"]), ("pattern", _pattern(row["text"])), ("line", line))


def moves(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]) -> list[Move]:
    """The rule lines of two recorded `by_rule`s paired (by text, then
    pattern, then line; the nearest line among equals), each with its bytes
    in both; those in one only paired with `None`."""
    left = list(range(len(before)))
    pairs: dict[int, int] = {}
    for level in range(3):
        for j, row in enumerate(after):
            if j in pairs:
                continue
            key = _keys(row)[level]
            if key is None:
                continue
            same = [i for i in left if _keys(before[i])[level] == key]
            if not same:
                continue
            here = int(_line(row["rule"]) or 0)
            best = min(same, key=lambda i: abs(int(_line(before[i]["rule"]) or 0) - here))
            pairs[j] = best
            left.remove(best)
    out = [Move(before[pairs[j]] if j in pairs else None, row) for j, row in enumerate(after)]
    return out + [Move(before[i], None) for i in left]


def moved_lines(
    before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]], *, grew: bool = False, count: int = 5
) -> list[str]:
    """The rule lines whose collective bytes changed, most first (`grew`:
    those that grew, most growth first), as `Move.text` lines; at most
    `count`, and how many more."""
    found = [m for m in moves(before, after) if (m.change > 0 if grew else m.change != 0)]
    found.sort(key=lambda m: -m.change if grew else -abs(m.change))
    lines = [m.text() for m in found[:count]]
    if len(found) > count:
        lines.append(f"... and {len(found) - count} more rule lines")
    return lines
