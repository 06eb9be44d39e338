"""Timing helpers the benchmarks share: the best of several rounds, and the
CPU time of a command run as a fresh process."""

from __future__ import annotations

import os
import resource
import subprocess
from collections.abc import Callable
from pathlib import Path


def best_of(variants: dict[str, Callable[[], float]], repeat: int) -> dict[str, float]:
    """Each variant's best (each returns its own measurement); the variants
    take turns, round after round."""
    best: dict[str, float] = {}
    for _ in range(repeat):
        for name, fn in variants.items():
            best[name] = min(best.get(name, float("inf")), fn())
    return best


def cpu_of(argv: list[str], cwd: Path, *, check: bool = True) -> float:
    """User + system CPU seconds of `argv` run as a fresh process on the CPU
    platform (start-up included); with `check`, a command that fails stops
    the benchmark, showing the end of its output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        argv, cwd=cwd, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if check and done.returncode != 0:
        raise SystemExit(
            f"{argv[3:]} exited with {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
