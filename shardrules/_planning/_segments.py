"""Rule patterns split at their `/`s, for telling which leaves a rule was
written for (`_catchall`, SR125); and which patterns take any path.

A pattern (each alternative of a top-level `|` on its own) is split into
segments at the `/`s outside groups and classes, a leading `^` and a trailing
`$` set aside. Each segment that can never match a `/` (no `.`, no negated
class or `\\W`-like escape that takes one) gets a test that it matches a
path's segment whole: the first segment may match the end of one when the
pattern has no `^`, the last the start of one when it has no `$`. A segment
that can match a `/` matches none. The names a segment spells out (runs of two
letters or more in its literal text) are kept, to tell `encoder/...` from
`decoder/...`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
from collections.abc import Sequence
from typing import Any

from .._language._regex import _c, _p, compiled, path_bytes, searcher
from ._match import digit_blind, required_literal

_SLASH = ord("/")
_PROBES = ("~", "0", "a/b", "Q_9.z")
"""Paths with nothing in common: a pattern found in each is a catch-all."""

_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", None)} - {None}
_BOUNDARIES = {
    getattr(_c, name) for name in ("AT_BOUNDARY", "AT_LOC_BOUNDARY", "AT_UNI_BOUNDARY") if hasattr(_c, name)
}
_WORD = re.compile(r"[A-Za-z]{2,}")
SPECIAL = re.compile(r"([.^$*+?{}\[\]()|\\])")
"""The characters a regex gives a meaning of their own."""


@functools.lru_cache(maxsize=4096)
def catch_all(pattern: str | None) -> bool:
    """Whether a rule with this pattern (`None`: `default`) takes any path:
    `default`, or a pattern with no text of its own found in each of a few
    paths that share nothing (`""`, `"."`, `".*"`, `"^"`, `"$"`)."""
    if pattern is None:
        return True
    if required_literal(pattern):
        return False
    search = searcher(pattern)
    return all(search(path_bytes(probe)) is not None for probe in _PROBES)


@dataclasses.dataclass(frozen=True, eq=False)
class Alternative:
    """One alternative of a pattern, split at its `/`s: each segment's place
    in the pattern (`start`, `end`), its whole-segment test (`None`: it may
    match a `/`) and the names written in it."""

    pattern: str
    caret: int | None  # where its `^` is, if it starts with one
    dollar: bool  # whether it ends with `$`
    spans: tuple[tuple[int, int], ...]
    tests: tuple[Any, ...]
    words: tuple[tuple[str, ...], ...]
    blinds: tuple[bool, ...]  # which segments treat all digits alike
    cased: bool = True  # whether its names match only as written (no `(?i)`)
    choices: tuple[tuple[tuple[tuple[str, ...], ...], ...], ...] = ()  # per segment: `_choices`

    @property
    def blind(self) -> bool:
        return all(self.blinds)

    @functools.cached_property
    def relaxed(self) -> Alternative:
        """This alternative with each segment that tells digits apart taken to
        match any segment: what it matches in one path, it may match in every
        path with that path's key (`path_key`)."""
        tests = tuple(t if b else _anything for t, b in zip(self.tests, self.blinds, strict=True))
        return dataclasses.replace(self, tests=tests, blinds=(True,) * len(tests))

    def needed(self, path: str) -> bool:
        """Whether every name written in the segments of this alternative
        that line up with one of `path`'s in any way it can be meant for it
        (its last two; each of them where it ends in `$`, or where its last
        is a plain name, those that line up where the first of the path's
        segments from the second on that starts with that name is its last)
        is in `path`: where a segment matches, its names are in the path;
        where it does not, the leaf is meant for the rule only if they are
        (`names_in`). Digits are no part of a name, so all paths with one key
        agree."""
        if not self.cased:
            return True
        m = len(self.words)
        if self.dollar:
            first = max(0, m - path.count("/") - 1)
        elif m >= 2 and self.plain_last is not None:
            starts = [
                j for j, segment in enumerate(path.split("/")) if j and segment.startswith(self.plain_last)
            ]
            if not starts:
                return False  # its last segment matches none of the path's it may line up with
            first = max(0, m - 1 - starts[0])
        else:
            first = max(0, m - 2)
        return all(self.named(i, path) for i in range(first, m))

    @functools.cached_property
    def plain_last(self) -> str | None:
        """Its last segment, where that is a name without digits (a path's
        segment it lines up with starts with it) and it does not end in `$`."""
        start, end = self.spans[-1]
        text = self.pattern[start:end]
        plain = text and not SPECIAL.search(text) and not any(c.isdigit() for c in text)
        return text if plain and not self.dollar else None

    def named(self, i: int, path: str) -> bool:
        """Whether `path` has the names segment `i` writes: each of its plain
        names, and for each of its groups of a few texts (`(encoder|vision)`)
        the names of one of them."""
        return all(word in path for word in self.words[i]) and all(
            any(all(word in path for word in option) for option in choice)
            for choice in (self.choices[i] if self.choices else ())
        )

    @property
    def last_name(self) -> str | None:
        """Its last segment when that is a plain name and the alternative ends
        with `$`: only paths ending in that name can line up with it whole."""
        start, end = self.spans[-1]
        text = self.pattern[start:end]
        return text if self.dollar and text and not SPECIAL.search(text) else None


