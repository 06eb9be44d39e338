"""Finding the first rule whose pattern matches a path."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ._rules import Rule


class Matcher:
    """First match wins over a group's pattern rules, in order. Each pattern is
    a Python regex searched (`re.search`) anywhere in the path."""

    def __init__(self, rules: Sequence[Rule]):
        self.rules = tuple(r for r in rules if r.pattern is not None)
        self._searches = tuple(re.compile(r.pattern).search for r in self.rules if r.pattern is not None)

    def first(self, path: str) -> Rule | None:
        """The first rule matching `path`, or `None`."""
        for rule, search in zip(self.rules, self._searches, strict=True):
            if search(path) is not None:
                return rule
        return None
