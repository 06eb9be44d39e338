"""`diff --step`'s collectives per rule line: the bytes each device sends or
receives per step for each rule of A and of B (`StepCost.by_rule`), the two
sides' rules matched, most changed first.

A rule of A and one of B are the same rule when, in this order (each pass
over the rules the passes before left unmatched, in each side's order):

1. they are the same kind of owner that is no rule (`inferred`, `the
   model's code`);
2. they are written the same (`"attn/o/kernel$" -> (heads, embed)`),
   wherever they are in their files;
3. their patterns are the same (the spec changed: what a diff of rules
   most often is); a `default` rule's pattern is `default`;
4. they are on the same line of the file diffed (A's and B's top-level
   rule files, whatever their names), or of included files of the same
   name (the rule was rewritten in place).

A rule left unmatched is shown with 0 bytes on the other side: a cost
lists only the rules some collective is for."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._planning._plan import format_bytes

HEADER = ("collectives per rule line", "as written", "A", "B", "B - A")


@dataclasses.dataclass(frozen=True)
class RuleChange:
    """One rule's collective bytes per device per step under A and under B
    (`a`/`b`: the `RuleCost`, `None` where no collective of that side is
    for such a rule: 0 bytes), and
    how the two were matched (`text`, `pattern`, `line`, `owner`; `None`
    for a rule of one side only)."""

    a: Any
    b: Any
    matched_by: str | None

    @property
    def bytes_a(self) -> int:
        return 0 if self.a is None else int(self.a.bytes_per_device)

    @property
    def bytes_b(self) -> int:
        return 0 if self.b is None else int(self.b.bytes_per_device)

    @property
    def change(self) -> int:
        return self.bytes_b - self.bytes_a

    def to_json(self) -> dict[str, Any]:
        def side(r: Any) -> dict[str, Any] | None:
            return None if r is None else {"rule": r.rule, "text": r.text, "arrays": list(r.arrays)}

        return {
            "a": side(self.a),
            "b": side(self.b),
            "matched_by": self.matched_by,
            "bytes_per_device": {"a": self.bytes_a, "b": self.bytes_b},
            "change": self.change,
        }


def _owner(r: Any) -> str | None:
    return r.rule if not r.text else None


def _pattern(r: Any) -> str | None:
    if not r.text:
        return None
    return r.text.split(" -> ", 1)[0].strip()


def _line(r: Any, top: str) -> str | None:
    """`FILE:LINE` with the file's folder left out, and the side's top-level
    file (`top`, its name) written `*`: the same line of the file diffed, or
    of an included file of the same name."""
    if not r.text or ":" not in r.rule:
        return None
    file, _, line = r.rule.replace("\\", "/").rsplit("/", 1)[-1].rpartition(":")
    return f"{'*' if file == top else file}:{line}"


_KEYS: tuple[tuple[str, Callable[[Any, str], str | None]], ...] = (
    ("owner", lambda r, top: _owner(r)),
    ("text", lambda r, top: r.text or None),
    ("pattern", lambda r, top: _pattern(r)),
    ("line", _line),
)


def matched(a: Sequence[Any], b: Sequence[Any], tops: tuple[str, str] = ("", "")) -> list[RuleChange]:
    """A's and B's `RuleCost`s paired (see the module's docstring; `tops`:
    the names of A's and B's top-level rule files), most changed first
    (then most bytes, then by rule)."""
    left, right = list(a), list(b)
    out: list[RuleChange] = []
    for how, key in _KEYS:
        for ra in list(left):
            k = key(ra, tops[0])
            if k is None:
                continue
            rb = next((r for r in right if key(r, tops[1]) == k), None)
            if rb is not None:
                out.append(RuleChange(ra, rb, how))
                left.remove(ra)
                right.remove(rb)
    out += [RuleChange(r, None, None) for r in left] + [RuleChange(None, r, None) for r in right]
    out.sort(key=lambda c: (-abs(c.change), -max(c.bytes_a, c.bytes_b), _name(c)))
    return out


def _name(c: RuleChange) -> str:
    return (c.b or c.a).rule


def changes(costs: Mapping[str, Any], tops: tuple[str, str] = ("", "")) -> list[RuleChange] | None:
    """The rules of the two costs matched (`tops`: the names of A's and B's
    top-level rule files), or `None` where a side has collectives but
    attributes none of them (a plan file written before costs were
    attributed to rules): nothing to compare them with."""
    a, b = costs["a"], costs["b"]
    if any(not c.by_rule and c.collectives for c in (a, b)):
        return None
    return matched(a.by_rule, b.by_rule, tops)


def missing_note(costs: Mapping[str, Any]) -> str | None:
    """Why `changes` is `None`, for standard error."""
    if not any(not costs[side].by_rule and costs[side].collectives for side in ("a", "b")):
        return None
    sides = [side.upper() for side in ("a", "b") if not costs[side].by_rule and costs[side].collectives]
    return (
        f"{' and '.join(sides)}'s cost records no collectives per rule line (a plan file written by an "
        "earlier dump --step): write it again with dump --step to compare them rule by rule"
    )


def rows(found: Sequence[RuleChange]) -> list[tuple[str, ...]]:
    """One row per rule: where it is (B's, else A's), as written (A's → B's
    where they differ), the bytes per device per step under A and B, and
    the change."""
    out = []
    for c in found:
        where = (c.b or c.a).rule
        if c.a is not None and c.b is not None and c.a.rule != c.b.rule:
            where = f"{c.a.rule} -> {c.b.rule}"
        text_a, text_b = (c.a.text if c.a else None), (c.b.text if c.b else None)
        text = text_b if text_a in (None, text_b) else text_a if text_b is None else f"{text_a}  =>  {text_b}"
        sign = "+" if c.change > 0 else "-" if c.change < 0 else ""
        out.append(
            (
                where,
                text or "-",
                format_bytes(c.bytes_a),
                format_bytes(c.bytes_b),
                sign + format_bytes(abs(c.change)),
            )
        )
    return out
