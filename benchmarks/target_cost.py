"""Costing a step for TPU chips with no TPU: `step.cost(*args, target=...)` against the CPU's.

    python benchmarks/target_cost.py [--only NAME ...]

Run it with an interpreter that has libtpu (`pip install "shardrules[tpu]"`);
without it the TPU rows are skipped and said to be.

Two train steps, each on two TPU topologies:

- **transformer**: `examples/transformer`'s `train_step` (2 blocks, SGD,
  float32) with its rule file `transformer.shard` (FSDP over `fsdp`, tensor
  parallelism over `model`, activation rules), 16 rows of 32 tokens on 16
  chips, 64 on 256 (as `step_cost.py`);
- **7B-like**: `benchmarks/_llama7b.py`, Llama-2-7B's sizes (6.74e9
  parameters in bf16, 32 layers stacked and run with `lax.scan`, each
  `jax.checkpoint`ed), an Adam step (float32 moments, the state donated),
  with `rules/llama7b.shard` (FSDP over `fsdp`, tensor parallelism over
  `model`, activation rules for the batch); sequences of 2,048 tokens, 4 per
  `fsdp` slice: 256 on `v5p:8x8x4` (`fsdp=64, model=4`), 16 on `v5e:4x4`
  (`fsdp=4, model=4`), and 4 (one per slice) on `v5e:4x4` as well.

For each: the wall time of `step.cost(*args, target=...)` from cold caches
(`jax.clear_caches()` first), split into the TPU compiler's time, our reading
of the compiled HLO (`_costs`) and the rest (tracing, lowering, and the
ideal: the one-device step compiled on one CPU device); and its figures: peak
memory per chip and its parts, whether it fits, the estimated step time with
its parts, FLOPs per chip against the ideal, collective bytes per chip.
Beside each, the same step costed on as many simulated CPU devices as the
mesh has (`step.cost(*args)`, no target; a process of its own, since the
number of CPU devices is fixed when JAX starts) and the ratios TPU / CPU.
One process per row; the TPU rows take turns with the CPU rows, one at a
time. Nothing is written outside the console.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HERE = Path(__file__).resolve().parent
# name: (model, target, mesh shape over ("fsdp", "model"), batch rows)
ROWS = {
    "transformer-v5e": ("transformer", "v5e:4x4", (4, 4), 16),
    "transformer-v5p": ("transformer", "v5p:8x8x4", (64, 4), 64),
    "7b-v5e": ("7b", "v5e:4x4", (4, 4), 16),
    "7b-v5e-small": ("7b", "v5e:4x4", (4, 4), 4),
    "7b-v5p": ("7b", "v5p:8x8x4", (64, 4), 256),
}


# --------------------------------------------------------------------------- in a worker process


def _step_and_args(model: str, mesh, rows: int):
    import jax

    import shardrules as sr

    sys.path.insert(0, str(HERE))
    if model == "7b":
        import _llama7b

        return _llama7b.make_step(sr.load(HERE / "rules" / "llama7b.shard"), mesh), _llama7b.shapes(rows)
    import _models

    example = _models.transformer()
    seq = _models.tokens(1, rows)
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), example.params)
    batch = {"tokens": seq[:, :-1], "targets": seq[:, 1:]}
    batch = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), batch)
    step = sr.jit(
        example.step,
        sr.load(example.rules),
        mesh,
        in_groups=("params", "inputs"),
        out_groups=("params", None),
    )
    return step, (shapes, batch)


class _Timer:
    """Seconds spent in what `step.cost` calls, by part: each `Lowered.compile` (the
    TPU compiler; a second try with `xla_tpu_no_crash_on_oom` where the first ran
    out of the chip's memory), our reading of the compiled HLO, and the rest."""

    def __init__(self) -> None:
        from jax import stages

        from shardrules._costs import _step

        self.compiles: list[tuple[float, bool]] = []  # (seconds, a retry past the chip's memory)
        self.reading = 0.0
        self._saved = [(_step, "cost_of"), (_step, "on_target"), (stages.Lowered, "compile")]
        self._saved = [(owner, name, getattr(owner, name)) for owner, name in self._saved]
        for owner, name, fn in self._saved:
            setattr(owner, name, self._compile(fn) if name == "compile" else self._read(fn))

    def _read(self, fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.reading += time.perf_counter() - start

        return run

    def _compile(self, fn):
        def run(lowered, *args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(lowered, *args, **kwargs)
            finally:
                self.compiles.append((time.perf_counter() - start, bool(kwargs.get("compiler_options"))))

        return run

    def restore(self) -> None:
        for owner, name, fn in self._saved:
            setattr(owner, name, fn)

    def parts(self, total: float) -> dict:
        compiling = sum(s for s, _ in self.compiles)
        return {
            "tpu compile": compiling,
            "compiles": self.compiles,
            "hlo reading": self.reading,
            "trace + lower": total - compiling - self.reading,
        }


def _worker(row: str, compiler: str) -> dict:
    model, target, shape, rows = ROWS[row]
    devices = shape[0] * shape[1]
    if compiler == "cpu":
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"  # the TPU compiler needs no TPU: the topology's devices are described
    import jax

    import shardrules as sr

    if compiler == "tpu":
        from shardrules._costs._targets import tpu_devices

        mesh = jax.make_mesh(shape, ("fsdp", "model"), devices=list(tpu_devices(target)))
    else:
        assert jax.device_count() == devices, jax.devices()
        mesh = jax.make_mesh(shape, ("fsdp", "model"))
    step, args = _step_and_args(model, mesh, rows)
    jax.clear_caches()
    timer = _Timer() if compiler == "tpu" else None
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)
        cost = step.cost(*args, target=target) if compiler == "tpu" else step.cost(*args)
    seconds = time.perf_counter() - start
    parts = {}
    if timer is not None:
        timer.restore()
        parts = timer.parts(seconds)
    return {"row": row, "compiler": compiler, "seconds": seconds, "parts": parts, "cost": cost.to_json()}


# --------------------------------------------------------------------------- in the parent process


def _run_worker(row: str, compiler: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    done = subprocess.run(
        [sys.executable, __file__, "--worker", row, compiler], env=env, stdout=subprocess.PIPE, text=True
    )
    if done.returncode != 0:
        return {"row": row, "compiler": compiler, "error": f"exit status {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _gib(n: float) -> str:
    from shardrules._planning._plan import format_bytes

    return format_bytes(n)


def _flops(n: float) -> str:
    from shardrules._planning._plan import format_flops

    return format_flops(n)


def _collective_bytes(cost: dict) -> int:
    return sum(c["bytes_per_device"] for c in cost["collectives"])


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def _tables(pairs: list[tuple[dict, dict]]) -> list[str]:
    lines = [
        "| row | target | mesh | batch | `step.cost(target=)` s (compiles: the topology's and the ideal's on one CPU device / HLO reading / trace + lower) "
        "| CPU `step.cost` s | peak / chip (arguments, outputs, temporaries, code) | fits "
        "| estimate s (compute / memory / communication) | bound | MFU | FLOPs / chip (x ideal) "
        "| collectives / chip |",
        "|---|---|---|---:|---|---:|---|---|---|---|---:|---|---:|",
    ]
    for tpu, cpu in pairs:
        _, target, shape, rows = ROWS[tpu["row"]]
        mesh = f"fsdp={shape[0]}, model={shape[1]}"
        if "error" in tpu:
            lines.append(f"| {tpu['row']} | {target} | {mesh} | {rows} | {tpu['error']} | | | | | | | | |")
            continue
        c, e, p = tpu["cost"], tpu["cost"]["estimate"], tpu["parts"]
        ideal = c["ideal_flops_per_device"]
        ratio = f"{c['flops_per_device'] / ideal:.2f}x" if ideal else "-"
        mfu = f"{e['mfu']:.1%}" if e["mfu"] is not None else "-"
        cpu_s = f"{cpu['seconds']:.1f}" if "seconds" in cpu else cpu.get("error", "-")
        lines.append(
            f"| {tpu['row']} | {target} | {mesh} | {rows} "
            f"| {tpu['seconds']:.1f} ({p['tpu compile']:.1f} / {p['hlo reading']:.1f} / {p['trace + lower']:.1f}) "
            f"| {cpu_s} | {_gib(c['peak_bytes_per_device'])} ({_gib(c['argument_bytes_per_device'])}, "
            f"{_gib(c['output_bytes_per_device'])}, {_gib(c['temp_bytes_per_device'])}, "
            f"{_gib(c['code_bytes_per_device'])}) | {'yes' if c['fits'] else 'no'} "
            f"({_gib(c['hbm_bytes_per_device'])}) | {e['total_s']:.3g} ({e['compute_s']:.3g} / {e['memory_s']:.3g} / "
            f"{e['communication_s']:.3g}) | {e['bound']} | {mfu} "
            f"| {_flops(c['flops_per_device'])} ({ratio}) | {_gib(_collective_bytes(c))} |"
        )
    lines += [
        "",
        "TPU / CPU, the same step on the same mesh (CPU: simulated devices, no target):",
        "",
        "| row | peak | temporaries | arguments | FLOPs | bytes accessed | collective bytes "
        "| collectives TPU (count, bytes / chip) | collectives CPU (count, bytes / chip) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for tpu, cpu in pairs:
        if "error" in tpu or "error" in cpu:
            continue
        t, c = tpu["cost"], cpu["cost"]

        def kinds(cost: dict) -> str:
            return ", ".join(
                f"{k['kind']} {k['count']} ({_gib(k['bytes_per_device'])})" for k in cost["collectives"]
            )

        lines.append(
            f"| {tpu['row']} | {_ratio(t['peak_bytes_per_device'], c['peak_bytes_per_device'])} "
            f"| {_ratio(t['temp_bytes_per_device'], c['temp_bytes_per_device'])} "
            f"| {_ratio(t['argument_bytes_per_device'], c['argument_bytes_per_device'])} "
            f"| {_ratio(t['flops_per_device'], c['flops_per_device'])} "
            f"| {_ratio(t['bytes_accessed_per_device'], c['bytes_accessed_per_device'])} "
            f"| {_ratio(_collective_bytes(t), _collective_bytes(c))} | {kinds(t)} | {kinds(c)} |"
        )
    return lines


def _versions() -> str:
    def v(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return (
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()}; "
        f"Python {platform.python_version()}, jax {v('jax')}, jaxlib {v('jaxlib')}, libtpu {v('libtpu')}, "
        f"shardrules {v('shardrules')}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(ROWS), help="these rows only")
    parser.add_argument("--worker", nargs=2, metavar=("ROW", "COMPILER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(*args.worker)))
        return 0

    from shardrules._costs._targets import has_libtpu

    if not has_libtpu():
        print(f'{_versions()}\nlibtpu is not installed: no TPU rows (pip install "shardrules[tpu]")')
        return 0
    pairs = []
    for row in args.only or list(ROWS):
        pairs.append((_run_worker(row, "tpu"), _run_worker(row, "cpu")))
        print(f"{row}: done", file=sys.stderr, flush=True)
    print(_versions())
    print("cold caches, one run each; CPU: XLA's CPU compiler on as many simulated devices as the mesh has\n")
    print("\n".join(_tables(pairs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
