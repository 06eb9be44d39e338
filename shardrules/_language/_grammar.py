"""Locating and loading the grammar file, once per process."""

from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path

import lark

GRAMMAR_NAME = "shardrules.lark"


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


@functools.cache
def parser() -> lark.Lark:
    """The LALR parser built from the grammar (built on first use, then reused)."""
    return lark.Lark(
        grammar_text(),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=False,
    )
