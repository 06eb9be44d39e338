"""Finding the first rule whose pattern matches a path, fast.

Semantics are those of the obvious loop — for each rule in order, `re.search`
its pattern in the path; the first hit wins — but most rules are ruled out
without running their regex: each pattern's longest run of literal text that
every match must contain (`q_proj/kernel` in `attn/q_proj/kernel$`) is looked
for with a plain substring test first.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ._regex import _c, _p
from ._rules import Rule


def required_literal(pattern: str) -> str:
    """The longest run of literal characters every match of `pattern` contains,
    or `""` when there is none to rely on (alternation at the top, flags)."""
    try:
        parsed = _p.parse(pattern)
    except re.error:
        return ""
    if parsed.state.flags & (re.IGNORECASE | re.VERBOSE):
        return ""
    best, run = "", []
    for op, av in parsed:
        if op == _c.LITERAL:
            run.append(chr(av))
            continue
        if len(run) > len(best):
            best = "".join(run)
        run = []
    if len(run) > len(best):
        best = "".join(run)
    return best


class Matcher:
    """First match wins over a group's pattern rules, in order. Each pattern is
    a Python regex searched (`re.search`) anywhere in the path."""

    def __init__(self, rules: Sequence[Rule]):
        self.rules = tuple(r for r in rules if r.pattern is not None)
        self._entries = tuple(
            (required_literal(r.pattern), re.compile(r.pattern).search, r)
            for r in self.rules
            if r.pattern is not None
        )

    def first(self, path: str) -> Rule | None:
        """The first rule matching `path`, or `None`."""
        for literal, search, rule in self._entries:
            if literal in path and search(path) is not None:
                return rule
        return None