@functools.lru_cache(maxsize=4096)
def alternatives(pattern: str) -> tuple[Alternative, ...]:
    """The alternatives of `pattern` that have a last segment to line up."""
    out = []
    for start, end, slashes in _split(pattern):
        caret = start if pattern.startswith("^", start) and start < end else None
        first = start + (caret is not None)
        dollar = end > first and pattern[end - 1] == "$" and not _escaped(pattern, end - 1)
        last = end - dollar
        bounds = [first, *(s + 1 for s in slashes)]
        ends = [*slashes, last]
        spans = tuple(zip(bounds, ends, strict=True))
        tests, words, blinds, choices = [], [], [], []
        for i, (a, b) in enumerate(spans):
            text = pattern[a:b]
            parsed = _parse(text)
            if parsed is None or not _closed(list(parsed)):
                tests.append(None)
                words.append(())
                choices.append(())
                blinds.append(True)  # it matches no segment, whatever its digits
                continue
            whole = f"(?:{text})"
            if i == 0 and caret is None:
                whole = "(?s:.*)" + whole
            if i == len(spans) - 1 and not dollar:
                whole += "(?s:.*)"
            tests.append(compiled(whole).fullmatch)
            words.append(tuple(_WORD.findall(_literals(parsed))))
            choices.append(_choices(parsed))
            blinds.append(digit_blind(whole))
        if tests[-1] is not None:
            out.append(
                Alternative(
                    pattern,
                    caret,
                    dollar,
                    spans,
                    tuple(tests),
                    tuple(words),
                    tuple(blinds),
                    _cased(pattern),
                    tuple(choices),
                )
            )
    return tuple(out)


def _cased(pattern: str) -> bool:
    parsed = _parse(pattern)
    return parsed is not None and not parsed.state.flags & re.IGNORECASE


def _anything(segment: bytes) -> bool:
    return True


def _split(pattern: str) -> list[tuple[int, int, list[int]]]:
    """The top-level alternatives of `pattern`: `(start, end, [offsets of the
    `/`s between its segments])`; a `/` in a group or a class does not split."""
    out: list[tuple[int, int, list[int]]] = []
    start, slashes, depth, i = 0, [], 0, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":
            i += 1
            for lead in ("^", "]"):  # `[^]...]`, `[]...]`: a leading `]` is a character
                if pattern.startswith(lead, i):
                    i += 1
            while i < len(pattern) and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif depth == 0 and char == "/":
            slashes.append(i)
        elif depth == 0 and char == "|":
            out.append((start, i, slashes))
            start, slashes = i + 1, []
        i += 1
    out.append((start, len(pattern), slashes))
    return out


def _escaped(text: str, at: int) -> bool:
    backslashes = len(text[:at]) - len(text[:at].rstrip("\\"))
    return backslashes % 2 == 1


def _parse(text: str) -> Any:
    try:
        return _p.parse(text)
    except (re.error, OverflowError, RecursionError):
        return None


def _items(sub: Any) -> list[Any]:
    return sub.data if hasattr(sub, "data") else list(sub)


