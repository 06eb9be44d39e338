"""`diff --step` with no `--shapes`: the trees a step's own example arguments
give each group its `shardrules.jit` names (`in_groups`), as `explain --step`
takes them, and one plan table per group.

Each argument (or element of a tuple argument) is planned on its own, as
`shardrules.jit` plans it: a rule's pattern sees the argument's own paths. A
group given to more than one argument (parameters and optimizer state both
`params`) has one table, each argument's paths under its parameter's name
(`opt_state/0/mu/...`); a lone array is planned as `{name: array}`, as `jit`
plans it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._reports._dump import Table
from ._lint import UsageError

Trees = dict[str, list[tuple[str, Any]]]
"""Group → (label, tree) per argument the step's `in_groups` give it, in argument order."""


def argument_trees(spec: str, step: Any, args: Sequence[Any]) -> Trees:
    """What the step's `in_groups` give each group of its example `args`."""
    import jax

    from .._tracing._groups import param_names

    groups = step.in_groups
    if groups is None:
        return {}
    groups = (groups,) * len(args) if isinstance(groups, str) else tuple(groups)
    if len(groups) != len(args):
        raise UsageError(
            f"--step {spec}: in_groups has {len(groups)} entries for {len(args)} example arguments; give "
            "one entry per positional argument"
        )
    found: Trees = {}

    def walk(tree: Any, group: Any, label: str, name: str) -> None:
        if group is None:
            return
        if isinstance(group, str):
            leaves = jax.tree.leaves(tree)
            if name and len(leaves) == 1 and leaves[0] is tree:  # a lone array: matched by its name
                tree = {name: tree}
            found.setdefault(group, []).append((label, tree))
            return
        if not isinstance(tree, (tuple, list)) or len(tree) != len(group):
            raise UsageError(
                f"--step {spec}: in_groups gives {label} {len(group)} groups, which does not fit its "
                f"{type(tree).__name__}"
            )
        for j, (element, inner) in enumerate(zip(tree, group, strict=True)):
            walk(element, inner, f"{label}/{j}", "")

    names = param_names(step.fn, len(args))
    for i, (arg, group, name) in enumerate(zip(args, groups, names, strict=True)):
        walk(arg, group, name or f"argument {i}", name)
    return found


def chosen(spec: str, trees: Trees, group: str | None) -> list[str]:
    """The groups to compare: `group` (`--group`) when given, else every group
    the step names, in the order of its arguments."""
    if not trees:
        raise UsageError(
            f"--step {spec}: the step's sr.jit gives none of its arguments a group (in_groups), so no "
            "arguments say what to plan: give the shapes to plan for with --shapes SOURCE, or in_groups= "
            "to the step's sr.jit"
        )
    if group is None:
        return list(trees)
    if group not in trees:
        raise UsageError(
            f"--group {group}: the step {spec} gives no argument the group `{group}` (its in_groups name "
            f"{', '.join(f'`{g}`' for g in trees)}); name one of those, or give the shapes to plan with --shapes"
        )
    return [group]


def pairs(
    spec: str, trees: dict[str, Trees], group: str | None, plan: Callable[[str, Any, str], Table]
) -> list[dict[str, Table]]:
    """A table for each side (`a`, `b`) per group compared (`chosen`: B's
    step's groups, then any only A's names), each tree planned by
    `plan(side, tree, group)`; a side whose step gives no argument a group
    has no leaves for it."""
    groups = chosen(spec, trees["b"] or trees["a"], group)
    if group is None:
        groups += [g for g in trees["a"] if g not in groups]
    out = []
    for name in groups:
        found = {
            side: group_table(trees[side][name], lambda tree, side=side, name=name: plan(side, tree, name))
            for side in ("a", "b")
            if name in trees[side]
        }
        for side, other in (("a", "b"), ("b", "a")):
            if side not in found:
                found[side] = Table(found[other].rules, name, found[other].mesh, [], [], [])
        out.append(found)
    return out


def group_table(trees: list[tuple[str, Any]], plan: Callable[[Any], Table]) -> Table:
    """One table for the trees of a group: each planned by `plan`, their paths
    under their argument's label when there is more than one."""
    tables = [(label, plan(tree)) for label, tree in trees]
    if len(tables) == 1:
        return tables[0][1]
    first = tables[0][1]
    paths: list[str] = []
    kinds: list[int] = []
    parts: list[Any] = []
    for label, table in tables:
        paths += [f"{label}/{path}" if path else label for path in table.paths]
        kinds += [kind + len(parts) for kind in table.kinds]
        parts += table.parts
    return Table(first.rules, first.group, first.mesh, paths, kinds, parts)
