"""Locating and loading the grammar file, once per process.

The parser is built on its first use, not when shardrules is imported (a
program that never parses a rule file pays for neither Lark nor the build),
and once: threads asking for it together wait for the one being built.
"""

from __future__ import annotations

import importlib.resources
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import lark

GRAMMAR_NAME = "shardrules.lark"

_built: lark.Lark | None = None
_building = threading.Lock()


def grammar_text() -> str:
    """The text of `shardrules.lark`.

    An installed wheel carries the grammar inside the package
    (`shardrules/grammar/shardrules.lark`); a source checkout keeps it at the
    repository's top level (`grammar/shardrules.lark`).
    """
    packaged = importlib.resources.files("shardrules").joinpath("grammar").joinpath(GRAMMAR_NAME)
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    checkout = Path(__file__).resolve().parents[2] / "grammar" / GRAMMAR_NAME
    if checkout.is_file():
        return checkout.read_text(encoding="utf-8")
    raise FileNotFoundError(
        f"the shardrules grammar ({GRAMMAR_NAME}) is missing from this installation; "
        "reinstall the package (pip install --force-reinstall shardrules)"
    )


def parser() -> lark.Lark:
    """The LALR parser built from the grammar (built on first use, then reused)."""
    global _built
    if _built is None:
        with _building:
            if _built is None:
                _built = _build()
    return _built


def _build() -> lark.Lark:
    import lark

    return lark.Lark(
        grammar_text(),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=False,
    )
