"""What differs between JAX 0.8 and 0.12 (`shardrules._tracing._compat`),
checked against the installed JAX: a release that renames a primitive
parameter or a private name shardrules reads fails here, by name."""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.extend.core  # the tests read its `Literal`; shardrules imports it only when tracing
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from shardrules._planning._plan import spec_repr
from shardrules._tracing import _compat


def eqns_named(closed, name: str) -> list:
    """Every equation of primitive `name` in `closed`, nested ones included."""
    found = []

    def walk(jaxpr) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == name:
                found.append(eqn)
            for value in eqn.params.values():
                for sub in value if isinstance(value, tuple | list) else [value]:
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(closed.jaxpr)
    return found


# ---------------------------------------------------------------- scan and while


def test_scan_counts_reads_the_installed_jaxs_scan() -> None:
    """Two constants (closed over), a carry of three arrays, one scanned input."""

    def f(a, b, c0, c1, c2, xs):
        def body(carry, x):
            p, q, r = carry
            return (p * a + x, q + b, r * 2.0), p.sum()

        return jax.lax.scan(body, (c0, c1, c2), xs)

    ones = jnp.ones(4)
    closed = jax.make_jaxpr(f)(ones, ones, ones, ones, ones, jnp.ones((5, 4)))
    (eqn,) = eqns_named(closed, "scan")
    consts, carry = _compat.scan_counts(dict(eqn.params))
    assert (consts, carry) == (2, 3)
    assert len(eqn.invars) == consts + carry + 1
    assert len(eqn.outvars) == carry + 1


def test_scan_counts_reads_both_forms_and_names_an_unknown_one() -> None:
    assert _compat.scan_counts({"num_consts": 1, "num_carry": 2, "jaxpr": None}) == (1, 2)  # JAX 0.8 to 0.10

    class Tree:  # JAX 0.11 and 0.12: `ft_in`: the operands as (consts, carry, xs)
        def unpack(self):
            return ([None] * 3, [None] * 4, [None])

    assert _compat.scan_counts({"ft_in": Tree(), "jaxpr": None}) == (3, 4)
    with pytest.raises(NotImplementedError, match=r"`scan`'s constants and carry .*\['jaxpr', 'length'\]"):
        _compat.scan_counts({"jaxpr": None, "length": 3})


def test_while_counts_from_the_parameters_and_from_the_arities() -> None:
    def f(a, b, x):
        return jax.lax.while_loop(lambda c: c[0].sum() < a, lambda c: (c[0] + b, c[1] * 2.0), (x, x))

    closed = jax.make_jaxpr(f)(1.0, jnp.ones(3), jnp.ones(3))
    (eqn,) = eqns_named(closed, "while")
    params = dict(eqn.params)
    assert _compat.while_counts(params, len(eqn.invars)) == (1, 1)
    without = {k: v for k, v in params.items() if k not in ("cond_nconsts", "body_nconsts")}
    assert _compat.while_counts(without, len(eqn.invars)) == (1, 1)
    with pytest.raises(NotImplementedError, match="`while`'s constants"):
        _compat.while_counts({}, 3)


# ---------------------------------------------------------------- binding again


