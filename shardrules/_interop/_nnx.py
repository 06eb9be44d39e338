"""Flax NNX support: named scopes for NNX module calls, and sharded creation of
NNX modules for `shardrules.init`.

Named scopes let `auto_constrain` see NNX modules the way it sees Flax linen
modules (which name their calls themselves).

While a function is traced, each NNX module found in its arguments runs its
`__call__` inside `jax.named_scope(PATH)`, PATH being its place in the model
(`blocks/0/attn`). Flax is never imported here: without `flax.nnx` already
loaded there is nothing to do.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Iterator
from typing import Any

import jax

_active = threading.local()
_lock = threading.Lock()


def _stack() -> list[str]:
    if not hasattr(_active, "paths"):
        _active.paths = []
    return _active.paths


def module_paths(trees: Any) -> dict[int, str]:
    """`id(module)` → its `/`-joined path, for every NNX module inside `trees`."""
    nnx = sys.modules.get("flax.nnx")
    if nnx is None:
        return {}
    paths: dict[int, str] = {}
    for leaf in jax.tree.leaves(trees, is_leaf=lambda x: isinstance(x, nnx.Module)):
        if isinstance(leaf, nnx.Module):
            for path, node in nnx.iter_graph(leaf):
                if isinstance(node, nnx.Module) and path:
                    paths.setdefault(id(node), "/".join(str(p) for p in path))
    return paths


def _scoped(call: Any, paths: dict[int, str]) -> Any:
    @functools.wraps(call)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        path = paths.get(id(self))
        if path is None:
            return call(self, *args, **kwargs)
        stack = _stack()
        outer = stack[-1] if stack else ""
        name = path[len(outer) + 1 :] if outer and path.startswith(outer + "/") else path
        stack.append(path)
        try:
            with jax.named_scope(name):
                return call(self, *args, **kwargs)
        finally:
            stack.pop()

    return wrapper


@contextlib.contextmanager
def module_scopes(trees: Any) -> Iterator[None]:
    """Within the block, NNX modules in `trees` call inside named scopes."""
    paths = module_paths(trees)
    if not paths:
        yield
        return
    nnx = sys.modules["flax.nnx"]
    classes = {
        type(node)
        for leaf in jax.tree.leaves(trees, is_leaf=lambda x: isinstance(x, nnx.Module))
        if isinstance(leaf, nnx.Module)
        for _, node in nnx.iter_graph(leaf)
        if isinstance(node, nnx.Module)
    }
    patched: list[tuple[type, Any, bool]] = []
    with _lock:  # classes are shared: patch and restore them one trace at a time
        try:
            for cls in classes:
                call = cls.__dict__.get("__call__") or next(
                    (c.__dict__["__call__"] for c in cls.__mro__ if "__call__" in c.__dict__), None
                )
                if call is None:
                    continue
                patched.append((cls, call, "__call__" in cls.__dict__))
                cls.__call__ = _scoped(call, paths)  # type: ignore[method-assign]
            yield
        finally:
            for cls, call, own in reversed(patched):
                if own:
                    cls.__call__ = call  # type: ignore[method-assign]
                else:
                    delattr(cls, "__call__")


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
