"""SR125's third case: a leaf that is a copy of one a rule takes, in a copy
of the rule's container (`_catchall`).

An optimizer's state often mirrors the parameters without their container's
name: a train state `{"params": p, "opt_state": adam.init(p)}` holds
`params/Dense_0/kernel` and its moments `opt_state/0/mu/Dense_0/kernel`. A
rule `"^params/Dense_\\d+/kernel$"` takes the first and misses the second,
which is no anchor the `^` alone keeps out. Such a leaf, taken by a
catch-all, is evidently meant for the rule when

- the rule's pattern (an alternative with `^` and `$`, each segment matching
  one of the path's whole) matches, but for its first `d` segments (the
  container, `params`), the leaf's last segments, and the leaf has segments
  before them (its own container, `opt_state/0/mu`);
- the rule takes a leaf of the same shape in a container it matches whose
  path ends in those same segments (`params/Dense_0/kernel`), and no end of
  the leaf's path is a leaf of the tree (a copy of that leaf is that leaf's,
  as the anchor case says); and
- the leaf's container is a copy of that one: each array under it has an
  array of the same shape at the same path under the rule's container (the
  optimizer's moments of a subset of the parameters, as `optax.masked`
  keeps; a decoder with cross-attention the encoder lacks is no copy of it),
  and it lies deeper than that one, and not inside it, and holds two arrays
  or more (one array alike is no evidence of a copy) (`tower_b` is no
  copy of `tower_a`, nor `layers/2/mlp` of `layers/0/mlp`: an anchor to one
  of them means that one).

The fix: the pattern without its `^` and container.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._language._regex import path_bytes
from ._meant import Hit, Leaves


def copies(
    found: Leaves,
    paths: Sequence[str],
    kinds: Sequence[int],
    parts: Sequence[tuple[Any, ...]],
    mine: list[int],
) -> None:
    """Add to `found` the leaves at `mine` (positions of the leaves its
    catch-all takes, none found yet) that are copies in a copied container."""
    anchored = [
        (rule, alt)
        for rule, alt in found.every
        if alt.caret is not None
        and alt.dollar
        and id(rule) in found.live
        and len(alt.spans) >= 2
        and all(test is not None for test in alt.tests)
    ]
    if not anchored or not mine:
        return
    own: dict[int, dict[str, Any]] = {id(rule): {} for rule, _ in anchored}
    for path, kind in zip(paths, kinds, strict=True):
        taker = own.get(id(parts[kind][2]))
        if taker is not None:
            taker[path] = parts[kind][0]
    tails: dict[tuple[int, int], dict[str, list[str]]] = {}  # (rule, d) → tail → containers
    trees: dict[str, dict[str, Any]] = {}  # a container's arrays, by path below it
    memo: dict[tuple[int, int, str], bool] = {}

    def matches(alt: Any, i: int, segment: str) -> bool:
        key = (id(alt), i, segment)
        if key not in memo:
            memo[key] = alt.tests[i](path_bytes(segment)) is not None
        return memo[key]

    def tree(prefix: str) -> dict[str, Any]:
        if prefix not in trees:
            start = prefix + "/"
            trees[prefix] = {
                p[len(start) :]: parts[k][0]
                for p, k in zip(paths, kinds, strict=True)
                if p.startswith(start) and parts[k][0] is not None
            }
        return trees[prefix]

    every: set[str] = set()
    by_last: dict[str, list[tuple[Any, Any]]] = {}  # a last segment → the rules whose last matches it
    for i in mine:
        path, shape, dtype = paths[i], parts[kinds[i]][0], parts[kinds[i]][1]
        last = path[path.rfind("/") + 1 :]
        if last not in by_last:
            by_last[last] = [(r, a) for r, a in anchored if matches(a, len(a.spans) - 1, last)]
        if not by_last[last]:
            continue
        segments = path.split("/")
        n = len(segments)
        for rule, alt in by_last[last]:
            if rule.guard is not None and not rule.guard.holds(shape, dtype):
                continue
            m = len(alt.spans)
            hit = None
            matched = 0  # the pattern's segments, from its last, that match the path's
            while matched < min(m - 1, n - 1) and matches(alt, m - 1 - matched, segments[n - 1 - matched]):
                matched += 1
            for d in range(m - matched, m):  # the container: the pattern's first d segments
                tail = "/".join(segments[n - (m - d) :])
                by_tail = tails.get((id(rule), d))
                if by_tail is None:
                    by_tail = tails[id(rule), d] = {}
                    for taken in own[id(rule)]:
                        head, _, rest = taken.partition("/") if d == 1 else _split(taken, d)
                        by_tail.setdefault(rest, []).append(head)
                mirror = "/".join(segments[: n - (m - d)])
                for head in by_tail.get(tail, ()):
                    if own[id(rule)][f"{head}/{tail}"] != shape or not _apart(head, mirror):
                        continue
                    every = every or set(paths)
                    if any("/".join(segments[s:]) in every for s in range(1, n)):
                        break  # a copy of a leaf of the tree, which is not the rule's (the anchor's case)
                    original, copy = tree(head), tree(mirror)
                    if len(copy) > 1 and all(original.get(below) == s for below, s in copy.items()):
                        hit = Hit(rule, alt, "copy", m - d, n - 1, head)
                        break
                if hit is not None:
                    break
            if hit is not None:
                found.add(path, shape, dtype, hit)
                break


def _split(path: str, d: int) -> tuple[str, str, str]:
    segments = path.split("/")
    return "/".join(segments[:d]), "/", "/".join(segments[d:])


def _apart(original: str, copy: str) -> bool:
    """Whether container `copy` may be a copy of `original`: neither is inside
    the other, and it lies deeper, as an optimizer's state does
    (`opt_state/0/mu` of `params`); containers side by side (`tower_b` and
    `tower_a`, `layers/2/mlp` and `layers/0/mlp`) are the model's own, and an
    anchor to one of them means that one."""
    if copy.startswith(original + "/") or original.startswith(copy + "/"):
        return False
    return copy.count("/") > original.count("/")
