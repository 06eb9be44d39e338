"""The model, data and hyperparameters both versions of the program share.

Plain JAX: a dict of weights for a two-layer MLP, a mean-squared-error loss,
and a synthetic regression batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

D_IN, D_HIDDEN, D_OUT = 16, 256, 4
BATCH = 256  # the global batch: 32 examples on each of 8 devices
STEPS, LEARNING_RATE = 20, 0.1


def init_params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    return {
        "hidden": {"kernel": normal(D_IN, D_HIDDEN), "bias": np.zeros(D_HIDDEN, np.float32)},
        "out": {"kernel": normal(D_HIDDEN, D_OUT), "bias": np.zeros(D_OUT, np.float32)},
    }


def make_batch(seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, D_IN)).astype(np.float32)
    w = rng.standard_normal((D_IN, D_OUT)) / np.sqrt(D_IN)
    return {"x": x, "y": np.sin(x @ w).astype(np.float32)}


def loss_fn(params: dict, batch: dict) -> jax.Array:
    """Mean squared error over the examples in `batch`."""
    h = jax.nn.gelu(batch["x"] @ params["hidden"]["kernel"] + params["hidden"]["bias"])
    y = h @ params["out"]["kernel"] + params["out"]["bias"]
    return jnp.mean((y - batch["y"]) ** 2)
