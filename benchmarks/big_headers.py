"""A 1T-parameter MoE's checkpoint header: `sr.load_shapes`, `shardrules
suggest` and `shardrules lint` on it, each against its floor in the same run.

    python benchmarks/big_headers.py [--repeat 5]

The checkpoint: a Kimi-K2-sized MoE (`_expert_layouts.kimi_k2_header`: 61
layers, 384 experts, 69,975 tensors, about 1.03 trillion parameters), written
as real `.safetensors` files whose data regions are left sparse (nothing reads
them): one file with the whole header (9.2 MB of JSON), and the same tensors
sharded one file per layer with a `model.safetensors.index.json`. Measured,
best of `--repeat` rounds, the variants taking turns:

1. In this process: `sr.load_shapes` of the file against `json.loads` of its
   header bytes (floor; read beforehand, while `load_shapes` reads the file
   too); of the index against `json.loads` of the index and of every shard's
   header. Target: at most 1.5x the floor.
2. The commands, as fresh processes, in CPU time (user + sys, from
   `getrusage(RUSAGE_CHILDREN)`): `shardrules suggest --shapes HEADER --mesh
   fsdp=32,expert=8,model=8 -o FILE` and `shardrules lint FILE --mesh ...
   --shapes HEADER`, for the file and the index, against a Python that starts,
   imports the command line and `json.loads` the header (floor). Target: each
   command under 2 s of CPU time.

Exits 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _expert_layouts as E  # noqa: E402
from _timing import best_of, cpu_of  # noqa: E402

import shardrules as sr  # noqa: E402

MESH = "fsdp=32,expert=8,model=8"
CODES = {"bfloat16": "BF16", "float32": "F32"}


def write_safetensors(path: Path, tensors: dict) -> bytes:
    """A `.safetensors` file of `tensors` (name → `ShapeDtypeStruct`) whose
    data region is a hole of the right length; returns the header's bytes."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, leaf in tensors.items():
        size = math.prod(leaf.shape) * leaf.dtype.itemsize
        header[name] = {
            "dtype": CODES[str(leaf.dtype)],
            "shape": list(leaf.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        with contextlib.suppress(OSError):  # no sparse files: the header alone, which is all that is read
            f.truncate(8 + len(raw) + offset)  # sparse: no byte of it is written
    return raw


def write_sharded(folder: Path, tree: dict) -> tuple[Path, list[bytes], bytes]:
    """One shard per layer (the rest in the last), and the index naming them."""
    groups: dict[str, dict] = {}
    for name, leaf in tree.items():
        layer = name.split(".")[2] if name.startswith("model.layers.") else "rest"
        groups.setdefault(layer, {})[name] = leaf
    weight_map: dict[str, str] = {}
    headers = []
    for i, part in enumerate(groups.values()):
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        headers.append(write_safetensors(folder / file, part))
        weight_map.update(dict.fromkeys(part, file))
    index = folder / "model.safetensors.index.json"
    text = json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}).encode()
    index.write_bytes(text)
    return index, headers, text


def timed(fn: Callable[[], object]) -> float:
    gc.collect()  # each variant starts with the same heap
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="rounds; each variant keeps its best")
    args = parser.parse_args()
    tree = E.kimi_k2_header()
    params = sum(math.prod(leaf.shape) for leaf in tree.values())
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        single = folder / "model.safetensors"
        raw = write_safetensors(single, tree)
        (folder / "sharded").mkdir()
        index, shard_headers, index_text = write_sharded(folder / "sharded", tree)
        shapes = sr.load_shapes(single)
        assert len(shapes) == len(tree) and sr.load_shapes(index) == shapes
        made = len({id(leaf) for leaf in shapes.values()})

        def index_floor() -> None:
            json.loads(index_text)
            for header in shard_headers:
                json.loads(header)

        def collector_off(fn: Callable[[], object]) -> Callable[[], None]:
            def run() -> None:
                gc.disable()
                try:
                    fn()
                finally:
                    gc.enable()

            return run

        header_floor = lambda: json.loads(raw)  # noqa: E731
        reading = best_of(
            {
                "header floor": lambda: timed(header_floor),
                "header floor, collector off": lambda: timed(collector_off(header_floor)),
                "header": lambda: timed(lambda: sr.load_shapes(single)),
                "index floor": lambda: timed(index_floor),
                "index floor, collector off": lambda: timed(collector_off(index_floor)),
                "index": lambda: timed(lambda: sr.load_shapes(index)),
            },
            args.repeat,
        )

        python = [sys.executable]
        floor_code = (
            "import json, struct, shardrules._cli._main\n"
            f"f = open({str(single)!r}, 'rb'); json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))"
        )
        commands: dict[str, Callable[[], float]] = {
            "python -c pass": lambda: cpu_of([*python, "-c", "pass"], folder),
            "start + import + json.loads (floor)": lambda: cpu_of([*python, "-c", floor_code], folder),
        }
        for label, source in (("", single), (" (index)", index)):
            out = folder / f"drafted{len(label)}.shard"
            suggest = [
                *python,
                "-m",
                "shardrules",
                "suggest",
                "--shapes",
                str(source),
                "--mesh",
                MESH,
                "-o",
                str(out),
            ]
            lint = [*python, "-m", "shardrules", "lint", str(out), "--mesh", MESH, "--shapes", str(source)]
            commands[f"shardrules suggest{label}"] = lambda argv=suggest: cpu_of(argv, folder)
            commands[f"shardrules lint{label}"] = lambda argv=lint: cpu_of(argv, folder)
        cpu = best_of(commands, args.repeat)

    print(f"machine: {platform.machine()} {os.cpu_count()} cores, {platform.system()}")
    print(f"python {platform.python_version()}, jax {jax.__version__}, shardrules {sr.__version__}")
    missed = False
    print(
        f"checkpoint: {len(tree):,} tensors, {params / 1e12:.2f}T parameters; header {len(raw) / 1e6:.1f} MB, "
        f"index of {len(shard_headers)} shards; {made} ShapeDtypeStructs read; best of {args.repeat} rounds"
    )
    print()
    print("| in this process | seconds | vs floor | vs floor, collector off | target |")
    print("|---|--:|--:|--:|--:|")
    for key, floor_text, text in (
        ("header", "`json.loads` of the header bytes", "`sr.load_shapes(model.safetensors)`"),
        (
            "index",
            f"`json.loads` of the index and the {len(shard_headers)} headers",
            "`sr.load_shapes(model.safetensors.index.json)`",
        ),
    ):
        floor, off, seconds = reading[f"{key} floor"], reading[f"{key} floor, collector off"], reading[key]
        missed = missed or seconds / floor > 1.5
        print(f"| floor: {floor_text} | {floor:.3f} | 1.00x | {floor / off:.2f}x | |")
        print(f"| floor, collector off | {off:.3f} | {off / floor:.2f}x | 1.00x | |")
        print(f"| {text} | {seconds:.3f} | {seconds / floor:.2f}x | {seconds / off:.2f}x | 1.5x |")
    print()
    floor = cpu["start + import + json.loads (floor)"]
    print("| command (fresh process) | CPU seconds | vs floor | target |\n|---|--:|--:|--:|")
    for name, seconds in cpu.items():
        target = "< 2 s" if name.startswith("shardrules") else ""
        missed = missed or (bool(target) and seconds >= 2.0)
        print(f"| {name} | {seconds:.2f} | {seconds / floor:.2f}x | {target} |")
    print("\nall targets met" if not missed else "\nTARGET MISSED")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
