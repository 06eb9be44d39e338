"""Trainer → rollout with `sr.transfer` under a memory cap, against one `jax.device_put`.

    python benchmarks/transfer.py [--gib 1] [--leaves 16] [--cap 64MiB]

A tree of float32 leaves on a trainer mesh (data=3, model=2 on devices 0-5 of
8 simulated CPU devices) moves to a rollout mesh (model=2 on devices 6-7), the
kernels from `(data, model)` to `(_, model)` and the embeddings from
`(model, data)` to `(model, _)`. Each variant runs in a fresh process, with the
source made two ways: placed from NumPy by `sr.apply` (the NumPy tree then
dropped) and returned by a jitted step. Figures:

- seconds of the move (results ready, sources deleted where donated), cold
  (the first call in the process: plans, and compiles the small programs that
  cut and assemble pieces) and warm (a second tree of the same shapes);
- the peak resident set size above the RSS once the source is placed (device
  memory is host memory on CPU), as a multiple of the tree, sampled every
  millisecond during the warm move;
- for the transfers, each device's bytes alive (`jax.live_arrays`, buffers
  counted once) at every chunk while its pieces are in flight, above the most
  it holds before or after the move: at most the cap plus one piece is the
  target;
- the planning time of the first call and of a warm call (`plan_for` on a tree
  of the same signature).

Baseline: one batched `jax.device_put` of the whole tree to the target
shardings (precomputed), then the sources dropped. Exits 1 unless every value
is exact, the capped donating transfer's in-flight memory per device is at
most the cap plus one piece, and its warm time is at most 1.5x the baseline's
(not checked with `--mapped`, which makes every allocation slower).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from importlib.metadata import version

TRAIN = """mesh data, model
rules params:
  "kernel\\d+$" -> (data, model)
  "embed\\d+$"  -> (model, data)
"""
ROLLOUT = """mesh model
rules params:
  "kernel\\d+$" -> (_, model)
  "embed\\d+$"  -> (model, _)
"""

CHILD = r"""
import json, os, sys, threading, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh
import shardrules as sr
from shardrules._placement import _moving

variant, source_kind, gib, n, cap, train_text, rollout_text = sys.argv[1:8]
gib, n = float(gib), int(n)
cap = None if cap == "none" else cap
devices = jax.devices()
train_mesh = Mesh(np.array(devices[:6]).reshape(3, 2), ("data", "model"))
rollout_mesh = Mesh(np.array(devices[6:]), ("model",))
train, rollout = sr.loads(train_text), sr.loads(rollout_text)
rows = int(gib * 2**30 / 4 / n / 4096) // 6 * 6
names = [f"kernel{i}" if i % 2 == 0 else f"embed{i}" for i in range(n)]
shapes = {  # kernels (rows, 4096), embeddings (4096, rows): each dimension the trainer splits over data divides by 3
    k: jax.ShapeDtypeStruct((rows, 4096) if k.startswith("kernel") else (4096, rows), jnp.float32) for k in names
}

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def make(offset):
    if source_kind == "apply":
        host = {k: np.full(s.shape, i + offset, np.float32) for i, (k, s) in enumerate(shapes.items())}
        placed = jax.block_until_ready(sr.apply(host, train, train_mesh))
        del host
        return placed
    step = jax.jit(
        lambda: {k: jnp.full(s.shape, i + offset, s.dtype) for i, (k, s) in enumerate(shapes.items())},
        out_shardings=sr.shardings(shapes, train, train_mesh),
    )
    return jax.block_until_ready(step())

def live():
    out, seen = {}, set()
    for x in jax.live_arrays():
        if x.is_deleted():
            continue
        for s in x.addressable_shards:
            key = (s.device.id, s.data.unsafe_buffer_pointer())
            if key not in seen:
                seen.add(key)
                out[s.device.id] = out.get(s.device.id, 0) + s.data.nbytes
    return out

targets = sr.shardings(shapes, rollout, rollout_mesh)
t = sr.transfer(train, rollout, train_mesh, rollout_mesh)

def move(tree):
    if variant == "device_put":
        out = jax.block_until_ready(jax.device_put(tree, targets))
        tree.clear()
        return out
    if variant == "reshard":
        return jax.block_until_ready(sr.reshard(tree, rollout, rollout_mesh, donate=True))
    return jax.block_until_ready(t.run(tree, max_bytes_in_flight=cap, donate=True))

result = {}
start = time.perf_counter(); first_plan = t.plan_for(shapes); result["plan_first"] = time.perf_counter() - start
start = time.perf_counter(); t.plan_for(shapes); result["plan_warm"] = time.perf_counter() - start
tree = make(0)
start = time.perf_counter(); out = move(tree); result["cold"] = time.perf_counter() - start
ok = all(float(out[k][0, 0]) == i and float(out[k][-1, -1]) == i for i, k in enumerate(shapes))
del out, tree
tree = make(100)
before_live = live()
before = rss()
peak = [before]
stop = [False]
def watch():
    while not stop[0]:
        peak[0] = max(peak[0], rss())
        time.sleep(0.001)
