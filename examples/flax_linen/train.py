"""Flax linen's sharding tutorial, logical-axis version: the model names each
parameter's dimensions with `nn.with_logical_partitioning`, and the rule file's
`alias` lines map those names to mesh axes instead of `nn.logical_axis_rules`.

`sr.init` creates the boxed parameters already sharded, an Optax train step runs
under `sr.jit` (`jax.jit` with shardings from the same rules, donating the old
state), and the layout is checked against Flax's own `nn.logical_to_mesh_sharding`.

The mesh has JAX's default Explicit axes; `--auto-axes` builds it with Auto
axes, and `--one-device` runs the same program on one device (every mesh axis
of size 1), as a reference.
Run it from anywhere: `python examples/flax_linen/train.py [--auto-axes] [--one-device]`.
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

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import shardrules as sr  # noqa: E402

RULES = Path(__file__).with_name("dot_relu_dot.shard")
EMBED, DEPTH, BATCH, STEPS = 64, 256, 32, 8
# What the rule file's aliases say, written as Flax's logical_axis_rules (for the check).
FLAX_RULES = (("batch", "data"), ("hidden", "model"), ("embed", None))


class LogicalDotReluDot(nn.Module):
    """Dense (embed → hidden) → relu → matmul (hidden → embed), dimensions named."""

    depth: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.initializers.lecun_normal()
        y = nn.Dense(
            self.depth,
            kernel_init=nn.with_logical_partitioning(init, ("embed", "hidden")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("hidden",)),
        )(x)
        w2 = self.param(
            "W2", nn.with_logical_partitioning(init, ("hidden", "embed")), (self.depth, x.shape[-1])
        )
        return nn.relu(y) @ w2


class Stack(nn.Module):
    """Two blocks with a residual connection each."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for _ in range(2):
            x = x + LogicalDotReluDot(DEPTH)(x)
        return x


def describe(name: str, array: jax.Array) -> str:
    shard = array.addressable_shards[0].data.shape
    return f"  {name:<38} {array.shape!s:<10} {array.sharding.spec!s:<20} shard {shard}"


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

    model, tx = Stack(), optax.adam(1e-2)
    x = jax.random.normal(jax.random.key(1), (BATCH, EMBED))
    y = jnp.roll(x, 1, axis=-1)

    def init_state(key: jax.Array) -> dict:
        params = model.init(key, x)["params"]  # boxed: nn.LogicallyPartitioned
        return {"params": params, "opt_state": tx.init(params)}

    # Created sharded: the plan comes from jax.eval_shape, the arrays from jit.
    state = sr.init(init_state, rules, mesh)(jax.random.key(0))
    print(sr.plan(state["params"], rules, mesh).table(), end="\n\n")

    # The same layout as Flax's own reading of the names under equivalent rules.
    ours = nn.unbox(sr.shardings(state["params"], rules, mesh))
    theirs = nn.logical_to_mesh_sharding(nn.get_partition_spec(state["params"]), mesh, FLAX_RULES)
    shapes = nn.unbox(state["params"])
    same = jax.tree.map(lambda a, b, s: a.is_equivalent_to(b, s.ndim), ours, theirs, shapes)
    print(f"same as nn.logical_to_mesh_sharding: {all(jax.tree.leaves(same))}\n")

    batch = sr.apply({"x": x, "y": y}, rules, mesh, group="inputs")

    def train_step(state: dict, batch: dict) -> tuple[dict, jax.Array]:
        def loss_fn(params: dict) -> jax.Array:
            return jnp.mean((model.apply({"params": params}, batch["x"]) - batch["y"]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss

    # `jax.jit` with in/out shardings from the rules (`sr.shardings` of the boxed trees). On
    # Explicit axes it also lays out the `W2` product, a contraction over `model` that plain
    # `jax.jit` refuses to guess.
    step = sr.jit(
        train_step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None), donate=(0,)
    )
    losses = []
    for i in range(STEPS):
        state, loss = step(state, batch)
        losses.append(float(loss))
        print(f"step {i}  loss {losses[-1]:.4f}")

    print("\nafter training:")
    block = state["params"]["LogicalDotReluDot_0"]
    print(describe("LogicalDotReluDot_0/Dense_0/kernel", block["Dense_0"]["kernel"].value))
    print(describe("LogicalDotReluDot_0/W2", block["W2"].value))
    mu = state["opt_state"][0].mu["LogicalDotReluDot_0"]["W2"].value
    print(describe("opt_state/0/mu/LogicalDotReluDot_0/W2", mu))
    if not losses[-1] < losses[0]:
        print(f"loss did not decrease: {losses[0]:.4f} -> {losses[-1]:.4f}", file=sys.stderr)
        return 1
    print(f"\nloss {losses[0]:.6f} -> {losses[-1]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
