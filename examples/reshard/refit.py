"""Refit a rollout from a trainer on other devices, every few steps, under a memory cap.

The trainer runs on devices 0-5 (`data=3, model=2`, laid out by
`trainer.shard`), the rollout on devices 6-7 (`model=2`, by `serve.shard`).
`sr.transfer` plans once which piece of each array goes from which trainer
device to which rollout device; every refit then runs that plan on the new
weights with `max_bytes_in_flight`, so no device ever holds more than the cap
plus one piece in flight, and `verify=True` checks every piece where it lands.

The meshes have JAX's default Explicit axes; `--auto-axes` builds them with Auto axes.
Run it from anywhere: `python examples/reshard/refit.py [--auto-axes]`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
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

HERE = Path(__file__).parent
STEPS, REFIT_EVERY, LR = 6, 2, 0.1


def host_params() -> dict:
    rng = np.random.default_rng(0)
    return {
        "embed": rng.standard_normal((96, 48), np.float32),
        "mlp": {
            "up": rng.standard_normal((48, 96), np.float32) / 8,
            "down": rng.standard_normal((96, 48), np.float32) / 8,
        },
        "scale": np.ones(48, np.float32),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--auto-axes", action="store_true", help="build the meshes with Auto axes")
    args = parser.parse_args(argv)
    devices = jax.devices()
    trainer_rules, serve_rules = sr.load(HERE / "trainer.shard"), sr.load(HERE / "serve.shard")
    auto = jax.sharding.AxisType.Auto
    trainer_mesh = jax.make_mesh(
        (3, 2), ("data", "model"), (auto, auto) if args.auto_axes else None, devices=devices[:6]
    )
    serve_mesh = jax.make_mesh((2,), ("model",), (auto,) if args.auto_axes else None, devices=devices[6:])

    params = sr.apply(host_params(), trainer_rules, trainer_mesh)
    # A stand-in for training: each step moves every weight a little (same layout in and out).
    step = jax.jit(
        lambda p: jax.tree.map(lambda w: w * (1 - LR) + LR * jnp.tanh(w), p),
        out_shardings=sr.shardings(params, trainer_rules, trainer_mesh),
    )

    refit = sr.transfer(trainer_rules, serve_rules, trainer_mesh, serve_mesh, shapes=params)
    cap = "16KiB"
    print(
        f"refit plan: {refit.bytes_moved / 2**10:.0f} KiB in {refit.pieces} pieces from devices 0-5 to 6-7; "
        f"at most {refit.in_flight_per_device(cap) / 2**10:.0f} KiB in flight per device with a {cap} cap"
    )
    served = None
    for n in range(1, STEPS + 1):
        params = step(params)
        if n % REFIT_EVERY == 0:
            start = time.perf_counter()
            served = refit.run(params, max_bytes_in_flight=cap, verify=True)  # the plan is reused
            seconds = time.perf_counter() - start
            same = all(
                np.array_equal(np.asarray(a), np.asarray(b))
                for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(served), strict=True)
            )
            print(f"step {n}: refit in {seconds * 1e3:.1f} ms, weights identical on the rollout: {same}")
            assert same
    assert served is not None
    up = served["mlp"]["up"]
    print(f"rollout mlp/up: {up.sharding.spec} on devices {sorted(d.id for d in up.sharding.device_set)}")
    tokens = jnp.arange(4) % 96
    hidden = served["embed"][tokens] @ served["mlp"]["up"]
    print(
        f"a rollout forward pass on devices 6-7: {hidden.shape}, finite: {bool(jnp.isfinite(hidden).all())}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
