"""Automatic activation constraints on Flax linen and Flax NNX models."""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import shardrules as sr

UP, BLOCK = '[{"data"}, {"model"}]', '[{"data"}, {}]'


def constraints(text: str) -> list[str]:
    return re.findall(r"sdy\.sharding_constraint %\S+ <@\w+, (\[.*?\])>", text)


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(32, name="up")(x)
        return x + nn.Dense(16, name="down")(nn.gelu(h))


class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
        for i in range(2):
            x = Block(name=f"block_{i}")(x)
        return nn.Dense(4, name="head")(x)


def test_linen_module_outputs_are_constrained_by_module_path(mesh42):
    rules = sr.loads(
        'mesh data, model\nrules activations:\n  "block_\\d+/up$" -> (data, model)\n  "block_\\d+$" -> (data, _)\n'
    )
    model, x = Model(), jnp.ones((8, 16))
    params = model.init(jax.random.key(0), x)
    f = jax.jit(sr.auto_constrain(model.apply, rules, mesh42))
    assert constraints(f.lower(params, x).as_text()) == [UP, BLOCK, UP, BLOCK]
    np.testing.assert_allclose(f(params, x), model.apply(params, x), rtol=1e-5, atol=1e-6)


class NBlock(nnx.Module):
    def __init__(self, rngs):
        self.up = nnx.Linear(16, 32, rngs=rngs)
        self.down = nnx.Linear(32, 16, rngs=rngs)

    def __call__(self, x):
        return x + self.down(nnx.gelu(self.up(x)))


class NModel(nnx.Module):
    def __init__(self, rngs):
        self.blocks = nnx.List([NBlock(rngs) for _ in range(2)])
        self.head = nnx.Linear(16, 4, rngs=rngs)

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_nnx_module_outputs_are_constrained_by_their_path_in_the_model(mesh42):
    rules = sr.loads(
        'mesh data, model\nrules activations:\n  "blocks/\\d+/up$" -> (data, model)\n  "blocks/\\d+$" -> (data, _)\n'
    )
    model, x = NModel(nnx.Rngs(0)), jnp.ones((8, 16))
    f = jax.jit(sr.auto_constrain(lambda m, x: m(x), rules, mesh42))
    assert constraints(f.lower(model, x).as_text()) == [UP, BLOCK, UP, BLOCK]
    np.testing.assert_allclose(f(model, x), model(x), rtol=1e-5, atol=1e-6)
    assert (
        NBlock.__call__.__name__ == "__call__" and "__wrapped__" not in NBlock.__call__.__dict__
    )  # restored
