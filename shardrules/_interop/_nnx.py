"""Flax NNX support: sharded creation of NNX modules for `shardrules.init`.
(Named scopes for NNX module calls are `_modules`'.)
"""

from __future__ import annotations

import functools
import sys
from typing import Any

# ------------------------------------------------------------------ sharded init


def is_module(value: Any) -> bool:
    """Whether `value` is a Flax NNX module (never imports Flax)."""
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(value, nnx.Module)


def state_initialiser(init_fn: Any) -> tuple[Any, Any]:
    """For an `init_fn` that builds an NNX module: a function of the same
    arguments that returns the module's `nnx.State` (a plain pytree, which
    `jax.jit` can create in any layout), and `merge(state)`, which puts the
    module back together from such a state with `nnx.merge`.

    The module's graph definition (its structure, without arrays) is taken from
    the first trace of the state function, so `merge` works after it has run,
    or been `jax.eval_shape`d, once.

    ```python
    make_state, merge = state_initialiser(lambda: Model(rngs=nnx.Rngs(0)))
    state = jax.jit(make_state, out_shardings=targets)()
    model = merge(state)
    ```
    """
    nnx = sys.modules["flax.nnx"]
    graphdefs: list[Any] = []

    @functools.wraps(init_fn)
    def make_state(*args: Any) -> Any:
        graphdef, state = nnx.split(init_fn(*args))
        if not graphdefs:
            graphdefs.append(graphdef)
        return state

    def merge(state: Any) -> Any:
        if not graphdefs:
            raise RuntimeError("call or trace the state function before merging its state")
        return nnx.merge(graphdefs[0], state)

    return make_state, merge
