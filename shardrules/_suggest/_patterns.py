"""One regular expression per rule: every path of the rule's leaves, none of
the leaves of the rules after it (nor of those left to `default`).

Patterns end at the parameter's name (`$`) and start as late in the path as
they can while telling the rule's leaves from the later ones: the module and
parameter names (`mlp\\.down_proj\\.weight$`), a word they share where that is
enough (`norm\\.weight$` for every norm), more of the path where it is not.
Layer and expert numbers are `\\d+`. Each candidate is tried against one
path of every kind of leaf, so the first rule matching a leaf is the one
meant for it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ._leaves import INDEX, Kind

_WORDS = ("norm", "_proj", "bias")
"""Words a rule's module names may share, tried before naming each module."""
_FIRST = ("q", "k", "v", "query", "key", "value", "gate", "up", "w1", "w3", "wi_0", "wi_1")
"""Alternatives written in this order (then alphabetically): `(q|k|v)_proj`."""


def _ordered(texts: list[str]) -> list[str]:
    return sorted(texts, key=lambda t: (_FIRST.index(t) if t in _FIRST else len(_FIRST), t))


def sample(kind: Kind) -> str:
    """A path of `kind`, its indices written `0`."""
    return kind.key.replace(INDEX, "0")


def patterns(groups: Sequence[Sequence[Kind]], rest: Sequence[Kind] = ()) -> list[str]:
    """A pattern per group (in file order); `rest`: leaves no group takes."""
    later: list[list[str]] = []
    tail: list[str] = [sample(k) for k in rest]
    for group in reversed(groups):
        later.append(list(tail))
        tail += [sample(k) for k in group]
    later.reverse()
    return [_pattern(group, others) for group, others in zip(groups, later, strict=True)]


def _pattern(group: Sequence[Kind], others: list[str]) -> str:
    mine = [sample(k) for k in group]
    longest = max(len(k.tokens) for k in group)
    for depth in range(min(2, longest), longest + 1):
        for candidate in _candidates(group, depth):
            regex = re.compile(candidate)
            if all(regex.search(p) for p in mine) and not any(regex.search(p) for p in others):
                return candidate
    return "^(" + "|".join(sorted({_whole(k) for k in group})) + ")$"


def _candidates(group: Sequence[Kind], depth: int) -> list[str]:
    """Patterns over the last `depth` tokens of each path, most general first."""
    tails = sorted({(k.tokens[-depth:], k.seps[-depth + 1 :] if depth > 1 else ()) for k in group})
    if any(len(tokens) < depth for tokens, _ in tails):
        return []
    if any(tokens[0] == INDEX for tokens, _ in tails) and depth < max(len(k.tokens) for k in group):
        return []  # `experts\.\d+\.w1`, not `\d+\.w1`: a number reads better after its container
    seps = _seps([s for _, s in tails], depth - 1)
    columns = [sorted({tokens[i] for tokens, _ in tails}) for i in range(depth)]
    varying = [i for i, column in enumerate(columns) if len(column) > 1]
    out = []
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
    if token == INDEX:
        return r"\d+"
    if token.endswith("_" + INDEX):
        return _escape(token[: -len(INDEX)]) + r"\d+"
    return _escape(token)


def _alternatives(tokens: list[str]) -> str:
    """`q_proj`, `k_proj` → `(q|k)_proj`: one token or the shared part factored out."""
    if len(tokens) == 1:
        return _token(tokens[0])
    if any(INDEX in t for t in tokens):
        return "(" + "|".join(_token(t) for t in tokens) + ")"
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
    return "".join("\\" + c if c in _SPECIAL else c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def _whole(kind: Kind) -> str:
    return _join([_token(t) for t in kind.tokens], _seps([kind.seps], len(kind.seps)))
