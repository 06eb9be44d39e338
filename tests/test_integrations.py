"""Optax states and Equinox modules with plain rule files: no extra rules needed."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import shardrules as sr

RULES = sr.loads(
    "mesh data, fsdp, model\n"
    "rules params:\n"
    '  "kernel$" -> (fsdp, model)\n'
    '  "bias$"   -> (model)\n'
    "  default   -> replicated\n",
    name="opt.shard",
)


def params():
    return {
        "dense": {"kernel": jnp.ones((8, 16)), "bias": jnp.zeros(16)},
        "head": {"kernel": jnp.ones((16, 4)), "bias": jnp.zeros(4)},
    }


OPTIMIZERS = {
    "adam": lambda: optax.adam(1e-3),
    "adamw": lambda: optax.adamw(1e-3),
    "chain": lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(), optax.scale(-1e-3)),
    "masked": lambda: optax.masked(optax.adam(1e-3), {"dense": True, "head": False}),
    "multi_transform": lambda: optax.multi_transform(
        {"a": optax.adam(1e-3), "b": optax.sgd(1e-2)}, {"dense": "a", "head": "b"}
    ),
    "inject_hyperparams": lambda: optax.inject_hyperparams(optax.adam)(learning_rate=1e-3),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_states_get_their_parameters_shardings(name, mesh222):
    tx = OPTIMIZERS[name]()
    p = sr.apply(params(), RULES, mesh222)
    state = sr.apply(tx.init(p), RULES, mesh222)
    by_shape = {"kernel": {(8, 16): P("fsdp", "model"), (16, 4): P("fsdp", "model")}, "bias": P("model")}
    found = 0
    for keypath, leaf in jax.tree_util.tree_leaves_with_path(state):
        path = jax.tree_util.keystr(keypath, simple=True, separator="/")
        if not isinstance(leaf, jax.Array) or leaf.ndim == 0:
            continue
        if path.endswith("kernel"):
            assert leaf.sharding.spec == by_shape["kernel"][leaf.shape], path
            found += 1
        elif path.endswith("bias"):
            assert leaf.sharding.spec == P("model"), path
            found += 1
    assert found >= 4  # at least one moment per parameter

    @jax.jit
    def step(p, s):
        grads = jax.grad(lambda q: sum(jnp.sum(x**2) for x in jax.tree.leaves(q)))(p)
        updates, s = tx.update(grads, s, p)
        return sr.constrain(optax.apply_updates(p, updates), RULES, mesh222), sr.constrain(s, RULES, mesh222)

    p2, s2 = step(p, state)
    for a, b in zip(jax.tree.leaves(s2), jax.tree.leaves(state), strict=True):
        if isinstance(a, jax.Array) and a.ndim:
            assert a.sharding.is_equivalent_to(b.sharding, a.ndim)
    assert p2["dense"]["kernel"].sharding.spec == P("fsdp", "model")


class MLP(eqx.Module):
    layers: list
    activation: callable = eqx.field(static=True)
    name: str = "mlp"

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.layers = [eqx.nn.Linear(8, 16, key=k1), eqx.nn.Linear(16, 4, key=k2)]
        self.activation = jax.nn.relu

    def __call__(self, x):
        return self.layers[1](self.activation(self.layers[0](x)))


def test_equinox_modules_keep_their_non_array_fields(mesh222):
    rules = sr.loads(
        'mesh data, fsdp, model\nrules params:\n  "weight$" -> (model, _)\n  default -> replicated\n'
    )
    model = MLP(jax.random.key(0))
    placed = sr.apply(model, rules, mesh222)
    assert placed.activation is jax.nn.relu and placed.name == "mlp"
    assert placed.layers[0].weight.sharding.spec == P("model", None)
    assert placed.layers[0].bias.sharding.spec == P(None)
    x = jnp.ones(8)
    np.testing.assert_allclose(eqx.filter_jit(lambda m, x: m(x))(placed, x), model(x), rtol=1e-6)
