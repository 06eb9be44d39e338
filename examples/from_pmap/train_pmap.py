"""The starting point: data parallelism with `jax.pmap`.

Every device gets a full copy of the weights (stacked along a new leading axis)
and one slice of the batch (the batch reshaped to `(devices, per_device, ...)`).
Inside the step, `jax.lax.pmean` over the mapped axis averages the loss and the
gradients. `train_jit.py` is the same program without pmap.
Run it from anywhere: `python examples/from_pmap/train_pmap.py`.
"""

from __future__ import annotations

import os
import sys

# Simulate 8 devices on the CPU; both must be set before JAX is imported.
_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", "").split():
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import functools  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from pmap_model import LEARNING_RATE, STEPS, init_params, loss_fn, make_batch  # noqa: E402


@functools.partial(jax.pmap, axis_name="batch")
def train_step(params: dict, batch: dict) -> tuple[dict, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)  # this device's slice only
    loss = jax.lax.pmean(loss, "batch")
    grads = jax.lax.pmean(grads, "batch")  # the data-parallel gradient mean
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads), loss


def train(steps: int = STEPS) -> tuple[dict, list[float]]:
    """Train from `init_params()`; returns the final weights (one copy) and the losses."""
    n = jax.local_device_count()
    params = jax.tree.map(lambda a: jnp.broadcast_to(a, (n, *a.shape)), init_params())  # one copy per device
    batch = jax.tree.map(lambda a: a.reshape(n, a.shape[0] // n, *a.shape[1:]), make_batch())
    losses = []
    for _ in range(steps):
        params, loss = train_step(params, batch)
        losses.append(float(loss[0]))  # the same on every device
    return jax.tree.map(lambda a: a[0], params), losses


def main() -> int:
    params, losses = train()
    for i in range(0, len(losses), 5):
        print(f"step {i:3d}  loss {losses[i]:.6f}")
    kernel = params["hidden"]["kernel"]
    print(f"hidden/kernel {kernel.shape}: a whole copy on each device")
    print(f"pmap over {jax.local_device_count()} devices: loss {losses[0]:.6f} -> {losses[-1]:.6f}")
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
