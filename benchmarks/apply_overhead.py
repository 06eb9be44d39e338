"""`sr.apply` against a raw `jax.device_put` with precomputed shardings.

    python benchmarks/apply_overhead.py [--gib 1] [--repeat 5]

Both move the same 1 GiB tree of float32 NumPy arrays (256 leaves) onto 8
simulated CPU devices laid out `fsdp=4, model=2`. `sr.apply` also checks the
plan and every input before moving anything. Target: at most 10% slower than
the raw `device_put`. Exits 1 if it is more.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

import shardrules as sr

RULES = 'mesh fsdp, model\nrules params:\n  "kernel$" -> (fsdp, model)\n  "bias$" -> (model)\n'


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    mesh = jax.make_mesh((4, 2), ("fsdp", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    rules = sr.loads(RULES)
    layers = 128
    rows = int(args.gib * 2**30 / 4 / layers / 1024)
    rows -= rows % 8
    tree = {
        f"layer_{i}": {"kernel": np.ones((rows, 1024), np.float32), "bias": np.ones(1024, np.float32)}
        for i in range(layers)
    }
    shardings = sr.shardings(tree, rules, mesh)  # precomputed for the baseline

    def raw():
        jax.block_until_ready(jax.device_put(tree, shardings))

    def ours():
        jax.block_until_ready(sr.apply(tree, rules, mesh))

    ours()  # warm up both (the plan cache, JAX's transfer paths)
    raw()
    times = {"raw": [], "ours": []}
    for _ in range(args.repeat):  # interleaved, so drift affects both alike
        for name, fn in (("raw", raw), ("ours", ours)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    base, mine = min(times["raw"]), min(times["ours"])
    size = sum(x.nbytes for x in jax.tree.leaves(tree)) / 2**30
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; python {platform.python_version()}, jax {jax.__version__}"
    )
    print(f"tree: {len(jax.tree.leaves(tree))} leaves, {size:.2f} GiB of float32; best of {args.repeat}\n")
    print(f"{'':34}{'seconds':>9}")
    print(f"{'jax.device_put (precomputed)':34}{base:9.3f}")
    print(f"{'sr.apply':34}{mine:9.3f}")
    overhead = mine / base - 1
    print(f"\noverhead: {overhead:+.1%} (target <= +10%)")
    return 0 if overhead <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
