"""SR125: a catch-all takes leaves that a rule of its file was written for.

A catch-all rule (a group's `default`, or a pattern that matches any path:
`""`, `"."`, `".*"`) lays out every leaf no earlier rule matches. When such a
leaf is one an earlier rule of the same file was evidently written for, the
rule is wrong, not the leaf, and planning the leaf by the catch-all would hide
it: a `^layers/...` anchored at the path's start misses the optimizer's
`opt_state/0/mu/layers/...` copies, a `layers/\\d+/` misses a tree whose
paths say `layers_3/`. That is an error (a rule that matches nothing, with
no leaf evidently meant for it, stays the SR201 warning).

**Evidently written for**, exactly. A pattern (each alternative of a
top-level `|` on its own) is split at its `/`s into segments, a leading `^`
and a trailing `$` set aside; a leaf's path is split at its `/`s too. The two
are lined up from the end: from the path's last segment for a pattern ending
in `$`, else from whichever segment lines up best. The *trailing match* is
the number of the pattern's segments, counted from its last, that each match
the path's segment they line up with, whole (the pattern's first segment may
match the end of one when the pattern has no `^`, its last the start of one
when it has no `$`; a segment that can match a `/`, such as `.*`, matches
none). A leaf taken by a catch-all is evidently meant for an earlier rule of
the same file and group whose guard (if any) holds for it when either

1. **anchor**: every segment of the pattern matches, and the path has
   segments before them: the pattern would match but for its `^` (the fix:
   drop it); where the rule takes leaves, only if the path from where the
   pattern matches is a leaf of the same shape that the rule takes (a copy,
   as an optimizer's moments are of a parameter; `^w$` may be meant for the
   top-level `w` alone); or
2. **names**: the rule matches no leaf of the tree, its last two segments
   (or more) match, and every name (two letters or more) written in its
   segments that do not match, where they line up with one of the path's,
   is in the path (a rule for `encoder/.../attn/kernel` is not taken to mean
   `decoder/.../attn/kernel`; of a group naming a few, such as
   `(encoder|vision)`, one). The fix: the pattern with the path's own
   segments, numbers as `\\d+`, in place of those that do not match.

or, third, **copy**: the leaf is a copy of one the rule takes in a copy of
the container its `^` names (`_copies`: `^params/...` and the optimizer's
`opt_state/0/mu/...` of a train state).

The fix offered is checked to match the leaf.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .._errors import Diagnostic, Span
from .._language._format import spec_text
from .._language._regex import path_bytes, searcher
from .._language._rules import Rule
from ._copies import copies
from ._match import path_keys
from ._meant import Each, Hit, Leaves
from ._segments import Alternative, alternatives, catch_all, escape


def findings(
    paths: Sequence[str], kinds: Sequence[int], parts: Sequence[tuple[Any, ...]], group_rules: Sequence[Rule]
) -> list[Diagnostic]:
    """SR125 for the leaves of a compiled group (`paths`, `kinds` and `parts`
    as `_compile` makes them) that a catch-all takes and an earlier rule of
    its file was evidently written for: one finding per rule and catch-all."""
    catchers: dict[int, Rule] = {}
    for kind, part in enumerate(parts):
        rule, why = part[2], part[5]
        if rule is not None and why in ("rule", "default", "error") and catch_all(rule.pattern):
            catchers[kind] = rule
    if not catchers:
        return []
    live = {id(part[2]) for part in parts if part[2] is not None}
    index: dict[str, int] = {}

    def taken_by(path: str) -> tuple[Rule | None, Any]:
        if not index:  # made once, and only where a rule's anchor is in question
            index.update(zip(paths, kinds, strict=True))
        kind = index.get(path)
        return (None, None) if kind is None else (parts[kind][2], parts[kind][0])

    leaves: dict[int, Leaves] = {}
    for catcher in {id(r): r for r in catchers.values()}.values():
        candidates = [
            (rule, alt)
            for rule in group_rules
            if rule.pattern is not None
            and (catcher.is_default or rule.index < catcher.index)
            and _file(rule) == _file(catcher)
            and not catch_all(rule.pattern)
            for alt in alternatives(rule.pattern)
        ]
        found = Leaves(catcher, candidates, live, taken_by)
        if not found.empty:
            leaves[id(catcher)] = found
    if not leaves:
        return []
    # The catch-alls' leaves, by kind and path key (digits as 0): one look per key
    # (in C but for the keys), and a loop over the leaves only where something hits.
    # Leaves of several kinds with one key differ only where a guard or another
    # catch-all could tell them apart.
    taken = [i for i, kind in enumerate(kinds) if kind in catchers]
    keys: list[Any] = path_keys([paths[i] for i in taken])
    if len(leaves) > 1 or any(f.guarded for f in leaves.values()):
        keys = list(zip([kinds[i] for i in taken], keys, strict=True))
    verdicts = {}
    for key, i in dict(zip(keys, taken, strict=True)).items():
        found = leaves.get(id(catchers[kinds[i]]))
        if found is not None:
            verdict = found.verdict(paths[i], parts[kinds[i]][0], parts[kinds[i]][1])
            if verdict is not None:
                verdicts[key] = (found, verdict)
    if verdicts:
        for key, i in zip(keys, taken, strict=True):
            found_verdict = verdicts.get(key)
            if found_verdict is not None:
                found, verdict = found_verdict
                shape, dtype = parts[kinds[i]][0], parts[kinds[i]][1]
                if isinstance(verdict, Each):
                    hit = found.hit(verdict, paths[i], shape, dtype)
                elif isinstance(verdict, list):
                    hit = found.resolve(verdict, paths[i], shape)
                else:
                    hit = verdict
                if hit is not None:
                    found.add(paths[i], shape, dtype, hit)
    for found in leaves.values():  # copies in a copied container (`_copies`)
        done = {path for group in found.found.values() for path, _, _, _ in group}
        mine = [i for i in taken if catchers[kinds[i]] is found.catcher and paths[i] not in done]
        copies(found, paths, kinds, parts, mine)
    return [_finding(group, found.catcher) for found in leaves.values() for group in found.found.values()]


def _file(rule: Rule) -> str | None:
    return None if rule.span is None else rule.span.file


# ------------------------------------------------------------------ the finding


def _finding(group: list[tuple[str, tuple[int, ...], Any, Hit]], catcher: Rule) -> Diagnostic:
    path, shape, dtype, hit = group[0]
    rule, alt, pattern = hit.rule, hit.alt, hit.alt.pattern
    segments = path.split("/")
    m = len(alt.spans)
    name = "`default`" if catcher.is_default else f"the catch-all rule `{catcher.pattern}`"
    spec = spec_text(catcher.written)
    if hit.how == "anchor":
        assert alt.caret is not None
        matched = "/".join(segments[hit.j - m + 1 : hit.j + 1])
        cause = (
            f"which rule `{pattern}` was evidently written for: its pattern matches the path's `{matched}`, "
            "but its `^` ties it to the start of the path"
        )
        where = (alt.caret, alt.caret + 1)
        fix = pattern[: alt.caret] + pattern[alt.caret + 1 :]
        edit = (
            f"drop the anchor: `{fix}` matches `{path}` too"
            if _matches(fix, path)
            else f"edit the pattern to match `{path}`"
        )
        own = f"^{escape(segments[0])}/"  # the leaves under the path's first segment
    elif hit.how == "copy":
        assert alt.caret is not None
        original = "/".join([hit.container, *segments[len(segments) - hit.k :]])
        mirror = "/".join(segments[: len(segments) - hit.k])
        head = pattern[alt.caret : alt.spans[m - hit.k][0]]
        cause = (
            f"which rule `{pattern}` was evidently written for: the leaf is a copy of `{original}`, "
            f"which the rule takes, under `{mirror}` (a copy of `{hit.container}`), "
            f"and the rule's `{head}` ties it to the original's container"
        )
        where = (alt.caret, alt.spans[m - hit.k][0])
        fix = pattern[: alt.caret] + pattern[alt.spans[m - hit.k][0] :]
        edit = (
            f"did you mean `{fix}` (without `{head}`)? It matches `{path}` and `{original}`"
            if _matches(fix, path)
            else f"edit the pattern to match `{path}`"
        )
        own = f"^{escape(segments[0])}/"
    else:
        head = pattern[alt.spans[0][0] : alt.spans[m - hit.k - 1][1]]
        tail = pattern[alt.spans[m - hit.k][0] : alt.spans[-1][1]]
        before = "/".join(segments[: hit.j - hit.k + 1])
        have = (
            f"its `{head}` does not match the path's `{before}`"
            if before
            else f"the path has nothing before them for its `{head}`"
        )
        cause = (
            f"which rule `{pattern}` was evidently written for: the rule matches no leaf of this tree, "
            f"and the path ends in its segments `{tail}`, but {have}"
        )
        where = alt.spans[0][0], alt.spans[m - hit.k - 1][1]
        fix = _renamed(pattern, alt, hit, segments)
        dropped = " (without the anchor `^`)" if alt.caret is not None else ""
        edit = (
            f"did you mean `{fix}`{dropped}? It matches `{path}`"
            if _matches(fix, path)
            else f"edit `{head}` to match `{before}`"
        )
        own = tail + "$" * alt.dollar  # the leaves with the rule's last segments
    catch = f"{name} ({catcher.location})"
    return Diagnostic(
        "SR125",
        "error",
        f"{catch} takes `{path}` (shape {shape}, {dtype}), {cause}",
        _narrowed(rule, *where),
        path,
        f"{edit}; or, if {name} is meant to take them, give them a rule of their own just above it, "
        f'e.g. `"{own}" -> {spec}`',
        tuple((p, s) for p, s, _, _ in group),
        f"{catch} takes leaves {cause}",
    )


def _renamed(pattern: str, alt: Alternative, hit: Hit, segments: list[str]) -> str:
    """`pattern` with its unmatched segments (and `^`) replaced by the path's
    own, numbers as `\\d+`: back to the nearest segment holding a name the
    pattern wrote there, else as many as the pattern had."""
    m = len(alt.spans)
    unmatched = m - hit.k
    before = segments[: hit.j - hit.k + 1]
    names = {w for t in range(unmatched) for w in alt.words[t]}
    take = min(unmatched, len(before))
    for back in range(1, len(before) + 1):
        if any(w in before[-back] for w in names):
            take = back
            break
    head = "/".join(_general(s) for s in before[len(before) - take :])
    rest = pattern[alt.spans[unmatched][0] : _alt_end(alt)]
    start = alt.caret if alt.caret is not None else alt.spans[0][0]
    new = f"{head}/{rest}" if head else rest
    return pattern[:start] + new + pattern[_alt_end(alt) :]


def _alt_end(alt: Alternative) -> int:
    return alt.spans[-1][1] + alt.dollar


def _general(segment: str) -> str:
    """A path's segment as a pattern: escaped, a number (alone or after `_`) as `\\d+`."""
    if segment.isdigit() and segment.isascii():
        return r"\d+"
    found = re.fullmatch(r"(.*_)([0-9]+)", segment)
    if found is not None:
        return escape(found.group(1)) + r"\d+"
    return escape(segment)


def _matches(pattern: str, path: str) -> bool:
    try:
        return searcher(pattern)(path_bytes(path)) is not None
    except Exception:  # an edit RE2 cannot compile matches nothing
        return False


def _narrowed(rule: Rule, start: int, end: int) -> Span | None:
    """The span of `pattern[start:end]` of `rule`'s pattern (written verbatim
    between its quotes), else the whole pattern's."""
    span = rule.pattern_span or rule.span
    if span is None or rule.pattern_span is None or span.line != span.end_line:
        return span
    col = span.col + 1 + start
    return Span(span.file, span.line, col, span.line, col + max(1, end - start))
