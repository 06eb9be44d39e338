"""Shapes and plans at a million leaves, each against its floor in the same run.

    python benchmarks/million_leaves.py [--repeat 3] [--experts 5460]

The tree: a flat shapes JSON (`name: [shape, dtype]`, as `--shapes` reads it)
of a wide MoE, 61 layers of 5,460 experts (three weights each) plus attention
and norms: about a million leaves, ~50 MB. The rules: 64, the real ones last.
Measured side by side, best of `--repeat` interleaved rounds:

- `sr.load_shapes` of the file, against `json.load` of it (floor);
- `sr.specs` on that tree with a `RuleSet` whose plan cache already holds the
  structure (a second call), against `jax.tree.flatten` + `jax.tree.unflatten`
  of the same tree (floor);
- `shardrules lint rules.shard --shapes shapes.json --mesh ...` as a command,
  against a Python that starts, imports shardrules and `json.load`s the file
  (floor).

Targets: `load_shapes` within 1.5x its floor, cached `specs` within 1.5x, lint
within 2x. Exits 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

import shardrules as sr

SIZES = {"data": 2, "fsdp": 32, "model": 8}
MESH = ",".join(f"{k}={v}" for k, v in SIZES.items())
D, FF, VOCAB = 7168, 2048, 129280

REAL_RULES = [
    (r"embed$", "(model, fsdp)"),
    (r"lm_head$", "(fsdp, model)"),
    (r"attn\.(q|k|v)$", "(fsdp, model)"),
    (r"attn\.o$", "(model, fsdp)"),
    (r"experts\.\d+\.(gate|up)$", "(fsdp, model)"),
    (r"experts\.\d+\.down$", "(model, fsdp)"),
    (r"norm$", "replicated"),
    (r"step$", "replicated"),
]


def shapes(experts: int, layers: int = 61) -> dict[str, list]:
    """The shapes file's object: `name: [shape, dtype]`."""
    out: dict[str, list] = {"embed": [[VOCAB, D], "bfloat16"], "lm_head": [[D, VOCAB], "bfloat16"]}
    out["final_norm"] = [[D], "float32"]
    out["step"] = [[], "int32"]
    for i in range(layers):
        p = f"layers.{i}."
        for name in "qkv":
            out[p + "attn." + name] = [[D, 1024], "bfloat16"]
        out[p + "attn.o"] = [[1024, D], "bfloat16"]
        out[p + "attn_norm"] = [[D], "float32"]
        out[p + "mlp_norm"] = [[D], "float32"]
        for e in range(experts):
            q = f"{p}experts.{e}."
            out[q + "gate"] = [[D, FF], "bfloat16"]
            out[q + "up"] = [[D, FF], "bfloat16"]
            out[q + "down"] = [[FF, D], "bfloat16"]
    return out


def rule_file(n_rules: int = 64) -> str:
    fillers = [
        (rf"vision_tower\.block_{i}\.(attn|mlp)\.w{i % 7}$", "(fsdp, model)")
        for i in range(n_rules - len(REAL_RULES))
    ]
    lines = ["mesh data, fsdp, model", "", "rules params:"]
    lines += [f'  "{pattern}" -> {spec}' for pattern, spec in fillers + REAL_RULES]
    return "\n".join(lines) + "\n"


def timed(fn) -> float:
    gc.collect()  # each variant starts with the same heap
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def best_of(variants: dict, repeat: int) -> dict[str, float]:
    """Each variant's best time; the variants take turns, round after round, so
    that a burst of other work on the machine slows one round of each."""
    best: dict[str, float] = {}
    for _ in range(repeat):
        for name, fn in variants.items():
            best[name] = min(best.get(name, float("inf")), timed(fn))
    return best


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def paused_load(path: Path) -> None:
    """`json.load` with the cyclic collector off (as `load_shapes` parses)."""
    gc.disable()
    try:
        with open(path, "rb") as f:
            json.load(f)
    finally:
        gc.enable()


def cached_specs(shapes_path: Path, rules_path: Path, repeat: int) -> tuple[dict[str, float], int]:
    """`sr.specs` for a structure the rule set's plan cache holds, against its floor."""
    tree = sr.load_shapes(shapes_path)
    rules = sr.load(rules_path)
    sr.specs(tree, rules, SIZES)

    def floor() -> None:
        flat, treedef = jax.tree.flatten(tree)
        jax.tree.unflatten(treedef, flat)

    variants = {
        "flatten + unflatten (floor)": floor,
        "sr.specs, cached structure": lambda: sr.specs(tree, rules, SIZES),
    }
    return best_of(variants, repeat), len(tree)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each variant keeps its best")
    parser.add_argument("--experts", type=int, default=5460, help="experts per layer (5460: ~1M leaves)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shapes_path, rules_path = folder / "shapes.json", folder / "rules.shard"
        with open(shapes_path, "w") as f:
            json.dump(shapes(args.experts), f, separators=(",", ":"))
        rules_path.write_text(rule_file())
        megabytes = shapes_path.stat().st_size / 1e6

        def load_floor() -> None:
            with open(shapes_path, "rb") as f:
                json.load(f)

        # 1. Loading, with nothing else alive (the collector's work grows with the heap).
        loading = best_of(
            {
                "json.load (floor)": load_floor,
                "sr.load_shapes": lambda: sr.load_shapes(shapes_path),
                "json.load, collector off (reference)": lambda: paused_load(shapes_path),
            },
            args.repeat,
        )

        cached, leaves = cached_specs(shapes_path, rules_path, args.repeat)  # 2.

        # 3. The command, against a Python that starts, imports and reads the file.
        lint_argv = [sys.executable, "-m", "shardrules", "lint", str(rules_path)]
        lint_argv += ["--shapes", str(shapes_path), "--mesh", MESH]
        floor_code = f"import json, shardrules; json.load(open({str(shapes_path)!r}, 'rb'))"
        done = run(lint_argv, folder)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-2000:])
            raise SystemExit(f"lint exited with {done.returncode}")
        findings = done.stdout.strip().splitlines()[-1:] or [""]
        command = best_of(
            {
                "python + import + json.load (floor)": lambda: run(
                    [sys.executable, "-c", floor_code], folder
                ),
                "shardrules lint --shapes": lambda: run(lint_argv, folder),
            },
            args.repeat,
        )

    print(
        f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, {platform.system()}"
    )
    print(f"python {platform.python_version()}, jax {jax.__version__}, shardrules {sr.__version__}")
    print(
        f"tree: flat shapes JSON, {leaves} leaves, {megabytes:.1f} MB; 64 rules; "
        f"best of {args.repeat} interleaved rounds"
    )
    print(f"lint says: {findings[0]}")
    print()
    print(f"{'':40}{'seconds':>9}{'vs floor':>10}{'target':>8}")
    missed = False
    for best, target in ((loading, 1.5), (cached, 1.5), (command, 2.0)):
        (floor_name, floor), (name, seconds), *others = best.items()
        ratio = seconds / floor
        missed = missed or ratio > target
        print(f"{floor_name:40}{floor:9.3f}{1:10.2f}")
        print(f"{name:40}{seconds:9.3f}{ratio:10.2f}{target:8.1f}")
        for other, value in others:
            print(f"{other:40}{value:9.3f}{value / floor:10.2f}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
