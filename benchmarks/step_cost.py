"""What a layout costs, and what it costs to find out: `step.cost` on a train step.

    python benchmarks/step_cost.py [--repeat 3]

The step is `examples/transformer`'s `train_step` (2 blocks of attention and
MLP, `jax.value_and_grad`, SGD), its parameters and its rule file.

**The cost of a cost.** `step.cost(params, batch)` traces the step, compiles
it for the mesh and compiles it once more for one device (the ideal). Its
wall time is set against the compile one pays to run the step anyway: plain
`jax.jit(...).lower(...).compile()` on the same mesh with the shardings the
rules give (on Explicit axes, where plain `jax.jit(train_step)` is refused by
JAX, `jax.jit(jax.sharding.auto_axes(train_step))`, as in `jit_overhead.py`),
and against `sr.jit`'s own `lower(...).compile()`. Arguments are
`jax.ShapeDtypeStruct`s (nothing is allocated); each timing starts from cold
caches (`jax.clear_caches()`); best of `--repeat`, the variants taking turns.
Two meshes, each in its own process (the number of simulated CPU devices is
fixed when JAX starts): 8 devices as `fsdp=4, model=2` with the example's
batch of 16, and 256 as `fsdp=64, model=4` with a batch of 64 (16 rows do
not divide over 64 devices).

**What a layout costs.** The same model and step on 8 devices under three
rule files: DP (`rules/data_parallel.shard`: parameters replicated, batch over
`data=8`), FSDP (`rules/transformer_fsdp.shard`: parameters and batch over
`fsdp=8`) and FSDP+TP (the example's `transformer.shard` on `fsdp=4,
model=2`, with its activation rules): per-device FLOPs against the ideal,
peak memory, collective bytes and kinds, all from `step.cost`. As a check,
the collectives `step.cost` reports (kinds, counts, sizes) are compared with
the collective instructions in the compiled HLO text; the script exits 1
when they differ.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
import warnings
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
# (devices, mesh shape over ("fsdp", "model"), batch rows)
MESHES = {8: ((4, 2), 16), 256: ((64, 4), 64)}
LAYOUTS = (  # label, rule file, mesh shape, axis names
    ("DP", HERE / "rules" / "data_parallel.shard", (8,), ("data",)),
    ("FSDP", HERE / "rules" / "transformer_fsdp.shard", (8,), ("fsdp",)),
    ("FSDP+TP", HERE.parent / "examples" / "transformer" / "transformer.shard", (4, 2), ("fsdp", "model")),
)


# --------------------------------------------------------------------------- in a worker process


def _worker(devices: int, repeat: int) -> dict:
    """Timings on `devices` simulated CPU devices (and, on 8, the layout table)."""
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    # The example sets its own device count when it is imported, unless JAX has started.
    assert jax.device_count() == devices, jax.devices()
    sys.path.insert(0, str(HERE))
    import _models

    model = _models.transformer()
    shape, rows = MESHES[devices]
    seq = _models.tokens(1, rows)  # the example's sequence length (32) and vocabulary (256)
    batch = {"tokens": seq[:, :-1], "targets": seq[:, 1:]}
    out = {"devices": devices, "mesh": f"fsdp={shape[0]}, model={shape[1]}", "batch": rows}
    out["timings"] = {kind: _timings(model, batch, shape, kind, repeat) for kind in ("explicit", "auto")}
    if devices == 8:
        out["layouts"] = [_layout(model, *layout) for layout in LAYOUTS]
    return out


def _shapes(tree):
    import jax

    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


def _timings(model, batch, shape, kind: str, repeat: int) -> dict:
    import jax
    from jax.sharding import AxisType, PartitionSpec

    import shardrules as sr

    rules = sr.load(model.rules)
    types = (AxisType.Explicit if kind == "explicit" else AxisType.Auto,) * 2
    mesh = jax.make_mesh(shape, ("fsdp", "model"), axis_types=types)
    args = (_shapes(model.params), _shapes(batch))
    shardings = (sr.shardings(args[0], rules, mesh), sr.shardings(args[1], rules, mesh, group="inputs"))
    placed = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), args, shardings)
    body = model.step
    if kind == "explicit":  # plain jax.jit(train_step) is refused on Explicit axes
        out_specs = (jax.tree.map(lambda s: s.spec, shardings[0]), PartitionSpec())
        body = jax.sharding.auto_axes(model.step, out_sharding=out_specs)

    def baseline():
        with jax.set_mesh(mesh):
            jax.jit(body, in_shardings=shardings, out_shardings=(shardings[0], None)).lower(*placed).compile()

    def step():
        return sr.jit(model.step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))

    variants = {
        "baseline": baseline,
        "sr.jit lower+compile": lambda: step().lower(*args).compile(),
        "step.cost": lambda: step().cost(*args),
    }
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(repeat):
        for name, run in variants.items():
            jax.clear_caches()
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def _layout(model, label: str, path: Path, shape: tuple[int, ...], axes: tuple[str, ...]) -> dict:
    import jax

    import shardrules as sr
    from shardrules._costs._cost import collectives

    mesh = jax.make_mesh(shape, axes)
    step = sr.jit(
        model.step, sr.load(path), mesh, in_groups=("params", "inputs"), out_groups=("params", None)
    )
    args = (_shapes(model.params), _shapes(model.batch))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)  # SR116: DP replicates every parameter
        cost = step.cost(*args)
        hlo = step.lower(*args).compile().as_text()
    # The check: each collective instruction in the HLO, counted by name, and their sizes read
    # with the HLO's `/*index=N*/` comments (in long tuple types) taken out first.
    counts: dict[str, int] = {}
    for kind in re.findall(r"\b(" + "|".join(KINDS) + r")(?:-start)?\(", hlo):
        counts[kind] = counts.get(kind, 0) + 1
    sizes = {c.kind: c.bytes_per_device for c in collectives(re.sub(r"/\*.*?\*/", "", hlo))}
    return {
        "layout": label,
        "rules": str(path.relative_to(HERE.parent)),
        "mesh": ", ".join(f"{a}={n}" for a, n in zip(axes, shape, strict=True)),
        "cost": cost.to_json(),
        "hlo_collectives": {kind: [counts[kind], sizes.get(kind, 0)] for kind in sorted(counts)},
    }


# --------------------------------------------------------------------------- in the parent process


def _run_worker(devices: int, repeat: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    done = subprocess.run(
        [sys.executable, __file__, "--worker", str(devices), "--repeat", str(repeat)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def _timing_table(results: list[dict]) -> list[str]:
    lines = [
        "| devices | mesh | batch | axes | baseline `jax.jit` s | `sr.jit` lower+compile s | `step.cost` s "
        "| `step.cost` / baseline | `step.cost` / `sr.jit` compile |",
        "|---:|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for kind, t in r["timings"].items():
            lines.append(
                f"| {r['devices']} | {r['mesh']} | {r['batch']} | {kind} | {t['baseline']:.2f} "
                f"| {t['sr.jit lower+compile']:.2f} | {t['step.cost']:.2f} | {t['step.cost'] / t['baseline']:.2f} "
                f"| {t['step.cost'] / t['sr.jit lower+compile']:.2f} |"
            )
    return lines


def _kinds(found: dict[str, list[int]]) -> str:
    """`{kind: [count, bytes]}` as text."""
    return (
        ", ".join(f"{kind} x{n} {size / 1024:.1f} KiB" for kind, (n, size) in sorted(found.items())) or "none"
    )


def _layout_table(layouts: list[dict]) -> tuple[list[str], list[str]]:
    lines = [
        "| layout | mesh | MFLOP / device | ideal MFLOP | ratio | arguments MiB / device | peak MiB / device "
        "| collective MiB / device | collectives (count) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    problems = []
    for row in layouts:
        c = row["cost"]
        total = sum(k["bytes_per_device"] for k in c["collectives"])
        kinds = ", ".join(f"{k['kind']} ({k['count']})" for k in c["collectives"]) or "none"
        lines.append(
            f"| {row['layout']} | {row['mesh']} | {c['flops_per_device'] / 1e6:.2f} "
            f"| {c['ideal_flops_per_device'] / 1e6:.2f} | {c['ratio']:.2f} | {_mib(c['argument_bytes_per_device'])} "
            f"| {_mib(c['peak_bytes_per_device'])} "
            f"| {_mib(total)} | {kinds} |"
        )
        counted = {k["kind"]: [k["count"], k["bytes_per_device"]] for k in c["collectives"]}
        if counted != row["hlo_collectives"]:
            problems.append(
                f"{row['layout']}: step.cost counted {_kinds(counted)}; the HLO has {_kinds(row['hlo_collectives'])}"
            )
    return lines, problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--worker", type=int, choices=sorted(MESHES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker, args.repeat)))
        return 0

    results = [_run_worker(devices, args.repeat) for devices in sorted(MESHES)]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()}; "
        f"Python {platform.python_version()}, jax {version('jax')}, jaxlib {version('jaxlib')}, "
        f"shardrules {version('shardrules')}"
    )
    print(f"step: examples/transformer train_step; best of {args.repeat}, cold caches\n")
    print("\n".join(_timing_table(results)), "\n")
    layouts, problems = _layout_table(next(r for r in results if "layouts" in r)["layouts"])
    print("\n".join(layouts))
    if problems:
        print("\ncheck: step.cost's collectives differ from the compiled HLO's")
    for problem in problems:
        print(f"  {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