def test_rebind_evaluates_every_equation_as_jax_does() -> None:
    """Each equation bound again (a nested jit, custom derivatives, a remat, a
    loop: on JAX 0.8 some give `bind` functions first) gives JAX's results."""

    @jax.custom_jvp
    def g(a):
        return jnp.sin(a)

    g.defjvp(lambda p, t: (g(p[0]), jnp.cos(p[0]) * t[0]))

    @jax.custom_vjp
    def h(a):
        return jnp.tanh(a)

    h.defvjp(lambda a: (h(a), a), lambda a, ct: (ct * (1 - jnp.tanh(a) ** 2),))

    def f(x):
        y = jax.jit(lambda v: v * 2.0)(x)
        y = jax.checkpoint(lambda v: jnp.exp(v) * 0.5)(g(y))
        y, _ = jax.lax.scan(lambda c, _: (c + 1.0, None), y, length=2)
        return h(y).sum()

    x = jnp.linspace(0.0, 1.0, 8)
    closed = jax.make_jaxpr(f)(x)
    names = {e.primitive.name for e in closed.jaxpr.eqns}
    assert {"custom_jvp_call", "custom_vjp_call", "scan"} <= names or "custom_vjp_call_jaxpr" in names

    def evaluate(jaxpr, consts, *args):
        env = dict(zip(jaxpr.constvars, consts, strict=True)) | dict(zip(jaxpr.invars, args, strict=True))
        read = lambda v: v.val if isinstance(v, jax.extend.core.Literal) else env[v]  # noqa: E731
        for eqn in jaxpr.eqns:
            out = _compat.rebind(eqn.primitive, [read(v) for v in eqn.invars], dict(eqn.params))
            out = out if eqn.primitive.multiple_results else [out]
            env.update(zip(eqn.outvars, out, strict=True))
        return [read(v) for v in jaxpr.outvars]

    (got,) = evaluate(closed.jaxpr, closed.consts, x)
    np.testing.assert_allclose(got, f(x), rtol=1e-6)
    grad = jax.grad(lambda v: evaluate(closed.jaxpr, closed.consts, v)[0])(x)
    np.testing.assert_allclose(grad, jax.grad(f)(x), rtol=1e-5)


# ---------------------------------------------------------------- private names


def test_the_errors_are_the_ones_jax_raises() -> None:
    assert _compat.ShardingTypeError is not _compat._NeverRaised
    assert _compat.DuplicateSpecError is not _compat._NeverRaised
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    a = jax.device_put(jnp.ones((16, 64)), NamedSharding(mesh, P(None, "data")))
    b = jax.device_put(jnp.ones((64, 16)), NamedSharding(mesh, P("data", None)))
    with jax.set_mesh(mesh), pytest.raises(_compat.ShardingTypeError):
        jax.jit(lambda a, b: a @ b)(a, b)  # contracted over `data` on both sides: ambiguous
    with pytest.raises(_compat.DuplicateSpecError):
        NamedSharding(mesh, P("data", "data"))


def test_shaped_array_is_the_type_of_abstract_values() -> None:
    assert isinstance(jax.typeof(jnp.ones(3)), _compat.ShapedArray)


def test_a_private_name_a_jax_lacks_falls_back() -> None:
    assert _compat._private("jax._src.core", "NoSuchName", "fallback") == "fallback"
    assert _compat._private("jax._src.no_such_module", "x", None) is None
    with pytest.raises(ValueError):  # the stand-in class is never raised: `except` catches nothing
        try:
            raise ValueError("x")
        except _compat._NeverRaised:
            pass


def test_trace_state_clean_and_its_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    jax.jit(lambda x: seen.append(_compat.trace_state_clean()) or x)(1.0)
    assert _compat.trace_state_clean() and seen == [False]
    private = _compat._private
    monkeypatch.setattr(
        _compat, "_private", lambda m, n, f: None if n == "trace_state_clean" else private(m, n, f)
    )
    jax.jit(lambda x: seen.append(_compat.trace_state_clean()) or x)(2.0)
    assert _compat.trace_state_clean() and seen == [False, False]


def test_backends_started_and_its_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    jax.devices()  # the tests' 8 CPU devices: started
    assert _compat.backends_started() is True
    private = _compat._private
    monkeypatch.setattr(
        _compat, "_private", lambda m, n, f: f if n == "backends_are_initialized" else private(m, n, f)
    )
    assert _compat.backends_started() is True  # not known: nothing is changed under a running JAX


