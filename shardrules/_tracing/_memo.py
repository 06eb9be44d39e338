"""One trace of a `shardrules.jit` step per argument signature (`TraceMemo`).

A step is traced without layouts first (`_constrain`'s replicated trace),
then that trace is evaluated with the rules' layouts inside `jax.jit`'s own
trace. Planning the outputs' shardings (`out_groups`) needs the output's
shapes before `jax.jit` is made, and costing a step (`step.cost`) needs the
scopes the evaluation finds: without a memo each of those traced the user's
function again, which for a Flax NNX model costs about as much as the
evaluation itself. The memo keeps the replicated trace of each signature
(the pytree structure, the values that are not arrays, each array's type as
`jax.typeof` gives it) for the step's mesh, so every later use evaluates it
instead of tracing again; `traces` counts the traces made, which the tests
hold to one per signature.

A memo belongs to one planned step (`RuleJit`'s entry for one signature and
mesh), so it lives as long as that entry, as `jax.jit`'s own cache of traces
lives as long as its function.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax


class Found(NamedTuple):
    """A replicated trace: the closed jaxpr, the output's shapes, and what
    `_reach` found in it (auto-named scopes' parameters, unreached operations)."""

    closed: Any
    out_shape: Any
    reach: Any


class TraceMemo:
    """The replicated traces of one step on one mesh, by signature."""

    def __init__(self) -> None:
        self._found: dict[Any, Found] = {}
        self.traces = 0  # replicated traces made (not found here)

    @staticmethod
    def key(treedef: Any, leaves: Sequence[Any], dynamic: Sequence[int], values: Sequence[Any]) -> Any:
        """What selects a trace: the arguments' structure, their leaves that
        are not traced (by type and value), and each traced value's type as
        JAX sees it (shape, dtype, weak type, layout). `None` where a leaf
        that is not traced cannot be compared (then nothing is kept)."""
        traced = set(dynamic)
        fixed = tuple((type(leaf), leaf) for i, leaf in enumerate(leaves) if i not in traced)
        try:
            types = tuple(jax.typeof(v) for v in values)
            key = (treedef, fixed, types, bool(jax.config.read("jax_enable_x64")))
            hash(key)
        except (TypeError, ValueError):
            return None
        return key

    def get(self, key: Any) -> Found | None:
        return None if key is None else self._found.get(key)

    def put(self, key: Any, found: Found) -> Found:
        self.traces += 1
        if key is not None:
            self._found[key] = found
        return found
