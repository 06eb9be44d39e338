"""One regular expression per rule: every path of the rule's leaves, none of
the leaves of the rules after it (nor of those left to `default`).

Patterns end at the parameter's name (`$`) and start as late in the path as
they can while telling the rule's leaves from the later ones: the module and
parameter names (`mlp\\.down_proj\\.weight$`), a word they share where that is
enough (`norm\\.weight$` for every norm), more of the path where it is not.
Layer and expert numbers are `\\d+`, and so are the numbers of names that
differ only by them (`layer\\d+\\.w$` rather than `(layer0|layer1|...)`);
where the parameter's own name alone tells the rule's leaves apart, it is the
pattern. Each candidate is tried, as rules match (RE2, ASCII classes), against
one path of every kind of leaf, so the first rule matching a leaf is the one
meant for it; a candidate RE2 refuses or finds too large is passed over.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .._language._regex import UnsupportedPattern, check, search
from ._leaves import Kind, has_index
from ._leaves import parts as pieces

_WORDS = ("norm", "_proj", "bias")
"""Words a rule's module names may share, tried before naming each module."""
_COMPACT = 160
"""Candidates longer than this are tried only when no shorter one will do."""
_GENERIC = frozenset({"weight", "weights", "kernel", "bias", "scale", "w", "b", "embedding", "value"})
"""Parameter names too common to be a pattern on their own."""
_DIGITS = re.compile(r"[0-9]+")
_MANY = 4
"""More names than this at one place in the paths, differing in their numbers, are written `\\d+`."""
_FIRST = ("q", "k", "v", "query", "key", "value", "gate", "up", "w1", "w3", "wi_0", "wi_1")
"""Alternatives written in this order (then alphabetically): `(q|k|v)_proj`."""


def _ordered(texts: list[str]) -> list[str]:
    return sorted(texts, key=lambda t: (_FIRST.index(t) if t in _FIRST else len(_FIRST), t))


def sample(kind: Kind) -> str:
    """A path of `kind` (its first leaf's)."""
    return kind.example


def patterns(groups: Sequence[Sequence[Kind]], rest: Sequence[Kind] = ()) -> list[str | None]:
    """A pattern per group (in file order); `rest`: leaves no group takes.
    `None` for a group no rule pattern tells apart (even an alternation of
    its whole paths is too large for RE2's budget): its leaves are for
    `default`."""
    later: list[list[str]] = []
    tail: list[str] = [sample(k) for k in rest]
    for group in reversed(groups):
        later.append(list(tail))
        tail += [sample(k) for k in group]
    later.reverse()
    return [_pattern(group, others) for group, others in zip(groups, later, strict=True)]


def _pattern(group: Sequence[Kind], others: list[str]) -> str | None:
    mine = [sample(k) for k in group]
    longest = max(len(k.tokens) for k in group)
    depths = [*range(min(2, longest), longest + 1)]
    tried: list[str] = []
    for compact in (True, False):
        for depth in depths if not compact else [*depths, 1]:
            for candidate in _candidates(group, depth):
                if compact and (len(candidate) > _COMPACT or candidate in tried):
                    continue
                if depth == 1 and candidate.removesuffix("$") in _GENERIC:
                    continue
                tried.append(candidate)
                if _selects(candidate, mine, others):
                    return candidate
    whole = "^(" + "|".join(sorted({_whole(k) for k in group})) + ")$"
    return whole if _selects(whole, mine, others) else None


def _selects(candidate: str, mine: list[str], others: list[str]) -> bool:
    """Whether `candidate` is a rule pattern matching every path of `mine`
    and none of `others`, as rules match."""
    try:
        check(candidate)
    except (re.error, UnsupportedPattern):
        return False
    return all(search(candidate, p) for p in mine) and not any(search(candidate, p) for p in others)