def test_the_multihost_store_client_and_its_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client `jax.distributed.initialize` makes, read from where this JAX
    keeps it; on a JAX whose `jax._src.distributed` is gone, none (the records
    are then all-gathered)."""
    import sys

    from jax._src import distributed

    from shardrules._placement import _exchange

    client = object()
    monkeypatch.setattr(distributed.global_state, "client", client)
    assert _exchange._client() is client
    monkeypatch.delattr(sys.modules["jax._src"], "distributed")
    monkeypatch.setitem(sys.modules, "jax._src.distributed", None)  # `import` raises ImportError
    assert _exchange._client() is None


def test_user_context_keeps_the_scope_names_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def f(x):
        with jax.named_scope("layer"):
            return jnp.sin(x) * 2.0

    closed = jax.make_jaxpr(f)(1.0)

    def again(x):
        env = {closed.jaxpr.invars[0]: x}
        read = lambda v: v.val if isinstance(v, jax.extend.core.Literal) else env[v]  # noqa: E731
        for eqn in closed.jaxpr.eqns:
            with _compat.user_context(eqn):
                env[eqn.outvars[0]] = _compat.rebind(
                    eqn.primitive, [read(v) for v in eqn.invars], dict(eqn.params)
                )
        return read(closed.jaxpr.outvars[0])

    retraced = jax.make_jaxpr(again)(1.0)
    assert all("layer" in str(e.source_info.name_stack) for e in retraced.jaxpr.eqns)
    private = _compat._private
    monkeypatch.setattr(
        _compat, "_private", lambda m, n, f: None if n == "source_info_util" else private(m, n, f)
    )
    assert isinstance(_compat.user_context(closed.jaxpr.eqns[0]), contextlib.nullcontext)


def test_elementwise_primitives_from_jaxs_batching_rules_and_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_outputs.elementwise` reads JAX's batching rules; where they are gone,
    the common element-wise primitives by name."""
    import sys

    from shardrules._tracing import _outputs

    common = {"add", "mul", "tanh", "exp", "max", "integer_pow"}
    from_jax = _outputs.elementwise.__wrapped__()
    assert common <= from_jax and len(from_jax) > 60
    monkeypatch.setitem(sys.modules, "jax._src.interpreters.batching", None)
    monkeypatch.delattr(sys.modules["jax._src.interpreters"], "batching")
    by_name = _outputs.elementwise.__wrapped__()
    assert common <= by_name and by_name < from_jax


def test_source_line_names_the_users_line_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from shardrules._tracing._layouts import source_line

    closed = jax.make_jaxpr(lambda x: jnp.sin(x))(1.0)
    assert source_line(closed.jaxpr.eqns[0]).startswith(f"{__file__}:")
    monkeypatch.setitem(sys.modules, "jax._src.source_info_util", None)
    monkeypatch.delattr(sys.modules["jax._src"], "source_info_util")
    assert source_line(closed.jaxpr.eqns[0]) == ""


# ---------------------------------------------------------------- layouts


def test_a_closed_over_sharded_array_is_traced_with_values_typed_on_the_mesh_if_need_be() -> None:
    """The gradient of `x @ w`, `x` closed over and split over `data`, `w`
    traced without a layout: JAX 0.8 refuses it on no mesh and settles it
    replicated on the mesh; later JAX settles the first."""
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    x = jax.device_put(jnp.ones((128, 64)), NamedSharding(mesh, P("data", None)))
    a = jax.device_put(jnp.ones((16, 128)), NamedSharding(mesh, P(None, "data")))
    w = jax.ShapeDtypeStruct((64, 16), jnp.float32)
    shapes = functools.partial(jax.eval_shape, jax.grad(lambda w: (x @ w).sum()))
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        assert _compat.trace_replicated(shapes, [w], mesh.abstract_mesh).shape == (64, 16)
        (typed,) = _compat.replicated_on([w], mesh.abstract_mesh)
        assert typed.sharding.spec == P() and typed.sharding.mesh == mesh.abstract_mesh
        # what neither settles (two closed-over arrays contracted over `data`): JAX's first error
        both = functools.partial(jax.eval_shape, lambda y: y + a @ x)
        with pytest.raises(_compat.ShardingTypeError):
            _compat.trace_replicated(both, [jax.ShapeDtypeStruct((16, 64), jnp.float32)], mesh.abstract_mesh)


