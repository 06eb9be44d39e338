"""What a search learns of a step before it drafts anything: the step's
groups, which of them holds the weights, which the batch, and how many rows
the batch has.

A step is a factory `FUNCTION(rules, mesh) -> (step, args)`, as
`--step MODULE:FUNCTION` takes it: a `shardrules.jit` step and example
arguments (arrays or `jax.ShapeDtypeStruct`s). It is called once with rules
that lay nothing out (`probe`), and once per candidate with that candidate's
rules and mesh (`made`); its arguments must not change with the mesh, or the
candidates' costs would not compare.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from .._errors import ShardRulesError
from .._tracing._groups import signature

Factory = Callable[[Any, Any], Any]


class StepError(ValueError):
    """A step factory that cannot be searched (it fails, returns something
    else than a step and its arguments, or changes its arguments with the mesh)."""


@dataclasses.dataclass(frozen=True)
class Probe:
    """A step's groups and arguments, as the search drafts and compares them.

    - `groups`: each group the step's arguments name, with its trees (one
      per argument, or element of a tuple argument, in that group).
    - `params`: the group named `params` (the weights, and the optimizer
      state that mirrors them where it shares their group), or else the
      group holding the most bytes.
    - `weights`: the other groups that are not batches (an optimizer
      state of its own group, say): each gets the weights' rules.
    - `batches`: groups whose arrays share their leading dimension.
    - `rows`: that dimension (the global batch), `None` without a batch.
    - `named`: every group the step names, its outputs' included.
    - `signature`: the arguments' tree and shapes.
    """

    groups: dict[str, list[Any]]
    params: str
    weights: tuple[str, ...]
    batches: tuple[str, ...]
    rows: int | None
    named: tuple[str, ...]
    signature: Any


def made(factory: Factory, rules: Any, mesh: Any, name: str) -> tuple[Any, tuple[Any, ...]]:
    """`factory(rules, mesh)`, checked to be a `shardrules.jit` step and its
    arguments; `StepError` saying what it raised, for a factory that fails."""
    try:
        result = factory(rules, mesh)
    except (StepError, ShardRulesError):
        raise
    except Exception as err:
        shown = ", ".join(f"{k}={v}" for k, v in dict(mesh.shape).items())
        raise StepError(
            f"the step {name}, called with (rules, mesh) for the mesh {shown}, raised "
            f"{type(err).__name__}: {err}"
        ) from err
    return checked(result, f"the step {name}")


def checked(result: Any, what: str) -> tuple[Any, tuple[Any, ...]]:
    """`result` as a step and its arguments; `StepError` saying what `what`
    (`the step train:make_step`) returned otherwise."""
    from .._tracing._jit import RuleJit

    example = "`return sr.jit(train_step, rules, mesh, in_groups=(...)), (params, opt_state, batch)`"
    if not (isinstance(result, tuple) and len(result) == 2):
        got = type(result).__name__ if not isinstance(result, tuple) else f"a tuple of {len(result)}"
        raise StepError(f"{what} returned {got}; return the step and its example arguments, e.g. {example}")
    if not isinstance(result[0], RuleJit):
        raise StepError(
            f"{what} returned a {type(result[0]).__name__} as its step, not a `shardrules.jit` step (whose "
            f"shardings come from the rules it is given); e.g. {example}"
        )
    if not isinstance(result[1], (tuple, list)):
        raise StepError(
            f"{what} returned a {type(result[1]).__name__} as its arguments; return them as a tuple, one "
            f"item per positional argument of the step, e.g. {example}"
        )
    return result[0], tuple(result[1])


def changed(now: tuple[Any, ...], first: tuple[Any, ...]) -> str:
    """The first array of `now` whose shape or dtype differs from `first`'s, in words."""
    a = jax.tree_util.tree_flatten_with_path(now)[0]
    b = jax.tree_util.tree_flatten_with_path(first)[0]
    if [p for p, _ in a] != [p for p, _ in b]:
        return "other arguments (another tree)"
    for (path, x), (_, y) in zip(a, b, strict=True):
        mine, theirs = (
            (tuple(np.shape(x)), str(getattr(x, "dtype", ""))),
            (tuple(np.shape(y)), str(getattr(y, "dtype", ""))),
        )
        if mine != theirs:
            where = jax.tree_util.keystr(path)
            return f"`args{where}` of shape {mine[0]} {mine[1]} (for the first, {theirs[0]} {theirs[1]})"
    return "other arguments"


def probe(step: Any, args: tuple[Any, ...]) -> Probe:
    """The groups of `step` (a `RuleJit`) called with `args`."""
    groups: dict[str, list[Any]] = {}
    for arg, group in zip(args, step._in_groups(len(args)) or (None,) * len(args), strict=True):
        _collect(arg, group, groups)
    if not groups:
        raise StepError(
            "the step lays out none of its arguments (`in_groups` names no group): give the weights' "
            'argument a group, e.g. `sr.jit(step, rules, mesh, in_groups=("params", "inputs"))`'
        )
    sizes = {g: sum(_nbytes(t) for t in trees) for g, trees in groups.items()}
    params = "params" if "params" in groups else max(groups, key=lambda g: sizes[g])
    batches, weights, rows = [], [], []
    for g, trees in groups.items():
        if g == params:
            continue
        leading = {np.shape(x)[0] for t in trees for x in _arrays(t) if np.ndim(x) >= 1}
        if len(leading) == 1:
            batches.append(g)
            rows.append(leading.pop())
        else:
            weights.append(g)
    named = list(groups)
    _names(step.out_groups, named)
    return Probe(
        groups,
        params,
        tuple(weights),
        tuple(batches),
        math.gcd(*rows) if rows else None,
        tuple(named),
        signature(args),
    )


def _collect(tree: Any, group: Any, out: dict[str, list[Any]]) -> None:
    if group is None:
        return
    if isinstance(group, str):
        out.setdefault(group, []).append(tree)
        return
    if isinstance(group, Sequence) and isinstance(tree, (tuple, list)):
        for sub, g in zip(tree, group, strict=False):
            _collect(sub, g, out)


def _names(groups: Any, out: list[str]) -> None:
    if isinstance(groups, str):
        if groups not in out:
            out.append(groups)
    elif isinstance(groups, Sequence):
        for g in groups:
            _names(g, out)


def _arrays(tree: Any) -> list[Any]:
    return [x for x in jax.tree.leaves(tree) if hasattr(x, "shape") and hasattr(x, "dtype")]


def _nbytes(tree: Any) -> int:
    return sum(math.prod(np.shape(x)) * np.dtype(x.dtype).itemsize for x in _arrays(tree))


def params_tree(found: Probe) -> Any:
    """The weights' trees as one tree to draft from: the group's one tree,
    or its trees by position (`0/...`, `1/...`)."""
    trees = found.groups[found.params]
    return trees[0] if len(trees) == 1 else {str(i): t for i, t in enumerate(trees)}
