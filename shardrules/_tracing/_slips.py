"""Slips in how `shardrules.jit` is called, said where they are made.

An argument planned with the wrong group (in and out groups swapped, the
optimizer state given the batch's group) fails with SR105 for leaves no rule
of that group matches. The finding alone names the group and the leaves but
not the call: here it is made to name the argument (or output) and the
direction, and to suggest the group whose rules do match those paths, rather
than a `default` rule that would hide the mistake.

An argument given no group (`None`: JAX decides its layout) whose arrays the
rules of a group would shard is warned about (SR212): the usual cause is an
optimizer state left out of `in_groups`, which then stays as it was placed
(often replicated) and comes back so. An argument's group with a rule that
matches none of its leaves (SR201), or that leaves it mostly replicated
(SR116), is warned about naming the argument.

The output's shardings are planned here (`out_shardings`), for the shapes the
step's one trace gives (`RuleJit.traced`) or else `jax.eval_shape`'s.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from .._errors import Diagnostic, PlanError, ShardRulesWarning, error_for
from .._interop._paths import path_str
from .._language._rules import RuleSet
from .._planning import _check
from .._planning._api import placement_shardings
from .._planning._compile import compile_plan
from .._pspec import entries
from .._quiet import warn
from ._compat import DuplicateSpecError, ShardingTypeError, mesh_context, trace_replicated
from ._explicit import closed_over_error, is_explicit, untyped
from ._groups import for_groups, param_names


def where(what: str, index: int, name: str = "") -> str:
    """How an argument or output is named in a message: `in_groups[1]
    (argument `opt_state`)`, `out_groups[0] (output 0)`."""
    if what == "in_groups":
        return f"in_groups[{index}] (argument `{name}`)" if name else f"in_groups[{index}] (argument {index})"
    return f"out_groups[{index}] (output {index})" if index >= 0 else "out_groups (the output)"


def _fitting_groups(tree: Any, rules: RuleSet, mesh: Any, tried: str | None) -> list[str]:
    """The groups (other than `tried` and `activations`) whose rules match
    every array leaf of `tree`, those that match with patterns first."""
    found: list[tuple[int, str]] = []
    for group in rules.group_names:
        if group in (tried, "activations"):
            continue
        try:
            plan = compile_plan(tree, rules, mesh, group)
        except Exception:  # a group that cannot plan this tree (rank mismatch, ...) does not fit it
            continue
        if any(d.code == "SR105" for d in plan.errors):
            continue
        by_default = sum(lp.why == "default" for lp in plan.leaves)
        found.append((by_default, group))
    return [g for _, g in sorted(found)]


def planned(
    plan: Callable[[Any, str], Any],
    rules: RuleSet,
    mesh: Any,
    what: str,
    index: int,
    name: str = "",
) -> Callable[[Any, str], Any]:
    """`plan`, with SR105 (leaves the group's rules do not match) re-raised
    naming the argument or output and the group whose rules do match."""

    def run(tree: Any, group: str) -> Any:
        try:
            return plan(tree, group)
        except PlanError as err:
            if not any(d.code == "SR105" for d in err.diagnostics):
                raise
            fitting = _fitting_groups(tree, rules, mesh, group)
            raise error_for(
                [_placed(d, what, index, name, group, fitting) for d in err.diagnostics], rules.sources
            ) from None

    return run


def _placed(
    d: Diagnostic, what: str, index: int, name: str, group: str, fitting: Sequence[str]
) -> Diagnostic:
    if d.code != "SR105":
        return d
    place = where(what, index, name)
    if fitting:
        other = fitting[0]
        hint = (
            f"{place} is `{group!r}`, but the rules of group `{other}` match all of its arrays: "
            f"did you mean `{other!r}` there (in_groups and out_groups swapped, or the arguments "
            "in another order)?"
        )
    else:
        hint = (
            f"check that {place} is the group meant for it; if it is, add rules for these paths under "
            f"`rules {group}:` (`shardrules explain` lists the paths)"
        )
    return dataclasses.replace(d, message=f"{place}: {d.message}", hint=hint)


def warn_ungrouped(
    args: Sequence[Any],
    groups: Sequence[Any],
    names: Sequence[str],
    rules: RuleSet,
    mesh: Any,
    stacklevel: int = 3,
) -> None:
    """SR212 (a `ShardRulesWarning`): an argument given group `None` whose
    array leaves (every one with a dimension) the pattern rules of one group
    all match, and which that group would shard; `stacklevel` as
    `warnings.warn`'s, counted from this function's caller."""
    for i, (arg, group) in enumerate(zip(args, groups, strict=False)):
        if group is not None:
            continue
        arrays = [x for x in jax.tree.leaves(arg) if np.ndim(x) >= 1 and hasattr(x, "dtype")]
        if not arrays or (len(arrays) == 1 and arrays[0] is arg):
            continue  # a lone array has no path for rules to match
        for other in rules.group_names:
            if other == "activations":
                continue
            try:
                plan = compile_plan(arg, rules, mesh, other)
            except Exception:  # a group that cannot plan this tree says nothing about it
                continue
            leaves = [lp for lp in plan.leaves if lp.is_array and lp.shape]
            if plan.errors or not leaves or any(lp.why != "rule" for lp in leaves):
                continue
            sharded = [
                lp for lp in leaves if lp.spec is not None and any(e is not None for e in entries(lp.spec))
            ]
            if not sharded:
                continue
            place = where("in_groups", i, names[i] if i < len(names) else "")
            first = sharded[0]
            diag = Diagnostic(
                "SR212",
                "warning",
                f"{place} has no group (None: it keeps the layout it comes with), but the rules of group "
                f"`{other}` match all {len(leaves)} of its arrays and shard {len(sharded)} of them "
                f"(`{first.path}` {first.shape} would be {first.spec})",
                first.rule.span if first.rule is not None else None,
                first.path,
                f"give it that group (`{other!r}` in in_groups) to lay it out as the rules say; "
                "keep None only where its layout is meant to come from elsewhere",
            )
            if not rules.acknowledges(diag):
                warn(ShardRulesWarning(diag, rules.sources), stacklevel=stacklevel + 1)
            break


def warn_about_groups(
    fn: Callable[..., Any],
    args: Sequence[Any],
    groups: Sequence[Any] | None,
    rules: RuleSet,
    mesh: Any,
    stacklevel: int,
) -> None:
    """A rule of the group of an argument of `fn` matching nothing (SR201) or
    a mostly replicated plan (SR116), as `ShardRulesWarning`s naming the
    argument; `stacklevel` as `warnings.warn`'s, counted from this function's caller."""
    names = param_names(fn, len(args))
    for i, (arg, group) in enumerate(zip(args, groups or (), strict=False)):
        leaves = jax.tree.leaves(arg)
        if isinstance(group, str) and not (len(leaves) == 1 and leaves[0] is arg):
            place = where("in_groups", i, names[i]) + f" in group `{group}`"
            _check.warn_about(compile_plan(arg, rules, mesh, group), stacklevel=stacklevel + 2, where=place)


def leaf_origins(
    fn: Callable[..., Any], args: Sequence[Any], groups: Sequence[Any] | None, rules: RuleSet, mesh: Any
) -> list[tuple[str, Any]]:
    """What each leaf of `fn`'s positional `args` is, for a message: its label
    (`argument `params`, leaf `layers/w``) and the rule of its group (`groups`:
    one per argument, a sequence for a tuple argument) that lays it out, or
    `None` where it has no group or no rule lays it out."""
    names = param_names(fn, len(args))
    found: list[tuple[str, Any]] = []
    for i, arg in enumerate(args):
        group = groups[i] if groups is not None and i < len(groups) else None
        found.extend(_origins(arg, group, names[i] or str(i), rules, mesh, ""))
    return found


def _origins(
    tree: Any, group: Any, name: str, rules: RuleSet, mesh: Any, prefix: str
) -> list[tuple[str, Any]]:
    if isinstance(group, (tuple, list)) and isinstance(tree, (tuple, list)) and len(group) == len(tree):
        return [
            found
            for k, (part, inner) in enumerate(zip(tree, group, strict=True))
            for found in _origins(part, inner, name, rules, mesh, f"{prefix}{k}/")
        ]
    keyed = jax.tree_util.tree_flatten_with_path(tree)[0]
    lone = len(keyed) == 1 and keyed[0][1] is tree and not prefix
    found = []
    for path, rule in _planned_leaves(tree, group, name, rules, mesh, lone):
        label = (
            f"argument `{name}`"
            if lone
            else f"argument `{name}`, leaf `{prefix}{path}`".replace(", leaf ``", "")
        )
        found.append((label, rule))
    return found


def _planned_leaves(
    tree: Any, group: Any, name: str, rules: RuleSet, mesh: Any, lone: bool = False
) -> list[tuple[str, Any]]:
    """Each leaf of `tree` in JAX's order: its path as rules match it (`name`
    for a `lone` array) and the rule of `group` that lays it out, or `None`."""
    keyed = jax.tree_util.tree_flatten_with_path(tree)[0]
    if isinstance(group, str):
        try:
            plan = compile_plan({name: tree} if lone else tree, rules, mesh, group)
            if len(plan.leaves) == len(keyed):  # the plan's leaves are JAX's, in its order
                return [(name if lone else lp.path, lp.rule) for lp in plan.leaves]
        except Exception:  # a tree its group cannot plan: its leaves are named without a rule
            pass
    return [(name if lone else path_str(keypath), None) for keypath, _ in keyed]


def out_shardings(
    fn: Callable[..., Any],
    args: Sequence[Any],
    groups: Any,
    rules: RuleSet,
    mesh: Any,
    out_shape: Any = None,
) -> Any:
    """The shardings `groups` (`out_groups`; `None`: none) give the output of
    `fn(*args)`, whose shapes are `out_shape` (the step's trace gives them)
    or, by default, `jax.eval_shape`'s (on Explicit axes, its arguments
    replicated; on Auto axes, the trace `jax.jit` reuses); a group
    whose rules do not match an output's leaves is SR105 naming that output."""
    if groups is None:
        return None

    def plan(tree: Any, group: str) -> Any:
        return placement_shardings(tree, rules, mesh, group=group)

    if out_shape is None and not is_explicit(mesh):
        # traced as `jax.jit` traces the step on Auto axes, which finds this trace in JAX's cache
        out_shape = jax.eval_shape(fn, *args)
    elif out_shape is None:
        with mesh_context(mesh):  # shapes only, values replicated
            try:
                # a function of its own: JAX caches traces by function, and this one records
                # `with_sharding_constraint`'s asserts rather than making them (`_asserts`)
                shapes = functools.partial(jax.eval_shape, lambda *values: fn(*values))
                out_shape = trace_replicated(shapes, jax.tree.map(untyped, args), mesh.abstract_mesh)
            except (ShardingTypeError, DuplicateSpecError) as err:
                raise closed_over_error(fn, err, rules) from None
    else:
        out_shape = jax.tree.map(untyped, out_shape)  # as `jax.eval_shape` gives them: no layouts
    if (
        isinstance(groups, (list, tuple))
        and isinstance(out_shape, (list, tuple))
        and len(groups) == len(out_shape)
    ):
        return type(out_shape)(
            for_groups(o, g, planned(plan, rules, mesh, "out_groups", i), "out_groups")
            for i, (o, g) in enumerate(zip(out_shape, groups, strict=True))
        )
    return for_groups(out_shape, groups, planned(plan, rules, mesh, "out_groups", -1), "out_groups")


