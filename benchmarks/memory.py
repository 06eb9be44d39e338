"""Peak memory of sharded init and checkpoint loading, against the naive ways.

    python benchmarks/memory.py [--gib 2]

Two layouts of the same 2 GiB of float32: 8 tensors of 256 MiB, and 32 of
64 MiB (closer to a transformer's weight matrices). Each variant runs in a
fresh process on 8 simulated CPU devices (so device
memory is host memory, and the process's peak resident set size measures it).
The figure reported is the peak RSS above the same process's RSS just before
the work starts (interpreter, JAX and the mesh already set up), as a multiple
of the model's size. Targets: `sr.init` and `sr.load_checkpoint` at most 1.3x;
the naive ways (init on one device then `sr.apply`; read whole tensors then
`sr.apply`) are shown beside them. Exits 1 if ours is over target or not
below the naive way.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import struct
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

RULES = """mesh fsdp, model
rules params:
  "w\\d+$" -> (fsdp, model)
"""

CHILD = r"""
import json, os, resource, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp, numpy as np
import shardrules as sr

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")

variant, gib, folder, n = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
rules = sr.load(os.path.join(folder, "rules.shard"))
mesh = jax.make_mesh((4, 2), ("fsdp", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
rows = int(gib * 2**30 / 4 / n / 4096)
def init_fn(key):
    return {f"w{i}": jax.random.normal(jax.random.fold_in(key, i), (rows, 4096), jnp.float32) for i in range(n)}
jax.block_until_ready(jax.device_put(jnp.ones(8), jax.devices()[0]))  # warm up the runtime
before = rss()
if variant == "init":
    out = sr.init(init_fn, rules, mesh)(jax.random.key(0))
elif variant == "init-naive":
    out = sr.apply(jax.jit(init_fn)(jax.random.key(0)), rules, mesh)
elif variant == "load":
    out = sr.load_checkpoint(os.path.join(folder, "model.safetensors"), rules, mesh)
elif variant == "load-naive":
    header = json.load(open(os.path.join(folder, "header.json")))
    data = open(os.path.join(folder, "model.safetensors"), "rb").read()
    base = 8 + header.pop("__size__")
    arrays = {k: np.frombuffer(data, np.float32, count=int(np.prod(v["shape"])), offset=base + v["data_offsets"][0]).reshape(v["shape"]) for k, v in header.items()}
    out = sr.apply(arrays, rules, mesh)
jax.block_until_ready(out)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"before": before, "peak": peak, "bytes": sum(x.nbytes for x in out.values())}))
"""


def write_checkpoint(folder: Path, gib: float, n: int) -> None:
    """A float32 .safetensors file of the same tensors `init_fn` makes, written in chunks."""
    rows = int(gib * 2**30 / 4 / n / 4096)
    header, offset = {}, 0
    for i in range(n):
        size = rows * 4096 * 4
        header[f"w{i}"] = {"dtype": "F32", "shape": [rows, 4096], "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    chunk = bytes(64 * 2**20)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        left = offset
        while left:
            f.write(chunk[: min(left, len(chunk))])
            left -= min(left, len(chunk))
    (folder / "header.json").write_text(json.dumps({**header, "__size__": len(raw)}))


def run(variant: str, gib: float, folder: Path, n: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, variant, str(gib), str(folder), str(n)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        raise RuntimeError(f"{variant} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0, help="model size in GiB (default 2)")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()}; python {platform.python_version()}, "
        f"jax {version('jax')}, shardrules {version('shardrules')}"
    )
    ok = True
    for n in (8, 32):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "rules.shard").write_text(RULES)
            write_checkpoint(folder, args.gib, n)
            results = {v: run(v, args.gib, folder, n) for v in ("init", "init-naive", "load", "load-naive")}
        size = args.gib * 1024 / n
        print(
            f"\nmodel: {args.gib:g} GiB of float32 in {n} tensors of {size:g} MiB, "
            "on 8 simulated CPU devices (fsdp=4, model=2)"
        )
        print(f"{'':26}{'peak above start':>18}{'x model':>9}")
        ratios = {}
        for variant, r in results.items():
            ratios[variant] = (r["peak"] - r["before"]) / r["bytes"]
            label = {
                "init": "sr.init",
                "init-naive": "init, then sr.apply",
                "load": "sr.load_checkpoint",
                "load-naive": "read all, then sr.apply",
            }[variant]
            print(f"{label:26}{(r['peak'] - r['before']) / 2**30:15.2f} GiB{ratios[variant]:9.2f}")
        met = ratios["init"] <= 1.3 and ratios["load"] <= 1.3
        below = ratios["init"] < ratios["init-naive"] and ratios["load"] < ratios["load-naive"]
        print(
            f"targets (<= 1.3x): {'met' if met else 'NOT met'}; below the naive ways: {'yes' if below else 'NO'}"
        )
        ok = ok and met and below
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
