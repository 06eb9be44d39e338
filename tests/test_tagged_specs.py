"""`PartitionSpec`s that carry `unreduced`/`reduced` axes, meshes made with
`make_mesh(axis_sizes=)`, and specs longer than an array's rank, through every
public entry point that reads a spec.

Newer JAX refuses to iterate or index a spec with `unreduced` or `reduced`
axes (`P(*spec)`, `spec[0]` raise and ask for `spec.partitions`); JAX 0.8 has
no `partitions`, and its tagged specs iterate. shardrules reads every spec
through `shardrules._pspec`. A value whose parameter is `reduced` along an
axis gets an `unreduced` gradient there: `sr.jit` must give it the layout
`jax.jit` gives it, with the same values.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules import _pspec


def _tagged_specs() -> bool:
    try:
        return P("a", reduced=frozenset({"b"})).reduced == frozenset({"b"})
    except TypeError:  # a JAX whose PartitionSpec takes no `reduced`
        return False


TAGS = _tagged_specs()
needs_tags = pytest.mark.skipif(not TAGS, reason="this JAX's PartitionSpec has no unreduced/reduced axes")

RULES = sr.loads(
    "mesh data, model\n"
    "rules params:\n"
    '  "w$" -> (data, model)\n'
    "rules inputs:\n"
    '  "^b$" -> (data, _)\n'
    "rules activations:\n"
    '  "h$" -> (data, _)\n',
    name="tagged.shard",
)


def explicit() -> jax.sharding.Mesh:
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


def arrays(mesh: jax.sharding.Mesh) -> tuple[jax.Array, jax.Array]:
    """A weight replicated and `reduced` along `data` (its gradient is unreduced
    there), and a batch split along `data`."""
    rng = np.random.default_rng(0)
    w = jax.device_put(
        rng.standard_normal((16, 4)).astype(np.float32),
        NamedSharding(mesh, P(None, None, reduced=frozenset({"data"}))),
    )
    b = jax.device_put(rng.standard_normal((8, 16)).astype(np.float32), NamedSharding(mesh, P("data", None)))
    return w, b


def grad_step(w: Any, b: Any) -> Any:
    def loss(w: Any) -> Any:
        with jax.named_scope("h"):
            h = jnp.tanh(b @ w)
        return h.sum()

    return jax.grad(loss)(w)


def summed(mesh: jax.sharding.Mesh, value: jax.Array) -> np.ndarray:
    """An unreduced array's values (its partial sums added up), on the host."""
    with jax.set_mesh(mesh):
        return np.asarray(jax.jit(lambda g: jax.sharding.reshard(g, P(*(None,) * g.ndim)))(value))


# ---------------------------------------------------------------- the helper


@pytest.mark.parametrize(
    "spec, entries",
    [(P(), ()), (P("data"), ("data",)), (P(("data", "model"), None), (("data", "model"), None))],
)
def test_entries_of_plain_specs(spec: P, entries: tuple[Any, ...]) -> None:
    assert _pspec.entries(spec) == entries
    assert _pspec.with_entries(spec, entries) == spec
    assert _pspec.tags(spec) == (frozenset(), frozenset())
    assert _pspec.cotangent(spec) is spec
    assert _pspec.padded(spec, 3) == P(*entries, *(None,) * (3 - len(entries)))


@needs_tags
def test_entries_of_tagged_specs_on_this_jax() -> None:
    spec = P("data", None, unreduced=frozenset({"model"}))
    if hasattr(spec, "partitions"):  # where JAX reads the entries from `partitions`, it refuses iteration
        with pytest.raises(ValueError, match="partitions"):
            P(*spec)
    assert _pspec.entries(spec) == ("data", None)
    assert _pspec.entry(spec, 0) == "data" and _pspec.entry(spec, 5) is None
    assert _pspec.tags(spec) == (frozenset({"model"}), frozenset())
    wider = _pspec.padded(spec, 3)
    assert _pspec.entries(wider) == ("data", None, None) and wider.unreduced == frozenset({"model"})
    moved = _pspec.with_entries(spec, (None, "data"))
    assert _pspec.entries(moved) == (None, "data") and moved.unreduced == frozenset({"model"})
    assert _pspec.described(spec) == "P('data', None, unreduced={'model'})"
    # The cotangent of a value reduced along an axis is unreduced there, and the reverse.
    reduced = P(None, "model", reduced=frozenset({"data"}))
    ct = _pspec.cotangent(reduced)
    assert _pspec.entries(ct) == (None, "model") and ct.unreduced == frozenset({"data"}) and not ct.reduced
    assert _pspec.cotangent(ct).reduced == frozenset({"data"})


