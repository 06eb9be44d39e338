"""Flax-style logical axis rules (`(name, mesh_axes)` pairs, MaxText's
`logical_axis_rules`) as aliases with alternatives.

Flax's `logical_to_mesh_axes` walks the rules in list order; a rule sets the
dimension carrying its name when that dimension has no axes yet and none of
the rule's axes is taken by another dimension; a name no rule sets stays
unsharded. The rule file says the same with one alias per name, in the order
of each name's first rule, its rules as alternatives in list order, and `| _`
last. That is exact when each name's rules are consecutive in the list (the
usual case); a name whose rules are not is reported.

A logical name that is also a mesh axis cannot be an alias (SR013): in a rule
file such a name stands for the axis itself, which is what its rule says when
it maps the name to itself (MaxText's `diloco`); any other rules it has are
reported.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import Any

from ._common import SourceError, check_count, is_name, shown

Axes = tuple[str, ...]


def read_rules(raw: Any, where: str) -> tuple[list[tuple[str, Axes]], list[str]]:
    """The rules of `raw`, a sequence of `(name, axes)` pairs (`axes`: a mesh
    axis name, a list of them, or `None`/`[]` for unsharded), each as
    `(name, axes tuple)`, and notes for the rules that cannot be converted
    (they are left out). A `SourceError` when `raw` is not such a sequence
    (`where`: what it is, for messages)."""
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        raise SourceError(f"{where}: expected a list of (name, mesh axes) pairs, got {type(raw).__name__}")
    check_count(len(raw), where, "rules")
    rules: list[tuple[str, Axes]] = []
    notes: list[str] = []
    for number, rule in enumerate(raw, start=1):
        if isinstance(rule, (str, bytes)) or not isinstance(rule, Sequence) or len(rule) != 2:
            raise SourceError(f"{where}: rule {number} is {shown(rule)}, not a (name, mesh axes) pair")
        name, axes = rule
        if not isinstance(name, str):
            raise SourceError(f"{where}: rule {number} names {shown(name)}, not a logical axis name")
        if axes is None:
            axes = ()
        elif isinstance(axes, str):
            axes = (axes,)
        elif isinstance(axes, Sequence) and not isinstance(axes, bytes):
            axes = tuple(axes)
        else:
            notes.append(
                f"rule {number} ({shown(name)}): {shown(axes)} is not a mesh axis name or a list of them; "
                "the rule is left out"
            )
            continue
        bad = [a for a in axes if not is_name(a)]
        if bad or not is_name(name):
            what = shown(name) if not is_name(name) else _few([shown(a) for a in bad[:_FEW]], len(bad))
            notes.append(
                f"rule {number} ({shown(name)} -> {shown(list(axes))}): `{what}` cannot be a name in a rule "
                "file; the rule is left out"
            )
            continue
        if len(set(axes)) != len(axes):
            notes.append(
                f"rule {number} ({name}): names a mesh axis twice ({shown(', '.join(axes))}); the rule is left out"
            )
            continue
        rules.append((name, axes))
    return rules, notes


def _alternative(axes: Axes) -> str:
    if not axes:
        return "_"
    return axes[0] if len(axes) == 1 else "(" + ", ".join(axes) + ")"


def alias_lines(rules: list[tuple[str, Axes]], mesh_axes: Sequence[str]) -> tuple[list[str], list[str]]:
    """The alias lines for `rules` (see the module's docstring) and the notes on
    what they cannot say exactly; `mesh_axes`: the names known to be mesh axes.
    Time and text grow linearly with the rules: a note names the first few
    rules it is about and how many there are."""
    order: list[str] = []
    alternatives: dict[str, list[Axes]] = {}
    positions: dict[str, list[int]] = {}
    users: dict[str, list[int]] = {}  # mesh axis -> the rules using it, in order
    for i, (name, axes) in enumerate(rules):
        if name not in alternatives:
            order.append(name)
            alternatives[name] = []
            positions[name] = []
        alternatives[name].append(axes)
        positions[name].append(i)
        for axis in axes:
            users.setdefault(axis, []).append(i)
    axes_known = set(mesh_axes) | set(users)
    lines: list[str] = []
    notes: list[str] = []
    for name in order:
        notes += _order_notes(name, positions[name], rules, users)
        alts = alternatives[name]
        if name in axes_known:
            lines += _mesh_axis_name(name, alts, rules, users.get(name, []), notes)
            continue
        shown_alts = [_alternative(a) for a in alts]
        if shown_alts[-1] != "_":
            shown_alts.append("_")
        lines.append(f"alias {name} = " + " | ".join(shown_alts))
    return lines, notes


_FEW = 3
"""How many rules a note names before saying how many more there are."""


def _few(items: list[str], total: int) -> str:
    """The first of `items` and, when there are more of `total`, how many."""
    more = total - len(items)
    return ", ".join(items) + (f" and {more:,} more" if more > 0 else "")


def _order_notes(
    name: str, positions: list[int], rules: list[tuple[str, Axes]], users: dict[str, list[int]]
) -> list[str]:
    """A note for each rule of `name` that is separated from the one before it
    by rules of other names using some of its axes: the alias tries it right
    after the one before, ahead of them. (When none of the rules in between
    uses its axes, whether it applies does not depend on them, nor theirs on
    it, so the order changes nothing and there is no note.)

    The rules in between that use its axes are found from `users` (each
    axis's rules in order) by bisection, `_FEW + 1` per axis at most: the
    first `_FEW + 1` of the union are among them. So a note costs the rule's
    axes times a logarithm, not the rules in between."""
    notes = []
    for before, at in itertools.pairwise(positions):
        found: set[int] = set()
        for axis in set(rules[at][1]):
            using = users[axis]
            start = bisect.bisect_right(using, before)
            found.update(i for i in using[start : start + _FEW + 1] if i < at)
        if not found:
            continue
        clash = sorted(found)
        named = "; ".join(f"{rules[i][0]} -> {_alternative(rules[i][1])}" for i in clash[:_FEW])
        if len(clash) > _FEW:
            named += f"; and more of the {at - before - 1:,} rules in between"
        notes.append(
            f"`{name}`: its rule {at + 1} ({name} -> {_alternative(rules[at][1])}) is not next to its rule "
            f"{before + 1}; the alias tries it right after that one: rules in between use the same axes "
            f"({named}), so a leaf with both names may be laid out differently"
        )
    return notes


def _mesh_axis_name(
    name: str, alts: list[Axes], rules: list[tuple[str, Axes]], using: list[int], notes: list[str]
) -> list[str]:
    """What to write for a logical name that is also a mesh axis: a comment if
    its rules map it to itself, notes for whatever else they say (`using`:
    the rules that use the axis `name`)."""
    if alts[0] == (name,):
        others = sorted({rules[i][0] for i in using if rules[i][0] != name})
        rest = " | ".join(_alternative(a) for a in alts[1:])
        if others or rest:
            notes.append(
                f"`{name}` is a mesh axis too, so it cannot be an alias (SR013): the name stands for the "
                f"axis. Where another dimension takes `{name}` first"
                + (f" (through {_few(others[:_FEW], len(others))})" if others else "")
                + (
                    f", Flax tries its next rules ({rest}); shardrules"
                    if rest
                    else ", Flax leaves it unsharded; shardrules"
                )
                + " raises SR102"
            )
        return [f"# `{name}` is a mesh axis too: the name stands for the axis, as its rule says"]
    notes.append(
        f"`{name}` is a mesh axis too, so it cannot be an alias (SR013): a leaf dimension named `{name}` is "
        f"sharded over the axis `{name}`, not by its rules ({' | '.join(_alternative(a) for a in alts)})"
    )
    return [f"# `{name}`: not converted, see the notes above"]
