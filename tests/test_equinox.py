"""Equinox: modules with non-array leaves through `apply`, and an `eqx.filter_jit`
train step (donating its state) that keeps the planned layout."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr

RULES = sr.loads(
    """\
mesh data, model

rules params:
  "layers/0/weight$" -> (model, _)  # column parallel
  "layers/0/bias$"   -> (model)
  "layers/1/weight$" -> (_, model)  # row parallel
  default            -> replicated

rules inputs:
  "." -> (data, ...)
""",
    name="eqx.shard",
)
PLANNED = {
    "layers/0/weight": P("model", None),
    "layers/0/bias": P("model"),
    "layers/1/weight": P(None, "model"),
    "layers/1/bias": P(None),
}


@dataclasses.dataclass(frozen=True)
class Config:
    width: int
    note: str


class Net(eqx.Module):
    layers: tuple[eqx.nn.Linear, eqx.nn.Linear]
    activation: Callable  # a function: a non-array leaf
    scale: float  # a Python number: a non-array leaf
    config: Config = eqx.field(static=True)
    label: str = eqx.field(static=True, default="net")
    extra: None = None

    def __init__(self, key: jax.Array, width: int = 32):
        k1, k2 = jax.random.split(key)
        self.layers = (eqx.nn.Linear(8, width, key=k1), eqx.nn.Linear(width, 2, key=k2))
        self.activation = jax.nn.gelu
        self.scale = 0.5
        self.config = Config(width, "hello")

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.scale * self.layers[1](self.activation(self.layers[0](x)))


def arrays_by_path(tree):
    return {
        jax.tree_util.keystr(p, simple=True, separator="/"): leaf
        for p, leaf in jax.tree_util.tree_leaves_with_path(tree)
        if isinstance(leaf, jax.Array)
    }


def test_non_array_leaves_come_back_identical(mesh42):
    model = Net(jax.random.key(0))
    placed = sr.apply(model, RULES, mesh42)
    assert placed.activation is model.activation is jax.nn.gelu
    assert placed.config is model.config and placed.label == "net" and placed.extra is None
    assert placed.scale == 0.5 and type(placed.scale) is float
    static_before = eqx.filter(model, eqx.is_array, inverse=True)
    static_after = eqx.filter(placed, eqx.is_array, inverse=True)
    assert eqx.tree_equal(static_before, static_after) is True
    assert jax.tree.structure(placed) == jax.tree.structure(model)
    # Every array moved, values unchanged.
    for (path, before), after in zip(
        arrays_by_path(model).items(), arrays_by_path(placed).values(), strict=True
    ):
        np.testing.assert_array_equal(before, after, err_msg=path)


def test_arrays_get_the_planned_shardings(mesh42):
    placed = sr.apply(Net(jax.random.key(0)), RULES, mesh42)
    found = arrays_by_path(placed)
    assert set(found) == set(PLANNED)
    for path, spec in PLANNED.items():
        assert found[path].sharding == NamedSharding(mesh42, spec), path
    specs = sr.specs(placed, RULES, mesh42)
    assert specs.layers[0].weight == P("model", None)
    assert specs.activation is None  # a non-array leaf has no spec


def test_filter_jit_step_keeps_the_layout_and_donates(mesh42):
    model = sr.apply(Net(jax.random.key(0)), RULES, mesh42)
    optim = optax.adam(1e-2)
    opt_state = sr.apply(optim.init(eqx.filter(model, eqx.is_array)), RULES, mesh42)
    # Adam's moments follow their parameters' paths (0/mu/layers/0/weight).
    assert arrays_by_path(opt_state)["0/mu/layers/0/weight"].sharding.spec == P("model", None)

    @eqx.filter_jit(donate="all")
    def step(model, opt_state, x, y):
        model, opt_state = sr.constrain((model, opt_state), RULES, mesh42)
        x, y = sr.constrain((x, y), RULES, mesh42, group="inputs")

        def loss_fn(model):
            return jnp.mean((jax.vmap(model)(x) - y) ** 2)

        loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
        updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        model = eqx.apply_updates(model, updates)
        return (*sr.constrain((model, opt_state), RULES, mesh42), loss)

    x = jax.random.normal(jax.random.key(1), (64, 8))
    y = jnp.stack([jnp.sin(x[:, 0]), jnp.cos(x[:, 1])], axis=-1)
    x, y = sr.apply((x, y), RULES, mesh42, group="inputs")
    assert x.sharding.spec == P("data", None)
    losses = []
    for _ in range(10):
        old_weight = model.layers[0].weight
        model, opt_state, loss = step(model, opt_state, x, y)
        losses.append(float(loss))
        assert old_weight.is_deleted()  # donated
    assert losses[-1] < losses[0]
    assert model.activation is jax.nn.gelu and model.config == Config(32, "hello")
    for path, spec in PLANNED.items():
        array = arrays_by_path(model)[path]
        assert array.sharding.is_equivalent_to(NamedSharding(mesh42, spec), array.ndim), path
    mu = arrays_by_path(opt_state)["0/mu/layers/1/weight"]
    assert mu.sharding.is_equivalent_to(NamedSharding(mesh42, P(None, "model")), 2)


def test_unmatched_leaves_name_module_paths(mesh42):
    strict = sr.loads('rules params:\n  "layers/0/weight$" -> (model, _)\n')
    with pytest.raises(sr.PlanError) as info:
        sr.apply(Net(jax.random.key(0)), strict, mesh42)
    assert info.value.code == "SR105"
    for path in ("layers/0/bias", "layers/1/weight", "layers/1/bias"):
        assert path in str(info.value)
