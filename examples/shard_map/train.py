"""A data + tensor parallel training step written with `jax.shard_map`.

Inside `shard_map` each device sees only its own blocks of the arrays, and the
code says where they meet: a `jax.lax.psum` over `model` finishes the
row-parallel matmul, a `jax.lax.pmean` over `data` averages the loss (and so the
gradients) over the batch shards. Which blocks each device gets is the
`in_specs`/`out_specs`: here they are `sr.specs(...)` of the same rule file
that lays the arrays out with `sr.apply`, so the two cannot drift apart.

The first step is checked against the same step run without sharding.

The mesh has JAX's default Explicit axes; `--auto-axes` builds it with Auto
axes, and `--one-device` runs the same program on one device (every mesh axis
of size 1), as a reference.
Run it from anywhere: `python examples/shard_map/train.py [--auto-axes] [--one-device]`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

# Simulate 8 devices on the CPU; both must be set before JAX is imported.
_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", "").split():
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardrules as sr  # noqa: E402

RULES = Path(__file__).with_name("mlp.shard")
D_IN, D_HIDDEN, D_OUT, BATCH = 32, 256, 8, 256
STEPS, LEARNING_RATE = 30, 0.1


def init_params(rng: np.random.Generator) -> dict:
    """Two dense layers: up (D_IN → D_HIDDEN), relu, down (D_HIDDEN → D_OUT)."""

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    return {
        "up": {"kernel": normal(D_IN, D_HIDDEN), "bias": np.zeros(D_HIDDEN, np.float32)},
        "down": {"kernel": normal(D_HIDDEN, D_OUT), "bias": np.zeros(D_OUT, np.float32)},
    }


def make_batch(rng: np.random.Generator) -> dict:
    x = rng.standard_normal((BATCH, D_IN)).astype(np.float32)
    w = rng.standard_normal((D_IN, D_OUT)) / np.sqrt(D_IN)
    return {"x": x, "y": np.tanh(x @ w).astype(np.float32)}


def loss_fn(params: dict, batch: dict) -> jax.Array:
    """The unsharded reference: mean squared error over the whole batch."""
    h = jax.nn.relu(batch["x"] @ params["up"]["kernel"] + params["up"]["bias"])
    y = h @ params["down"]["kernel"] + params["down"]["bias"]
    return jnp.mean((y - batch["y"]) ** 2)


def local_loss_fn(params: dict, batch: dict) -> jax.Array:
    """The same loss, written for one device's blocks inside `shard_map`.

    `x` is (BATCH / data, D_IN); `up/kernel` is (D_IN, D_HIDDEN / model), so `h`
    holds this device's hidden features; `down/kernel` is (D_HIDDEN / model,
    D_OUT), so `h @ down` is this device's part of a sum over hidden features.
    """
    h = jax.nn.relu(batch["x"] @ params["up"]["kernel"] + params["up"]["bias"])
    y = jax.lax.psum(h @ params["down"]["kernel"], "model") + params["down"]["bias"]
    return jax.lax.pmean(jnp.mean((y - batch["y"]) ** 2), "data")  # the mean over all batch shards


def sgd(loss: Callable, params: dict, batch: dict) -> tuple[dict, jax.Array]:
    value, grads = jax.value_and_grad(loss)(params, batch)
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads), value


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
    params, batch = init_params(rng), make_batch(rng)

    param_specs = sr.specs(params, rules, mesh)
    batch_specs = sr.specs(batch, rules, mesh, group="inputs")
    print(f"{jax.device_count()} devices, mesh {dict(mesh.shape)}, rules {RULES.name}")
    print(f"in_specs:  params {param_specs}")
    print(f"           batch  {batch_specs}\n")

    step = jax.jit(
        jax.shard_map(
            lambda p, b: sgd(local_loss_fn, p, b),
            mesh=mesh,
            in_specs=(param_specs, batch_specs),
            out_specs=(param_specs, P()),  # updated params keep their layout; the loss is replicated
        )
    )
    reference = jax.jit(lambda p, b: sgd(loss_fn, p, b))

    want_params, want_loss = reference(params, batch)
    sharded_params = sr.apply(params, rules, mesh)
    sharded_batch = sr.apply(batch, rules, mesh, group="inputs")
    got_params, got_loss = step(sharded_params, sharded_batch)
    diff = max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(jax.tree.leaves(got_params), jax.tree.leaves(want_params), strict=True)
    )
    print(
        f"first step: loss {float(got_loss):.6f} (unsharded {float(want_loss):.6f}), max param diff {diff:.1e}"
    )
    if abs(float(got_loss) - float(want_loss)) > 1e-5 or diff > 1e-5:
        print("shard_map step and unsharded step disagree", file=sys.stderr)
        return 1

    params, losses = sharded_params, []
    for i in range(STEPS):
        params, loss = step(params, sharded_batch)
        losses.append(float(loss))
        if i % 10 == 0 or i == STEPS - 1:
            print(f"step {i:3d}  loss {losses[-1]:.4f}")
    kernel = params["down"]["kernel"]
    print(
        f"\ndown/kernel {kernel.shape} {kernel.sharding.spec}, shard {kernel.addressable_shards[0].data.shape}"
    )
    if not losses[-1] < losses[0]:
        print(f"loss did not decrease: {losses[0]:.4f} -> {losses[-1]:.4f}", file=sys.stderr)
        return 1
    print(f"loss {losses[0]:.6f} -> {losses[-1]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
