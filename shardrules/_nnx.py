"""Named scopes for Flax NNX module calls, so `auto_constrain` sees NNX modules
the way it sees Flax linen modules (which name their calls themselves).

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