def test_entries_fall_back_to_iteration_without_partitions() -> None:
    """JAX 0.8's PartitionSpec has no `partitions`: its specs, tagged or not, iterate."""

    class OldSpec(tuple):
        unreduced = frozenset({"model"})
        reduced: frozenset[str] = frozenset()

        def update(self, **kwargs: Any) -> Any:
            return ("updated", kwargs)

    old = OldSpec(("data", None))
    assert not hasattr(old, "partitions")
    assert _pspec.entries(old) == ("data", None)  # type: ignore[arg-type]
    assert _pspec.tags(old) == (frozenset({"model"}), frozenset())  # type: ignore[arg-type]
    # No `to_ct_spec`: the swap is made with `update`.
    assert _pspec.cotangent(old) == ("updated", {"unreduced": frozenset(), "reduced": frozenset({"model"})})  # type: ignore[arg-type]
    assert _pspec.with_entries(old, ("data",)) == ("updated", {"partitions": ("data",)})  # type: ignore[arg-type]


# ---------------------------------------------------------------- entry points


@needs_tags
def test_jit_gives_a_reduced_weights_gradient_the_layout_jax_jit_gives() -> None:
    mesh = explicit()
    w, b = arrays(mesh)
    with jax.set_mesh(mesh):
        expected = jax.jit(grad_step)(w, b)
    step = sr.jit(grad_step, RULES, mesh)
    got = step(w, b)
    assert jax.typeof(got).sharding.spec == jax.typeof(expected).sharding.spec
    assert _pspec.tags(jax.typeof(got).sharding.spec)[0] == frozenset({"data"})  # unreduced, as JAX has it
    np.testing.assert_allclose(summed(mesh, got), summed(mesh, expected), rtol=1e-5)
    # What a step says about itself reads the same specs.
    assert step.cost(w, b).flops_per_device > 0


@needs_tags
def test_activation_rules_and_auto_constrain_on_values_with_tagged_layouts() -> None:
    mesh = explicit()
    w, b = arrays(mesh)

    def forward(w: Any, b: Any) -> Any:
        with jax.named_scope("h"):
            return b @ w

    with jax.set_mesh(mesh):
        expected = jax.jit(forward)(w, b)
        auto = jax.jit(sr.auto_constrain(forward, RULES))(w, b)
    got = sr.jit(forward, RULES, mesh)(w, b)
    for out in (got, auto):
        assert _pspec.entries(jax.typeof(out).sharding.spec) == ("data", None)
        np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-5)


@needs_tags
def test_constrain_a_value_whose_layout_is_tagged() -> None:
    mesh = explicit()
    _, b = arrays(mesh)
    reduced = jax.device_put(
        np.asarray(b), NamedSharding(mesh, P("data", None, reduced=frozenset({"model"})))
    )
    with jax.set_mesh(mesh):
        out = jax.jit(lambda t: sr.constrain(t, RULES))({"w": reduced})["w"]
    assert _pspec.entries(jax.typeof(out).sharding.spec) == ("data", "model")
    np.testing.assert_array_equal(np.asarray(out), np.asarray(b))


@needs_tags
def test_shard_map_takes_tagged_specs_in_its_groups() -> None:
    mesh = explicit()
    _, b = arrays(mesh)
    spec = P("data", None, reduced=frozenset({"model"}))
    x = jax.device_put(np.asarray(b), NamedSharding(mesh, spec))
    try:
        expected = jax.shard_map(lambda a: a + a, mesh=mesh, in_specs=spec, out_specs=spec)(x)
    except ValueError as err:  # JAX 0.8 drops the tag from its own out_specs
        pytest.skip(f"this JAX's own shard_map refuses a reduced spec: {str(err).splitlines()[0]}")
    mapped = sr.shard_map(lambda a: a + a, RULES, mesh, in_groups=(spec,), out_groups=spec)
    assert mapped.specs(x) == ((spec,), spec)
    got = mapped(x)
    assert jax.typeof(got).sharding.spec == jax.typeof(expected).sharding.spec == jax.typeof(x).sharding.spec
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    # Checked as any literal spec: too long for the array is SR103, in our words.
    with pytest.raises(sr.PlanError) as err:
        sr.shard_map(
            lambda a: a,
            RULES,
            mesh,
            in_groups=(P("data", None, None, reduced=frozenset({"model"})),),
            out_groups=spec,
        )(x)
    assert err.value.code == "SR103"
    assert "has 3 entries but the array has 2 dimensions (shape (8, 16))" in str(err.value)
    with pytest.raises(sr.MeshError) as err:
        sr.shard_map(
            lambda a: a,
            RULES,
            mesh,
            in_groups=(P("fsdp", None, reduced=frozenset({"model"})),),
            out_groups=spec,
        )(x)
    assert err.value.code == "SR101" and "mesh axis `fsdp`" in str(err.value)


