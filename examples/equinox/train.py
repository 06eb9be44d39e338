"""Equinox's autoparallelism tutorial with the layout in a rule file.

An `eqx.nn.MLP` (whose activation functions and sizes are not arrays) is placed
with `sr.apply`, then trained with 8-way data parallelism: an `eqx.filter_jit`
step that donates the model and optimizer state, pins their layout with
`sr.constrain`, and splits the batch over `batch`. Where the tutorial calls
`eqx.filter_shard` with hand-written shardings, this script names rule groups.

The mesh has JAX's default Explicit axes; `--auto-axes` builds it with Auto
axes, and `--one-device` runs the same program on one device (every mesh axis
of size 1), as a reference.
Run it from anywhere: `python examples/equinox/train.py [--auto-axes] [--one-device]`.
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

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import shardrules as sr  # noqa: E402

RULES = Path(__file__).with_name("mlp.shard")
DATASET, BATCH, STEPS = 4096, 256, 30


def get_data(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A toy regression: y = sin(x) summed over features, with noise."""
    kx, kn = jax.random.split(key)
    x = jax.random.normal(kx, (DATASET, 8))
    y = jnp.sum(jnp.sin(x), axis=-1, keepdims=True) + 0.05 * jax.random.normal(kn, (DATASET, 1))
    return x, y


def describe(name: str, array: jax.Array) -> str:
    shard = array.addressable_shards[0].data.shape
    return f"  {name:<16} {array.shape!s:<10} {array.sharding.spec!s:<16} shard {shard}"


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
    mesh = make_mesh((8,), ("batch",), args)
    print(f"{jax.device_count()} devices, mesh {dict(mesh.shape)}, rules {RULES.name}\n")

    model = eqx.nn.MLP(8, 1, width_size=128, depth=2, activation=jax.nn.gelu, key=jax.random.key(0))
    optim = optax.adam(1e-2)
    print(sr.plan(model, rules, mesh).table(), end="\n\n")

    # Arrays move to their shards; the activation functions and sizes pass through.
    model = sr.apply(model, rules, mesh)
    opt_state = sr.apply(optim.init(eqx.filter(model, eqx.is_array)), rules, mesh)
    print(f"activation kept: {model.activation is jax.nn.gelu}, width {model.width_size}\n")

    @eqx.filter_jit(donate="all")
    def train_step(model: eqx.nn.MLP, opt_state: optax.OptState, x: jax.Array, y: jax.Array):
        model, opt_state = sr.constrain((model, opt_state), rules, mesh)
        x, y = sr.constrain((x, y), rules, mesh, group="inputs")

        def loss_fn(model: eqx.nn.MLP) -> jax.Array:
            return jnp.mean((jax.vmap(model)(x) - y) ** 2)

        loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
        updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        model = eqx.apply_updates(model, updates)
        model, opt_state = sr.constrain((model, opt_state), rules, mesh)
        return model, opt_state, loss

    x, y = get_data(jax.random.key(1))
    losses = []
    for step in range(STEPS):
        start = (step * BATCH) % DATASET
        batch = sr.apply((x[start : start + BATCH], y[start : start + BATCH]), rules, mesh, group="inputs")
        model, opt_state, loss = train_step(model, opt_state, *batch)
        losses.append(float(loss))
        if step % 10 == 0 or step == STEPS - 1:
            print(f"step {step:3d}  loss {losses[-1]:.4f}")

    print("\nafter training:")
    print(describe("layers/0/weight", model.layers[0].weight))
    print(describe("batch x", batch[0]))
    if not losses[-1] < losses[0]:
        print(f"loss did not decrease: {losses[0]:.4f} -> {losses[-1]:.4f}", file=sys.stderr)
        return 1
    print(f"\nloss {losses[0]:.6f} -> {losses[-1]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
