"""`shardrules lint --step`: what it costs per transformer block, and how many
times it traces the step.

    python benchmarks/step_trace.py [--repeat 3] [--depths 2,8,32]

The step is `examples/transformer`'s `train_step` (attention and MLP blocks,
`jax.value_and_grad`, SGD) with its rule file, at several depths (the number
of blocks; `forward` loops over the blocks it is given), under
`sr.jit(..., in_groups=("params", "inputs"), out_groups=("params", None))` with
`jax.ShapeDtypeStruct` arguments, on 8 simulated CPU devices (`fsdp=4,
model=2`, Explicit axes). Each depth is linted in this process as the console
script does it: `shardrules._cli.main(["lint", FILE, "--step", ...])` (its
output discarded), from cold caches (`jax.clear_caches()`), after one untimed
run so that every import is done: best of `--repeat`, the variants taking
turns.

- `lint`: `--step __main__:check_step`, the step as its factory returns it.
- `two traces` (the baseline): `--step __main__:planned_step`, whose factory
  first plans the step for its arguments as a call does (`step.jitted(...)`:
  the output's shapes for `out_groups` from a `jax.eval_shape` of the step),
  so that lint traces it a second time: what `lint --step` did before it took
  the output's shapes from its own trace. `lint / two` is lint's time over it.
- `trace`: one bare `jax.make_jaxpr(train_step)` of the same arguments on the
  mesh's `Auto` form, what the step costs to trace at all; `lint / trace`.
- Across depths: lint's time over depth 2's, and per block: the time above
  depth 2's over the blocks added (at depth 2, its time over its 2 blocks).
- Traces: while each depth is linted once more, the calls of the step's
  Python body (a counter in the function) and of `jax.make_jaxpr` and
  `jax.eval_shape` (wrapped to count), for both factories. One call of the
  body per lint is one trace of the step.

Exits 1 if the step's body runs more than once per `lint`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import sys
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
from jax.sharding import AxisType

import shardrules as sr
from shardrules._cli import main as cli

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "transformer"))
import train as example

DEPTH = 2  # the blocks `check_step` builds its arguments with
BODY_CALLS = [0]  # calls of the step's Python body


def counted_step(params, batch):
    """`examples/transformer`'s `train_step`, counting the calls of its body."""
    BODY_CALLS[0] += 1
    return example.train_step(params, batch)


def arguments(depth: int) -> tuple[dict, dict]:
    """The example's parameters with `depth` blocks, and a batch, as shapes."""
    s = jax.ShapeDtypeStruct
    f32 = jnp.float32
    d, ff, vocab = example.D, example.FF, example.VOCAB

    def block() -> dict:
        return {
            "norm1": {"scale": s((d,), f32)},
            "attn": {name: {"kernel": s((d, d), f32)} for name in ("q", "k", "v", "o")},
            "norm2": {"scale": s((d,), f32)},
            "mlp": {"up": {"kernel": s((d, ff), f32)}, "down": {"kernel": s((ff, d), f32)}},
        }

    params = {
        "embed": {"embedding": s((vocab, d), f32)},
        "blocks": [block() for _ in range(depth)],
        "norm": {"scale": s((d,), f32)},
        "head": {"kernel": s((d, vocab), f32)},
    }
    tokens = s((example.BATCH, example.SEQ), jnp.int32)
    return params, {"tokens": tokens, "targets": tokens}


