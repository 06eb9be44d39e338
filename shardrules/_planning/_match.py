"""Finding the first rule whose pattern matches a path, fast.

Semantics are those of the obvious loop — for each rule in order, search its
pattern in the path (with RE2: `_language._regex`); the first hit wins — but
almost all of that work is shared between paths.

Large trees repeat one shape of path many times over with other numbers in it
(`layers_17/moe/experts/203/up_proj/kernel`). A path's *key* is the path with
every ASCII digit written as `0`; the work that depends only on the key is
done once per key:

- A pattern that treats all digits alike ("digit-blind": `layers_\\d+/attn`,
  `kernel$`, `.`, `\\w`) matches a path exactly when it matches the path's key,
  so it is decided once per key.
- A pattern that tells digits apart (`layers_0/`, `[0-3]`) is searched in each
  path, but only where its required literal text, written as a key, occurs in
  the path's key (a necessary condition), and only if no digit-blind rule
  before it has already matched that key.

So for each key the matcher keeps the short list of rules still to try; for
most trees that list is one rule, known to match.

A rule with a guard (`if elements >= 16384`) applies only where its guard
holds for the leaf's shape and dtype, so a guarded rule known to match a key
does not end that key's list: `first_fitting` asks its guard, per kind of
leaf, and goes on where it refuses. `first` ignores guards; a group without
any is matched by it alone, at no extra cost.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from .._language._regex import Search, _c, _p, path_bytes, searcher
from .._language._rules import Rule

# Path → key: every ASCII digit becomes 0. Keys are UTF-8 bytes, whose `translate`
# is ten times faster than `str.translate` (UTF-8 never puts ASCII bytes inside
# another character's encoding).
_KEY = bytes.maketrans(b"123456789", b"000000000")
_DIGITS = range(ord("0"), ord("9") + 1)
# Keys remembered per matcher; past this, paths are still matched, just not remembered.
_MAX_KEYS = 1 << 17
_SEARCH: Any = object()  # `Matcher.firsts`: a key whose paths are searched one by one


def path_key(path: str) -> bytes:
    """A path's key: its UTF-8 bytes with every ASCII digit written as `0`."""
    return path_bytes(path).translate(_KEY)


def path_keys(paths: Sequence[str]) -> list[bytes]:
    """`path_key` of every path, encoded and translated all at once (one call
    each for a million paths, not a million calls). UTF-8 encodes each
    character on its own, so the bytes of the joined paths are the joined
    bytes of each."""
    joined = _joined(paths)
    if joined is None:
        return [path_key(path) for path in paths]
    return joined.translate(_KEY).split(b"\n")


def _joined(paths: Sequence[str]) -> bytes | None:
    """The paths' UTF-8 bytes joined by line breaks; `None` when a path has a
    line break of its own (or there are none)."""
    joined = "\n".join(paths)
    if not paths or joined.count("\n") != len(paths) - 1:
        return None
    return joined.encode("utf-8", "surrogatepass")


def _texts(paths: Sequence[str]) -> list[bytes]:
    """`path_bytes` of every path (as `path_keys`)."""
    joined = _joined(paths)
    return [path_bytes(path) for path in paths] if joined is None else joined.split(b"\n")


def required_literal(pattern: str) -> str:
    """The longest run of literal characters every match of `pattern` contains,
    or `""` when there is none to rely on (alternation at the top, flags)."""
    return _facts(pattern)[0]


def digit_blind(pattern: str) -> bool:
    """Whether `pattern` matches a path exactly when it matches the path with
    its ASCII digits changed to other digits: every part of it accepts either
    all ten digits or none of them (and there are no backreferences)."""
    return _facts(pattern)[1]


def _facts(pattern: str) -> tuple[str, bool]:
    """`required_literal` and `digit_blind` of `pattern`, from one parse."""
    try:
        parsed = _p.parse(pattern)
    except re.error:
        return "", False
    return _literal(parsed), _blind(list(parsed))


