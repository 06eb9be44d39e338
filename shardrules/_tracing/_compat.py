"""What differs between the JAX versions shardrules supports (0.8 to 0.12).

The tracing stage reads a few names JAX keeps private and a few primitive
parameters that JAX has changed between releases. Those are read here, each
with a fallback for a JAX where it is gone or spelled otherwise, and
`tests/test_compat.py` checks each against the installed JAX, so a release that
changes one again fails there, by name, rather than deep inside a trace.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.core


class _NeverRaised(Exception):
    """Stands in for an exception class a JAX does not have: nothing raises it,
    so an `except` clause naming it catches nothing."""


def _private(module: str, name: str, fallback: Any) -> Any:
    """`module.name` from JAX's private modules, or `fallback` where this JAX
    has no such name."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return fallback


# What JAX raises for a result layout it cannot decide on Explicit axes.
ShardingTypeError: type[Exception] = _private("jax._src.core", "ShardingTypeError", _NeverRaised)
# What JAX raises for a layout that uses one mesh axis twice.
DuplicateSpecError: type[Exception] = _private("jax._src.named_sharding", "DuplicateSpecError", _NeverRaised)
# The abstract value of an array (public as `jax.core.ShapedArray` in JAX 0.8 to 0.12).
ShapedArray: type = getattr(jax.core, "ShapedArray", None) or _private("jax._src.core", "ShapedArray", object)


class _OnFirstUse:
    """A module imported when one of its names is first read, not before;
    each name read is then kept, so later reads are plain attribute reads.
    (The import system's own lock makes a first read from several threads
    import the module once.)"""

    def __init__(self, module: str) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        value = getattr(importlib.import_module(self._module), name)
        setattr(self, name, value)
        return value

    def __repr__(self) -> str:
        return f"<module {self._module!r}, imported on first use>"


# The jaxpr's types (`ClosedJaxpr`, `Jaxpr`, `Literal`, `Var`): public in
# `jax.extend.core` (JAX 0.8 to 0.12; `jax.core` no longer has them). Importing
# it imports all of `jax.extend`, Pallas and checkify included (20 ms and more),
# so it is imported when tracing first reads one of them, not with shardrules.
if TYPE_CHECKING:
    from jax.extend import core as jcore
else:
    jcore = _OnFirstUse("jax.extend.core")


def scan_counts(params: dict[str, Any]) -> tuple[int, int]:
    """`(consts, carry)`: how many of a `scan` equation's operands are the
    loop's constants and how many its carry (the rest are the scanned inputs).

    JAX 0.8 to 0.10 give them as the parameters `num_consts` and `num_carry`;
    JAX 0.11 and 0.12 as `ft_in`, the operands' tree `(consts, carry, xs)`."""
    if "num_consts" in params and "num_carry" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    unpack: Any = getattr(params.get("ft_in"), "unpack", None)
    if callable(unpack):
        parts: Any = unpack()
        if len(parts) == 3:
            return len(parts[0]), len(parts[1])
    raise NotImplementedError(
        f"shardrules does not know how this JAX ({jax.__version__}) gives a `scan`'s constants and carry "
        f"(its parameters: {sorted(params)}); shardrules is tested with JAX 0.8 to 0.12"
    )


def while_counts(params: dict[str, Any], operands: int) -> tuple[int, int]:
    """`(cond_consts, body_consts)`: how many of a `while` equation's
    `operands` operands are constants of its condition and of its body (the
    rest are the carry). From the parameters `cond_nconsts` and
    `body_nconsts` (JAX 0.8 to 0.12), else from the arities of the two
    sub-computations: the condition takes its constants and the carry, the
    body its constants and the carry."""
    if "cond_nconsts" in params and "body_nconsts" in params:
        return int(params["cond_nconsts"]), int(params["body_nconsts"])
    cond: Any = params.get("cond_jaxpr")
    body: Any = params.get("body_jaxpr")
    try:
        on_cond, on_body = len(cond.in_avals), len(body.in_avals)
    except AttributeError:
        raise NotImplementedError(
            f"shardrules does not know how this JAX ({jax.__version__}) gives a `while`'s constants "
            f"(its parameters: {sorted(params)}); shardrules is tested with JAX 0.8 to 0.12"
        ) from None
    carry = on_cond + on_body - operands
    return on_cond - carry, on_body - carry


def trace_state_clean() -> bool:
    """Whether no JAX transformation is tracing the caller. Where this JAX
    does not say, whether a new array is a tracer (true inside `jax.jit`,
    not inside `jax.grad` or `jax.vmap` alone)."""
    clean = _private("jax._src.core", "trace_state_clean", None)
    if clean is not None:
        return bool(clean())
    return not isinstance(jax.numpy.zeros(()), jax.core.Tracer)


