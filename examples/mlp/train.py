"""Train a small MLP with data + tensor parallelism on 8 simulated CPU devices.

The layout of every parameter and of the batch comes from `mlp.shard`, next to
this file.

The mesh has JAX's default Explicit axes; `--auto-axes` builds it with Auto
axes, and `--one-device` runs the same program on one device (every mesh axis
of size 1), as a reference.
Run it from anywhere: `python examples/mlp/train.py [--auto-axes] [--one-device]`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# Simulate 8 devices on the CPU; both must be set before JAX is imported.
_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", "").split():
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import shardrules as sr  # noqa: E402

RULES = Path(__file__).with_name("mlp.shard")
D_IN, D_HIDDEN, D_OUT, BATCH = 32, 256, 8, 512
STEPS, LEARNING_RATE = 40, 0.1


def init_params(rng: np.random.Generator) -> dict:
    """An RMS-normed two-layer MLP: norm → up (D_IN→D_HIDDEN) → gelu → down (D_HIDDEN→D_OUT).

    Plain NumPy arrays: `sr.apply` moves them straight to their shards.
    """

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    return {
        "norm": {"scale": np.ones(D_IN, np.float32)},
        "up": {"kernel": normal(D_IN, D_HIDDEN), "bias": np.zeros(D_HIDDEN, np.float32)},
        "down": {"kernel": normal(D_HIDDEN, D_OUT), "bias": np.zeros(D_OUT, np.float32)},
    }


def forward(params: dict, x: jax.Array) -> jax.Array:
    """The MLP's output for a batch `x` of shape (batch, D_IN)."""
    x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * params["norm"]["scale"]
    h = jax.nn.gelu(x @ params["up"]["kernel"] + params["up"]["bias"])
    return h @ params["down"]["kernel"] + params["down"]["bias"]


def make_batch(rng: np.random.Generator) -> dict:
    """A synthetic regression task: `y` is a fixed random nonlinear function of `x`."""
    x = rng.standard_normal((BATCH, D_IN)).astype(np.float32)
    a = rng.standard_normal((D_IN, 64)) / np.sqrt(D_IN)
    b = rng.standard_normal((64, D_OUT)) / 8.0
    return {"x": x, "y": (np.tanh(x @ a) @ b).astype(np.float32)}


def loss_fn(params: dict, batch: dict) -> jax.Array:
    """Mean squared error."""
    return jnp.mean((forward(params, batch["x"]) - batch["y"]) ** 2)


def sgd_step(params: dict, batch: dict) -> tuple[dict, jax.Array]:
    """One step of plain gradient descent."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
    return params, loss


def describe(name: str, array: jax.Array) -> str:
    """`name`, its global shape, its spec and the shape of one device's shard."""
    shard = array.addressable_shards[0].data.shape
    return f"  {name:<12} {array.shape!s:<10} {array.sharding.spec!s:<18} shard {shard}"


def make_mesh(shape: tuple[int, ...], names: tuple[str, ...], args: argparse.Namespace) -> jax.sharding.Mesh:
    """`jax.make_mesh` (Explicit axes), Auto axes with `--auto-axes`; `--one-device`: every size 1."""
    types = (jax.sharding.AxisType.Auto,) * len(names) if args.auto_axes else None
    if args.one_device:
        return jax.make_mesh((1,) * len(names), names, types, devices=jax.devices()[:1])
    return jax.make_mesh(shape, names, types)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--auto-axes", action="store_true", help="build the mesh with Auto axes")
    parser.add_argument("--one-device", action="store_true", help="every mesh axis of size 1, on one device")
    args = parser.parse_args(argv)
    rules = sr.load(RULES)
    mesh = make_mesh((4, 2), ("data", "model"), args)
    rng = np.random.default_rng(0)
    params = init_params(rng)
    batch = make_batch(rng)

    print(f"{jax.device_count()} devices, mesh {dict(mesh.shape)}, rules {RULES.name}\n")
    print(sr.plan(params, rules, mesh).table(), end="\n\n")
    print(sr.plan(batch, rules, mesh, group="inputs").table(), end="\n\n")

    # Check the whole layout, then move the arrays onto the mesh.
    params = sr.apply(params, rules, mesh)
    batch = sr.apply(batch, rules, mesh, group="inputs")

    # `jax.jit` with in/out shardings from the same rules. On Explicit axes it also settles
    # the layout of the row-parallel `down` product, which plain `jax.jit` refuses to guess.
    step = sr.jit(
        sgd_step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None), donate=(0,)
    )

    losses = []
    for i in range(STEPS):
        params, loss = step(params, batch)
        losses.append(float(loss))
        if i % 10 == 0 or i == STEPS - 1:
            print(f"step {i:3d}  loss {losses[-1]:.4f}")

    print("\nafter training:")
    print(describe("up/kernel", params["up"]["kernel"]))
    print(describe("down/kernel", params["down"]["kernel"]))
    print(describe("batch/x", batch["x"]))

    if not losses[-1] < losses[0]:
        print(f"loss did not decrease: {losses[0]:.4f} -> {losses[-1]:.4f}", file=sys.stderr)
        return 1
    print(f"\nloss {losses[0]:.6f} -> {losses[-1]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
