"""Flax NNX's sharding tutorial (`DotReluDot` on a data × model mesh) with the
layout in a rule file instead of `nnx.with_partitioning` annotations.

`sr.init` builds the model with every variable created in its planned shards,
`nnx.Optimizer` gets its state laid out by the same rules, and a train step on
the `nnx.split` state, under `sr.jit`, keeps the layout.

The mesh has JAX's default Explicit axes; `--auto-axes` builds it with Auto
axes, and `--one-device` runs the same program on one device (every mesh axis
of size 1), as a reference.
Run it from anywhere: `python examples/flax_nnx/train.py [--auto-axes] [--one-device]`.
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
import optax  # noqa: E402
from flax import nnx  # noqa: E402

import shardrules as sr  # noqa: E402

RULES = Path(__file__).with_name("dot_relu_dot.shard")
DEPTH, BATCH, STEPS = 256, 64, 8


class DotReluDot(nnx.Module):
    """x → Linear → relu → @ w2: no sharding annotations in the model code."""

    def __init__(self, depth: int, rngs: nnx.Rngs):
        init = nnx.initializers.lecun_normal()
        self.dot1 = nnx.Linear(depth, depth, kernel_init=init, use_bias=True, rngs=rngs)
        self.w2 = nnx.Param(init(rngs.params(), (depth, depth)))

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.relu(self.dot1(x)) @ self.w2


def describe(name: str, array: jax.Array) -> str:
    """`name`, its shape, its spec and the shape of one device's shard."""
    shard = array.addressable_shards[0].data.shape
    return f"  {name:<28} {array.shape!s:<12} {array.sharding.spec!s:<20} shard {shard}"


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
    mesh = make_mesh((2, 4), ("data", "model"), args)
    print(f"{jax.device_count()} devices, mesh {dict(mesh.shape)}, rules {RULES.name}\n")

    # The model, created sharded: nnx.eval_shape plans, jit with out_shardings builds.
    model = sr.init(lambda: DotReluDot(DEPTH, rngs=nnx.Rngs(0)), rules, mesh)()
    print(sr.plan(nnx.state(model), rules, mesh).table(), end="\n\n")

    # The optimizer's moments sit under paths such as opt_state/0/mu/dot1/kernel,
    # so the parameter rules place them too.
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    opt_plan = sr.plan(nnx.state(optimizer), rules, mesh)
    print("optimizer state:")
    for leaf in opt_plan:
        if leaf.is_array:
            print(f"  {leaf.path:<28} {leaf.spec}")
    nnx.update(optimizer, sr.apply(nnx.state(optimizer), rules, mesh))

    keys = jax.random.split(jax.random.key(1), 2)
    batch = {
        "x": jax.random.normal(keys[0], (BATCH, DEPTH)),
        "y": jax.random.normal(keys[1], (BATCH, DEPTH)),
    }
    batch = sr.apply(batch, rules, mesh, group="inputs")

    # The step takes and returns the state of the model and the optimizer (`nnx.split`), so
    # that `sr.jit` can give it shardings from the rules. On Explicit axes it also lays out
    # the `@ w2` product, a contraction over `model` that `nnx.jit` refuses to guess.
    graphdef, state = nnx.split((model, optimizer))

    def train_step(state: nnx.State, batch: dict) -> tuple[nnx.State, jax.Array]:
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model: DotReluDot) -> jax.Array:
            return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    step = sr.jit(
        train_step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None), donate=(0,)
    )
    print()
    losses = []
    for i in range(STEPS):
        state, loss = step(state, batch)
        losses.append(float(loss))
        print(f"step {i}  loss {losses[-1]:.4f}")
    nnx.update((model, optimizer), state)

    print("\nafter training:")
    print(describe("dot1/kernel", model.dot1.kernel[...]))
    print(describe("w2", model.w2[...]))
    print(describe("opt_state/0/mu/w2", optimizer.opt_state[0].mu["w2"][...]))
    print(describe("batch/x", batch["x"]))
    if not losses[-1] < losses[0]:
        print(f"loss did not decrease: {losses[0]:.4f} -> {losses[-1]:.4f}", file=sys.stderr)
        return 1
    print(f"\nloss {losses[0]:.6f} -> {losses[-1]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
