"""The bundled examples run to completion from any working directory, and their rule
files are in the canonical layout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import shardrules as sr

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# Entry points: scripts directly inside an example folder that run as `__main__`.
SCRIPTS = sorted(p for p in EXAMPLES.glob("*/*.py") if 'if __name__ == "__main__":' in p.read_text())
RULE_FILES = sorted(EXAMPLES.rglob("*.shard"))


def _name(path: Path) -> str:
    return path.relative_to(EXAMPLES).as_posix()


def test_examples_are_found() -> None:
    """The globs find the bundled example, so the tests below cannot pass on none."""
    assert EXAMPLES / "mlp" / "train.py" in SCRIPTS, f"example scripts found: {SCRIPTS}"
    assert EXAMPLES / "mlp" / "mlp.shard" in RULE_FILES, f"rule files found: {RULE_FILES}"


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=_name)
def test_example_runs(script: Path, tmp_path: Path) -> None:
    """The script sets up its own devices (no XLA_FLAGS or JAX_PLATFORMS given) and exits 0."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, output
    assert result.stdout.strip(), output
    assert "ShardRulesWarning" not in result.stderr, output  # the examples' rules fit their trees
    if script.stem == "train":
        assert "loss" in result.stdout, output


@pytest.mark.parametrize("rule_file", RULE_FILES, ids=_name)
def test_example_rules_are_formatted(rule_file: Path) -> None:
    """`shardrules fmt --check` would pass on every example rule file."""
    text = rule_file.read_text()
    assert sr.format_text(text, name=str(rule_file)) == text
