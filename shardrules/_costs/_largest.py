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

_VALUE = re.compile(
    r"^\s*(?:ROOT\s+)?%(?P<name>[^\s=]+)\s*=\s*(?P<type>[a-z]+[0-9]*)\[(?P<dims>[0-9,]*)\][^ ]*\s+(?P<op>[a-z][\w\-]*)\("
)
_OP_NAME = re.compile(r'op_name="(?P<name>[^"]*)"')
_NOT_VALUES = frozenset((
    "parameter", "constant", "get-tuple-element", "bitcast", "tuple", "copy-start", "copy-done",
    "all-gather-done", "all-reduce-done", "collective-permute-done", "async-done", "after-all",
))  # fmt: skip
_BITS = {"pred": 8, "s4": 4, "u4": 4}


def _bytes(dtype: str, dims: Sequence[int]) -> int:
    bits = _BITS.get(dtype)
    if bits is None:
        digits = re.sub(r"^[a-z]+", "", dtype)
        bits = int(digits) if digits else 8
    return math.prod(dims) * bits // 8


def largest_values(hlo: str, count: int = 3) -> list[tuple[str, int]]:
    """The `count` largest values the compiled program `hlo` makes, as
    `("layers/mlp: f32[8,4096]", bytes)`, most bytes first (instructions
    inside a fusion are not values of their own; each value once, by the
    scope its metadata names)."""
    from ._cost import scope_of

    found: dict[str, int] = {}
    in_fusion = False
    for line in hlo.splitlines():
        stripped = line.lstrip()
        if not line.startswith(" ") and "{" in line:  # a computation's header
            in_fusion = "fused" in stripped.split("(", 1)[0] or stripped.startswith("%fused")
            continue
        m = _VALUE.match(line)
        if in_fusion or m is None or m["op"] in _NOT_VALUES:
            continue
        dims = [int(d) for d in m["dims"].split(",") if d]
        size = _bytes(m["type"], dims)
        named = _OP_NAME.search(line)
        scopes = [s for s in scope_of(named["name"])] if named else []
        where = scopes[0] if scopes and scopes[0] else "(no scope)"
        key = f"{where}: {m['type']}[{','.join(map(str, dims))}]"
        found[key] = max(found.get(key, 0), size)
    return sorted(found.items(), key=lambda kv: -kv[1])[:count]


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
            local = layout.shard_shape(shape) if hasattr(layout, "shard_shape") else shape
            name = path_str(keys) or "(the argument)"
            found.append((f"argument {position}: {name}", math.prod(local) * np.dtype(leaf.dtype).itemsize))
    return sorted(found, key=lambda kv: -kv[1])[:count]