@needs_tags
def test_placing_and_planning_arrays_laid_out_with_tags() -> None:
    mesh = explicit()
    _, b = arrays(mesh)
    reduced = jax.device_put(
        np.asarray(b), NamedSharding(mesh, P("data", None, reduced=frozenset({"model"})))
    )
    tree = {"w": reduced}
    assert sr.plan(tree, RULES, mesh).leaves[0].spec == P("data", "model")
    assert not [d for d in sr.check(tree, RULES, mesh) if d.severity == "error"]
    for out in (sr.apply(tree, RULES, mesh)["w"], sr.reshard(tree, RULES, mesh)["w"]):
        assert out.sharding.spec == P("data", "model")
        np.testing.assert_array_equal(np.asarray(out), np.asarray(b))


@needs_tags
def test_converted_rules_read_tagged_specs_and_say_what_is_left_out() -> None:
    conversion = sr.convert_regex(
        [("attn/kernel", P("data", None, unreduced=frozenset({"model"}))), (".*", P(None))]
    )
    assert '"attn/kernel" -> (data, _, ...)' in conversion.text
    assert any("unreduced" in note and "not converted" in note for note in conversion.notes)


def test_specs_longer_than_the_rank_are_refused_in_our_words_on_explicit_axes() -> None:
    """JAX refuses a spec longer than an array's rank (on Explicit axes when the
    value is typed, as a raw ValueError): a rule or a spec given is refused first."""
    mesh = explicit()
    x = jax.device_put(np.ones((8, 16), np.float32), NamedSharding(mesh, P("data", None)))
    with pytest.raises(sr.PlanError) as err:
        sr.shard_map(lambda a: a, RULES, mesh, in_groups=(P("data"),), out_groups=P("data", None, None))(x)
    assert err.value.code == "SR103" and "the out_groups entry for the output" in str(err.value)
    too_long = sr.loads('mesh data, model\nrules params:\n  "w$" -> (data, model, _)\n')
    for call in (
        lambda: sr.apply({"w": x}, too_long, mesh),
        lambda: sr.jit(lambda t: t, too_long, mesh, in_groups=("params",))({"w": x}),
        lambda: sr.reshard({"w": x}, too_long, mesh),
    ):
        with pytest.raises(sr.PlanError) as err:
            call()
        assert err.value.code == "SR103" and "`w`" in str(err.value)


@pytest.mark.skipif(
    "axis_sizes" not in inspect.signature(jax.make_mesh).parameters,
    reason="this JAX's make_mesh names its sizes axis_shapes",
)
def test_meshes_made_with_axis_sizes() -> None:
    rules = sr.loads('mesh data, model\nrules params:\n  "w$" -> (data, model)\n')
    newer = {"axis_sizes": (2, 4), "axis_names": ("data", "model")}  # the keywords of newer JAX
    mesh = jax.make_mesh(**newer, axis_types=(AxisType.Explicit,) * 2)
    x = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    placed = sr.apply({"w": x}, rules, mesh)["w"]
    assert placed.sharding.spec == P("data", "model") and placed.sharding.mesh == mesh
    assert sr.specs({"w": x}, rules, mesh)["w"] == P("data", "model")
    step = sr.jit(
        lambda t: jax.tree.map(lambda v: v * 2, t), rules, mesh, in_groups=("params",), out_groups="params"
    )
    np.testing.assert_array_equal(np.asarray(step({"w": placed})["w"]), 2 * x)
    with jax.set_mesh(mesh):
        ambient = sr.apply({"w": x}, rules)["w"]
    assert ambient.sharding.spec == P("data", "model")
