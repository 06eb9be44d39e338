"""`load_checkpoint` with positioned reads against the memory map it replaced.

    python benchmarks/load_reads.py [--mib 256] [--repeat 3]

A `.safetensors` file of about `--mib` MiB (bfloat16 `(4096, 4096)` kernels,
and a few norms) is loaded on 8 simulated CPU devices in three layouts:

- FSDP: `(fsdp, _)`, dimension 0 over the 8 devices (each slice one range);
- TP inner: `(_, model)`, dimension 1 over the 8 devices (each slice 4096 runs
  of 1 KiB: the reader reads whole rows in 16 MiB blocks and cuts the slices
  out);
- TP inner again with the blocks turned off (`READ_COST` 0: one read per
  run, 262,144 reads of 1 KiB), to show what the blocks save;
- 2-D: `(fsdp, model)` on a 4 × 2 mesh.

Each is loaded by `sr.load_checkpoint` (positioned reads of each process's
byte ranges) and by the reader it replaced, re-implemented here: a
`np.memmap` of each tensor, each distinct slice copied out of it once, handed
to `jax.make_array_from_callback`. Both give the same arrays (checked). Best
of `--repeat` rounds, the two taking turns; the file is in the page cache
(written just before). The reads and bytes `Plan.load_cost` predicts are
printed beside, with the reads the reader issued (counted).

Then the cost of issuing the reads alone: 32,768 positioned reads of 1 KiB
against two of 16 MiB (the same 32 MiB), which is what `_ranges.READ_COST`
prices a read at.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import struct
import sys
import tempfile
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import ml_dtypes
import numpy as np

import shardrules as sr
from shardrules._placement import _ranged
from shardrules._planning import _ranges
from shardrules._planning._shapes import load_shapes

LAYOUTS = {
    "FSDP (fsdp, _)": ((8, 1), "(fsdp, _)", None),
    "TP inner (_, model)": ((1, 8), "(_, model)", None),
    "TP inner, one read per run": ((1, 8), "(_, model)", 0),
    "2-D (fsdp, model)": ((4, 2), "(fsdp, model)", None),
}
"""label → (mesh shape, spec, `READ_COST` to use: 0 turns blocks off)"""


_DEFAULT_COST = _ranges.READ_COST


def write_checkpoint(path: Path, mib: int) -> None:
    """`mib // 32` bfloat16 `(4096, 4096)` kernels and as many `(4096,)` norms."""
    rng = np.random.default_rng(0)
    header, blobs, offset = {}, [], 0
    for i in range(max(1, mib // 32)):
        for name, shape in ((f"layers.{i}.kernel", (4096, 4096)), (f"layers.{i}.norm", (4096,))):
            raw = rng.standard_normal(shape, np.float32).astype(ml_dtypes.bfloat16).tobytes()
            header[name] = {
                "dtype": "BF16",
                "shape": list(shape),
                "data_offsets": [offset, offset + len(raw)],
            }
            blobs.append(raw)
            offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for blob in blobs:
            f.write(blob)


def memmap_load(path: Path, rules: sr.RuleSet, mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
    """The reader `load_checkpoint` had: a memory map per tensor, each distinct slice handed over once."""
    raw = path.read_bytes()[: 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]]
    header = json.loads(raw[8:])
    start = len(raw)
    shapes = load_shapes(str(path))
    targets = sr.shardings(shapes, rules, mesh)
    out = {}
    for name, info in header.items():
        shape = tuple(info["shape"])
        lo, _ = info["data_offsets"]
        data = np.memmap(path, dtype=ml_dtypes.bfloat16, mode="r", offset=start + lo, shape=shape)
        seen: dict = {}

        def read(index, data=data, seen=seen):
            key = tuple((s.start, s.stop, s.step) for s in index)
            if key not in seen:
                seen[key] = np.asarray(data[index])
            return seen[key]

        out[name] = jax.make_array_from_callback(shape, targets[name], read)
    return out


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        jax.block_until_ready(out)
        times.append(time.perf_counter() - start)
        del out
    return min(times)


def issue_reads(fd: int, size: int, count: int) -> float:
    """Seconds for `count` positioned reads of `size` bytes each, from the file's start."""
    buffer = np.empty(size * count, np.uint8)
    view = memoryview(buffer)
    start = time.perf_counter()
    for i in range(count):
        os.preadv(fd, [view[i * size : (i + 1) * size]], i * size)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}; Python {platform.python_version()}, "
        f"JAX {jax.__version__}, shardrules {importlib.metadata.version('shardrules')}"
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.safetensors"
        write_checkpoint(path, args.mib)
        size = path.stat().st_size
        print(f"checkpoint: {size / 2**20:.1f} MiB, {len(load_shapes(str(path)))} tensors, 8 CPU devices\n")
        print(
            "| layout | memory map (s) | positioned reads (s) | ratio | reads issued | predicted | bytes read |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for label, (mesh_shape, spec, read_cost) in LAYOUTS.items():
            _ranges.READ_COST = _DEFAULT_COST if read_cost is None else read_cost
            mesh = jax.make_mesh(mesh_shape, ("fsdp", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
            rules = sr.loads(
                f'mesh fsdp, model\nrules params:\n  "kernel" -> {spec}\n  default -> replicated\n'
            )
            counted = {"reads": 0, "bytes": 0}
            real = _ranged.read_at

            def counting(fd, view, offset, real=real, counted=counted):
                counted["reads"] += 1
                counted["bytes"] += len(view)
                real(fd, view, offset)

            _ranged.read_at = counting
            try:
                new = sr.load_checkpoint(path, rules, mesh)
            finally:
                _ranged.read_at = real
            old = memmap_load(path, rules, mesh)
            for name in new:
                assert np.array_equal(np.asarray(new[name]), np.asarray(old[name])), name
            del new, old
            cost = sr.plan(load_shapes(str(path)), rules, mesh).load_cost(hosts=1)
            assert (cost.reads, cost.bytes_read) == (counted["reads"], counted["bytes"])
            t_old = t_new = float("inf")
            for _ in range(2):  # taking turns
                t_old = min(
                    t_old, best(lambda mesh=mesh, rules=rules: memmap_load(path, rules, mesh), args.repeat)
                )
                t_new = min(
                    t_new,
                    best(lambda mesh=mesh, rules=rules: sr.load_checkpoint(path, rules, mesh), args.repeat),
                )
            print(
                f"| {label} | {t_old:.3f} | {t_new:.3f} | {t_new / t_old:.2f}x | {counted['reads']:,} | "
                f"{cost.reads:,} | {counted['bytes'] / 2**20:.1f} MiB |"
            )
        _ranges.READ_COST = _DEFAULT_COST
        fd = os.open(path, os.O_RDONLY)
        try:
            small = min(issue_reads(fd, 1024, 32768) for _ in range(args.repeat))
            large = min(issue_reads(fd, 16 << 20, 2) for _ in range(args.repeat))
        finally:
            os.close(fd)
        print(
            f"\n32 MiB as 32,768 reads of 1 KiB: {small * 1e3:.1f} ms ({small / 32768 * 1e6:.1f} µs a read); "
            f"as 2 reads of 16 MiB: {large * 1e3:.1f} ms ({32 / 1024 / large:.2f} GiB/s)"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
