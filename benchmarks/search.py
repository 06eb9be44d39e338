"""How good `suggest --search`'s choice is, and what it costs.

    python benchmarks/search.py [CASE ...] [--json FILE]

Cases (the steps of `_search_steps.py`, arguments as shapes):

| case | step | devices | target |
|---|---|---:|---|
| transformer-64, transformer-256 | `examples/transformer`, 2 rows per device | 64, 256 | `h100` |
| moe-64, moe-256 | NNX GQA+MoE, 4 layers, 2 rows per device | 64, 256 | `h100` |
| llama7b-64, llama7b-256 | 7B-like decoder, Adam, 1 x 2,048 tokens per device | 64, 256 | `v5p:4x4x4`, `v5p:8x8x4` |

For each, in a process of its own (as many simulated CPU devices as the case
has), three things by the same estimate (`StepCost.time_estimate_s` on the
target, the peak held to the chip's memory less 10%):

1. **the search**, as `shardrules suggest --search` runs it, timed (wall and
   CPU seconds, on this machine's cores);
2. **the exhaustive best**: every candidate the search did not set aside
   before compiling, compiled for the target itself (a GPU target's search
   already compiles them all; a TPU target's screens on CPU devices and
   compiles the best few for the TPU). Target: the search's choice within 3%;
3. **expert layouts** of the same devices: MaxText's published mesh setting
   (`ici_fsdp_parallelism: -1`: every device on `fsdp`, each weight split on
   its hidden size, the batch over `fsdp`, as its Llama-2-7B recipes for v5p
   and its Mixtral recipes; with a `data` axis where the model's hidden size
   is smaller than the devices), and the fsdp+tp layout of the cookbook
   (`examples/transformer/transformer.shard`, `rules/llama7b.shard`: FSDP
   over `fsdp`, tensor parallelism over `model`, activation rules), each
   costed like a candidate. Target: the search's choice no worse.

Writes the table RESULTS.md records; exits 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CASES: dict[str, tuple[str, int, str]] = {
    "transformer-64": ("transformer", 64, "h100"),
    "transformer-256": ("transformer", 256, "h100"),
    "moe-64": ("nnx_moe", 64, "h100"),
    "moe-256": ("nnx_moe", 256, "h100"),
    "llama7b-64": ("llama7b", 64, "v5p:4x4x4"),
    "llama7b-256": ("llama7b", 256, "v5p:8x8x4"),
}
WITHIN = 0.03

# Expert layouts: rule files with `{mesh}` and `{batch}` set per case.
TRANSFORMER_MAXTEXT = """mesh {mesh}
rules params:
  "embed/embedding$"     -> (_, fsdp)
  "attn/(q|k|v)/kernel$" -> (fsdp, _)
  "attn/o/kernel$"       -> (_, fsdp)
  "mlp/up/kernel$"       -> (fsdp, _)
  "mlp/down/kernel$"     -> (_, fsdp)
  "head/kernel$"         -> (fsdp, _)
  "norm\\d*/scale$"       -> replicated
rules inputs:
  "tokens|targets" -> ({batch}, _)
"""
MOE_MAXTEXT = """mesh {mesh}
rules params:
  "embed/embedding$"     -> (_, fsdp)
  "attn/(q|k|v)/kernel$" -> (fsdp, _)
  "attn/o/kernel$"       -> (_, fsdp)
  "moe/router/kernel$"   -> (fsdp, _)
  "moe/w_in$"            -> (_, fsdp, _)
  "moe/w_out$"           -> (_, _, fsdp)
  "norm\\d*/scale$"       -> replicated
rules inputs:
  "tokens|targets" -> ({batch}, _)
"""
MOE_FSDP_TP = """mesh {mesh}
rules params:
  "embed/embedding$"     -> (model, fsdp)
  "attn/(q|k|v)/kernel$" -> (fsdp, model)
  "attn/o/kernel$"       -> (model, fsdp)
  "moe/router/kernel$"   -> (fsdp, _)
  "moe/w_in$"            -> (_, fsdp, model)
  "moe/w_out$"           -> (_, model, fsdp)
  "norm\\d*/scale$"       -> replicated
rules inputs:
  "tokens|targets" -> ({batch}, _)
"""
LLAMA_MAXTEXT = """mesh {mesh}
rules params:
  "embed/embedding$"             -> (_, fsdp)
  "layers/attn/(q|k|v)/kernel$"  -> (_, fsdp, _)
  "layers/attn/o/kernel$"        -> (_, _, fsdp)
  "layers/mlp/(gate|up)/kernel$" -> (_, fsdp, _)
  "layers/mlp/down/kernel$"      -> (_, _, fsdp)
  "norm\\d*/scale$"               -> replicated
  "head/kernel$"                 -> (fsdp, _)