def _literal(parsed: Any) -> str:
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


def _blind(items: list[Any]) -> bool:
    for op, av in items:
        if op in (_c.LITERAL, _c.NOT_LITERAL):
            if av in _DIGITS:
                return False
        elif op == _c.IN:
            answers = {_in_class(av, d) for d in _DIGITS}
            if len(answers) != 1 or None in answers:  # tells digits apart, or cannot tell
                return False
        elif op in (_c.ANY, _c.AT, _c.CATEGORY):
            pass  # `.`, anchors, `\b`, `\d`, `\w`, `\s`...: the same for every digit
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", None)):
            if not _blind(list(av[2])):
                return False
        elif op == _c.SUBPATTERN:
            if not _blind(list(av[-1])):
                return False
        elif op == _c.BRANCH:
            if not all(_blind(list(branch)) for branch in av[1]):
                return False
        elif op in (_c.ASSERT, _c.ASSERT_NOT):
            if not _blind(list(av[1])):
                return False
        elif op == getattr(_c, "ATOMIC_GROUP", None):
            if not _blind(list(av)):
                return False
        else:  # backreferences and anything unforeseen: decide per path
            return False
    return True


def _category_has_digits(category: Any) -> bool:
    name = str(category)
    return (
        ("DIGIT" in name and "NOT_DIGIT" not in name)
        or ("WORD" in name and "NOT_WORD" not in name)
        or "NOT_SPACE" in name
        or "NOT_LINEBREAK" in name
    )


def _in_class(items: Any, code: int) -> bool | None:
    """Whether a character class accepts the character `code` (`None`: cannot tell)."""
    negate, hit = False, False
    for kind, value in items:
        if kind == _c.NEGATE:
            negate = True
        elif kind == _c.LITERAL:
            hit = hit or value == code
        elif kind == _c.RANGE:
            hit = hit or value[0] <= code <= value[1]
        elif kind == _c.CATEGORY:
            hit = hit or _category_has_digits(value)
        else:
            return None
    return hit != negate


