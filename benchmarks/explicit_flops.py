"""Per-device FLOPs of one train step under `sr.jit`: Explicit axes against Auto axes.

    python benchmarks/explicit_flops.py [--only NAME ...]
    python benchmarks/explicit_flops.py --decoder-1b [LAYERS]

For each model of `_models.py` (a train step: `jax.value_and_grad` of a
next-token loss, then SGD), the same rule file lays out the parameters and the
batch on a mesh with Explicit axes and on one with Auto axes, 8 simulated CPU
devices. The figure is XLA's `flops` from the compiled step's
`cost_analysis()`, which on a partitioned program counts one device's work.
The ideal is the same step under plain `jax.jit` on one device, divided by the
number of devices. A model whose code names the mesh it runs on (MaxText) is
built for each: with `shard_mode: explicit` for the Explicit mesh, where its own
code states its activations' layouts, and `shard_mode: auto` for the Auto mesh
and for one device.

Targets: Explicit within 1.05x of Auto on every model, and within 1.10x of the
ideal for pure data parallelism (`rules/data_parallel.shard`).

`--decoder-1b` instead costs the 1.1B-sized NNX decoder of `_models.py`
(TinyLlama's sizes, `LAYERS` of its 22 layers, 2 by default) on `fsdp=32,
model=8`, 256 simulated CPU devices (in this process alone), with
`step.cost` on shapes only (nothing runs): its FLOPs per device against the
ideal (the one-device step's over 256), target 1.05x, and its peak memory per
device. Models whose
library is not installed are reported as `skipped: <reason>`. The SR210
warnings (an axis the inferred layout had to drop) emitted while tracing each
Explicit step are counted and printed. Exits 1 if a target is missed or a step
fails.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# `--decoder-1b`: 256 devices, in a process of its own
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={256 if '--decoder-1b' in sys.argv else 8}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("KERAS_BACKEND", "jax")

import jax
from jax.sharding import AxisType

import shardrules as sr

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _models

VS_AUTO, VS_IDEAL = 1.05, 1.10
VS_IDEAL_1B = 1.05  # the 1.1B decoder on 256 devices

FSDP_TP, DATA = "fsdp=4, model=2", "data=8"
CASES: list[tuple[str, str, Callable[[], _models.Model], bool]] = [
    # (label, mesh, builder, data parallel: held to the ideal)
    ("transformer", FSDP_TP, _models.transformer, False),
    ("nnx gqa+moe", "data=4, model=2", _models.nnx_moe, False),
    ("nnx gather moe", FSDP_TP, _models.nnx_gather_moe, False),
    ("nnx gather moe, grouped", FSDP_TP, lambda: _models.nnx_gather_moe(grouped=True), False),
    ("keras-hub Gemma", FSDP_TP, _models.keras_gemma, False),
    ("recurrentgemma Griffin", FSDP_TP, _models.griffin, False),
    ("penzai llamalike", FSDP_TP, _models.penzai_llamalike, False),
    ("MaxText llama2", "fsdp=4, tensor=2", _models.maxtext_llama, False),
    ("transformer", DATA, lambda: _models.transformer(data_parallel=True), True),
    ("nnx gqa+moe", DATA, lambda: _models.nnx_moe(data_parallel=True), True),
    # one group for the whole batch: pure data parallelism cannot split its experts' buffers (not held to the ideal)
    ("nnx gather moe", DATA, lambda: _models.nnx_gather_moe(data_parallel=True), False),
    ("nnx gather moe, grouped", DATA, lambda: _models.nnx_gather_moe(data_parallel=True, grouped=True), True),
    ("keras-hub Gemma", DATA, lambda: _models.keras_gemma(data_parallel=True), True),
]


@dataclass
class Row:
    model: str
    mesh: str
    explicit: float = 0.0
    auto: float = 0.0
    ideal: float = 0.0
    sr210: int = 0
    data_parallel: bool = False
    note: str = ""  # "skipped: ..." or "failed: ..."

    @property
    def vs_auto(self) -> float:
        return self.explicit / self.auto

    @property
    def vs_ideal(self) -> float:
        return self.explicit / self.ideal

    @property
    def holds(self) -> bool:
        return self.vs_auto <= VS_AUTO and (not self.data_parallel or self.vs_ideal <= VS_IDEAL)


def flops(compiled) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"])


def measure(model: _models.Model, data_parallel: bool) -> tuple[Row, list[str]]:
    """Explicit, Auto and ideal per-device FLOPs of `model`'s step, and the SR210
    messages of the Explicit trace."""
    row = Row(model.name, model.mesh_text, data_parallel=data_parallel)
    rules = sr.load(model.rules)
    one = flops(jax.jit(model.step_on(None)).lower(model.params, model.batch).compile())
    row.ideal = one / jax.device_count()
    messages: list[str] = []
    for kind in (AxisType.Explicit, AxisType.Auto):
        mesh = jax.make_mesh(model.shape, model.axes, axis_types=(kind,) * len(model.axes))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sr.ShardRulesWarning)  # SR116 on replicated params, ...
            params = sr.apply(model.params, rules, mesh)
            batch = sr.apply(model.batch, rules, mesh, group="inputs")
        step = sr.jit(
            model.step_on(mesh), rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None)
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", sr.ShardRulesWarning)
            got = flops(step.lower(params, batch).compile())
        found = [str(w.message) for w in caught if getattr(w.message, "code", None) == "SR210"]
        if kind == AxisType.Explicit:
            row.explicit, row.sr210, messages = got, len(found), found
        else:
            row.auto = got
    return row, messages


def versions() -> str:
    def of(name: str) -> str:
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            return f"{name} not installed"

    names = ("jax", "jaxlib", "flax", "keras", "keras-hub", "recurrentgemma", "penzai", "maxtext")
    return (
        f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}; Python {platform.python_version()}; "
        + ", ".join(of(n) for n in names)
    )


def table(rows: list[Row]) -> str:
    head = (
        "| model | mesh | Explicit MFLOP | Auto MFLOP | ideal MFLOP | Explicit/Auto | Explicit/ideal | SR210 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    )
    lines = list(head)
    for r in rows:
        if r.note:
            lines.append(f"| {r.model} | {r.mesh} | {r.note} | | | | | |")
            continue
        lines.append(
            f"| {r.model} | {r.mesh} | {r.explicit / 1e6:.2f} | {r.auto / 1e6:.2f} | {r.ideal / 1e6:.2f} "
            f"| {r.vs_auto:.3f} | {r.vs_ideal:.3f} | {r.sr210} |"
        )
    return "\n".join(lines)


def verdict(target: str, ratios: list[float], bound: float) -> str:
    if not ratios:
        return f"{target}: nothing measured"
    worst = max(ratios)
    return f"{target}: {'holds' if worst <= bound else 'MISSED'} (worst {worst:.3f}x)"


def decoder_1b(layers: int) -> int:
    """The 1.1B-sized decoder's cost on 256 devices against the ideal (see the docstring)."""
    model = _models.nnx_decoder_1b(layers=layers)
    rules = sr.load(model.rules)
    mesh = jax.make_mesh(model.shape, model.axes, axis_types=(AxisType.Explicit,) * len(model.axes))
    step = sr.jit(model.step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)
        cost = step.cost(model.params, model.batch)
        grads = [d for d in step.decisions(model.params, model.batch) if d.scope == "embed (backward)"]
    ratio = cost.ratio or float("nan")
    print(
        f"{model.name}, {model.mesh_text}, batch {model.batch['tokens'].shape}: {time.perf_counter() - start:.1f} s"
    )
    print(
        f"  FLOPs per device {cost.flops_per_device:.4g}, ideal {cost.ideal_flops_per_device:.4g}: {ratio:.4f}x"
    )
    print(f"  peak memory per device {cost.peak_bytes_per_device / 2**20:.1f} MiB")
    for d in grads:
        print(f"  the embedding's gradient: {d.primitive} {d.shape} {d.spec} ({d.by})")
    print(verdict(f"within {VS_IDEAL_1B:.2f}x of ideal", [ratio], VS_IDEAL_1B))
    return 0 if ratio <= VS_IDEAL_1B else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="run only the models whose label contains one of these")
    parser.add_argument(
        "--decoder-1b", nargs="?", type=int, const=2, metavar="LAYERS", help="cost the 1.1B decoder"
    )
    args = parser.parse_args()
    print(versions())
    print(f"{jax.device_count()} devices\n")
    if args.decoder_1b is not None:
        return decoder_1b(args.decoder_1b)
    rows: list[Row] = []
    for label, mesh, build, data_parallel in CASES:
        if args.only and not any(o.lower() in label.lower() for o in args.only):
            continue
        start = time.perf_counter()
        try:
            model = build()
        except _models.Unavailable as why:
            rows.append(Row(label, mesh, note=f"skipped: {why}"))
            print(f"{label}: skipped: {why}", flush=True)
            continue
        try:
            row, messages = measure(model, data_parallel)
        except Exception as err:  # a step that fails is a result too: reported, exit 1
            rows.append(
                Row(label, model.mesh_text, note=f"failed: {type(err).__name__}: {err}".splitlines()[0])
            )
            print(f"{label}: failed: {err}", flush=True)
            continue
        rows.append(row)
        print(f"{label} ({row.mesh}): {time.perf_counter() - start:.1f} s, {row.sr210} SR210", flush=True)
        for message in messages:
            print("   ", message.replace("\n", "\n    "))
    print()
    print(table(rows))
    measured = [r for r in rows if not r.note]
    print()
    parallel = [r for r in measured if r.data_parallel]
    print(verdict(f"Explicit within {VS_AUTO:.2f}x of Auto", [r.vs_auto for r in measured], VS_AUTO))
    print(
        verdict(
            f"pure data parallelism within {VS_IDEAL:.2f}x of ideal", [r.vs_ideal for r in parallel], VS_IDEAL
        )
    )
    failed = any(r.note.startswith("failed") for r in rows)
    return 0 if all(r.holds for r in measured) and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
