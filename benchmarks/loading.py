"""Loading a rule file at the size limits, and refusing one over them.

    python benchmarks/loading.py [--repeat 3]

The file: 10,000 rules (`MAX_RULES`, the most one load may hold) with
realistic patterns (`layers/\\d+/block_{i}/attn/(q|k|v)_proj/kernel$`, 45 RE2
instructions each, 449,000 in all: under the 1,000,000 of
`MAX_TOTAL_PROGRAM`), specs and trailing comments, padded with comment lines
to 1 MiB (the most one file may hold). Measured, best of `--repeat` rounds,
side by side:

- floor: Lark's own LALR parse of the text with the project's grammar, positions
  kept (what any Lark-based loader pays before building anything);
- `parse`: text → syntax tree (`RuleFile`), spans included;
- `sr.loads`: everything: includes, names, every pattern checked (Python's
  syntax, what RE2 lacks, compiled by RE2) before the file is parsed, specs
  resolved.

Then files over each limit, each refused (SR009) before it is parsed; the time
to refuse is shown against the same floor: a text over 1 MiB, 80,000 rules in
720 KB, 50,001 lines, twenty 1 MiB includes, and patterns over the RE2 budget
(ten thousand thousand-character repeats, refused at the 125th; and, the worst
case, 10,000 patterns of 100 instructions and one more, refused at the last:
every pattern is checked, as loading checks them, but nothing is parsed).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import lark
import re2

import shardrules as sr
from shardrules._gcpause import paused
from shardrules._language import _grammar, _regex
from shardrules._language._build import MAX_TOTAL_PROGRAM, PatternBudget, pattern_problem
from shardrules._language._files import MAX_FILE_BYTES
from shardrules._language._includes import MAX_LINES, MAX_RULES
from shardrules._language._parse import parse

HEAD = ["mesh data, fsdp, model", "alias embed = fsdp", "alias heads = model", "", "rules params:"]


def big_file() -> str:
    """`MAX_RULES` realistic rules, padded with comment lines to 1 MiB."""
    lines = list(HEAD)
    for i in range(MAX_RULES):
        lines.append(
            f'  "layers/\\d+/block_{i}/attn/(q|k|v)_proj/kernel$" -> (..., embed, heads?)  # rule {i}'
        )
    text = "\n".join(lines) + "\n"
    filler = "# " + "-" * 76 + "\n"
    text += filler * ((MAX_FILE_BYTES - len(text)) // len(filler))
    assert len(text.encode()) <= MAX_FILE_BYTES
    return text


def over_budget_at_the_end() -> str:
    """`MAX_RULES` rules whose patterns cross `MAX_TOTAL_PROGRAM` at the last one."""
    per_rule = MAX_TOTAL_PROGRAM // MAX_RULES

    def pattern(i: int, size: int) -> str:
        for count in range(1, 200):
            found = f"layers/\\d+/block_{i:05d}/attn/(q|k|v)_proj/kernel_[0-9]{{{count}}}$"
            if pattern_problem(found)[0] == size:
                return found
        raise AssertionError(f"no pattern of {size} instructions")

    sized = pattern(0, per_rule)
    rules = [f'  "{sized.replace("00000", f"{i:05d}")}" -> (..., embed)' for i in range(MAX_RULES - 1)]
    rules.append(f'  "{pattern(MAX_RULES - 1, per_rule + 1)}" -> (..., embed)')
    text = "\n".join([*HEAD, *rules]) + "\n"
    assert len(text.encode()) <= MAX_FILE_BYTES and text.count("->") == MAX_RULES
    return text


def cold() -> None:
    """Forget the patterns compiled (ours, and RE2's own cache of the last 128)."""
    _regex.compiled.cache_clear()
    re2.purge()


def measure(variants: list[tuple[str, Callable[[], object]]], repeat: int) -> dict[str, float]:
    """Each variant's best time over `repeat` rounds. The variants take turns in
    each round (a burst of other work on a shared machine then slows one round
    of every variant, not every round of one), and each run starts with no
    pattern compiled, as a fresh process would."""
    times = {label: math.inf for label, _ in variants}
    for _ in range(repeat):
        for label, fn in variants:
            cold()
            start = time.perf_counter()
            fn()
            times[label] = min(times[label], time.perf_counter() - start)
    return times


def refusal(fn: Callable[[], object], expect: str) -> Callable[[], None]:
    """`fn`, checked to raise SR009 with `expect` in its message."""

    def run() -> None:
        try:
            fn()
        except sr.ShardRulesError as err:
            assert err.code == "SR009" and expect in str(err), err
        else:
            raise AssertionError("not refused")

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each variant keeps its best")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, {platform.system()}"
    )
    print(
        f"python {platform.python_version()}, jax {jax.__version__}, lark {lark.__version__}, "
        f"google-re2 {importlib.metadata.version('google-re2')}, shardrules {sr.__version__}; "
        f"best of {args.repeat} interleaved rounds"
    )
    text = big_file()
    source = text if text.endswith("\n") else text + "\n"
    lark_parser = _grammar.parser()

    def floor() -> None:
        with paused():  # as parse and loads run: see shardrules/_gcpause.py
            lark_parser.parse(source)

    budget = PatternBudget()
    budget.scan(text, "big.shard", {})
    many = "rules params:\n" + '"a"->(_)\n' * 80_000
    lines = "\n" * MAX_LINES + "rules params:\n"
    heavy = "rules params:\n" + "".join(f'  "[^a]{{1000}}{i:05d}" -> replicated\n' for i in range(9_999))
    at_the_end = over_budget_at_the_end()
    within = [
        ("floor: Lark parse", floor),
        ("parse", lambda: parse(text, "big.shard")),
        ("sr.loads", lambda: sr.loads(text, name="big.shard")),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        part = ("#" + "x" * 998 + "\n") * ((MAX_FILE_BYTES - 100) // 1000)
        for i in range(20):
            Path(tmp, f"part{i}.shard").write_text(part)
        Path(tmp, "top.shard").write_text("".join(f'include "part{i}.shard"\n' for i in range(20)))
        over = [
            (
                "a text of 1 MiB + 1 byte",
                refusal(lambda: sr.loads("#" * MAX_FILE_BYTES + "\n"), "than 1 MiB"),
            ),
            (
                f"{many.count('->'):,} rules in {len(many) // 1000} KB",
                refusal(lambda: sr.loads(many), "rules ("),
            ),
            (f"{lines.count(chr(10)):,} lines", refusal(lambda: sr.loads(lines), f"{MAX_LINES:,} lines")),
            ("twenty 1 MiB includes", refusal(lambda: sr.load(Path(tmp, "top.shard")), "MiB in all")),
            ("RE2 budget: 9,999 {1000} repeats", refusal(lambda: sr.loads(heavy), "RE2 instructions")),
            (
                "RE2 budget: crossed at the last rule",
                refusal(lambda: sr.loads(at_the_end), "RE2 instructions"),
            ),
        ]
        times = measure(within + over, args.repeat)
    base, loaded = times["floor: Lark parse"], times["sr.loads"]
    size = len(text.encode())
    print(f"\n1 MiB file ({size:,} bytes, {MAX_RULES:,} rules, {budget.used:,} RE2 instructions)")
    print(f"  {'':40}{'seconds':>9}{'vs floor':>10}")
    for label, _ in within:
        print(f"  {label:40}{times[label]:9.3f}{times[label] / base:9.2f}x")
    print("\nrefused before parsing (SR009)")
    print(f"  {'':40}{'seconds':>9}{'vs floor':>10}{'vs loads':>10}")
    for label, _ in over:
        print(f"  {label:40}{times[label]:9.3f}{times[label] / base:9.2f}x{times[label] / loaded:9.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