rules inputs:
  "tokens|targets" -> ({batch}, _)
"""


def _file(path: Path, mesh: str, batch: str) -> str:
    """A hand-written rule file with its mesh line (and batch alias) set."""
    lines = []
    for line in path.read_text().splitlines():
        if line.startswith("mesh "):
            line = f"mesh {mesh}"
        elif line.startswith("alias batch"):
            line = f"alias batch = {batch}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def experts(case: str) -> dict[str, str]:
    """The expert layouts of `case`: name -> rule text."""
    model, n, _ = CASES[case]
    if model == "transformer":  # hidden size 64: fsdp at most 64
        data = n // 64
        maxtext_mesh = f"fsdp={n}" if data == 1 else f"data={data}, fsdp=64"
        batch = "fsdp" if data == 1 else "(data, fsdp)"
        cookbook_mesh = f"fsdp={n // 2}, model=2" if n <= 128 else f"data={n // 128}, fsdp=64, model=2"
        cookbook_batch = "fsdp" if n <= 128 else "(data, fsdp)"
        return {
            f"MaxText ({maxtext_mesh})": TRANSFORMER_MAXTEXT.format(mesh=maxtext_mesh, batch=batch),
            f"cookbook fsdp+tp ({cookbook_mesh})": _file(
                REPO / "examples/transformer/transformer.shard", cookbook_mesh, cookbook_batch
            ),
        }
    if model == "nnx_moe":
        data = n // 64
        maxtext_mesh = f"fsdp={n}" if data == 1 else f"data={data}, fsdp=64"
        batch = "fsdp" if data == 1 else "(data, fsdp)"
        tp_mesh = f"fsdp={n // 2}, model=2" if n <= 128 else f"data={n // 128}, fsdp=64, model=2"
        tp_batch = "fsdp" if n <= 128 else "(data, fsdp)"
        return {
            f"MaxText ({maxtext_mesh})": MOE_MAXTEXT.format(mesh=maxtext_mesh, batch=batch),
            f"fsdp+tp ({tp_mesh})": MOE_FSDP_TP.format(mesh=tp_mesh, batch=tp_batch),
            f"hand-written data+model (data={n // 2}, model=2)": _file(
                HERE / "rules/nnx_moe.shard", f"data={n // 2}, model=2", "data"
            ),
        }
    return {
        f"MaxText (fsdp={n})": LLAMA_MAXTEXT.format(mesh=f"fsdp={n}", batch="fsdp"),
        f"cookbook fsdp+tp (fsdp={n // 4}, model=4)": _file(
            HERE / "rules/llama7b.shard", f"fsdp={n // 4}, model=4", "fsdp"
        ),
    }


def _figures(cost: Any) -> dict[str, Any]:
    return {
        "time_s": cost.time_estimate_s,
        "peak": cost.peak_bytes_per_device,
        "flops": cost.flops_per_device,
        "collective_bytes": sum(c.bytes_per_device for c in cost.collectives),
        "fits": cost.fits,
    }


def lint_clean(factory: Any, text: str) -> list[str]:
    """What `shardrules lint` would report of a written file on the step's own
    arguments (every group's plan, as `lint --shapes` plans it), and whether
    `shardrules fmt` would change it: [] when clean."""
    import shardrules as sr
    from shardrules._search._probe import probe
    from shardrules._search._search import _meshes

    rules = sr.loads(text, name="<written>")
    sizes = {a.name: int(a.size) for a in rules.mesh.axes}
    step, args = factory(rules, _meshes(None)(sizes))
    found = [] if sr.format_text(text, "<written>") == text else ["fmt would change it"]
    for group, trees in probe(step, args).groups.items():
        for tree in trees:
            plan = sr.plan(tree, rules, sizes, group=group)
            found += [f"{d.code} {d.message}" for d in plan.diagnostics]
    return found


def one(case: str) -> dict[str, Any]:
    """Run `case` in this process (JAX not started yet): its results."""
    name, n, target = CASES[case]
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", n)
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(REPO))
    import _search_steps

    import shardrules as sr
    from shardrules._quiet import quiet
    from shardrules._search._api import searched
    from shardrules._search._search import HEADROOM, _meshes, search

    factory = getattr(_search_steps, name)
    cpu0, wall0 = time.process_time(), time.monotonic()
    found = searched(
        None,
        None,
        "auto",
        step=factory,
        devices=n,
        target=target,
        hbm=None,
        hbm_headroom=HEADROOM,
        budget=None,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
        head_dim=None,
        min_bytes=1 << 20,
        embedding=None,
        others={},
    )
    wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    chosen = found.search.chosen
    assert chosen is not None and chosen.cost is not None
    out: dict[str, Any] = {
        "case": case,
        "target": target,
        "devices": n,
        "search_wall_s": wall,
        "search_cpu_s": cpu,
        "candidates": len(found.search.rows),
        "set_aside": sum(
            1 for r in found.search.rows if r.status == "rejected" and r.cost is None and r.screen is None
        ),
        "screened": sum(1 for r in found.search.rows if r.screen is not None),
        "compiled": sum(1 for r in found.search.rows if r.cost is not None),
        "chosen": {"mesh": chosen.shape.text, "strategy": chosen.shape.strategy, **_figures(chosen.cost)},
        "text": found.text,
        "lint": lint_clean(factory, found.text),
    }
    if any(r.screen is not None for r in found.search.rows):  # a TPU target: compile every candidate for it
        sweep = search(
            factory,
            n,
            target=target,
            exhaustive=True,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
        rows = sweep.rows
    else:
        rows = found.search.rows
    usable = found.search.usable
    fits = [
        r for r in rows if r.cost is not None and (usable is None or r.cost.peak_bytes_per_device <= usable)
    ]
    best = min(fits, key=lambda r: r.cost.time_estimate_s)  # type: ignore[union-attr]
    out["exhaustive"] = {
        "compiled": sum(1 for r in rows if r.cost is not None),
        "best": {"mesh": best.shape.text, "strategy": best.shape.strategy, **_figures(best.cost)},
        "all": sorted(
            (
                {"mesh": r.shape.text, "strategy": r.shape.strategy, **_figures(r.cost)}
                for r in rows
                if r.cost
            ),
            key=lambda f: f["time_s"],
        ),
    }
    mesh_of = _meshes(None)
    out["experts"] = {}
    for label, text in experts(case).items():
        rules = sr.loads(text, name=label)
        with quiet():
            step, args = factory(rules, mesh_of({a.name: int(a.size) for a in rules.mesh.axes}))
            cost = step.cost(*args, target=target)
        out["experts"][label] = _figures(cost)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cases", nargs="*", metavar="CASE", help=f"of {', '.join(CASES)} (default: all)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--json", metavar="FILE", help="also write every result here")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one)))
        return 0
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}: choose from {', '.join(CASES)}")
    args.cases = args.cases or list(CASES)
    results, missed = [], []
    for case in args.cases:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            [sys.executable, __file__, "--one", case],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
        )
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{case} failed")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result["process_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        results.append(result)
        missed += _report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    for line in missed:
        print("MISSED:", line)
    return 1 if missed else 0


def _report(r: dict[str, Any]) -> list[str]:
    chosen, best = r["chosen"], r["exhaustive"]["best"]
    gap = chosen["time_s"] / best["time_s"] - 1
    print(f"\n## {r['case']} ({r['devices']} devices, {r['target']})")
    print(
        f"search: {r['candidates']} candidates, {r['set_aside']} set aside before compiling, {r['screened']} "
        f"screened, {r['compiled']} compiled for the target; {r['search_wall_s']:.0f} s wall, "
        f"{r['search_cpu_s']:.0f} s CPU"
    )
    print(
        f"chosen: {chosen['mesh']} ({chosen['strategy']}) {chosen['time_s']:.4g} s, peak {chosen['peak'] / 2**30:.2f} GiB"
    )
    lint = r.get("lint", ["not checked"])
    print(f"written file: {'lint-clean and fmt-stable' if not lint else '; '.join(lint)}")
    print(
        f"exhaustive best of {r['exhaustive']['compiled']}: {best['mesh']} ({best['strategy']}) "
        f"{best['time_s']:.4g} s: chosen / best = {1 + gap:.3f}"
    )
    missed = [f"{r['case']}: {gap:.1%} over the exhaustive best"] if gap > WITHIN else []
    missed += [f"{r['case']}: the written file: {line}" for line in lint]
    for label, e in r["experts"].items():
        fits = "fits" if e["fits"] else "does not fit"
        print(
            f"expert {label}: {e['time_s']:.4g} s ({fits}): chosen / expert = {chosen['time_s'] / e['time_s']:.3f}"
        )
        if e["fits"] and chosen["time_s"] > e["time_s"] * (1 + 1e-9):
            missed.append(f"{r['case']}: worse than {label}")
    return missed


if __name__ == "__main__":
    sys.exit(main())