def output_origins(out_shape: Any, groups: Any, rules: RuleSet, mesh: Any) -> list[tuple[str, Any]]:
    """What each leaf of a step's output (shaped `out_shape`) is, as
    `leaf_origins` says of its arguments: `(path, rule)`, the path after the
    output's position (`0/layers/w`), the rule of its `out_groups` group
    (`groups`, as `out_shardings` reads them) that lays it out, or `None`."""
    if (
        isinstance(groups, (list, tuple))
        and isinstance(out_shape, (list, tuple))
        and len(groups) == len(out_shape)
    ):
        return [
            (f"{i}/{path}" if path != str(i) else path, rule)
            for i, (part, group) in enumerate(zip(out_shape, groups, strict=True))
            for path, rule in _output_leaves(part, group, rules, mesh, str(i))
        ]
    return _output_leaves(out_shape, groups, rules, mesh, "")


def _output_leaves(tree: Any, group: Any, rules: RuleSet, mesh: Any, name: str) -> list[tuple[str, Any]]:
    if isinstance(group, (tuple, list)) and isinstance(tree, (tuple, list)) and len(group) == len(tree):
        return [
            (f"{k}/{path}" if path != str(k) else path, rule)
            for k, (part, inner) in enumerate(zip(tree, group, strict=True))
            for path, rule in _output_leaves(part, inner, rules, mesh, str(k))
        ]
    keyed = jax.tree_util.tree_flatten_with_path(tree)[0]
    lone = len(keyed) == 1 and keyed[0][1] is tree
    return [
        (path or name, rule)
        for path, rule in _planned_leaves(tree, group, name or "output", rules, mesh, lone)
    ]
