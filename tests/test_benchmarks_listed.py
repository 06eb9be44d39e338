"""Every benchmark script is listed in benchmarks/README.md with how to run it,
and has its section of recorded results in benchmarks/RESULTS.md."""

from __future__ import annotations

from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


def test_there_are_scripts() -> None:
    assert len(SCRIPTS) >= 10, SCRIPTS


def test_every_script_is_in_the_readme_with_its_command() -> None:
    readme = (BENCHMARKS / "README.md").read_text(encoding="utf-8")
    missing = [s for s in SCRIPTS if f"| `{s}` |" not in readme or f"python benchmarks/{s}" not in readme]
    assert not missing, f"benchmarks/README.md does not list (with a command): {missing}"


def test_every_script_has_recorded_results() -> None:
    results = (BENCHMARKS / "RESULTS.md").read_text(encoding="utf-8")
    headings = [line for line in results.splitlines() if line.startswith("## ")]
    missing = [s for s in SCRIPTS if not any(f"`benchmarks/{s}`" in h for h in headings)]
    assert not missing, f"benchmarks/RESULTS.md has no section for: {missing}"
