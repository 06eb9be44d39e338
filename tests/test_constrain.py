"""Sharding constraints from rules: by path, by name, automatically on named scopes, and `sr.jit`."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr

RULES = sr.loads(
    r"""mesh data, model

rules params:
  "w_up$"   -> (_, model)
  "w_down$" -> (model, _)
  "scale$"  -> replicated

rules activations:
  "block_\d+/up$" -> (data, model)
  "block_\d+$"    -> (data, _)

rules inputs:
  "x" -> (data, _)
""",
    name="acts.shard",
)


def constraints(text: str) -> list[str]:
    """The sharding of every `sdy.sharding_constraint` in lowered StableHLO, in order."""
    return re.findall(r"sdy\.sharding_constraint %\S+ <@\w+, (\[.*?\])>", text)


def model(params, x, blocks=2):
    for i in range(blocks):
        with jax.named_scope(f"block_{i}"):
            with jax.named_scope("up"):
                h = x @ params["w_up"]
            h = jax.nn.gelu(h)
            with jax.named_scope("unmatched"):
                h = h * 2.0
            x = x + h @ params["w_down"] * params["scale"]
    return x


def make(seed=0):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    params = {
        "w_up": jax.random.normal(k1, (16, 32)) * 0.1,
        "w_down": jax.random.normal(k2, (32, 16)) * 0.1,
        "scale": jnp.ones(()),
    }
    return params, jax.random.normal(k3, (8, 16))


def test_auto_constrain_puts_a_constraint_on_every_matching_scope_output_and_nowhere_else(mesh42):
    params, x = make()
    f = jax.jit(sr.auto_constrain(model, RULES, mesh42))
    found = constraints(f.lower(params, x).as_text())
    up, block = '[{"data"}, {"model"}]', '[{"data"}, {}]'
    assert found == [up, block, up, block]
    np.testing.assert_allclose(f(params, x), jax.jit(model)(params, x), rtol=1e-5, atol=1e-6)


def test_without_matching_rules_nothing_is_added(mesh42):
    params, x = make()
    rules = sr.loads('mesh data, model\nrules activations:\n  "no_such_scope" -> (data, _)\n')
    f = jax.jit(sr.auto_constrain(model, rules, mesh42))
    with pytest.warns(sr.ShardRulesWarning, match="SR211"):
        assert constraints(f.lower(params, x).as_text()) == []


def test_several_outputs_are_matched_leaf_by_leaf(mesh42):
    rules = sr.loads('mesh data, model\nrules activations:\n  "attn/1$" -> (data, model)\n')

    def f(x):
        with jax.named_scope("attn"):
            a, b = x * 2, x + 1
        return a @ b.T, b

    g = jax.jit(sr.auto_constrain(f, rules, mesh42))
    assert constraints(g.lower(jnp.ones((8, 8))).as_text()) == ['[{"data"}, {"model"}]']


def test_rank_mismatch_names_the_scope_shape_and_rule(mesh42):
    rules = sr.loads(
        'mesh data, model\nrules activations:\n  "block_0/up$" -> (data, _, model)\n', name="bad.shard"
    )
    params, x = make()
    with pytest.raises(sr.PlanError) as info:
        jax.jit(sr.auto_constrain(model, rules, mesh42))(params, x)
    err = info.value
    assert err.code == "SR103" and err.path == "block_0/up"
    assert (
        "(8, 32)" in str(err) and err.span is not None and (err.span.file, err.span.line) == ("bad.shard", 3)
    )


def test_scopes_inside_scan_and_nested_jit_are_constrained(mesh42):
    params, x = make()

    @jax.jit
    def inner(p, h):
        return model(p, h, blocks=1)

    def f(p, h):
        def body(carry, _):
            return inner(p, carry), None

        with jax.named_scope("stack"):
            out, _ = jax.lax.scan(body, h, None, length=3)
        return out

    rules = sr.loads('mesh data, model\nrules activations:\n  "stack/block_\\d+/up$" -> (data, model)\n')
    g = jax.jit(sr.auto_constrain(f, rules, mesh42))
    assert constraints(g.lower(params, x).as_text()) == ['[{"data"}, {"model"}]']
    np.testing.assert_allclose(g(params, x), jax.jit(f)(params, x), rtol=1e-5, atol=1e-6)


def test_gradients_flow_through_constrained_functions(mesh42):
    params, x = make()
    loss = lambda p, x: (model(p, x) ** 2).mean()  # noqa: E731
    constrained = lambda p, x: (sr.auto_constrain(model, RULES, mesh42)(p, x) ** 2).mean()  # noqa: E731
    got = jax.jit(jax.grad(constrained))(params, x)
    want = jax.jit(jax.grad(loss))(params, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_constrain_by_path_gives_the_shardings_apply_gives(mesh42):
    params, x = make()
    placed = sr.apply(params, RULES, mesh42)

    @jax.jit
    def step(p, x):
        grads = jax.grad(lambda p: (model(p, x) ** 2).mean())(p)
        return sr.constrain(grads, RULES, mesh42)

    grads = step(placed, x)
    for g, p in zip(jax.tree.leaves(grads), jax.tree.leaves(placed), strict=True):
        assert g.sharding.is_equivalent_to(p.sharding, g.ndim)


def test_constrain_by_name_uses_the_activations_group(mesh42):
    @jax.jit
    def f(x):
        return sr.constrain(x * 2, RULES, mesh42, name="block_3/up")

    lowered = f.lower(jnp.ones((8, 32))).as_text()
    assert constraints(lowered) == ['[{"data"}, {"model"}]']
    # A pytree's leaves are matched as NAME/PATH; names no rule matches are left alone.
    with jax.set_mesh(mesh42):
        g = jax.jit(lambda x: sr.constrain({"a": x, "b": [x]}, RULES, name="block_1/up"))
        assert constraints(g.lower(jnp.ones((8, 4))).as_text()) == []
        h = jax.jit(lambda x: sr.constrain({"a": x}, RULES, name="block_1"))
        assert constraints(h.lower(jnp.ones((8, 4))).as_text()) == []
        k = jax.jit(lambda x: sr.constrain(x, RULES, name="block_1"))
        assert constraints(k.lower(jnp.ones((8, 4))).as_text()) == ['[{"data"}, {}]']


def test_sr_jit_derives_in_and_out_shardings_and_compiles_once(mesh42):
    params, x = make()
    traces = []

    def step(p, x):
        traces.append(1)
        loss, grads = jax.value_and_grad(lambda p: (model(p, x) ** 2).mean())(p)
        return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), loss

    f = sr.jit(step, RULES, mesh42, in_groups=("params", "inputs"), out_groups=("params", None), donate=(0,))
    placed = sr.apply(params, RULES, mesh42)
    new, loss = f(placed, x)
    first = len(traces)
    new, loss2 = f(new, x)
    assert len(traces) == first  # the second call neither retraces nor recompiles
    assert f.jitted(new, x)._cache_size() == 1
    assert float(loss2) < float(loss)
    assert placed["w_up"].is_deleted()  # donated
    for leaf, spec in [
        (new["w_up"], P(None, "model")),
        (new["w_down"], P("model", None)),
        (new["scale"], P()),
    ]:
        assert leaf.sharding.is_equivalent_to(NamedSharding(mesh42, spec), leaf.ndim)
    text = f.lower(new, x).as_text()
    up, block = '[{"data"}, {"model"}]', '[{"data"}, {}]'
    assert constraints(text) == [up, block, up, block]  # the activation rules, in the forward pass


def test_sr_jit_checks_its_group_lists(mesh42):
    f = sr.jit(lambda a, b: a + b, RULES, mesh42, in_groups=("inputs",))
    with pytest.raises(TypeError, match="1 entries for 2 arguments"):
        f(jnp.ones((8, 2)), jnp.ones((8, 2)))


def test_explicit_mesh_axes_are_resharded_not_constrained():
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    params, x = make()
    placed = sr.apply(params, RULES, mesh)

    seen = []

    @jax.jit
    def f(p):
        doubled = sr.constrain(jax.tree.map(lambda a: a * 2, p), RULES, mesh)
        seen.append(jax.typeof(doubled["w_up"]).sharding.spec)
        return doubled

    out = f(placed)
    assert seen == [P(None, "model")]  # the layout is part of the traced type
    assert out["w_up"].sharding.spec == P(None, "model")

    def scoped(x):
        with jax.named_scope("block_0"):
            y = jnp.sin(x)
        return y * 2

    with jax.set_mesh(mesh):
        g = jax.jit(sr.auto_constrain(scoped, RULES))
        x = jax.device_put(x, NamedSharding(mesh, P(None, "model")))
        # `block_\d+/up$`: this step has no such scope
        with pytest.warns(sr.ShardRulesWarning, match="SR211"):
            assert g(x).sharding.spec == P("data", None)  # resharded to `block_\d+$` -> (data, _)
        np.testing.assert_allclose(g(x), jnp.sin(x) * 2, rtol=1e-6)


def test_a_lone_array_argument_is_matched_by_its_parameter_name(mesh42):
    step = sr.jit(lambda x: x * 2, RULES, mesh42, in_groups=("inputs",))
    # RULES' activation rules: this step has no named scope
    with pytest.warns(sr.ShardRulesWarning, match="SR211"):
        assert (
            step.jitted(jnp.ones((8, 4)))
            .lower(jnp.ones((8, 4)))
            .compile()
            .input_shardings[0][0]
            .is_equivalent_to(NamedSharding(mesh42, P("data", None)), 2)
        )


@pytest.mark.parametrize("axis_type", [jax.sharding.AxisType.Explicit, jax.sharding.AxisType.Auto])
def test_sr_jit_without_a_mesh_follows_the_ambient_mesh_of_each_call(axis_type):
    devices = jax.devices()
    wide = jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2, devices=devices)
    tall = jax.make_mesh((2, 4), ("data", "model"), axis_types=(axis_type,) * 2, devices=devices[::-1])
    params, x = jax.tree.map(np.asarray, make())
    traces = []

    def step(p, x):
        traces.append(1)
        return model(p, x)

    f = sr.jit(step, RULES, in_groups=("params", "inputs"))
    jitted, seen = {}, []
    for mesh in (wide, tall, wide, tall):
        with jax.set_mesh(mesh):
            out = f(params, x)
            expected = jax.jit(model)(params, x)  # plain jax.jit follows the ambient mesh
            jitted.setdefault(mesh.devices.shape, []).append(f.jitted(params, x))
            compiled = f.lower(params, x).compile()
        assert out.sharding.mesh == expected.sharding.mesh == mesh  # this call's devices, in its order
        w_up = compiled.input_shardings[0][0]["w_up"]
        assert w_up.mesh == mesh and w_up.is_equivalent_to(NamedSharding(mesh, P(None, "model")), 2)
        seen.append(len(traces))
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    # back on a mesh seen before: the step planned and compiled for it is reused
    assert len(jitted) == 2 and all(first is again for first, again in jitted.values())
    assert seen[1] > seen[0] > 0 and seen[3] == seen[2] == seen[1]  # traced once per mesh