@pytest.mark.parametrize(
    ("spec", "text"),
    [(P(), "P()"), (P("data"), "P('data',)"), (P(None, ("data", "model")), "P(None, ('data', 'model'))")],
)
def test_spec_repr_writes_specs_as_newer_jax_does(spec, text) -> None:
    assert spec_repr(spec) == text
    assert spec_repr("PartitionSpec(None, 'model')") == "P(None, 'model')"  # JAX 0.8's words


def test_an_explicit_mesh_is_entered_once_and_an_auto_one_never() -> None:
    explicit = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    auto = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    assert isinstance(_compat.explicit_mesh_context(auto), contextlib.nullcontext)
    with _compat.explicit_mesh_context(explicit):
        assert jax.sharding.get_abstract_mesh() == explicit.abstract_mesh
        assert isinstance(_compat.explicit_mesh_context(explicit), contextlib.nullcontext)


def test_mesh_context_lets_a_trace_compute_a_constant_on_the_meshs_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    with _compat.mesh_context(mesh):  # outside a trace: `jax.set_mesh`
        assert jax.sharding.get_mesh() == mesh

    made = []

    def eager(x: jax.Array) -> jax.Array:
        with _compat.mesh_context(mesh):
            assert jax.sharding.get_abstract_mesh() == mesh.abstract_mesh
            with jax.ensure_compile_time_eval():  # compiled and run while the trace is made
                made.append(jnp.cos(jnp.arange(4) / 4.0))
        return x

    jax.make_jaxpr(eager)(jnp.zeros(4))
    np.testing.assert_allclose(np.asarray(made[0]), np.cos(np.arange(4) / 4.0), rtol=1e-6)
    private = _compat._private
    monkeypatch.setattr(
        _compat, "_private", lambda m, n, f: None if n == "_internal_use_concrete_mesh" else private(m, n, f)
    )

    def abstract_only(x: jax.Array) -> jax.Array:
        with _compat.mesh_context(mesh):  # a JAX without the private name: the abstract mesh alone
            assert jax.sharding.get_abstract_mesh() == mesh.abstract_mesh
        return x

    jax.jit(abstract_only)(1.0)


# ---------------------------------------------------------------- with_sharding_constraint's assert
def test_with_sharding_constraints_assert_is_recorded_in_the_replicated_trace_and_made_outside() -> None:
    """JAX makes the assert by calling `jax._src.pjit.assert_shardings_equal`
    from `with_sharding_constraint`, whose value `_asserts` reads: inside
    `trace_replicated` the constraint is a `sharding_assert` equation (also
    under `jax.vmap`, and in a remat region under `jax.grad`, where JAX's
    `dce_rules` keep it), outside it JAX's assert as before."""
    from jax._src import pjit

    assert callable(pjit.assert_shardings_equal)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))

    def step(w):
        w = jax.lax.with_sharding_constraint(w, P("data", None))
        rows = jax.vmap(lambda r: jax.lax.with_sharding_constraint(r, P(None)))(w)
        # in a remat region, which the gradient's partial evaluation prunes of what nothing uses
        remat = jax.checkpoint(lambda w: (jax.lax.with_sharding_constraint(w, P("data", None)) ** 2).sum())
        return jax.grad(remat)(rows)

    arg = jax.ShapeDtypeStruct((16, 4), jnp.float32)
    with jax.set_mesh(mesh):
        closed = _compat.trace_replicated(jax.make_jaxpr(step), [arg], mesh.abstract_mesh)
        with pytest.raises(AssertionError, match="acts as an assert"):
            jax.make_jaxpr(lambda w: step(w))(arg)  # outside it (a new function: JAX caches traces)
    found = eqns_named(closed, "sharding_assert")
    made = [(e.params["spec"], e.params["mapped"]) for e in found]
    assert made[:2] == [(P("data", None), ()), (P(None), (0,))], made
    assert made[2:] and set(made[2:]) == {(P("data", None), ())}, (
        made
    )  # the remat's (and its recomputation's)
