"""What loading a 7B checkpoint costs each of 16 hosts (`Plan.load_cost`), from its header alone.

    python benchmarks/load_cost_7b.py [--hosts 16]

A Llama-2-7B-shaped `.safetensors` header (transformers' names; 32 layers,
hidden 4096, intermediate 11008, vocabulary 32000, bfloat16: 6.74e9
parameters, 12.6 GiB) is written with an empty (sparse) data region, read as
`lint --shapes` reads it (the header only), and planned on 128 devices, 16
hosts of 8, in three layouts:

- FSDP: `fsdp=128`, every weight split on its first dimension;
- TP: `fsdp=16, model=8` (`fsdp` across hosts, `model` within each), as
  Megatron lays a transformer out: column-parallel weights (q, k, v, gate,
  up, the embedding and the head, stored `(out, in)`) `(model, fsdp)`, so
  `fsdp` splits their inner dimension, row-parallel ones (o, down) `(fsdp,
  model)`, norms replicated;
- TP, outer: the same with SR220's fix, `((model, fsdp), _)` for the
  column-parallel weights.

For each: per host, the bytes `load_checkpoint` reads, its reads and its peak
host memory, the SR220 findings, and how long `load_cost` took.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import struct
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

import shardrules as sr
from shardrules._planning._units import format_bytes

VOCAB, D, FF, LAYERS = 32000, 4096, 11008, 32

RULES = {
    "FSDP, fsdp=128": (
        {"fsdp": 128},
        'mesh fsdp\nrules params:\n  "norm" -> (fsdp)\n  default -> (fsdp, _)\n',
    ),
    "TP, fsdp=16 x model=8": (
        {"fsdp": 16, "model": 8},
        "mesh fsdp, model\nrules params:\n"
        '  "(q|k|v|gate|up)_proj|embed_tokens|lm_head" -> (model, fsdp)\n'
        '  "(o|down)_proj" -> (fsdp, model)\n'
        "  default -> replicated\n",
    ),
    "TP, outer dimensions": (
        {"fsdp": 16, "model": 8},
        "mesh fsdp, model\nrules params:\n"
        '  "(q|k|v|gate|up)_proj|embed_tokens|lm_head" -> ((model, fsdp), _)\n'
        '  "(o|down)_proj" -> (fsdp, model)\n'
        "  default -> replicated\n",
    ),
}


def llama7b_shapes() -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, D)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for name in ("q", "k", "v", "o"):
            shapes[f"{p}self_attn.{name}_proj.weight"] = (D, D)
        shapes[f"{p}mlp.gate_proj.weight"] = (FF, D)
        shapes[f"{p}mlp.up_proj.weight"] = (FF, D)
        shapes[f"{p}mlp.down_proj.weight"] = (D, FF)
        shapes[f"{p}input_layernorm.weight"] = (D,)
        shapes[f"{p}post_attention_layernorm.weight"] = (D,)
    shapes["model.norm.weight"] = (D,)
    shapes["lm_head.weight"] = (VOCAB, D)
    return shapes


def write_header(path: Path) -> int:
    """The header, and a data region left sparse (nothing written): returns the parameters."""
    header, offset, count = {"__metadata__": {"format": "pt"}}, 0, 0
    for name, shape in llama7b_shapes().items():
        size = 1
        for n in shape:
            size *= n
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + 2 * size]}
        offset += 2 * size
        count += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=16)
    args = parser.parse_args()
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}; Python {platform.python_version()}, "
        f"JAX {jax.__version__}, shardrules {importlib.metadata.version('shardrules')}"
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.safetensors"
        count = write_header(path)
        shapes = sr.load_shapes(str(path))
    data = sum(s.size * s.dtype.itemsize for s in shapes.values())
    print(f"Llama-2-7B shapes: {len(shapes)} tensors, {count / 1e9:.2f}e9 parameters, {format_bytes(data)}\n")
    print(
        f"| layout | bytes read per host | reads per host | peak per host | read by all {args.hosts} hosts "
        "| SR220 (rules, leaves) | load_cost (s) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    tables = []
    for label, (sizes, text) in RULES.items():
        rules = sr.loads(text, name="llama7b.shard")
        plan = sr.plan(shapes, rules, sizes)
        plan.raise_for_errors()
        start = time.perf_counter()
        cost = plan.load_cost(hosts=args.hosts)
        took = time.perf_counter() - start
        worst = cost.worst
        leaves = sum(f.count for f in cost.findings)
        print(
            f"| {label} | {format_bytes(worst.bytes_read)} | {worst.reads:,} | {format_bytes(cost.peak_bytes)} "
            f"| {format_bytes(cost.bytes_read)} ({cost.bytes_read / data:.1f}x the data) "
            f"| {len(cost.findings)}, {leaves} | {took:.3f} |"
        )
        tables.append((label, cost))
    for label, cost in tables:
        print(f"\n{label}:\n{cost}")
        for finding in cost.findings:
            print(f"  SR220 at line {finding.span.line}: {finding.message}")


if __name__ == "__main__":
    main()
