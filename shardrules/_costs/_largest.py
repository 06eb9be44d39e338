"""What takes most of a step's memory, for a message that says why a step
does not fit its chip (SR127): the largest arguments on one device (from the
step's planned input layouts) and the largest values its compiled program
makes (from the optimised HLO: each instruction's result outside fusions,
named by the scope its metadata gives)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from .._interop._paths import path_str
from ._hlo import op_name, program, size
from ._scopes import scope_of

_NOT_VALUES = frozenset((
    "parameter", "constant", "get-tuple-element", "bitcast", "tuple", "copy-done", "after-all",
    "all-gather-done", "all-reduce-done", "collective-permute-done", "async-done", "async-update",
))  # fmt: skip
"""Opcodes that make no new value (views, the ends of asynchronous work)."""


def largest_values(hlo: str, count: int = 3) -> list[tuple[str, int]]:
    """The `count` largest values the compiled program `hlo` makes, as
    `("layers/mlp: f32[8,4096]", bytes)`, most bytes first (instructions
    inside a fusion are not values of their own; each value once, by the
    scope its metadata names)."""
    p = program(hlo)
    found: dict[str, int] = {}
    for i in p.instructions:
        if i.op in _NOT_VALUES or p.called_by_fusion(i.computation):
            continue
        named = op_name(i)
        scopes = scope_of(named) if named else []
        where = scopes[0] if scopes and scopes[0] else "(no scope)"
        key = f"{where}: {_type_text(i.shape)}"
        found[key] = max(found.get(key, 0), size(i.shape))
    return sorted(found.items(), key=lambda kv: -kv[1])[:count]


_LAYOUT = re.compile(r"\{[^{}]*\}")


def _type_text(shape: str) -> str:
    """An HLO type without its layouts (`f32[8,4096]`); a tuple as its count of values."""
    plain = _LAYOUT.sub("", shape).replace("/*", "").strip()
    if plain.startswith("("):
        return f"{plain.count('[')} values"
    return plain


def largest_arguments(step: Any, args: Sequence[Any], count: int = 3) -> list[tuple[str, int]]:
    """The `count` largest argument leaves of `step` (a `RuleJit`) called
    with `args`, as `("params/embed", bytes on one device)` under the layouts
    its groups give them, most bytes first."""
    entry = step._entry(tuple(args), stacklevel=4)
    shardings = entry.in_shardings or (None,) * len(args)
    found: list[tuple[str, int]] = []
    for position, (arg, sharding) in enumerate(zip(args, shardings, strict=False)):
        leaves = jax.tree_util.tree_flatten_with_path(arg)[0]
        if sharding is None or not jax.tree_util.tree_leaves(sharding):
            layouts = [None] * len(leaves)
        else:
            layouts = jax.tree_util.tree_leaves(sharding, is_leaf=lambda x: x is None)
            if len(layouts) != len(leaves):
                layouts = [None] * len(leaves)
        for (keys, leaf), layout in zip(leaves, layouts, strict=True):
            if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
                continue
            shape = tuple(np.shape(leaf))
            shard_shape = getattr(layout, "shard_shape", None)
            local = shard_shape(shape) if shard_shape is not None else shape
            name = f"argument {position}" + (f": {path_str(keys)}" if keys else "")
            found.append((name, math.prod(local) * np.dtype(leaf.dtype).itemsize))
    return sorted(found, key=lambda kv: -kv[1])[:count]
