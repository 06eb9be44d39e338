"""Flax NNX: `apply` on `nnx.state(model)`, the split/merge round trip, and
`init` building a model whose variables are created in their sharded layout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr

RULES = sr.loads(
    """\
mesh data, model

rules params:
  "linear1/kernel" -> (_, model)
  "linear1/bias"   -> (model)
  "linear2/kernel" -> (model, _)
  default          -> replicated
""",
    name="nnx.shard",
)
PLANNED = {
    ("linear1", "kernel"): P(None, "model"),
    ("linear1", "bias"): P("model"),
    ("linear2", "kernel"): P("model", None),
    ("linear2", "bias"): P(None),
}


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear1 = nnx.Linear(16, 64, rngs=rngs)
        self.linear2 = nnx.Linear(64, 4, rngs=rngs)
        self.activation = jax.nn.gelu

    def __call__(self, x):
        return self.linear2(self.activation(self.linear1(x)))


def assert_planned(model):
    for (layer, name), spec in PLANNED.items():
        value = getattr(getattr(model, layer), name)[...]
        want = NamedSharding(value.sharding.mesh, spec)
        assert value.sharding.is_equivalent_to(want, value.ndim), (layer, name, value.sharding)


def test_paths_of_nnx_state_have_no_value_segment():
    state = nnx.state(MLP(nnx.Rngs(0)))
    plan = sr.plan(state, RULES, {"data": 4, "model": 2})
    assert sorted(leaf.path for leaf in plan) == [
        "linear1/bias",
        "linear1/kernel",
        "linear2/bias",
        "linear2/kernel",
    ]
    assert plan["linear1/kernel"].why == "rule"


def test_apply_on_the_state_and_merge_back(mesh42):
    model = MLP(nnx.Rngs(0))
    x = jnp.ones((8, 16))
    want = model(x)
    graphdef, state = nnx.split(model)
    placed = sr.apply(state, RULES, mesh42)
    assert isinstance(placed, nnx.State)
    assert isinstance(placed["linear1"]["kernel"], nnx.Param)
    merged = nnx.merge(graphdef, placed)
    assert_planned(merged)
    assert merged.activation is jax.nn.gelu
    np.testing.assert_allclose(merged(x), want, rtol=1e-5, atol=1e-6)
    # The same through nnx.update on the live model.
    nnx.update(model, sr.apply(nnx.state(model), RULES, mesh42))
    assert_planned(model)


def test_specs_fit_the_state(mesh42):
    state = nnx.state(MLP(nnx.Rngs(0)))
    specs = sr.specs(state, RULES, mesh42)
    assert jax.tree.structure(specs) == jax.tree.structure(state)
    assert specs["linear1"]["kernel"].get_value() == P(None, "model")


def test_init_creates_the_variables_sharded(mesh42, monkeypatch):
    # No unsharded copy: the real initialiser runs only under jit with out_shardings
    # (abstractly to plan, then compiled), never eagerly.
    real = nnx.Linear.__init__
    eager = []

    def watched(self, *args, **kwargs):
        real(self, *args, **kwargs)
        if not isinstance(self.kernel[...], jax.core.Tracer):
            eager.append(type(self.kernel.value))

    monkeypatch.setattr(nnx.Linear, "__init__", watched)
    model = sr.init(lambda: MLP(rngs=nnx.Rngs(0)), RULES, mesh42)()
    assert eager == []
    assert isinstance(model, MLP) and model.activation is jax.nn.gelu
    assert_planned(model)
    # The same values as an eagerly built model.
    monkeypatch.setattr(nnx.Linear, "__init__", real)
    reference = MLP(rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(model.linear1.kernel[...], reference.linear1.kernel[...])


def test_init_takes_arguments(mesh42):
    def build(key):
        return MLP(rngs=nnx.Rngs(key))

    a = sr.init(build, RULES, mesh42)(jax.random.key(1))
    b = sr.init(build, RULES, mesh42)(jax.random.key(2))
    assert_planned(a)
    assert not np.allclose(a.linear1.kernel[...], b.linear1.kernel[...])
    # A static argument (a Python seed), as for jax.jit.
    c = sr.init(lambda seed: MLP(rngs=nnx.Rngs(seed)), RULES, mesh42, static_argnums=0)(3)
    assert_planned(c)


def test_train_step_keeps_the_layout(mesh42):
    model = sr.init(lambda: MLP(rngs=nnx.Rngs(0)), RULES, mesh42)()
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    # The optimizer's moments follow the parameters' paths, so the same rules place them.
    nnx.update(optimizer, sr.apply(nnx.state(optimizer), RULES, mesh42))
    x = jax.random.normal(jax.random.key(1), (32, 16))
    y = jnp.sum(x[:, :4], axis=1, keepdims=True) * jnp.ones((1, 4))

    @nnx.jit
    def step(model, optimizer, x, y):
        def loss_fn(model):
            return jnp.mean((model(x) - y) ** 2)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    losses = [float(step(model, optimizer, x, y)) for _ in range(3)]
    assert losses[-1] < losses[0]
    assert_planned(model)
    mu = optimizer.opt_state[0].mu["linear1"]["kernel"][...]
    assert mu.sharding.is_equivalent_to(NamedSharding(mesh42, P(None, "model")), 2)


def test_init_of_a_plain_pytree_is_unchanged(mesh42):
    params = sr.init(lambda: {"linear1": {"kernel": jnp.ones((16, 64))}}, RULES, mesh42)()
    assert isinstance(params, dict) and params["linear1"]["kernel"].sharding.spec == P(None, "model")


def test_unmatched_nnx_leaves_are_reported_by_path(mesh42):
    strict = sr.loads('rules params:\n  "linear1/kernel" -> (_, model)\n')
    with pytest.raises(sr.PlanError) as info:
        sr.init(lambda: MLP(rngs=nnx.Rngs(0)), strict, mesh42)()
    assert info.value.code == "SR105"
    assert "linear2/kernel" in str(info.value) and "/value" not in str(info.value)


class Named(nnx.Module):
    """Variables that carry logical axis names (kept lazy: no mesh needed to build it)."""

    def __init__(self, rngs: nnx.Rngs):
        def names(*axes):
            return {"out_sharding": axes, "eager_sharding": False}

        self.up = nnx.Linear(
            16, 64, kernel_metadata=names("embed", "mlp"), bias_metadata=names("mlp"), rngs=rngs
        )
        self.down = nnx.Linear(64, 16, kernel_metadata=names("mlp", "embed"), use_bias=False, rngs=rngs)


LOGICAL = sr.loads("alias embed = data\nalias mlp = model\nrules params:\n  default -> logical\n")


def test_logical_reads_nnx_out_sharding_names(mesh42):
    model = sr.init(lambda: Named(nnx.Rngs(0)), LOGICAL, mesh42)()
    assert model.up.kernel[...].sharding.spec == P("data", "model")
    assert model.up.bias[...].sharding.spec == P("model")
    assert model.down.kernel[...].sharding.spec == P("model", "data")
    # The same as Flax's own reading of the names under equivalent rules.
    state = nnx.state(Named(nnx.Rngs(0)))
    with nnx.logical_axis_rules((("embed", "data"), ("mlp", "model"))):
        theirs = nnx.get_partition_spec(state)
    ours = sr.specs(state, LOGICAL, mesh42)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        assert a == b
