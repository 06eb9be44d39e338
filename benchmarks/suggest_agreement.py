"""`shardrules suggest` against the layouts of model libraries' own trees.

    python benchmarks/suggest_agreement.py

Each library's measurement is a module `_agree_<name>.py` here with a
`rows()` giving table rows (library and expert layout, model, strategy and
mesh, leaves the same, bytes the same, what differs), compared as device →
block maps (`_expert_layouts.agreement`). The libraries, in this order:
haiku, gemma, haliax, qwix; a module that is missing, or that fails to
import, is a row saying so. A library that is not installed is a row of its
own module saying why (or, for gemma, a tree built from its names and
shapes). Prints one Markdown table (benchmarks/RESULTS.md has a run).
"""

from __future__ import annotations

import importlib
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import jax

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import shardrules as sr  # noqa: E402

LIBRARIES = ("haiku", "gemma", "haliax", "qwix")
HEADER = [
    "library (expert layout)",
    "model",
    "strategy, mesh",
    "leaves the same",
    "bytes the same",
    "what differs",
]


def rows() -> list[list[str]]:
    """Every library's rows, or one row saying why it has none."""
    out = []
    for name in LIBRARIES:
        try:
            module = importlib.import_module(f"_agree_{name}")
        except ImportError as error:
            out.append([name, "-", "-", "-", "-", f"skipped: no measurement ({error})"])
            continue
        try:
            out.extend(module.rows())
        except Exception as error:  # a library that imports but fails: said, not fatal to the others
            out.append([name, "-", "-", "-", "-", f"failed: {type(error).__name__}: {error}"])
    return out


def _versions() -> str:
    found = []
    for dist in ("jax", "flax", "dm-haiku", "gemma", "kauldron", "haliax", "qwix"):
        try:
            found.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            continue
    return ", ".join(found)


def main() -> None:
    print(f"Machine: {platform.machine()}, {platform.system()}; Python {platform.python_version()}; "
          f"{_versions()}; shardrules {sr.__version__}; {jax.device_count()} devices\n")  # fmt: skip
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for row in rows():
        print("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")


if __name__ == "__main__":
    main()
