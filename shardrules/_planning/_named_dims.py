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
alias of that name, else the mesh axis of that name, else nothing (Flax
leaves a name without a rule unsharded). A dimension split over axes its
name does not stand for is an SR214 warning naming the dimension, its
logical name, the axes and the rule; one per rule and kind of leaf.
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


def _stands_for(name: Any, aliases: dict[str, tuple[str, ...]], axes: set[str], mesh_names: bool) -> Any:
    """The mesh axes logical name `name` lays its dimension out over, as a
    set, or `None` where that cannot be told (a name that is neither an
    alias nor a mesh axis, in a file without a mesh line)."""
    if name is None:
        return set()
    parts = name if isinstance(name, tuple) else (name,)
    found: set[str] = set()
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
        # else neither an alias nor an axis: unsharded, as Flax leaves it
    return found


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
        for dim, (entry, name) in enumerate(zip(lp.spec, leaf_names, strict=True)):
            used = set(entry_axes(entry))
            if not used:
                continue
            meant = _stands_for(name, aliases, axes, mesh_names)
            if meant is None or used <= meant:
                continue
            key = (id(rule), lp.shape, dim, name)
            if key in found:
                found[key] = dataclasses.replace(found[key], paths=(*found[key].paths, (lp.path, lp.shape)))
                continue
            shown = "_" if not meant else ", ".join(sorted(meant))
            what = "names the mesh axes" if mesh_names else "has the logical name"
            found[key] = Diagnostic(
                "SR214",
                "warning",
                f"rule `{rule.pattern or 'default'}` splits dimension {dim} of `{lp.path}` (shape "
                f"{lp.shape}) over {', '.join(sorted(used))}, but the tree {what} `{_show(name)}` for "
                f"that dimension, which the rule file lays out as ({shown})",
                rule.spec.span or rule.span,
                lp.path,
                f"check the spec's positions against the tree's names {_show(leaf_names)}: write the entry "
                f"for dimension {dim} as `{shown}`, or let the names decide with `-> logical` (aliases as "
                "Flax's logical_axis_rules)",
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
