"""Flax NNX's sharding tutorial (`DotReluDot` on a data × model mesh) with the
layout in a rule file instead of `nnx.with_partitioning` annotations.

`sr.init` builds the model with every variable created in its planned shards,
`nnx.Optimizer` gets its state laid out by the same rules, and an `nnx.jit`
train step keeps the layout. Run it from anywhere: `python examples/flax_nnx/train.py`.
"""

from __future__ import annotations

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


def main() -> int:
    rules = sr.load(RULES)
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
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

    @nnx.jit
    def train_step(model: DotReluDot, optimizer: nnx.Optimizer, batch: dict) -> jax.Array:
        def loss_fn(model: DotReluDot) -> jax.Array:
            return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    print()
    losses = []
    for i in range(STEPS):
        losses.append(float(train_step(model, optimizer, batch)))
        print(f"step {i}  loss {losses[-1]:.4f}")

    print("\nafter training:")
    print(describe("dot1/kernel", model.dot1.kernel[...]))
    print(describe("w2", model.w2[...]))
    print(describe("opt_state/0/mu/w2", optimizer.opt_state[0].mu["w2"][...]))
    print(describe("batch/x", batch["x"]))
    if not losses[-1] < losses[0]:
        print(f"loss did not decrease: {losses[0]:.4f} -> {losses[-1]:.4f}", file=sys.stderr)
        return 1
    print(f"\nloss {losses[0]:.4f} -> {losses[-1]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
