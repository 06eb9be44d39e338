"""The same data-parallel program as `train_pmap.py`, with `jax.jit` and a rule file.

No reshaping, no stacked copies, no collectives in the code: the step is the
one you would write for one device. `data_parallel.shard` says the weights are
replicated and the batch is split over the `batch` mesh axis; `sr.apply` lays
the arrays out that way and `jax.jit` follows the layout, adding the gradient
all-reduce itself. Pass `fsdp.shard` instead and the weights are sharded too.
Run it from anywhere: `python examples/from_pmap/train_jit.py [fsdp.shard]`.
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
from pmap_model import LEARNING_RATE, STEPS, init_params, loss_fn, make_batch  # noqa: E402

import shardrules as sr  # noqa: E402

HERE = Path(__file__).parent


def train_step(params: dict, batch: dict) -> tuple[dict, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)  # the whole batch: the mean is global
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads), loss


def train(steps: int = STEPS, rule_file: str = "data_parallel.shard") -> tuple[dict, list[float]]:
    """Train from `init_params()`; returns the final (sharded) weights and the losses."""
    rules = sr.load(HERE / rule_file)
    mesh = jax.make_mesh((jax.device_count(),), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))
    params = sr.apply(init_params(), rules, mesh)
    batch = sr.apply(make_batch(), rules, mesh, group="inputs")
    layout = sr.shardings(params, rules, mesh)
    step = jax.jit(train_step, out_shardings=(layout, None), donate_argnums=0)
    losses = []
    for _ in range(steps):
        params, loss = step(params, batch)
        losses.append(float(loss))
    return params, losses


def main() -> int:
    rule_file = sys.argv[1] if len(sys.argv) > 1 else "data_parallel.shard"
    params, losses = train(rule_file=rule_file)
    for i in range(0, len(losses), 5):
        print(f"step {i:3d}  loss {losses[i]:.6f}")
    kernel = params["hidden"]["kernel"]
    print(
        f"hidden/kernel {kernel.shape} {kernel.sharding.spec}, shard {kernel.addressable_shards[0].data.shape}"
    )
    print(f"jit + {rule_file} on {jax.device_count()} devices: loss {losses[0]:.6f} -> {losses[-1]:.6f}")
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
