"""Which regular expressions a rule file may use.

Rule files come from other people's repositories, and Python's `re` engine
backtracks: a pattern such as `(x+)+y` takes exponential time on a path of
`x`s that does not end in `y`. Rather than trust every pattern, the loader
accepts the subset below, on which backtracking stays polynomial of low degree
(and fast on paths of realistic length):

- no backreferences (`\\1`, `(?P=name)`, `(?(1)...)`);
- no repetition inside repetition (`(a+)+`, `(\\w+/)*`, `(ab{2,3})+`);
- no repeated group whose alternatives can start with the same character
  (`(a|ab)*`, `(\\d|x)+`; `(q|k|v)+` is fine);
- at most two unbounded repeats of classes that also match `/`, the separator
  of paths (`.*`, `[^x]+`, `\\S*`); `[^/]+`, `\\d+`, `\\w+` and `[a-z]+` stop
  at `/` and are not counted.

Everything else of Python's syntax is accepted and means what it means to
`re.search`.
"""

from __future__ import annotations

import importlib
from typing import Any

# Python's own regex parser (the one `re.compile` uses); private, so untyped.
_p: Any = importlib.import_module("re._parser")
_c: Any = importlib.import_module("re._constants")

MAX_BROAD_REPEATS = 2

_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", _c.MAX_REPEAT)}
_ANY = "any"


class UnsafePattern(Exception):
    """Why a pattern is outside the supported subset, with a suggestion."""

    def __init__(self, reason: str, hint: str):
        super().__init__(reason)
        self.reason, self.hint = reason, hint


def check(pattern: str) -> None:
    """Raise `UnsafePattern` if `pattern` (already known to compile) is outside the subset."""
    items = _p.parse(pattern)
    _walk(list(items), in_repeat=False)
    broad = _count_broad(list(items))
    if broad > MAX_BROAD_REPEATS:
        raise UnsafePattern(
            f"{broad} unbounded repeats of classes that match `/`, such as `.*` or `[^x]*`; at most "
            f"{MAX_BROAD_REPEATS} are allowed, as each one multiplies the time a non-matching path takes",
            "patterns are searched anywhere in the path, so a leading or trailing `.*` is never "
            "needed; spell out the fixed parts (e.g. `layers/\\d+/attn` rather than `.*layers.*attn.*`)",
        )


def _walk(items: list[Any], in_repeat: bool) -> None:
    for op, av in items:
        if op in (_c.GROUPREF, _c.GROUPREF_EXISTS):
            raise UnsafePattern(
                "backreferences are not supported", "match the text itself, not a reference to a group"
            )
        if op in _REPEATS:
            _low, high, sub = av
            repeating = high == _c.MAXREPEAT or high > 1
            if repeating and in_repeat:
                raise UnsafePattern(
                    "a repeat inside a repeat (such as `(a+)+`) can take exponential time",
                    "repeat a character class instead, e.g. `[\\w/]+` rather than `(\\w+/)+`",
                )
            if repeating and _ambiguous_branch(list(sub)):
                raise UnsafePattern(
                    "a repeated group whose alternatives can start alike (such as `(a|ab)*`) "
                    "can take exponential time",
                    "make the alternatives start with different characters, or use a character class",
                )
            _walk(list(sub), in_repeat or repeating)
        elif op == _c.SUBPATTERN:
            _walk(list(av[-1]), in_repeat)
        elif op == _c.BRANCH:
            for branch in av[1]:
                _walk(list(branch), in_repeat)
        elif op in (_c.ASSERT, _c.ASSERT_NOT):
            _walk(list(av[1]), in_repeat)
        elif op == getattr(_c, "ATOMIC_GROUP", None):
            _walk(list(av), in_repeat)


def _first(items: list[Any]) -> tuple[set[int] | str, bool]:
    """The characters a sequence can start with (`_ANY` for "too many to list"),
    and whether it can match the empty string."""
    out: set[int] = set()
    for op, av in items:
        first, nullable = _first_one(op, av)
        if first == _ANY:
            return _ANY, False
        out |= first  # type: ignore[arg-type]
        if not nullable:
            return out, False
    return out, True


def _first_one(op: Any, av: Any) -> tuple[set[int] | str, bool]:
    if op == _c.LITERAL:
        return {av}, False
    if op == _c.IN:
        chars: set[int] = set()
        for kind, value in av:
            if kind == _c.LITERAL:
                chars.add(value)
            elif kind == _c.RANGE and value[1] - value[0] < 64:
                chars.update(range(value[0], value[1] + 1))
            else:
                return _ANY, False
        return chars, False
    if op in (_c.ANY, _c.NOT_LITERAL, _c.CATEGORY):
        return _ANY, False
    if op == _c.SUBPATTERN:
        return _first(list(av[-1]))
    if op == _c.BRANCH:
        union: set[int] = set()
        nullable = False
        for branch in av[1]:
            first, empty = _first(list(branch))
            if first == _ANY:
                return _ANY, False
            union |= first  # type: ignore[arg-type]
            nullable = nullable or empty
        return union, nullable
    if op in _REPEATS:
        first, empty = _first(list(av[2]))
        return first, empty or av[0] == 0
    return set(), True  # anchors, lookarounds: match no character


def _ambiguous_branch(items: list[Any]) -> bool:
    """Whether an alternation in `items` has two alternatives that can start alike."""
    for op, av in items:
        if op == _c.SUBPATTERN and _ambiguous_branch(list(av[-1])):
            return True
        if op == _c.BRANCH:
            seen: set[int] = set()
            empty_seen = False
            for branch in av[1]:
                first, empty = _first(list(branch))
                if first == _ANY or seen & first or (empty and empty_seen):  # type: ignore[operator]
                    return True
                seen |= first  # type: ignore[arg-type]
                empty_seen = empty_seen or empty
    return False


_SLASH = ord("/")
_NOT_CATEGORIES = ("CATEGORY_NOT_DIGIT", "CATEGORY_NOT_WORD", "CATEGORY_NOT_SPACE")


def _matches_slash(kind: Any, value: Any) -> bool:
    if kind == _c.LITERAL:
        return value == _SLASH
    if kind == _c.RANGE:
        return value[0] <= _SLASH <= value[1]
    if kind == _c.CATEGORY:
        return str(value) in _NOT_CATEGORIES
    return False


def _spans_separators(items: list[Any]) -> bool:
    """Whether a repeated item also matches `/`, so that repeats of it can
    split a path across its segments in many ways (`.`, `[^x]`, `\\S`, ...).
    `[^/]`, `\\d`, `\\w` and `[a-z]` stop at `/` and are not counted."""
    if len(items) != 1:
        return False
    op, av = items[0]
    if op == _c.ANY:
        return True
    if op == _c.NOT_LITERAL:
        return av != _SLASH
    if op == _c.IN:
        negated = any(kind == _c.NEGATE for kind, _ in av)
        hit = any(_matches_slash(kind, value) for kind, value in av if kind != _c.NEGATE)
        return hit != negated
    return False


def _count_broad(items: list[Any]) -> int:
    count = 0
    for op, av in items:
        if op in _REPEATS:
            if av[1] == _c.MAXREPEAT and _spans_separators(list(av[2])):
                count += 1
            count += _count_broad(list(av[2]))
        elif op == _c.SUBPATTERN:
            count += _count_broad(list(av[-1]))
        elif op == _c.BRANCH:
            count += max((_count_broad(list(b)) for b in av[1]), default=0)
        elif op in (_c.ASSERT, _c.ASSERT_NOT):
            count += _count_broad(list(av[1]))
    return count
