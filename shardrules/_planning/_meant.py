"""Which rule a leaf that a catch-all takes was evidently written for
(`_catchall`, SR125): the test the docstring of `_catchall` states, made
once per kind of leaf and path key where the patterns allow it.

Most leaves of a large tree share their path's key (`path_key`: digits as
`0`) with many others, and a pattern that treats all digits alike lines up
the same with all of them: such leaves are looked at once (`Leaves.verdict`).
Where a pattern tells digits apart, each path is looked at on its own, but
only where the pattern with those segments relaxed (matching any) could hit,
and against that pattern alone (`Each`). A pattern that names what the path
lacks is not looked at (`Alternative.needed`).
A rule that takes leaves is blamed for its `^` only where the leaf is a copy
of one it takes, which depends on the path itself: `Leaves.resolve`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .._language._regex import path_bytes
from .._language._rules import Rule
from ._segments import Alternative

ZEROS = str.maketrans("123456789", "000000000")  # a name as `path_key` writes it


@dataclasses.dataclass(frozen=True)
class Hit:
    """A rule (one alternative of its pattern) a leaf was meant for, and how
    that shows: `"anchor"`, `"names"`, `"copy"` (`_copies`), or `"anchor?"`
    (an anchor of a rule that takes leaves, blamed only where the leaf is a
    copy of one it takes: `Leaves.resolve` decides for each path)."""

    rule: Rule
    alt: Alternative
    how: str
    k: int  # segments matched, from the pattern's last
    j: int  # the path's segment its last lines up with
    container: str = ""  # `"copy"` (`_copies`): the container of the leaf it is a copy of

    @property
    def rank(self) -> tuple[int, int, int]:
        return (self.how != "names", self.k, -self.rule.index)


@dataclasses.dataclass(frozen=True)
class Each:
    """`Leaves.verdict` where each path decides: the hits (to `resolve`) of the
    patterns that treat digits alike, and the patterns that tell digits apart
    and may hit a path with the key."""

    hits: list[Hit]
    sharp: list[tuple[Rule, Alternative]]


class Leaves:
    """The catch-all's leaves met so far, each with the rule meant for it."""

    def __init__(
        self,
        catcher: Rule,
        candidates: list[tuple[Rule, Alternative]],
        live: set[int],
        taken_by: Callable[[str], tuple[Rule | None, Any]],
    ):
        self.catcher = catcher
        self.live = live
        self.taken_by = taken_by  # a path's rule and shape in the plan (`None`s: no such leaf)
        self.by_name: dict[str, list[tuple[Rule, Alternative]]] = {}
        self.others: list[tuple[Rule, Alternative]] = []
        for rule, alt in candidates:
            if id(rule) in live and alt.caret is None:
                continue  # neither an anchor to blame nor a rule that matches nothing
            name = alt.last_name
            if name is None:
                self.others.append((rule, alt))
            else:  # as the name appears in path keys
                self.by_name.setdefault(name.translate(ZEROS), []).append((rule, alt))
        self._segment: dict[int, list[dict[str, bool]]] = {}  # per alternative and segment
        self.found: dict[tuple[int, int, str], list[tuple[str, tuple[int, ...], Any, Hit]]] = {}

    @property
    def empty(self) -> bool:
        return not self.by_name and not self.others

    @property
    def every(self) -> list[tuple[Rule, Alternative]]:
        """Every candidate."""
        return [*self.others, *(c for named in self.by_name.values() for c in named)]

    @property
    def guarded(self) -> bool:
        """Whether a candidate has a guard (then leaves of one key may differ by shape)."""
        return any(rule.guard is not None for rule, _ in self.every)

    def verdict(self, path: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """For the leaves of one kind whose paths have `path`'s key
        (`path_key`): the rule each was meant for (a `Hit`, the same for them
        all), `None` for none, a list of hits to `resolve` for each path (the
        best first: an anchor of a rule that takes leaves is blamed only where
        the path's own leaf is a copy), or an `Each` where a pattern that tells
        digits apart may hit (each path is then looked at with `hit`, for
        those patterns only)."""
        candidates = self._candidates(path)
        if not candidates:
            return None
        segments = path.split("/")
        blind = [c for c in candidates if c[1].blind]
        sharp = [c for c in candidates if not c[1].blind and self._possible(segments, shape, dtype, [c])]
        hits = self._hits(segments, shape, dtype, blind, exact=False)
        if sharp:
            return Each(hits, sharp)
        if not hits or hits[0].how != "anchor?":
            return hits[0] if hits else None
        return hits

    def hit(self, each: Each, path: str, shape: tuple[int, ...], dtype: Any) -> Hit | None:
        """The rule the leaf at `path` was meant for, or `None`: `each`'s hits
        of the patterns that treat digits alike, and its other patterns tried
        on the path itself."""
        hits = self._hits(path.split("/"), shape, dtype, each.sharp, exact=True)
        merged = sorted([*each.hits, *hits], key=lambda hit: hit.rank, reverse=True)
        return self.resolve(merged, path, shape)

    def resolve(self, hits: list[Hit], path: str, shape: tuple[int, ...]) -> Hit | None:
        """The first of `hits` (a `verdict`) that holds for the leaf at `path`."""
        segments = path.split("/")
        for hit in hits:
            if hit.how != "anchor?":
                return hit
            if self._copy(hit.rule, hit.alt, hit.j, segments, shape):
                return dataclasses.replace(hit, how="anchor")
        return None

    def add(self, path: str, shape: tuple[int, ...], dtype: Any, hit: Hit) -> None:
        self.found.setdefault((id(hit.rule), id(hit.alt), hit.how), []).append((path, shape, dtype, hit))

    def _candidates(self, path: str) -> list[tuple[Rule, Alternative]]:
        """The candidates that may hit `path` (or any path with its key): those
        whose last name it ends in, or that have none, and whose names the
        path has (`Alternative.needed`)."""
        named = self.by_name.get(path[path.rfind("/") + 1 :].translate(ZEROS))
        return [c for c in ([*named, *self.others] if named else self.others) if c[1].needed(path)]

    def _possible(
        self,
        segments: list[str],
        shape: tuple[int, ...],
        dtype: Any,
        candidates: list[tuple[Rule, Alternative]],
    ) -> bool:
        """Whether any candidate could hit a path with this one's key: each
        candidate relaxed (its segments that tell digits apart match any), at
        each lining up. A relaxed pattern matches at least the segments the
        pattern does (`k` at most the relaxed one's), and the fewer segments
        match, the more names must be in the path: so where the relaxed
        pattern cannot hit, with as many segments matched as names allow, the
        pattern cannot either."""
        for rule, alt in candidates:
            if rule.guard is not None and dtype is not None and not rule.guard.holds(shape, dtype):
                continue
            m = len(alt.spans)
            for k, j in self._line_ups(alt.relaxed, segments):
                if k == m and alt.caret is not None and j + 1 > m:
                    return True
                fewer = min(k, m - 1)
                path = "/".join(segments)
                if fewer >= 2 and id(rule) not in self.live and names_in(alt, fewer, j, path):
                    return True
        return False

    def _hits(
        self,
        segments: list[str],
        shape: tuple[int, ...],
        dtype: Any,
        candidates: list[tuple[Rule, Alternative]],
        exact: bool,
    ) -> list[Hit]:
        """Every rule among `candidates` the leaf may have been meant for, the
        best first (anchors, then the most segments matched, then the first
        rule). For a rule, each lining up where its whole pattern matches is
        tried (its `^` to blame), else the one that matches the most. Not
        `exact`: a rule's anchor that only the leaf's own path can blame is
        `"anchor?"`."""
        out = []
        for rule, alt in candidates:
            if rule.guard is not None and dtype is not None and not rule.guard.holds(shape, dtype):
                continue
            lined = self._line_ups(alt, segments)
            m = len(alt.spans)
            tried = [kj for kj in lined if kj[0] == m] or [max(lined, key=lambda kj: kj[0], default=(0, 0))]
            for k, j in tried:
                how = self._how(rule, alt, k, j, segments, shape, exact)
                if how is not None:
                    out.append(Hit(rule, alt, how, k, j))
                    if how != "anchor?":
                        break
        out.sort(key=lambda hit: hit.rank, reverse=True)
        return out

    def _how(
        self, rule: Rule, alt: Alternative, k: int, j: int, segments: list[str], shape: Any, exact: bool
    ) -> str | None:
        """Whether `k` segments of `alt` matching, its last at the path's
        segment `j`, say the leaf was meant for `rule`: how, or `None`. A rule
        that takes leaves is blamed for its anchor only where the leaf is a
        copy of one it takes (the optimizer's moments of a parameter): the
        path from where the pattern matches is a leaf of the same shape that
        the rule takes; else its `^` may be meant (`^w$` for the top-level
        `w`, not `block/w`)."""
        m = len(alt.spans)
        if k == m:
            if alt.caret is None or j + 1 <= m:
                return None
            if id(rule) not in self.live:
                return "anchor"
            if not exact:
                return "anchor?"
            return "anchor" if self._copy(rule, alt, j, segments, shape) else None
        if k >= 2 and id(rule) not in self.live and names_in(alt, k, j, "/".join(segments)):
            return "names"
        return None

    def _copy(self, rule: Rule, alt: Alternative, j: int, segments: list[str], shape: Any) -> bool:
        """Whether the path from where `alt` matches whole (its last segment at
        `j`) is a leaf of `shape` that `rule` takes."""
        taker, taken_shape = self.taken_by("/".join(segments[j - len(alt.spans) + 1 :]))
        return taker is rule and taken_shape == shape

    def _line_ups(self, alt: Alternative, segments: list[str]) -> list[tuple[int, int]]:
        """`(k, j)` for each segment `j` of the path that `alt`'s last segment
        can line up with (the last, for a pattern ending in `$`): how many of
        `alt`'s segments, from its last, match the path's from there."""
        m, n = len(alt.spans), len(segments)
        memo = self._segment.get(id(alt))
        if memo is None:
            memo = self._segment[id(alt)] = [{} for _ in range(m)]
        out = []
        for j in (n - 1,) if alt.dollar else range(n - 1, -1, -1):
            k = 0
            while k < m and k <= j:
                seen, segment = memo[m - 1 - k], segments[j - k]
                found = seen.get(segment)
                if found is None:
                    test = alt.tests[m - 1 - k]
                    found = seen[segment] = test is not None and test(path_bytes(segment)) is not None
                if not found:
                    break
                k += 1
            if k:
                out.append((k, j))
        return out


def names_in(alt: Alternative, k: int, j: int, path: str) -> bool:
    """Whether every name written in `alt`'s unmatched segments that line up
    with one of the path's is in the path (of a group of a few texts, such as
    `(encoder|vision)`, the names of one of them)."""
    m = len(alt.spans)
    for t in range(k, m):
        if j - t < 0:  # the pattern has more segments than the path: nothing lines up
            break
        if not alt.named(m - 1 - t, path):
            return False
    return True
