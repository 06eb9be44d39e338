"""`shardrules dump` and `shardrules diff` of a 136k-leaf tree against `sr.specs`
on the same tree, side by side.

    python benchmarks/dump_diff.py [--repeat 3]

dump: load the rule file, plan the tree, write the JSON text. diff: plan two
rule files (the second with one rule edited, so that 7,000+ leaves change) and
compare them; and diff of two dumps read back. Target: each at most 2x
`sr.specs`. Exits 1 if one costs more.
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
from shardrules._cli._plans import plan_file
from shardrules._reports._dump import dumps, table_of
from shardrules._reports._dumpread import loads
from shardrules._reports._plandiff import compare

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
        a, b = Path(tmp) / "moe.shard", Path(tmp) / "edited.shard"
        text = _trees.rule_file(64)
        a.write_text(text)
        lines = text.splitlines()
        edited = next(i for i, line in enumerate(lines) if line.strip().startswith('"experts/\\d+/down_proj'))
        lines[edited] = lines[edited].split("->")[0] + "-> (fsdp, model)"
        b.write_text("\n".join(lines) + "\n")

        def dump() -> str:
            return dumps(table_of(plan_file(str(a), tree, SIZES, None)))

        def diff():
            return compare(
                table_of(plan_file(str(a), tree, SIZES, None)), table_of(plan_file(str(b), tree, SIZES, None))
            )

        text_a, text_b = dump(), dumps(table_of(plan_file(str(b), tree, SIZES, None)))
        result = diff()
        assert not result.equal

        specs = best(lambda: sr.specs(tree, sr.load(a), SIZES), args.repeat)
        dump_s = best(dump, args.repeat)
        diff_s = best(diff, args.repeat)
        dumps_s = best(lambda: compare(loads(text_a), loads(text_b)), args.repeat)

    print(
        f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, {platform.system()}"
    )
    print(f"python {platform.python_version()}, jax {jax.__version__}, shardrules {sr.__version__}")
    print(f"tree: DeepSeek-V3-shaped MoE with Adam state, {leaves} leaves; 64 rules; best of {args.repeat}")
    print(f"dump: {len(text_a) / 2**20:.1f} MiB of JSON; diff: {result.changed} leaves changed")
    print()
    print(f"{'':34}{'seconds':>10}{'vs specs':>10}")
    rows = [
        ("sr.specs (baseline)", specs),
        ("dump (plan + JSON)", dump_s),
        ("diff of two rule files (2 plans)", diff_s),
        ("diff of two dumps (read JSON)", dumps_s),
    ]
    for name, seconds in rows:
        print(f"{name:34}{seconds:10.3f}{seconds / specs:10.2f}")
    print()
    target = 2.0
    worst = max(dump_s, diff_s / 2, dumps_s) / specs
    print(
        f"dump / specs = {dump_s / specs:.2f}, diff / (2 x specs) = {diff_s / 2 / specs:.2f}, "
        f"dumps diff / specs = {dumps_s / specs:.2f} (target <= {target})"
    )
    return 0 if worst <= target else 1


if __name__ == "__main__":
    sys.exit(main())
