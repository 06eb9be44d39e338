"""`sr.jit` against plain `jax.jit`: trace + compile time of one train step.

    python benchmarks/jit_overhead.py [--repeat 5]

The step is `examples/transformer`'s `train_step` (2 blocks of attention and
MLP, value_and_grad, SGD) on 8 simulated CPU devices, `fsdp=4, model=2`, with
its rule file (params, inputs and activations groups). Each measurement starts
from cold caches (`jax.clear_caches()`) and times `.lower(...).compile()`.

- Auto axes: the baseline is `jax.jit(train_step, in_shardings, out_shardings)`
  with the shardings `sr.shardings` gives; `sr.jit` adds its activation
  constraints (tracing the step, then evaluating the trace again).
- Explicit axes: plain `jax.jit(train_step)` is refused by JAX (a contraction
  over a sharded dimension); the baseline is the same `jax.jit` of
  `jax.sharding.auto_axes(train_step)`, which runs the step as on Auto axes,
  the fallback one would write by hand. `sr.jit` evaluates the trace with the
  explicit types, settling each ambiguous layout.

Target: `sr.jit` at most 1.3x its baseline for both axis types. Exits 1 if more.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np
from jax.sharding import AxisType

import shardrules as sr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "transformer"))
import train as example

TARGET = 1.3


def _time(make, args, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        jax.clear_caches()
        start = time.perf_counter()
        make().lower(*args).compile()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rules = sr.load(example.RULES)
    rng = np.random.default_rng(0)
    host_params = example.init_params(rng)
    seq = (rng.integers(0, example.VOCAB, (example.BATCH, 1)) + np.arange(example.SEQ + 1)) % example.VOCAB
    host_batch = {"tokens": seq[:, :-1], "targets": seq[:, 1:]}
    print(f"machine: {platform.machine()}  {os.cpu_count()} cores, {platform.system()}")
    print(f"python {platform.python_version()}, jax {jax.__version__}, shardrules {sr.__version__}")
    print(f"step: examples/transformer train_step; best of {args.repeat}, cold caches\n")
    print(f"{'':42}{'seconds':>9}{'ratio':>8}")
    worst = 0.0
    for kind in ("auto", "explicit"):
        types = (AxisType.Auto if kind == "auto" else AxisType.Explicit,) * 2
        mesh = jax.make_mesh((4, 2), ("fsdp", "model"), axis_types=types)
        params = sr.apply(host_params, rules, mesh)
        batch = sr.apply(host_batch, rules, mesh, group="inputs")
        in_shardings = (sr.shardings(params, rules, mesh), sr.shardings(batch, rules, mesh, group="inputs"))
        out_shardings = (in_shardings[0], None)
        if kind == "auto":
            body = example.train_step
        else:
            out_specs = (jax.tree.map(lambda s: s.spec, in_shardings[0]), jax.sharding.PartitionSpec())
            body = jax.sharding.auto_axes(example.train_step, out_sharding=out_specs)

        def baseline(body=body, in_shardings=in_shardings, out_shardings=out_shardings):
            return jax.jit(body, in_shardings=in_shardings, out_shardings=out_shardings)

        def ours(mesh=mesh):
            return sr.jit(
                example.train_step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None)
            )

        with jax.set_mesh(mesh):
            base = _time(baseline, (params, batch), args.repeat)
            mine = _time(ours, (params, batch), args.repeat)
        ratio = mine / base
        worst = max(worst, ratio)
        label = "jax.jit" if kind == "auto" else "jax.jit(auto_axes(step))"
        print(f"{kind + ' axes: ' + label:42}{base:9.3f}{1.0:8.2f}")
        print(f"{kind + ' axes: sr.jit':42}{mine:9.3f}{ratio:8.2f}")
    print(f"\nworst sr.jit / baseline = {worst:.2f} (target <= {TARGET})")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