def check_step(rules, mesh):
    """What `--step __main__:check_step` names: the step and its arguments at `DEPTH`."""
    step = sr.jit(counted_step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    return step, arguments(DEPTH)


def planned_step(rules, mesh):
    """`check_step`'s step, planned for its arguments as a call plans it (the
    output's shapes from `jax.eval_shape`): lint then traces it again."""
    step, args = check_step(rules, mesh)
    step.jitted(*args)
    return step, args


def lint(depth: int, factory: str = "check_step") -> int:
    """`shardrules lint transformer.shard --step __main__:FACTORY` at `depth`."""
    global DEPTH
    DEPTH = depth
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return cli(["lint", str(example.RULES), "--step", f"__main__:{factory}"])


def two_traces(depth: int) -> int:
    return lint(depth, "planned_step")


def bare_trace(depth: int) -> None:
    """One trace of the step, nothing else: the baseline."""
    mesh = jax.make_mesh((4, 2), ("fsdp", "model"), axis_types=(AxisType.Auto,) * 2)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        jax.make_jaxpr(example.train_step)(*arguments(depth))


def timed(run, depth: int) -> float:
    jax.clear_caches()
    start = time.perf_counter()
    run(depth)
    return time.perf_counter() - start


@contextlib.contextmanager
def counting():
    """Count the calls of `jax.make_jaxpr` and `jax.eval_shape` while inside."""
    counts = {"make_jaxpr": 0, "eval_shape": 0}
    originals = {name: getattr(jax, name) for name in counts}

    def wrap(name):
        def called(*args, **kwargs):
            counts[name] += 1
            return originals[name](*args, **kwargs)

        return called

    for name in counts:
        setattr(jax, name, wrap(name))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(jax, name, original)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--depths", default="2,8,32")
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    print(f"machine: {platform.machine()}  {os.cpu_count()} cores, {platform.system()}")
    print(f"python {platform.python_version()}, jax {jax.__version__}, shardrules {sr.__version__}")
    print(f"{jax.device_count()} simulated CPU devices; best of {args.repeat}, cold caches\n")
    variants = {"trace": bare_trace, "two": two_traces, "lint": lint}
    for run in variants.values():  # imports, first use of the backend
        run(depths[0])
    best = {(kind, d): float("inf") for kind in variants for d in depths}
    for _ in range(args.repeat):
        for d in depths:
            for kind, run in variants.items():
                best[kind, d] = min(best[kind, d], timed(run, d))
    traces = {}
    for kind in ("two", "lint"):
        for d in depths:
            BODY_CALLS[0] = 0
            jax.clear_caches()
            with counting() as counts:
                variants[kind](d)
            traces[kind, d] = f"{BODY_CALLS[0]}/{counts['make_jaxpr']}/{counts['eval_shape']}"
    base = depths[0]
    print(f"{'depth':>5}{'trace s':>9}{'two s':>8}{'lint s':>8}{'lint/two':>10}{'lint/trace':>11}"
          f"{'vs depth ' + str(base):>12}{'ms/block':>10}{'traces two':>12}{'traces lint':>13}")  # fmt: skip
    per_block = {}
    for d in depths:
        lint_s, two_s, trace_s = best["lint", d], best["two", d], best["trace", d]
        per_block[d] = lint_s / d if d == base else (lint_s - best["lint", base]) / (d - base)
        print(f"{d:5d}{trace_s:9.3f}{two_s:8.3f}{lint_s:8.3f}{lint_s / two_s:10.2f}{lint_s / trace_s:11.2f}"
              f"{lint_s / best['lint', base]:12.2f}{per_block[d] * 1e3:10.1f}"
              f"{traces['two', d]:>12}{traces['lint', d]:>13}")  # fmt: skip
    last = depths[-1]
    if last != base:
        print(f"\nper block: depth {last} {per_block[last] * 1e3:.1f} ms (above depth {base}), "
              f"depth {base} {per_block[base] * 1e3:.1f} ms: {per_block[last] / per_block[base]:.2f}x; "
              f"lint at depth {last} / depth {base}: {best['lint', last] / best['lint', base]:.2f}x")  # fmt: skip
    print("traces: calls of the step's body / of jax.make_jaxpr / of jax.eval_shape, in one lint")
    worst = max(int(traces["lint", d].split("/")[0]) for d in depths)
    print(f"calls of the step's body per lint: at most {worst} (target 1)")
    return 0 if worst <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