flight = []
if variant == "transfer":
    _moving._observe = lambda mover, chunk: flight.append(live())
watcher = threading.Thread(target=watch)
watcher.start()
start = time.perf_counter()
out = move(tree)
result["warm"] = time.perf_counter() - start
stop[0] = True
watcher.join()
peak[0] = max(peak[0], rss())
after_live = live()
ok = ok and all(float(out[k][0, 0]) == i + 100 and float(out[k][-1, -1]) == i + 100 for i, k in enumerate(shapes))
extra = 0
for seen in flight:
    for d, b in seen.items():
        extra = max(extra, b - max(before_live.get(d, 0), after_live.get(d, 0)))
result.update(
    before=before, peak=peak[0], bytes=sum(x.nbytes for x in out.values()), ok=ok,
    extra_in_flight=extra, chunks=len(flight),
    largest_piece=max(p.nbytes for leaf in t.leaves for p in leaf.pieces),
    bytes_moved=t.bytes_moved,
)
print(json.dumps(result))
"""

VARIANTS = {
    "device_put": "jax.device_put (whole tree)",
    "reshard": "sr.reshard(donate=True)",
    "transfer": "sr.transfer(...).run(donate=True)",
}


def run(variant: str, source: str, gib: float, n: int, cap: str, mapped: bool) -> dict:
    env = dict(os.environ)
    if mapped:  # every large allocation its own mapping, returned to the system when freed
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, variant, source, str(gib), str(n), cap, TRAIN, ROLLOUT],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if proc.returncode:
        raise RuntimeError(f"{variant} ({source}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def size(text: str) -> int:
    from shardrules._language._sizes import byte_size

    return byte_size(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="tree size in GiB (default 1)")
    parser.add_argument("--leaves", type=int, default=16, help="number of equal leaves (default 16)")
    parser.add_argument("--cap", default="64MiB", help="max_bytes_in_flight (default 64MiB)")
    parser.add_argument(
        "--mapped",
        action="store_true",
        help="run the children with MALLOC_MMAP_THRESHOLD_=65536, so that freed memory leaves the RSS "
        "(glibc otherwise keeps freed blocks below 32 MiB for reuse); the time check is not applied",
    )
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()}; python "
        f"{platform.python_version()}, jax {version('jax')}, shardrules {version('shardrules')}"
    )
    print(
        f"tree: {args.gib:g} GiB of float32 in {args.leaves} leaves; trainer data=3, model=2 on devices 0-5 "
        "-> rollout model=2 on devices 6-7 (8 simulated CPU devices)"
        + ("; large allocations mapped (MALLOC_MMAP_THRESHOLD_=65536)" if args.mapped else "")
    )
    rows = []
    for source in ("apply", "jit"):
        for variant, label in VARIANTS.items():
            caps = [args.cap, "none"] if variant == "transfer" else ["none"]
            for cap in caps:
                r = run(variant, source, args.gib, args.leaves, cap, args.mapped)
                name = label if variant != "transfer" else f"{label}, cap {cap}"
                rows.append((source, variant, cap, name, r))
    print(
        f"\n{'source':7}{'':44}{'cold s':>8}{'warm s':>8}{'x base':>8}{'RSS peak':>10}{'x tree':>8}"
        f"{'in flight/dev':>15}{'plan ms':>9}{'warm plan us':>14}"
    )
    met = True
    ok = True
    for source, variant, cap, name, r in rows:
        base = next(x for s, v, _, _, x in rows if s == source and v == "device_put")
        ratio = r["warm"] / base["warm"]
        extra = r["peak"] - r["before"]
        flight = f"{r['extra_in_flight'] / 2**20:.1f} MiB" if variant == "transfer" else "-"
        print(
            f"{source:7}{name:44}{r['cold']:8.3f}{r['warm']:8.3f}{ratio:8.2f}{extra / 2**20:7.0f} MiB"
            f"{extra / r['bytes']:8.2f}{flight:>15}{r['plan_first'] * 1e3:9.1f}{r['plan_warm'] * 1e6:14.0f}"
        )
        ok = ok and r["ok"]
        if variant == "transfer" and cap != "none":
            bound = size(cap) + r["largest_piece"]
            met = met and r["extra_in_flight"] <= bound and (args.mapped or ratio <= 1.5)
    print(
        f"\nvalues exact: {'yes' if ok else 'NO'}; capped transfer within the cap plus one piece per device and "
        f"within 1.5x the baseline's time: {'yes' if met else 'NO'}"
    )
    return 0 if ok and met else 1


if __name__ == "__main__":
    sys.exit(main())