def _candidates(group: Sequence[Kind], depth: int) -> list[str]:
    """Patterns over the last `depth` tokens of each path, most general first."""
    tails = sorted({(k.tokens[-depth:], k.seps[-depth + 1 :] if depth > 1 else ()) for k in group})
    if any(len(tokens) < depth for tokens, _ in tails):
        return []
    if any(pieces(tokens[0]) == [None] for tokens, _ in tails) and depth < max(len(k.tokens) for k in group):
        return []  # `experts\.\d+\.w1`, not `\d+\.w1`: a number reads better after its container
    seps = _seps([s for _, s in tails], depth - 1)
    columns = [sorted({tokens[i] for tokens, _ in tails}) for i in range(depth)]
    varying = [i for i, column in enumerate(columns) if len(column) > 1]
    out = []
    general = [sorted({_general(t) for t in column}) for column in columns]
    if any(len(c) > _MANY and len(g) < len(c) for g, c in zip(general, columns, strict=True)):
        parts = [  # `layer\d+` for `layer0` ... `layer2999`; a few names (`wi_0`, `wi_1`) as they are
            _alternatives(c)
            if len(c) <= _MANY or len(g) == len(c)
            else g[0]
            if len(g) == 1
            else f"({'|'.join(g)})"
            for g, c in zip(general, columns, strict=True)
        ]
        out.append(_join(parts, seps) + "$")
    if not varying or varying == [0]:
        first = columns[0]
        rest = _join([_token(c[0]) for c in columns[1:]], seps[1:]) if depth > 1 else ""
        lead = seps[0] if depth > 1 else ""
        for word in _WORDS:
            if len(first) > 1 and all(word in t.lower() for t in first):
                out.append(_escape(word) + ("" if all(t.lower().endswith(word) for t in first) else r"\w*"))
                out[-1] += lead + rest + "$"
        out.append(_alternatives(first) + lead + rest + "$")
    else:  # each position's names factored alone: `ln_(1|2|f)\.(bias|weight)$`
        parts = [_alternatives(c) for c in columns]
        out.append(_join(parts, seps) + "$")
    out.append(
        "("
        + "|".join(_join([_token(t) for t in tokens], _seps([s], depth - 1)) for tokens, s in tails)
        + ")$"
    )
    return out


def _seps(all_seps: list[tuple[str, ...]], n: int) -> list[str]:
    out = []
    for i in range(n):
        found = {s[i] for s in all_seps}
        out.append(r"\." if found == {"."} else "/" if found == {"/"} else "[./]")
    return out


def _join(parts: list[str], seps: list[str]) -> str:
    text = parts[0] if parts else ""
    for sep, part in zip(seps, parts[1:], strict=False):
        text += sep + part
    return text


def _token(token: str) -> str:
    """A token of a key as a pattern: its text literally, its indices `\\d+`."""
    return "".join(r"\d+" if part is None else _escape(part) for part in pieces(token))


def _general(token: str) -> str:
    """A token with every run of ASCII digits written `\\d+` (`layer12` → `layer\\d+`)."""
    out = []
    for part in pieces(token):
        if part is None:
            out.append(r"\d+")
            continue
        at = 0
        for found in _DIGITS.finditer(part):
            out += [_escape(part[at : found.start()]), r"\d+"]
            at = found.end()
        out.append(_escape(part[at:]))
    return "".join(out)


def _alternatives(tokens: list[str]) -> str:
    """`q_proj`, `k_proj` → `(q|k)_proj`: one token or the shared part factored out."""
    if len(tokens) == 1:
        return _token(tokens[0])
    if any(has_index(t) for t in tokens):
        return "(" + "|".join(_token(t) for t in tokens) + ")"
    tokens = ["".join(p for p in pieces(t) if p is not None) for t in tokens]  # their text, unescaped
    prefix = _common([list(t) for t in tokens])
    suffix = _common([list(t[len(prefix) :][::-1]) for t in tokens])[::-1]
    middles = [t[len(prefix) : len(t) - len(suffix)] for t in tokens]
    if all(middles):
        inner = "|".join(_escape(m) for m in _ordered(middles))
        return _escape(prefix) + "(" + inner + ")" + _escape(suffix)
    return "(" + "|".join(_escape(t) for t in _ordered(tokens)) + ")"


def _common(texts: list[list[str]]) -> str:
    """The characters every text starts with."""
    out = []
    for chars in zip(*texts, strict=False):
        if len(set(chars)) != 1:
            break
        out.append(chars[0])
    return "".join(out)


_SPECIAL = frozenset("\\.^$|?*+()[]{}")


def _escape(text: str) -> str:
    """`text` matched literally: regex characters escaped, nothing else (RE2
    refuses escapes of letters, digits and spaces that Python's `re.escape` writes)."""
    return "".join(_character(c) for c in text)


def _character(c: str) -> str:
    if c in _SPECIAL:
        return "\\" + c
    if c.isprintable():
        return c
    if ord(c) <= 0xFF:
        return f"\\x{ord(c):02x}"
    return "."  # no escape of a code point above U+00FF means the same to Python and RE2


def _whole(kind: Kind) -> str:
    return _join([_token(t) for t in kind.tokens], _seps([kind.seps], len(kind.seps)))


def shared_paths(kinds: Sequence[Kind], rules: Sequence[Any], fallback: Sequence[int]) -> set[int]:
    """Kinds of rules whose path (numbers aside) other rules' kinds, or leaves
    left to `default`, have too: a pattern matches them all alike."""
    owners: dict[str, set[int]] = {}
    for n, rule in enumerate(rules):
        for i in rule.kinds:
            owners.setdefault(kinds[i].key, set()).add(n)
    for i in fallback:
        owners.setdefault(kinds[i].key, set()).add(-1)
    return {i for rule in rules for i in rule.kinds if len(owners[kinds[i].key]) > 1}
