"""`diff --step`'s cost per rule line: for each rule of A and of B
(`StepCost.by_rule`), the collective bytes each device sends or receives per
step and the FLOPs per device of the matrix products it owns, the two sides'
rules matched, most changed first.

A rule of A and one of B are the same rule when, in this order (each pass
over the rules the passes before left unmatched):

1. they are the same kind of owner that is no rule (`inferred`, `the
   model's code`);
2. they are written the same (`"attn/o/kernel$" -> (heads, embed)`),
   wherever they are in their files;
3. their patterns are the same (the spec changed: what a diff of rules
   most often is); a `default` rule's pattern is `default`;
4. they are on the same line of the file diffed (A's and B's top-level
   rule files, whatever their names), or of included files of the same
   name (the rule was rewritten in place).

Within a pass, where a rule has several candidates (one pattern in two
groups: `"up$"` for the parameters and for the activations), the pairs
nearest in line of the same file are taken first. A rule left unmatched is
shown with nothing on the other side: a cost lists only the rules some
collective or product is for."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._planning._plan import format_bytes, format_flops

HEADER = ("rule line", "as written", "collectives A", "B", "B - A", "matmul FLOPs A", "B")


@dataclasses.dataclass(frozen=True)
class RuleChange:
    """One rule's cost per device per step under A and under B (`a`/`b`: the
    `RuleCost`, `None` where nothing of that side is for such a rule: 0
    bytes, 0 FLOPs), and how the two were matched (`owner`, `text`,
    `pattern`, `line`; `None` for a rule of one side only)."""

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
        """B's collective bytes less A's."""
        return self.bytes_b - self.bytes_a

    @property
    def flops_a(self) -> float:
        return 0.0 if self.a is None else float(self.a.matmul_flops_per_device)

    @property
    def flops_b(self) -> float:
        return 0.0 if self.b is None else float(self.b.matmul_flops_per_device)

    def to_json(self) -> dict[str, Any]:
        def side(r: Any) -> dict[str, Any] | None:
            return None if r is None else {"rule": r.rule, "text": r.text, "arrays": list(r.arrays)}

        return {
            "a": side(self.a),
            "b": side(self.b),
            "matched_by": self.matched_by,
            "bytes_per_device": {"a": self.bytes_a, "b": self.bytes_b},
            "change": self.change,
            "matmul_flops_per_device": {"a": self.flops_a, "b": self.flops_b},
        }


def _owner(r: Any, top: str) -> str | None:
    return r.rule if not r.text else None


def _text(r: Any, top: str) -> str | None:
    return r.text or None


def _pattern(r: Any, top: str) -> str | None:
    if not r.text:
        return None
    return r.text.split(" -> ", 1)[0].strip()


def _where(r: Any, top: str) -> tuple[str, int] | None:
    """The rule's file (its folder left out; the side's top-level file, named
    `top`, written `*`) and line; `None` for an owner that is no rule."""
    if not r.text or ":" not in r.rule:
        return None
    file, _, line = r.rule.replace("\\", "/").rsplit("/", 1)[-1].rpartition(":")
    if not line.isdigit():
        return None
    return ("*" if file == top else file), int(line)


def _line(r: Any, top: str) -> str | None:
    where = _where(r, top)
    return None if where is None else f"{where[0]}:{where[1]}"


_KEYS: tuple[tuple[str, Callable[[Any, str], str | None]], ...] = (
    ("owner", _owner),
    ("text", _text),
    ("pattern", _pattern),
    ("line", _line),
)


def matched(a: Sequence[Any], b: Sequence[Any], tops: tuple[str, str] = ("", "")) -> list[RuleChange]:
    """A's and B's `RuleCost`s paired (see the module's docstring; `tops`:
    the names of A's and B's top-level rule files), most changed first:
    collective bytes, then matmul FLOPs, then most bytes, then by rule."""
    left, right = list(a), list(b)
    out: list[RuleChange] = []
    for how, key in _KEYS:
        pairs = []
        for i, ra in enumerate(left):
            k = key(ra, tops[0])
            if k is None:
                continue
            for j, rb in enumerate(right):
                if key(rb, tops[1]) == k:
                    pairs.append((_distance(ra, rb, tops), i, j))
        taken_a: set[int] = set()
        taken_b: set[int] = set()
        for _, i, j in sorted(pairs):
            if i not in taken_a and j not in taken_b:
                taken_a.add(i)
                taken_b.add(j)
                out.append(RuleChange(left[i], right[j], how))
        left = [r for i, r in enumerate(left) if i not in taken_a]
        right = [r for j, r in enumerate(right) if j not in taken_b]
    out += [RuleChange(r, None, None) for r in left] + [RuleChange(None, r, None) for r in right]
    out.sort(
        key=lambda c: (
            -abs(c.change),
            -abs(c.flops_b - c.flops_a),
            -max(c.bytes_a, c.bytes_b),
            (c.b or c.a).rule,
        )
    )
    return out


def _distance(ra: Any, rb: Any, tops: tuple[str, str]) -> float:
    """How far apart two rules are written: lines apart in the same file,
    else farther than any two lines of one file."""
    wa, wb = _where(ra, tops[0]), _where(rb, tops[1])
    if wa is None or wb is None or wa[0] != wb[0]:
        return float("inf")
    return abs(wa[1] - wb[1])


def _missing(cost: Any) -> bool:
    """A cost with collectives that attributes none of them to rule lines."""
    return not cost.by_rule and bool(cost.collectives)


def changes(costs: Mapping[str, Any], tops: tuple[str, str] = ("", "")) -> list[RuleChange] | None:
    """The rules of the two costs matched (`tops`: the names of A's and B's
    top-level rule files), or `None` where a side has collectives but
    attributes none of them (a plan file written before costs were
    attributed to rules): nothing to compare them with."""
    a, b = costs["a"], costs["b"]
    if _missing(a) or _missing(b):
        return None
    return matched(a.by_rule, b.by_rule, tops)


def missing_note(costs: Mapping[str, Any]) -> str | None:
    """Why `changes` is `None`, for standard error."""
    sides = [side.upper() for side in ("a", "b") if _missing(costs[side])]
    if not sides:
        return None
    return (
        f"{' and '.join(sides)}'s cost records no collectives per rule line (a plan file written by an "
        "earlier dump --step): write it again with dump --step to compare them rule by rule"
    )


def rows(found: Sequence[RuleChange]) -> list[tuple[str, ...]]:
    """One row per rule: where it is (B's, else A's; `A's -> B's` where they
    differ), as written (`A's  =>  B's` where they differ), the collective
    bytes per device per step under A and B and the change, the matmul FLOPs
    per device under A and B."""
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
                format_flops(c.flops_a),
                format_flops(c.flops_b),
            )
        )
    return out
