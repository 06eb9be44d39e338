"""Lint of a 136k-leaf tree against `sr.specs` on the same tree, side by side.

    python benchmarks/lint_vs_specs.py [--repeat 3]

Lint does everything `specs` does plus the checks (dead and shadowed rules,
sharded scalars, replicated arrays, unused axes, every group's axes). Target:
lint costs at most 2x `specs`. Exits 1 if it costs more.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).parent))

import _trees
import jax

import shardrules as sr
from shardrules._cli import _lint

SIZES = {"data": 2, "fsdp": 32, "model": 8}


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    tree = _trees.deepseek_v3()
    leaves = len(jax.tree.leaves(tree))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "moe.shard"
        path.write_text(_trees.rule_file(64))
        result = _lint.lint_file(str(path), tree, SIZES)
        assert result.errors == 0, result.diagnostics[:3]

        floor = best(
            lambda: jax.tree_util.tree_unflatten(*reversed(jax.tree_util.tree_flatten_with_path(tree))),
            args.repeat,
        )
        # Both from scratch: lint loads the file afresh, so `specs` gets a fresh RuleSet
        # (an empty plan cache) each time too.
        specs = best(lambda: sr.specs(tree, sr.load(path), SIZES), args.repeat)
        lint = best(lambda: _lint.lint_file(str(path), tree, SIZES), args.repeat)

    ratio = lint / specs
    print(
        f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, {platform.system()}"
    )
    print(f"python {platform.python_version()}, jax {jax.__version__}, shardrules {sr.__version__}")
    print(f"tree: DeepSeek-V3-shaped MoE with Adam state, {leaves} leaves; 64 rules; best of {args.repeat}")
    print(f"findings: {len(result.diagnostics)} ({', '.join(sorted({d.code for d in result.diagnostics}))})")
    print()
    print(f"{'':28}{'seconds':>10}{'vs specs':>10}")
    print(f"{'flatten + unflatten (floor)':28}{floor:10.3f}{floor / specs:10.2f}")
    print(f"{'sr.specs (baseline)':28}{specs:10.3f}{1:10.2f}")
    print(f"{'lint':28}{lint:10.3f}{ratio:10.2f}")
    print()
    target = 2.0
    print(f"lint / specs = {ratio:.2f} (target <= {target})")
    return 0 if ratio <= target else 1


if __name__ == "__main__":
    sys.exit(main())
