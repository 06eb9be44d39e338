"""The same data-parallel program as `train_pmap.py`, with `jax.jit` and a rule file.

No reshaping, no stacked copies, no collectives in the code: the step is the
one you would write for one device. `data_parallel.shard` says the weights are
replicated and the batch is split over the `batch` mesh axis; `sr.apply` lays
the arrays out that way and `sr.jit` (a `jax.jit` with shardings from the same
rules) follows the layout, adding the gradient all-reduce itself. Pass
`fsdp.shard` instead and the weights are sharded too.

The mesh has JAX's default Explicit axes; `--auto-axes` builds it with Auto
axes, and `--one-device` runs the same program on one device (a `batch` axis
of size 1), as a reference.
Run it from anywhere:
`python examples/from_pmap/train_jit.py [fsdp.shard] [--auto-axes] [--one-device]`.
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
from pmap_model import LEARNING_RATE, STEPS, init_params, loss_fn, make_batch  # noqa: E402

import shardrules as sr  # noqa: E402

HERE = Path(__file__).parent


def train_step(params: dict, batch: dict) -> tuple[dict, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)  # the whole batch: the mean is global
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads), loss


def train(
    steps: int = STEPS,
    rule_file: str = "data_parallel.shard",
    *,
    auto_axes: bool = False,
    one_device: bool = False,
) -> tuple[dict, list[float]]:
    """Train from `init_params()`; returns the final (sharded) weights and the losses.

    The mesh has Explicit axes (`jax.make_mesh`'s default) unless `auto_axes`; with
    `one_device`, one `batch` row on the first device."""
    rules = sr.load(HERE / rule_file)
    types = (jax.sharding.AxisType.Auto,) if auto_axes else None
    if one_device:
        mesh = jax.make_mesh((1,), ("batch",), types, devices=jax.devices()[:1])
    else:
        mesh = jax.make_mesh((jax.device_count(),), ("batch",), types)
    params = sr.apply(init_params(), rules, mesh)
    batch = sr.apply(make_batch(), rules, mesh, group="inputs")
    # On Explicit axes `sr.jit` also lays out what plain `jax.jit` refuses: with `fsdp.shard`,
    # `x @ hidden/kernel` would have both of its dimensions split over `batch`.
    step = sr.jit(
        train_step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None), donate=(0,)
    )
    losses = []
    for _ in range(steps):
        params, loss = step(params, batch)
        losses.append(float(loss))
    return params, losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "rule_file", nargs="?", default="data_parallel.shard", help="a rule file in this folder"
    )
    parser.add_argument("--auto-axes", action="store_true", help="build the mesh with Auto axes")
    parser.add_argument("--one-device", action="store_true", help="a `batch` axis of size 1, on one device")
    args = parser.parse_args(argv)
    rule_file = args.rule_file
    params, losses = train(rule_file=rule_file, auto_axes=args.auto_axes, one_device=args.one_device)
    for i in range(0, len(losses), 5):
        print(f"step {i:3d}  loss {losses[i]:.6f}")
    kernel = params["hidden"]["kernel"]
    print(
        f"hidden/kernel {kernel.shape} {kernel.sharding.spec}, shard {kernel.addressable_shards[0].data.shape}"
    )
    devices = len(kernel.sharding.device_set)
    print(
        f"jit + {rule_file} on {devices} device{'s' * (devices > 1)}: loss {losses[0]:.6f} -> {losses[-1]:.6f}"
    )
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
