"""`jax.lax.with_sharding_constraint` on Explicit axes, where JAX makes it an
assert: the value must already be laid out as the constraint says.

A step on Explicit axes is traced once with its values replicated
(`_constrain`, `_slips`), where such an assert would compare the constraint
with a layout no value has at run time and fail. Inside that trace
(`deferred()`), the assert is not made: the constrained value goes through a
`sharding_assert` equation carrying the constraint's layout, and the trace's
evaluation with the explicit types (`check`) makes JAX's assert there, on
the layout the value then has, as `jax.jit` makes it: the value passes
unchanged where they agree, and JAX's `AssertionError` is raised where they
do not.

JAX makes the assert in `with_sharding_constraint` by calling
`jax._src.pjit.assert_shardings_equal(aval, sharding)` for each value, just
before it returns that value unchanged; the value itself is read from that
call's caller (the value whose abstract value `aval` is). Where a JAX
spells either otherwise, the assert is made as JAX makes it
(`tests/test_compat.py` checks both against the installed JAX).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

import jax
from jax.core import Tracer

_state = threading.local()  # `depth`: how many `deferred()` this thread is inside


def _pjit() -> Any:
    try:
        return importlib.import_module("jax._src.pjit")
    except ImportError:
        return None


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Within it, on this thread, `with_sharding_constraint`'s assert on
    Explicit axes is not made but recorded in the trace (see the module's
    docstring); other threads make it as before."""
    _install()
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


@functools.cache
def _install() -> None:
    """Wrap JAX's assert once: outside `deferred()` it is JAX's own."""
    pjit = _pjit()
    original = getattr(pjit, "assert_shardings_equal", None)
    if original is None:
        return

    def assert_or_defer(x_aval: Any, sharding: Any, *rest: Any, **options: Any) -> Any:
        value = _caller_value(x_aval) if getattr(_state, "depth", 0) else None
        if value is None or rest or options:
            return original(x_aval, sharding, *rest, **options)
        primitive().bind(value, mesh=sharding.mesh, spec=sharding.spec, mapped=())
        return None

    pjit.assert_shardings_equal = assert_or_defer


def _caller_value(aval: Any) -> Any:
    """The traced value of `with_sharding_constraint` (the caller's caller)
    whose abstract value is `aval` (one equal to it: JAX 0.8 makes a batched
    value's anew each time it is read), or `None`."""
    traced = [v for v in sys._getframe(2).f_locals.values() if isinstance(v, Tracer)]
    same = [v for v in traced if v.aval is aval] or [v for v in traced if v.aval == aval]
    return same[0] if same else None


@functools.cache
def primitive() -> Any:
    """The `sharding_assert` primitive: its operand unchanged, with the
    constraint's `mesh` and `spec`. It differentiates to the tangent unchanged
    (the assert is on the primal value), is kept where its result is unused
    (the gradient's partial evaluation of a remat region, a `cond`'s
    branches, an inner `jax.jit` removes what nothing uses; that of a
    `scan`'s body drops it all the same), and under `jax.vmap`, `mapped` lists
    the batch dimensions, innermost `vmap`'s first."""
    from jax.extend.core import Primitive
    from jax.interpreters import ad, batching, mlir
    from jax.interpreters import partial_eval as pe

    p = Primitive("sharding_assert")
    p.def_impl(lambda x, **_: x)
    p.def_abstract_eval(lambda x, **_: x)

    def jvp(primals: Any, tangents: Any, **params: Any) -> Any:
        return p.bind(primals[0], **params), tangents[0]

    def batched(values: Any, dims: Any, *, mesh: Any, spec: Any, mapped: tuple[int, ...]) -> Any:
        (x,), (d,) = values, dims
        if d is not None:  # JAX's `not_mapped`
            mapped = (*mapped, d)
        return p.bind(x, mesh=mesh, spec=spec, mapped=mapped), d

    ad.primitive_jvps[p] = jvp
    batching.primitive_batchers[p] = batched
    mlir.register_lowering(p, lambda ctx, x, **_: [x])
    # kept, its result unused: it is an assert (JAX 0.12 passes which operands are live too)
    pe.dce_rules[p] = lambda *used_and_eqn: ([True], used_and_eqn[-1])
    return p


def check(value: Any, params: dict[str, Any]) -> Any:
    """JAX's assert of a `sharding_assert` equation on `value`, as `jax.jit`
    makes it (under the `jax.vmap`s it was made in): `value` where its layout
    agrees with the constraint, else JAX's `AssertionError`."""
    sharding = jax.sharding.NamedSharding(params["mesh"], params["spec"])

    def constrained(x: Any) -> Any:
        return jax.lax.with_sharding_constraint(x, sharding)

    for d in params["mapped"]:
        constrained = jax.vmap(constrained, in_axes=d, out_axes=d)
    return constrained(value)