def _closed(items: list[Any]) -> bool:
    """Whether a parsed segment can never match a `/` (nor an anchor inside it)."""
    for op, av in items:
        if op == _c.LITERAL:
            if av == _SLASH:
                return False
        elif op == _c.NOT_LITERAL:
            if av != _SLASH:
                return False
        elif op == _c.IN:
            if _class_takes_slash(av):
                return False
        elif op == _c.CATEGORY:
            if "NOT_" in str(av):  # \D, \W, \S
                return False
        elif op == _c.AT:
            if av not in _BOUNDARIES:
                return False
        elif op in _REPEATS:
            if not _closed(_items(av[2])):
                return False
        elif op == _c.SUBPATTERN:
            if not _closed(_items(av[-1])):
                return False
        elif op == _c.BRANCH:
            if not all(_closed(_items(branch)) for branch in av[1]):
                return False
        else:  # `.` and anything unforeseen
            return False
    return True


def _class_takes_slash(items: Any) -> bool:
    negate = hit = False
    for kind, value in items:
        if kind == _c.NEGATE:
            negate = True
        elif kind == _c.LITERAL:
            hit = hit or value == _SLASH
        elif kind == _c.RANGE:
            hit = hit or value[0] <= _SLASH <= value[1]
        elif kind == _c.CATEGORY:
            hit = hit or "NOT_" in str(value)
        else:
            return True
    return hit != negate


def _literals(parsed: Any) -> str:
    """The text a parsed segment spells out at its top level (runs apart)."""
    return "".join(chr(av) if op == _c.LITERAL else " " for op, av in _items(parsed))


def names_of(paths: Sequence[str]) -> tuple[list[str], set[str]]:
    """The paths `respelled` tries (at most 20,000 of them, spread over all)
    and the names (two letters or more) written in them."""
    sample = list(paths) if len(paths) <= 20_000 else list(paths[:: len(paths) // 20_000 + 1])
    return sample, set(_WORD.findall("/".join(dict.fromkeys(sample))))


def respelled(pattern: str, names: tuple[list[str], set[str]]) -> tuple[str, str] | None:
    """For a pattern that matches no path: the pattern with one name it
    writes that no path has spelled as a close name the paths have (`q_porj`
    → `q_proj`), and a path it then matches (`names` is `names_of(paths)`);
    else `None`."""
    sample, have = names
    words = {w for alt in alternatives(pattern) for segment in alt.words for w in segment}
    for word in sorted(words - have):
        for close in difflib.get_close_matches(word, have, n=3, cutoff=0.75):
            new = re.sub(rf"(?<![A-Za-z\\]){word}(?![A-Za-z])", close, pattern)
            try:
                search = searcher(new)
            except Exception:  # a spelling RE2 refuses is no fix
                continue
            for path in sample:
                if search(path_bytes(path)) is not None:
                    return new, path
    return None


def _choices(parsed: Any) -> tuple[tuple[tuple[str, ...], ...], ...]:
    """The groups at a segment's top level that spell out one of a few texts
    (`(encoder|vision)`, `(?:self|cross)`): for each, the names of each text.
    A group with a text that writes no name asks for none."""
    out = []
    for item in _items(parsed):
        if item[0] in (_c.SUBPATTERN, _c.BRANCH):
            texts = _texts([item])
            if texts is not None:
                options = tuple(tuple(_WORD.findall(text)) for text in texts)
                if all(options):
                    out.append(options)
    return tuple(out)


def _texts(items: list[Any], limit: int = 32) -> list[str] | None:
    """Every text `items` match, where they are literals and groups of
    alternatives of literals (at most `limit`), else `None`."""
    texts = [""]
    for op, av in items:
        if op == _c.LITERAL:
            texts = [text + chr(av) for text in texts]
            continue
        if op == _c.SUBPATTERN:
            inner = _texts(_items(av[-1]), limit)
        elif op == _c.BRANCH:
            each = [_texts(_items(branch), limit) for branch in av[1]]
            inner = None if any(e is None for e in each) else [t for e in each for t in e or ()]
        else:
            return None
        if inner is None or len(texts) * len(inner) > limit:
            return None
        texts = [text + tail for text in texts for tail in inner]
    return texts


def escape(text: str) -> str:
    """`text` as a pattern that matches it literally."""
    return SPECIAL.sub(r"\\\1", text)
