"""Named scopes for module calls of frameworks that do not name them
themselves: Flax NNX and Equinox.

While a step is traced (`auto_constrain`, `jit`), every call of such a
module runs inside `jax.named_scope(NAME)`, NAME being the module's
attribute path from the module that calls it (`blocks/0`, `attn`), so that
the nested scopes spell the module's place in the model
(`blocks/0/attn`). The name is the same however the step came by its
modules: passed as arguments, rebuilt inside the step (`nnx.merge`), or
rebuilt by a transform (`nnx.value_and_grad`, `nnx.jit`, `nnx.scan`,
`eqx.filter_value_and_grad`, `eqx.filter_jit`), since each call is named
from the module object its caller holds. A module rebuilt from a slice of a
stacked one (a layer inside `nnx.scan`, or `jax.lax.scan` over an Equinox
stack) is not an attribute of its caller: it is named as the one module of
its class below the caller (the stack, `blocks`), where there is one. A
module the step calls directly is named by its path in the argument that
holds it, and the outermost module called is not a scope.

Frameworks are never imported here: one not loaded already has nothing to
name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax

from ._paths import path_str

_active = threading.local()
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class _Framework:
    base: type  # the module base class
    below: Callable[[Any], Iterable[tuple[str, Any]]]  # every module under one, with its path


def _nnx_below(module: Any) -> Iterator[tuple[str, Any]]:
    nnx = sys.modules["flax.nnx"]
    for path, node in nnx.iter_graph(module):
        if path and isinstance(node, nnx.Module):
            yield "/".join(str(p) for p in path), node


def _eqx_below(module: Any) -> Iterator[tuple[str, Any]]:
    eqx = sys.modules["equinox"]
    todo = [("", module)]
    while todo:
        prefix, node = todo.pop(0)
        inner = functools.partial(_other_module, node, eqx.Module)
        flat, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=inner)
        for keys, leaf in flat:
            if isinstance(leaf, eqx.Module):
                path = f"{prefix}/{path_str(keys)}" if prefix else path_str(keys)
                yield path, leaf
                todo.append((path, leaf))


def _other_module(outer: Any, base: type, x: Any) -> bool:
    return x is not outer and isinstance(x, base)


def _frameworks() -> list[_Framework]:
    found = []
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None:
        found.append(_Framework(nnx.Module, _nnx_below))
    eqx = sys.modules.get("equinox")
    if eqx is not None:
        found.append(_Framework(eqx.Module, _eqx_below))
    return found


def _stack() -> list[tuple[Any, str]]:
    """The module calls running in this thread, innermost last, with their paths."""
    if not hasattr(_active, "stack"):
        _active.stack = []
    return _active.stack


class _Namer:
    """Names each module call of one trace (see the module's docstring)."""

    def __init__(self, frameworks: list[_Framework], trees: Any):
        self.frameworks = frameworks
        self._below: dict[int, tuple[Any, dict[int, str], dict[type, list[str]]]] = {}
        self.roots: dict[int, str] = {}  # modules in the arguments: their paths from the outermost
        bases = tuple(f.base for f in frameworks)
        for leaf in jax.tree.leaves(trees, is_leaf=lambda x: isinstance(x, bases)):
            if isinstance(leaf, bases):
                for path, node in self._framework(leaf).below(leaf):
                    self.roots.setdefault(id(node), path)

    def _framework(self, module: Any) -> _Framework:
        return next(f for f in self.frameworks if isinstance(module, f.base))

    def _children(self, parent: Any) -> tuple[dict[int, str], dict[type, list[str]]]:
        found = self._below.get(id(parent))
        if found is None or found[0] is not parent:
            by_id: dict[int, str] = {}
            by_type: dict[type, list[str]] = {}
            for name, node in self._framework(parent).below(parent):
                by_id.setdefault(id(node), name)
                by_type.setdefault(type(node), []).append(name)
            found = self._below[id(parent)] = (parent, by_id, by_type)
        return found[1], found[2]

    def name(self, module: Any) -> tuple[str | None, str]:
        """`(scope to open or None, the module's path)` for a call of `module`."""
        stack = _stack()
        if not stack:  # called by the step itself: its path in an argument, if it is in one
            path = self.roots.get(id(module))
            return path, path or ""
        parent, outer = stack[-1]
        name = None
        if isinstance(parent, tuple(f.base for f in self.frameworks)):
            by_id, by_type = self._children(parent)
            name = by_id.get(id(module))
            if name is None:
                same = by_type.get(type(module), [])
                name = same[0] if len(same) == 1 else None
        if name is None:
            path = self.roots.get(id(module))
            if path and outer and path.startswith(outer + "/"):
                name = path[len(outer) + 1 :]
            elif path and not outer:
                name = path
        if name is None:
            return None, outer
        return name, f"{outer}/{name}" if outer else name


def _namers() -> list[_Namer]:
    """The namers of the traces running in this thread, innermost last."""
    if not hasattr(_active, "namers"):
        _active.namers = []
    return _active.namers


def _scoped(call: Any) -> Any:
    @functools.wraps(call)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        namers, stack = _namers(), _stack()
        if not namers or (stack and stack[-1][0] is self):  # no trace here, or `super().__call__`
            return call(self, *args, **kwargs)
        scope, path = namers[-1].name(self)
        stack.append((self, path))
        try:
            if scope is None:
                return call(self, *args, **kwargs)
            with jax.named_scope(scope):
                return call(self, *args, **kwargs)
        finally:
            stack.pop()

    return wrapper


def _classes(base: type) -> list[type]:
    """`base` and every class derived from it that defines `__call__` itself."""
    seen: dict[type, None] = {}
    todo = [base]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen[cls] = None
            todo.extend(cls.__subclasses__())
    return [c for c in seen if callable(c.__dict__.get("__call__"))]


@contextlib.contextmanager
def module_scopes(trees: Any) -> Iterator[None]:
    """Within the block, every NNX and Equinox module call in this thread runs
    inside a named scope (see the module's docstring); `trees`: the step's
    arguments. A block inside another (a step traced inside a step) names the
    calls it makes from its own arguments."""
    frameworks = _frameworks()
    if not frameworks:
        yield
        return
    namers = _namers()
    namers.append(_Namer(frameworks, trees))
    try:
        if len(namers) > 1:  # the classes are patched already, by the outer block
            yield
            return
        patched: list[tuple[type, Any]] = []
        with _lock:  # classes are shared: patch and restore them one trace at a time
            try:
                for framework in frameworks:
                    for cls in _classes(framework.base):
                        call = cls.__dict__["__call__"]
                        patched.append((cls, call))
                        cls.__call__ = _scoped(call)  # type: ignore[method-assign]
                yield
            finally:
                for cls, call in reversed(patched):
                    cls.__call__ = call  # type: ignore[method-assign]
    finally:
        namers.pop()