def backends_started() -> bool:
    """Whether JAX has started its backends (after which the platform and
    the number of CPU devices are fixed). Where this JAX does not say, taken
    as started, so that no setting is changed under a running JAX."""
    started = _private("jax._src.xla_bridge", "backends_are_initialized", None)
    return True if started is None else bool(started())


def user_context(eqn: Any) -> contextlib.AbstractContextManager[Any]:
    """The context in which binding `eqn`'s primitive again gives its results
    `eqn`'s source information (the user's traceback, its scope names under
    the current ones); where this JAX has no such context, none."""
    source_info_util = _private("jax._src", "source_info_util", None)
    try:
        name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack  # type: ignore[union-attr]
        return source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack)  # type: ignore[union-attr]
    except AttributeError:
        return contextlib.nullcontext()


def rebind(primitive: Any, values: Sequence[Any], params: dict[str, Any]) -> Any:
    """`primitive` bound again to `values` with an equation's `params`.

    `Primitive.get_bind_params` turns an equation's parameters into `bind`'s
    (a call primitive's sub-computation into a function): JAX 0.8 returns
    `(subfuns, params)` and wants the functions as `bind`'s first arguments,
    JAX 0.10 to 0.12 return the parameters alone."""
    got = primitive.get_bind_params(params)
    if isinstance(got, dict):
        return primitive.bind(*values, **got)
    subfuns, got = got
    return primitive.bind(*subfuns, *values, **got)


def trace_replicated(trace: Callable[..., Any], args: Sequence[Any], mesh: Any) -> Any:
    """`trace(*args)`, `args` (pytrees of `ShapeDtypeStruct`s) traced
    without a layout; where JAX cannot decide a layout so, `trace` again with
    them typed as replicated on `mesh` (an abstract mesh), and JAX's first
    error if that fails too.

    A value traced without a layout is typed on no mesh. JAX 0.10 to 0.12
    lay out the gradient of a contraction between such a value and an array
    sharded on the mesh (an array the function closes over); JAX 0.8 refuses
    it, but settles it when the value is typed replicated on the mesh.

    `with_sharding_constraint`'s assert on Explicit axes is recorded in the
    trace, not made (`_asserts`): it is made on the layouts the values have
    when the trace is evaluated with them."""
    from ._asserts import deferred

    with deferred():
        try:
            return trace(*args)
        except (ShardingTypeError, DuplicateSpecError) as err:
            try:
                return trace(*replicated_on(args, mesh))
            except (ShardingTypeError, DuplicateSpecError):
                raise err from None


def replicated_on(args: Sequence[Any], mesh: Any) -> list[Any]:
    """`args` (pytrees of `ShapeDtypeStruct`s) typed as replicated on `mesh`."""
    from jax.sharding import NamedSharding, PartitionSpec

    replicated = NamedSharding(mesh, PartitionSpec())

    def typed(s: Any) -> Any:
        weak = bool(getattr(s, "weak_type", False))
        return jax.ShapeDtypeStruct(s.shape, s.dtype, weak_type=weak, sharding=replicated)

    return [jax.tree.map(typed, a) for a in args]


def explicit_mesh_context(mesh: Any) -> contextlib.AbstractContextManager[Any]:
    """`jax.set_mesh(mesh)` where `mesh` has Explicit axes and is not JAX's
    mesh already (inside another trace, where `set_mesh` is refused, the
    mesh's abstract form); else no context. JAX 0.8 runs a `jax.shard_map`
    on Explicit axes outside `jax.jit` only inside it; later JAX needs none."""
    from .._planning._mesh import ambient_mesh

    if not getattr(mesh, "explicit_axes", ()) or ambient_mesh() in (mesh, mesh.abstract_mesh):
        return contextlib.nullcontext()
    return mesh_context(mesh)


def mesh_context(mesh: Any) -> contextlib.AbstractContextManager[Any]:
    """`mesh`'s abstract form as the mesh a trace types its values on and,
    where `mesh` has devices, those devices for what the trace computes
    eagerly: a constant made under `jax.ensure_compile_time_eval` (rotary
    frequencies, say) is compiled and run while the trace is made, and JAX
    refuses to compile on an abstract mesh alone. Outside any trace that is
    `jax.set_mesh(mesh)`; inside one, where `set_mesh` is refused, the
    abstract mesh with JAX's private `_internal_use_concrete_mesh` (JAX 0.8
    to 0.12; where a JAX lacks it, the abstract mesh alone)."""
    if isinstance(mesh, jax.sharding.Mesh) and trace_state_clean():
        return jax.set_mesh(mesh)
    stack = contextlib.ExitStack()
    concrete = _private("jax._src.sharding_impls", "_internal_use_concrete_mesh", None)
    if isinstance(mesh, jax.sharding.Mesh) and concrete is not None:
        stack.enter_context(concrete(mesh))
    stack.enter_context(jax.sharding.use_abstract_mesh(mesh.abstract_mesh))
    return stack
