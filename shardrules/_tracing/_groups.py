"""Groups per argument: what `shardrules.jit` and `shardrules.shard_map` share.

`in_groups` gives each positional argument a group name (a lone array is
matched by its parameter's name, having no path of its own), `None`, or a
sequence for a tuple argument; `out_groups` does the same for the output.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.core import Tracer


def signature(args: tuple[Any, ...]) -> Any:
    """The cache key of a call: the arguments' tree structure, shapes and dtypes."""
    leaves, treedef = jax.tree_util.tree_flatten(args)
    return treedef, tuple(
        (tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x).__name__))) for x in leaves
    )


def param_names(fn: Callable[..., Any], n: int) -> list[str]:
    """The parameter names of `fn`'s first `n` positional arguments, `""` where unknown."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return (names + [""] * n)[:n]


def for_groups(
    tree: Any,
    groups: Any,
    plan: Callable[[Any, str], Any],
    what: str,
    name: str = "",
    *,
    none: Any = None,
    literal: type | None = None,
) -> Any:
    """What `groups` gives `tree`: `plan(tree, group)` for a group name (a lone
    array planned as `{name: array}`), `none` for `None`, a `literal` instance
    as it is, or one entry per element of a tuple/list tree."""
    if groups is None:
        return none
    if literal is not None and isinstance(groups, literal):
        return groups
    if isinstance(groups, str):
        leaves = jax.tree.leaves(tree)
        if name and len(leaves) == 1 and leaves[0] is tree:
            return plan({name: tree}, groups)[name]
        return plan(tree, groups)
    if not isinstance(tree, (tuple, list)):
        raise TypeError(
            f"{what}: {len(groups)} groups given for a {type(tree).__name__}, which is not a tuple or list: "
            f'give one group name for the whole of it (e.g. {what}="params"), or None'
        )
    if len(tree) != len(groups):
        raise TypeError(
            f"{what}: {len(groups)} groups given for a {type(tree).__name__} of {len(tree)}; give one group "
            "per element, or one group name for all of it"
        )
    return type(tree)(
        for_groups(t, g, plan, what, none=none, literal=literal) for t, g in zip(tree, groups, strict=True)
    )


def moved(arg: Any, shardings: Any, traced: Callable[[Any, Any], Any] | None = None) -> Any:
    """`arg` with each concrete array leaf moved (`jax.device_put`) to its
    sharding in `shardings` (a prefix pytree; `None`: left as it is) where it is
    not there already; a traced leaf goes through `traced(leaf, sharding)`,
    or is left as it is."""

    def one(sharding: Any, leaf: Any) -> Any:
        if sharding is None or not hasattr(leaf, "shape"):
            return leaf
        if isinstance(leaf, Tracer):
            return leaf if traced is None else traced(leaf, sharding)
        if isinstance(leaf, jax.Array) and leaf.sharding.is_equivalent_to(sharding, leaf.ndim):
            return leaf
        return jax.device_put(leaf, sharding)

    if shardings is None:
        return arg
    return jax.tree.map(
        lambda s, a: jax.tree.map(lambda leaf: one(s, leaf), a), shardings, arg, is_leaf=_is_leaf
    )


def typed(arg: Any, shardings: Any) -> Any:
    """`arg`'s array leaves as `ShapeDtypeStruct`s with their shardings from
    `shardings` (where given), for tracing without moving anything."""
    if shardings is None:
        return arg

    def one(sharding: Any, leaf: Any) -> Any:
        if sharding is None or not hasattr(leaf, "shape"):
            return leaf
        return jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype, sharding=sharding)

    return jax.tree.map(one, shardings, arg, is_leaf=lambda x: x is None)


def _is_leaf(x: Any) -> bool:
    return x is None or isinstance(x, (jax.sharding.Sharding, jax.sharding.PartitionSpec))
