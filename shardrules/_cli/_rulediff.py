"""`diff --step`'s collectives per rule line: for each rule of A and of B
(`StepCost.by_rule`, as a plan file of version 4 records it), the bytes each
device sends or receives per step, the two sides' rules matched, most
changed first.

The rules are matched as golden plans and `lint --max-collective-increase`
match them (`_reports/_rulebytes.moves`): `inferred` and `the model's code`
with themselves; a rule line with one of the other side written the same
(`"attn/o/kernel$" -> (heads, embed)`, wherever it is in its file), else
with the same pattern (the spec changed), else on the same line (rewritten
in place), the nearest in line first among several. A rule left unmatched is
shown with 0 bytes on the other side: a cost lists only the rule lines some
collective is for."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._planning._plan import format_bytes, format_flops
from .._reports._rulebytes import Move, has_rules, moves, recorded_rules

HEADER = ("collectives per rule line", "as written", "A", "B", "B - A", "matmul FLOPs A", "matmul FLOPs B")


def _rows(cost: Any) -> list[dict[str, Any]]:
    return recorded_rules(cost.to_json()) or []


def changes(costs: Mapping[str, Any]) -> list[Move] | None:
    """The rule lines of the two costs matched, most changed first (then most
    bytes); `None` where a side has collectives but records no rule lines (a
    plan file written before costs were attributed to them)."""
    if not all(has_rules(costs[side].to_json()) for side in ("a", "b")):
        return None
    found = [
        m
        for m in moves(_rows(costs["a"]), _rows(costs["b"]))
        if m.before_bytes or m.after_bytes or m.flops("a") != m.flops("b")
    ]
    found.sort(key=lambda m: (-abs(m.change), -max(m.before_bytes, m.after_bytes), _rule(m)))
    return found


def _rule(m: Move) -> str:
    row = m.after if m.after is not None else m.before
    assert row is not None
    return str(row["rule"])


def matched_by(m: Move) -> str | None:
    """How the two sides' rules were matched: `owner`, `text`, `pattern`,
    `line`; `None` for a rule of one side only."""
    a, b = m.before, m.after
    if a is None or b is None:
        return None
    if not b["text"]:
        return "owner"
    if a["text"] == b["text"]:
        return "text"
    if a["text"].split(" -> ", 1)[0].strip() == b["text"].split(" -> ", 1)[0].strip():
        return "pattern"
    return "line"


def to_json(m: Move) -> dict[str, Any]:
    """One row of `step_cost_by_rule`."""

    def side(row: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if row is None else {"rule": row["rule"], "text": row["text"]}

    return {
        "a": side(m.before),
        "b": side(m.after),
        "matched_by": matched_by(m),
        "bytes_per_device": {"a": m.before_bytes, "b": m.after_bytes},
        "change": m.change,
        "matmul_flops_per_device": {"a": m.flops("a"), "b": m.flops("b")},
    }


def missing_note(costs: Mapping[str, Any]) -> str | None:
    """Why `changes` is `None`, for standard error."""
    sides = [side.upper() for side in ("a", "b") if not has_rules(costs[side].to_json())]
    if not sides:
        return None
    return (
        f"{' and '.join(sides)}'s cost records no collectives per rule line (a plan file written by an "
        "earlier dump --step): write it again with dump --step to compare them rule by rule"
    )


def rows(found: Sequence[Move]) -> list[tuple[str, ...]]:
    """One row per rule line: where it is (B's, else A's; `A's -> B's` where
    they differ), as written (`A's  =>  B's` where they differ), the bytes
    per device per step under A and B, the change, and the FLOPs per device
    of the matrix products it owns under A and B."""
    out = []
    for m in found:
        a, b = m.before, m.after
        where = (
            _rule(m) if a is None or b is None or a["rule"] == b["rule"] else f"{a['rule']} -> {b['rule']}"
        )
        text_a, text_b = (a["text"] if a else None), (b["text"] if b else None)
        text = text_b if text_a in (None, text_b) else text_a if text_b is None else f"{text_a}  =>  {text_b}"
        sign = "+" if m.change > 0 else "-" if m.change < 0 else ""
        out.append(
            (
                where,
                text or "-",
                format_bytes(m.before_bytes),
                format_bytes(m.after_bytes),
                sign + format_bytes(abs(m.change)),
                format_flops(m.flops("a")),
                format_flops(m.flops("b")),
            )
        )
    return out
