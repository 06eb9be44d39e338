"""What asking what a step costs costs, and `sr.jit`'s own overhead.

    python benchmarks/step_overhead.py [--repeat 3] [--steps 40] [--clock cpu|wall]

Two train steps (`jax.value_and_grad`, SGD): `examples/transformer`'s (2
blocks, `fsdp=4, model=2`, its rule file with activation rules) and the Flax
NNX GQA+MoE decoder of `_models.nnx_moe` (8 layers, 8 experts top-2,
`data=4, model=2`, `rules/nnx_moe.shard`), on simulated CPU devices. Every
ratio is against a floor measured in the same process, the variants taking
turns, each from cold caches (`jax.clear_caches()`) after one untimed run
of each (imports), best of `--repeat`, timed by the process's CPU time
(`--clock wall`: the wall clock; on a shared machine CPU time moves far less):

1. **`step.cost`** (arguments as `jax.ShapeDtypeStruct`s): it traces the
   step, compiles it for the mesh and once more for one device (the ideal),
   and reads the programs. Floor: what that compiling costs anyway, plain
   `jax.jit(step, in_shardings, out_shardings).lower(...).compile()` on the
   mesh plus the same on one device (on Explicit axes, where JAX refuses
   plain `jax.jit(step)`, `jax.jit(jax.sharding.auto_axes(step))`). Target:
   at most 1.2x, on Explicit and Auto axes. A second `step.cost` with the
   same signature is timed too: it compiles nothing.
2. **`explain --step --cost`** at 256 devices (`64 x 4`, the batch 32 times
   larger) against 8: the command run as a new process each (start-up,
   imports, the factory in `_cost_steps.py` with its parameters as shapes,
   the trace, both compiles, the report). Target: at most 2x.
3. **`sr.jit`'s first call** (trace, layouts, compile, one run, on arrays
   already placed) against plain `jax.jit`'s first call of the same step
   with the same shardings on an Auto mesh. Targets: at most 1.2x on an
   Auto mesh, at most 1.3x on JAX's default Explicit mesh (against the same
   Auto baseline).
4. **Steady state**: the fastest of `--steps` calls of each (wall time,
   the variants taking turns, after the first; the median is shown too: on
   a shared machine it moves with the other work, the fastest call far less).
   Target: at most 1.02x on the Auto mesh, where `sr.jit` and `jax.jit`
   compile the same program (with activation rules, a better laid-out one).
   On Explicit axes the program is the one JAX's layouts give: its step time
   is that layout's (the SR210 warnings name what it computes whole), shown,
   not held to the target. Target: at most 1.02x.

Exits 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
# What the in-process figures are timed by: the process's CPU time (all its threads: XLA
# compiles with several) by default, which another job on the machine changes far less than
# the wall clock; `--clock wall` for wall time. Steady-state steps are always wall time.
CLOCK = time.process_time
COST_TARGET, EXPLAIN_TARGET, AUTO_TARGET, EXPLICIT_TARGET, STEADY_TARGET = 1.2, 2.0, 1.2, 1.3, 1.02
MODELS = ("transformer", "nnx_moe")


def _model(name: str):
    import _models

    return _models.transformer() if name == "transformer" else _models.nnx_moe(layers=8)


def _mesh(model, kind: str, devices=None):
    import jax
    from jax.sharding import AxisType

    axis = AxisType.Explicit if kind == "explicit" else AxisType.Auto
    shape = model.shape if devices is None else (1,) * len(model.axes)
    return jax.make_mesh(shape, model.axes, axis_types=(axis,) * len(shape), devices=devices)


def _plain(model, rules, mesh, kind: str):
    """Plain `jax.jit` of the step with the rules' shardings on `mesh`
    (`auto_axes` around it on Explicit axes), and the shardings."""
    import jax

    import shardrules as sr

    shapes = _shapes(model)
    shardings = (sr.shardings(shapes[0], rules, mesh), sr.shardings(shapes[1], rules, mesh, group="inputs"))
    body = model.step
    if kind == "explicit":
        out_specs = (jax.tree.map(lambda s: s.spec, shardings[0]), jax.sharding.PartitionSpec())
        body = jax.sharding.auto_axes(model.step, out_sharding=out_specs)
    return jax.jit(body, in_shardings=shardings, out_shardings=(shardings[0], None)), shardings


def _shapes(model):
    import jax

    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (model.params, model.batch))


def _best(variants: dict, repeat: int) -> dict[str, float]:
    import jax

    for run in variants.values():  # untimed: imports and first-use costs
        jax.clear_caches()
        run()
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(repeat):
        for name, run in variants.items():
            jax.clear_caches()
            start = CLOCK()
            run()
            best[name] = min(best[name], CLOCK() - start)
    return best


def _costs(name: str, repeat: int) -> dict:
    """Item 1 for one model, on Explicit and Auto axes."""
    import jax

    import shardrules as sr

    model = _model(name)
    rules = sr.load(model.rules)
    args = _shapes(model)
    out = {}
    for kind in ("explicit", "auto"):
        mesh, one = _mesh(model, kind), _mesh(model, kind, jax.devices()[:1])

        def plain(m, kind=kind):
            jitted, shardings = _plain(model, rules, m, kind)
            placed = jax.tree.map(
                lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), args, shardings
            )
            with jax.set_mesh(m):
                jitted.lower(*placed).compile()

        def step(mesh=mesh):
            return sr.jit(
                model.step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None)
            )

        first: list[float] = []
        again: list[float] = []

        def cost_twice(step=step, first=first, again=again) -> None:
            made = step()
            start = CLOCK()
            made.cost(*args)
            first.append(CLOCK() - start)
            made.cost(*args)
            again.append(CLOCK() - start - first[-1])

        best = _best(
            {
                "jax.jit on the mesh": lambda plain=plain, mesh=mesh: plain(mesh),
                "jax.jit on one device": lambda plain=plain, one=one: plain(one),
                "step.cost": cost_twice,
            },
            repeat,
        )
        # each timed apart (the first of each list is the untimed warm-up run)
        best["step.cost"], best["step.cost again"] = min(first[1:]), min(again[1:])
        out[kind] = best
    return out


def _calls(name: str, repeat: int, steps: int) -> dict:
    """Items 3 and 4 for one model: first calls and steady state."""
    import jax

    import shardrules as sr

    model = _model(name)
    rules = sr.load(model.rules)
    auto = _mesh(model, "auto")
    explicit = _mesh(model, "explicit")
    placed = {
        kind: (sr.apply(model.params, rules, m), sr.apply(model.batch, rules, m, group="inputs"))
        for kind, m in (("auto", auto), ("explicit", explicit))
    }
    made: dict = {}

    def plain() -> None:
        jitted, _ = _plain(model, rules, auto, "auto")
        with jax.set_mesh(auto):
            jax.block_until_ready(jitted(*placed["auto"]))
        made["jax.jit (Auto)"] = (jitted, placed["auto"], auto)

    def ours(kind: str, mesh) -> None:
        step = sr.jit(model.step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
        jax.block_until_ready(step(*placed[kind]))
        made[f"sr.jit ({kind.capitalize()})"] = (step, placed[kind], mesh)

    first = _best(
        {
            "jax.jit (Auto)": plain,
            "sr.jit (Auto)": lambda: ours("auto", auto),
            "sr.jit (Explicit)": lambda: ours("explicit", explicit),
        },
        repeat,
    )
    times: dict[str, list[float]] = {k: [] for k in made}
    for _ in range(steps):
        for key, (fn, args, mesh) in made.items():
            with jax.set_mesh(mesh):
                start = time.perf_counter()
                jax.block_until_ready(fn(*args))
                times[key].append(time.perf_counter() - start)
    return {
        "first": first,
        "steady": {k: min(v) for k, v in times.items()},
        "median": {k: statistics.median(v) for k, v in times.items()},
    }


def _worker(what: str, name: str, repeat: int, steps: int) -> dict:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    assert jax.device_count() == 8, jax.devices()
    sys.path.insert(0, str(HERE))
    warnings.simplefilter("ignore")  # the rule files' notes, said once per trace
    return _costs(name, repeat) if what == "costs" else _calls(name, repeat, steps)


def _run(*argv: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    done = subprocess.run(
        [sys.executable, __file__, *argv], env=env, stdout=subprocess.PIPE, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _explain(name: str, devices: int) -> tuple[float, float]:
    """`shardrules explain RULES --mesh ... --step _cost_steps:NAME --cost` as a
    new process on `devices` simulated devices: wall seconds, CPU seconds."""
    rules = (
        HERE / "rules" / "nnx_moe.shard"
        if name == "nnx_moe"
        else HERE.parent / "examples" / "transformer" / "transformer.shard"
    )
    axes = ("data", "model") if name == "nnx_moe" else ("fsdp", "model")
    shape = (4, 2) if devices == 8 else (64, 4)
    mesh = ",".join(f"{a}={n}" for a, n in zip(axes, shape, strict=True))
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent), env.get("PYTHONPATH", "")])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "shardrules", "explain", str(rules), "--mesh", mesh, "--step", f"_cost_steps:{name}", "--cost"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
    )  # fmt: skip
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--worker", nargs=2, metavar=("WHAT", "MODEL"))
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.worker:
        print(json.dumps(_worker(*args.worker, args.repeat, args.steps)))
        return 0
    import jax

    import shardrules as sr

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()}")
    print(f"python {platform.python_version()}, jax {jax.__version__}, shardrules {sr.__version__}")
    print(
        f"best of {args.repeat}, cold caches, timed by {args.clock} time; steady state: fastest of {args.steps} calls (wall)\n"
    )
    misses = []

    def check(label: str, ratio: float, target: float) -> str:
        if ratio > target:
            misses.append(f"{label}: {ratio:.2f} > {target}")
        return f"{ratio:.2f}"

    print("1. step.cost against compiling the step on its mesh plus on one device (plain jax.jit)\n")
    print(
        "| step | axes | jax.jit, mesh s | jax.jit, one device s | floor s | step.cost s | ratio | again s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name in MODELS:
        for kind, t in _run(
            "--worker", "costs", name, "--repeat", str(args.repeat), "--clock", args.clock
        ).items():
            floor = t["jax.jit on the mesh"] + t["jax.jit on one device"]
            ratio = check(f"step.cost {name} {kind}", t["step.cost"] / floor, COST_TARGET)
            print(
                f"| {name} | {kind} | {t['jax.jit on the mesh']:.2f} | {t['jax.jit on one device']:.2f} "
                f"| {floor:.2f} | {t['step.cost']:.2f} | {ratio} | {t['step.cost again']:.3f} |"
            )
    print(f"\ntarget: ratio <= {COST_TARGET}\n")

    print("2. explain --step --cost, a new process: 256 devices against 8\n")
    print(f"| step | 8 devices: wall s | CPU s | 256 devices: wall s | CPU s | ratio ({args.clock}) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in MODELS:
        by = 1 if args.clock == "cpu" else 0
        small = min((_explain(name, 8) for _ in range(args.repeat)), key=lambda t: t[by])
        large = min((_explain(name, 256) for _ in range(args.repeat)), key=lambda t: t[by])
        ratio = check(f"explain 256/8 {name}", large[by] / small[by], EXPLAIN_TARGET)
        print(f"| {name} | {small[0]:.2f} | {small[1]:.2f} | {large[0]:.2f} | {large[1]:.2f} | {ratio} |")
    print(f"\ntarget: ratio <= {EXPLAIN_TARGET}\n")

    print("3./4. sr.jit's first call and steady state against plain jax.jit on an Auto mesh\n")
    print("| step | variant | first call s | ratio | step ms (fastest) | ratio | step ms (median) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in MODELS:
        got = _run(
            "--worker",
            "calls",
            name,
            "--repeat",
            str(args.repeat),
            "--steps",
            str(args.steps),
            "--clock",
            args.clock,
        )
        base_first, base_step = got["first"]["jax.jit (Auto)"], got["steady"]["jax.jit (Auto)"]
        for variant, first in got["first"].items():
            target = EXPLICIT_TARGET if "Explicit" in variant else AUTO_TARGET
            r1 = check(f"first call {name} {variant}", first / base_first, target)
            steady = got["steady"][variant] / base_step
            # the same program on Auto axes: its step time is sr.jit's own overhead; on Explicit
            # axes the program is the one JAX's layouts give (SR210 names what it computes whole)
            r2 = (
                check(f"steady {name} {variant}", steady, STEADY_TARGET)
                if "Auto" in variant
                else f"{steady:.2f}"
            )
            print(
                f"| {name} | {variant} | {first:.2f} | {r1} | {got['steady'][variant] * 1e3:.2f} | {r2} "
                f"| {got['median'][variant] * 1e3:.2f} |"
            )
    print(
        f"\ntargets: first call <= {AUTO_TARGET} (Auto), <= {EXPLICIT_TARGET} (Explicit); steady <= {STEADY_TARGET} (Auto)"
    )
    for miss in misses:
        print("MISSED:", miss)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
