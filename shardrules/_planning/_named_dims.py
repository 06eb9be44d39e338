"""Positional specs checked against the logical names a tree carries (SR214).

A rule's spec says, by position, which mesh axes split each dimension. Model
code often says what each dimension *is* as well: Flax linen's
`LogicallyPartitioned` names, NNX variables' `out_sharding` /
`sharding_names` metadata (MaxText's `("embed", "layers", "heads")`). Where
both are known they can disagree: a spec written for `(embed, heads)` kernels
applied to MaxText's layer-stacked `(embed, layers, heads)` ones with `...`
splits the *layer* dimension over the `embed` axes. That plan is valid (every
axis divides), so nothing else would say so.

For each leaf a positional rule shards, each sharded dimension's mesh axes
are compared with what its logical name stands for in the rule file: the
alias of that name, else the mesh axis of that name. A dimension split over
axes its name does not stand for is an SR214 warning naming the dimension,
its logical name, the axes and the rule; one per rule and kind of leaf. A
name the file has no alias for (nor an axis of that name) says nothing by
itself (the file may not mirror every name the model uses), so it is
warned about only where the axes splitting it are what another dimension's
name stands for: the spec's positions are shifted.
Linen's `Partitioned` names mesh axes, not logical names, and is compared
directly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._errors import Diagnostic
from ._blocks import entry_axes
from ._logical import MeshAxisNames, logical_names
from ._plan import Plan


def _stands_for(
    name: Any, aliases: dict[str, tuple[str, ...]], axes: set[str], mesh_names: bool
) -> tuple[set[str], bool] | None:
    """The mesh axes logical name `name` lays its dimension out over, and
    whether the rule file says so (the name, or each part of it, is an alias
    or a mesh axis); `None` where that cannot be told at all (a name that is
    not text, or a file without a mesh line)."""
    if name is None:
        return set(), False
    parts = name if isinstance(name, tuple) else (name,)
    found: set[str] = set()
    known = True
    for part in parts:
        if not isinstance(part, str):
            return None
        if mesh_names:  # linen's `Partitioned`: the names are mesh axes
            found.add(part)
        elif part in aliases:
            found.update(aliases[part])
        elif part in axes:
            found.add(part)
        elif not axes:
            return None  # no mesh line: whether it is an axis cannot be told
        else:
            known = False  # neither an alias nor an axis: the file says nothing of it
    return found, known


def check(plan: Plan, tree: Any) -> Plan:
    """`plan` with SR214 for each positional rule that splits a dimension over
    axes its logical name does not stand for (see the module's docstring)."""
    names = logical_names(tree)
    if names is None or len(names) != len(plan.leaves):
        return plan
    rules = plan.rules
    aliases = {name: tuple(axes) for name, axes in rules.aliases.items()}
    axes = set(rules.mesh.names) if rules.mesh is not None else set()
    found: dict[Any, Diagnostic] = {}
    for lp, leaf_names in zip(plan.leaves, names, strict=True):
        rule = lp.rule
        if leaf_names is None or rule is None or lp.spec is None or rule.spec.kind != "entries":
            continue
        if lp.shape is None or len(leaf_names) != len(lp.shape):
            continue
        mesh_names = isinstance(leaf_names, MeshAxisNames)
        meanings = [_stands_for(n, aliases, axes, mesh_names) for n in leaf_names]
        for dim, (entry, name) in enumerate(zip(lp.spec, leaf_names, strict=True)):
            used = set(entry_axes(entry))
            meaning = meanings[dim]
            if not used or meaning is None:
                continue
            meant, known = meaning
            if known:
                if used <= meant:
                    continue
                shown = "_" if not meant else ", ".join(sorted(meant))
                why = f"which the rule file lays out as ({shown})"
                fix = f"write the entry for dimension {dim} as `{shown}`"
            else:  # a name the file has no alias for: wrong where its axes are another dimension's
                other = next(
                    (
                        (e, leaf_names[e])
                        for e, m in enumerate(meanings)
                        if e != dim and m is not None and m[1] and m[0] & used
                    ),
                    None,
                )
                if other is None:
                    continue
                why = (
                    f"which the rule file has no alias for, while {', '.join(sorted(used))} is what the "
                    f"tree's `{_show(other[1])}` (dimension {other[0]}) stands for: the spec's positions "
                    "are shifted"
                )
                fix = f"give dimension {other[0]} that entry, or add `alias {_show(name)} = AXES`"
            key = (id(rule), lp.shape, dim, name)
            if key in found:
                found[key] = dataclasses.replace(found[key], paths=(*found[key].paths, (lp.path, lp.shape)))
                continue
            what = "names the mesh axes" if mesh_names else "has the logical name"
            found[key] = Diagnostic(
                "SR214",
                "warning",
                f"rule `{rule.pattern or 'default'}` splits dimension {dim} of `{lp.path}` (shape "
                f"{lp.shape}) over {', '.join(sorted(used))}, but the tree {what} `{_show(name)}` for "
                f"that dimension, {why}",
                rule.spec.span or rule.span,
                lp.path,
                f"check the spec's positions against the tree's names {_show(leaf_names)}: {fix}, or let "
                "the names decide with `-> logical` (aliases as Flax's logical_axis_rules)",
                ((lp.path, lp.shape),),
                f"rule `{rule.pattern or 'default'}` splits dimension {dim} (logical name `{_show(name)}`) "
                f"over {', '.join(sorted(used))}",
            )
    if not found:
        return plan
    return dataclasses.replace(plan, diagnostics=(*plan.diagnostics, *found.values()))


def _show(name: Any) -> str:
    if isinstance(name, tuple):
        return "(" + ", ".join(_show(n) for n in name) + ")"
    return "_" if name is None else str(name)
