"""Peak memory and time of `sr.reshard` against one `jax.device_put` of the whole tree.

    python benchmarks/reshard.py [--gib 1] [--leaves 16]

A tree of float32 leaves already placed on a 4×2 (data, model) mesh of 8
simulated CPU devices moves to a 2×4 (replica, tensor) mesh with another
layout. Each variant runs in a fresh process (device memory is host memory on
CPU, so the process's peak resident set size measures it, as in
benchmarks/memory.py): the figure is the peak RSS above the RSS once the source
tree is placed, as a multiple of the tree's size, and the seconds the move
took (to the results being ready, sources deleted). Variants: one batched
`jax.device_put` of the whole tree with precomputed shardings, then the
sources dropped (the baseline); `sr.reshard` keeping the sources; `sr.reshard`
with `donate=True`. Exits 1 unless the donating reshard's extra peak is below
the baseline's and at most the tree's size / leaves × 2.5 (about one leaf, plus
allocator slack).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from importlib.metadata import version

RULES = """mesh data, model
rules params:
  "w\\d+$" -> (data, model)
"""
TARGET = """mesh replica, tensor
rules params:
  "w\\d+$" -> (tensor, replica)
"""

CHILD = r"""
import json, os, resource, sys, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp
import shardrules as sr

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")

variant, gib, n, rules_text, target_text = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
auto = (jax.sharding.AxisType.Auto,) * 2
source = jax.make_mesh((4, 2), ("data", "model"), axis_types=auto)
target = jax.make_mesh((2, 4), ("replica", "tensor"), axis_types=auto)
rules, target_rules = sr.loads(rules_text), sr.loads(target_text)
rows = int(gib * 2**30 / 4 / n / 4096)
shapes = {f"w{i}": jax.ShapeDtypeStruct((rows, 4096), jnp.float32) for i in range(n)}
make = jax.jit(
    lambda: {k: jnp.full(s.shape, i, s.dtype) for i, (k, s) in enumerate(shapes.items())},
    out_shardings=sr.shardings(shapes, rules, source),
)
tree = jax.block_until_ready(make())
shardings = sr.shardings(tree, target_rules, target)
before = rss()
start = time.perf_counter()
if variant == "device_put":
    out = jax.block_until_ready(jax.device_put(tree, shardings))
    tree = None  # the sources go when the last reference does (the pieces out reuses stay)
elif variant == "reshard":
    out = jax.block_until_ready(sr.reshard(tree, target_rules, target))
else:
    out = jax.block_until_ready(sr.reshard(tree, target_rules, target, donate=True))
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
ok = all(float(x[0, 0]) == int(k[1:]) and float(x[-1, -1]) == int(k[1:]) for k, x in out.items())
print(json.dumps({"before": before, "peak": peak, "bytes": sum(x.nbytes for x in out.values()), "seconds": seconds, "ok": ok}))
"""

LABELS = {
    "device_put": "jax.device_put (whole tree)",
    "reshard": "sr.reshard",
    "reshard-donate": "sr.reshard(donate=True)",
}


def run(variant: str, gib: float, n: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, variant, str(gib), str(n), RULES, TARGET],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        raise RuntimeError(f"{variant} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="tree size in GiB (default 1)")
    parser.add_argument("--leaves", type=int, default=16, help="number of equal leaves (default 16)")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()}; python {platform.python_version()}, "
        f"jax {version('jax')}, shardrules {version('shardrules')}"
    )
    results = {v: run(v, args.gib, args.leaves) for v in LABELS}
    print(
        f"\ntree: {args.gib:g} GiB of float32 in {args.leaves} leaves of {args.gib * 1024 / args.leaves:g} MiB, "
        "4x2 (data, model) -> 2x4 (replica, tensor), 8 simulated CPU devices"
    )
    print(f"{'':30}{'peak above start':>18}{'x tree':>8}{'seconds':>9}")
    ratios = {}
    for variant, r in results.items():
        ratios[variant] = (r["peak"] - r["before"]) / r["bytes"]
        print(
            f"{LABELS[variant]:30}{(r['peak'] - r['before']) / 2**30:15.2f} GiB"
            f"{ratios[variant]:8.2f}{r['seconds']:9.3f}"
        )
    ok = all(r["ok"] for r in results.values())
    bound = 2.5 / args.leaves
    met = ratios["reshard-donate"] < ratios["device_put"] and ratios["reshard-donate"] <= bound
    print(
        f"values exact: {'yes' if ok else 'NO'}; donating reshard below the baseline and <= {bound:.2f}x: "
        f"{'yes' if met else 'NO'}"
    )
    return 0 if ok and met else 1


if __name__ == "__main__":
    sys.exit(main())
