"""Loading a rule file at the size limits: `sr.loads` of a 1 MiB file.

    python benchmarks/loading.py [--repeat 3]

The file: 10,000 rules (the most one load may hold) with realistic patterns,
specs and trailing comments, padded with comment lines to 1 MiB (the most one
file may hold). Measured, best of `--repeat` rounds, side by side:

- floor: Lark's own LALR parse of the text with the project's grammar, positions
  kept (what any Lark-based loader pays before building anything);
- `parse`: text → syntax tree (`RuleFile`), spans included;
- `sr.loads`: everything: includes, names, every pattern checked (Python's
  syntax, what RE2 lacks, compiled by RE2), specs resolved.

Also: files over the limits (80,000 rules in 800 KB; twenty 1 MiB includes) are
refused before parsing: their time is printed too.
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

import jax
import lark

import shardrules as sr
from shardrules._gcpause import paused
from shardrules._language import _grammar
from shardrules._language._files import MAX_FILE_BYTES
from shardrules._language._includes import MAX_RULES
from shardrules._language._parse import parse


def big_file() -> str:
    lines = ["mesh data, fsdp, model", "alias embed = fsdp", "alias heads = model", "", "rules params:"]
    for i in range(MAX_RULES):
        lines.append(
            f'  "layers/\\d+/block_{i}/attn/(q|k|v)_proj/kernel$" -> (..., embed, heads?)  # rule {i}'
        )
    text = "\n".join(lines) + "\n"
    filler = "# " + "-" * 76 + "\n"
    text += filler * ((MAX_FILE_BYTES - len(text)) // len(filler))
    assert len(text.encode()) <= MAX_FILE_BYTES
    return text


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def refused(fn) -> float:
    start = time.perf_counter()
    try:
        fn()
    except sr.ShardRulesError as err:
        assert err.code == "SR009", err
    else:
        raise AssertionError("not refused")
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each variant keeps its best")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()}")
    print(
        f"python {platform.python_version()}, jax {jax.__version__}, lark {lark.__version__}, "
        f"shardrules {sr.__version__}"
    )
    text = big_file()
    source = text if text.endswith("\n") else text + "\n"
    lark_parser = _grammar.parser()
    with paused():  # as parse and loads run: see shardrules/_gcpause.py
        floor = best(lambda: lark_parser.parse(source), args.repeat)
    parsed = best(lambda: parse(text, "big.shard"), args.repeat)
    loaded = best(lambda: sr.loads(text, name="big.shard"), args.repeat)
    size = len(text.encode())
    print(f"\n1 MiB file ({size:,} bytes, {MAX_RULES:,} rules)")
    print(f"  {'':34}{'seconds':>9}{'vs floor':>10}")
    for label, seconds in [("floor: Lark parse", floor), ("parse", parsed), ("sr.loads", loaded)]:
        print(f"  {label:34}{seconds:9.3f}{seconds / floor:9.2f}x")

    many = "rules params:\n" + '"a"->(_)\n' * 80_000
    with tempfile.TemporaryDirectory() as tmp:
        part = ("#" + "x" * 998 + "\n") * ((MAX_FILE_BYTES - 100) // 1000)
        for i in range(20):
            Path(tmp, f"part{i}.shard").write_text(part)
        Path(tmp, "top.shard").write_text("".join(f'include "part{i}.shard"\n' for i in range(20)))
        print("\nrefused before parsing (SR009)")
        label = f"{many.count('->'):,} rules in {len(many) // 1000} KB"
        print(f"  {label:34}{refused(lambda: sr.loads(many)):9.3f}")
        print(f"  {'twenty 1 MiB includes':34}{refused(lambda: sr.load(Path(tmp, 'top.shard'))):9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