class Matcher:
    """First match wins over a group's pattern rules, in order. Each pattern is
    searched anywhere in the path."""

    def __init__(self, rules: Sequence[Rule]):
        self.rules = tuple(r for r in rules if r.pattern is not None)
        self.guarded = any(r.guard is not None for r in self.rules)
        entries = []
        for rule in self.rules:
            assert rule.pattern is not None
            literal, blind = _facts(rule.pattern)
            literal_bytes = path_bytes(literal)
            entries.append(
                (literal_bytes.translate(_KEY), literal_bytes, searcher(rule.pattern), blind, rule)
            )
        self._entries = tuple(entries)
        # key → the rules still to try for paths with that key: (search, literal, rule),
        # with search None for a rule known to match.
        self._by_key: dict[bytes, tuple[tuple[Search | None, bytes, Rule], ...]] = {}
        self._fits: dict[tuple[int, tuple[int, ...], Any], bool] = {}  # guards, per rule and kind of leaf

    def first(self, path: str) -> Rule | None:
        """The first rule matching `path`, or `None`; guards are not asked (see `first_fitting`)."""
        text = path.encode("utf-8", "surrogatepass")  # `path_bytes`, inline: once per leaf
        key = text.translate(_KEY)
        todo = self._by_key.get(key)
        if todo is None:
            todo = self._todo(key)
            if len(self._by_key) < _MAX_KEYS:
                self._by_key[key] = todo
        for search, literal, rule in todo:
            if search is None or (literal in text and search(text) is not None):
                return rule
        return None

    def firsts(self, paths: Sequence[str]) -> list[Rule | None]:
        """`first` of every path: the rule of each key that every path with
        it matches is found once per key, and only the other paths are searched."""
        keys = path_keys(paths)
        decided: dict[bytes, Any] = {}  # key → its rule, or _SEARCH: search each path
        searched: dict[bytes, tuple[tuple[Search | None, bytes, Rule], ...]] = {}
        for key in set(keys):
            todo = self._todo_of(key)
            if todo and todo[0][0] is not None:
                decided[key], searched[key] = _SEARCH, todo
            else:
                decided[key] = todo[0][2] if todo else None
        out = list(map(decided.__getitem__, keys))
        if searched:
            texts = _texts(paths)
            for i, rule in enumerate(out):
                if rule is _SEARCH:
                    out[i] = self._searched(texts[i], searched[keys[i]])
        return out

    def _todo_of(self, key: bytes) -> tuple[tuple[Search | None, bytes, Rule], ...]:
        todo = self._by_key.get(key)
        if todo is None:
            todo = self._todo(key)
            if len(self._by_key) < _MAX_KEYS:
                self._by_key[key] = todo
        return todo

    @staticmethod
    def _searched(text: bytes, todo: tuple[tuple[Search | None, bytes, Rule], ...]) -> Rule | None:
        for search, literal, rule in todo:
            if search is None or (literal in text and search(text) is not None):
                return rule
        return None

    def first_fitting(self, path: str, shape: tuple[int, ...], dtype: Any) -> Rule | None:
        """The first rule matching `path` whose guard (if any) holds for an
        array of `shape` and `dtype`, or `None`. (`first` where no rule has a guard.)"""
        if not self.guarded:
            return self.first(path)
        text = path.encode("utf-8", "surrogatepass")
        key = text.translate(_KEY)
        todo = self._by_key.get(key)
        if todo is None:
            todo = self._todo(key)
            if len(self._by_key) < _MAX_KEYS:
                self._by_key[key] = todo
        for search, literal, rule in todo:
            matched = search is None or (literal in text and search(text) is not None)
            if matched and self.holds(rule, shape, dtype):
                return rule
        return None

    def holds(self, rule: Rule, shape: tuple[int, ...], dtype: Any) -> bool:
        """Whether `rule`'s guard (if any) holds for an array of `shape` and
        `dtype`, worked out once per rule and kind of leaf."""
        if rule.guard is None:
            return True
        key = (id(rule), shape, dtype)
        found = self._fits.get(key)
        if found is None:
            found = self._fits[key] = rule.guard.holds(shape, dtype)
        return found

    def _todo(self, key: bytes) -> tuple[tuple[Search | None, bytes, Rule], ...]:
        todo: list[tuple[Search | None, bytes, Rule]] = []
        for key_literal, literal, search, blind, rule in self._entries:
            if key_literal not in key:
                continue  # its literal text is not in any path with this key
            if not blind:
                todo.append((search, literal, rule))
            elif search(key) is not None:
                todo.append((None, literal, rule))
                if rule.guard is None:
                    break  # every path with this key matches it: later rules never win
        return tuple(todo)


def by_key(paths: Iterable[str]) -> dict[bytes, list[int]]:
    """The positions of `paths`, grouped by key."""
    groups: dict[bytes, list[int]] = {}
    get = groups.get
    for i, key in enumerate(path_keys(list(paths))):
        members = get(key)
        if members is None:
            groups[key] = [i]
        else:
            members.append(i)
    return groups


def search_all(pattern: str, paths: Sequence[str], groups: dict[bytes, list[int]]) -> list[int]:
    """The positions of the `paths` that `pattern` occurs in, in order;
    `groups` is `by_key(paths)`. A digit-blind pattern is tried once per key."""
    literal, blind = _facts(pattern)
    literal_bytes = path_bytes(literal)
    key_literal = literal_bytes.translate(_KEY)
    search = searcher(pattern)
    found: list[int] = []
    for key, members in groups.items():
        if key_literal not in key:
            continue
        if blind:
            if search(key) is not None:
                found.extend(members)
        else:
            for i in members:
                text = path_bytes(paths[i])
                if literal_bytes in text and search(text) is not None:
                    found.append(i)
    found.sort()
    return found
