"""Every Python block in docs/ is a complete program, and runs.

The pages whose outputs are compared line by line (tests/test_docs.py: api.md,
cli.md, diagnostics.md, explicit-axes.md) are run there. On every other page
under docs/ (the cookbook included), each ```python block runs on its own, as a
script would: in a fresh namespace (`__name__ == "__main__"`), in a fresh
folder holding the page's rule files. A ```shard block whose first line is a
comment naming a file (`# mlp.shard`) is written to that file first, for the
blocks after it; so is a ```python block whose first line names a module
(`# layouts.py`), which the page's later programs import. The 8 simulated CPU devices of the test session stand in for
the accelerators.

`<!-- not-tested: REASON -->` on the line before a block skips it; the reasons
are listed in SKIPS below, so that a skip is a decision, not an accident.
`<!-- warns: SRnnn ... -->` there says the block gives that ShardRulesWarning
on purpose: it is asserted (the block fails without it), not let leak.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import warnings
from pathlib import Path

import pytest

import shardrules as sr

DOCS = Path(__file__).resolve().parent.parent / "docs"
COMPARED = {"api.md", "cli.md", "convert.md", "diagnostics.md", "explicit-axes.md"}  # run by test_docs.py
FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<lang>\w+)[ ]*\n(?P<body>.*?)^(?P=indent)```[ ]*$", re.M | re.S)
SKIP = re.compile(r"<!--\s*not-tested:\s*(?P<reason>.*?)\s*-->\s*$")
# the ShardRulesWarning a block gives on purpose (the page shows it), asserted rather than let leak
WARNS = re.compile(r"<!--\s*warns:\s*(?P<code>SR\d{3})\b.*?-->\s*$")
# page -> how many blocks it skips, and why (each skip needs a reason here too)
SKIPS: dict[str, tuple[int, str]] = {
    # launching, joining a coordinator, and one of two processes run at once:
    # jax.distributed.initialize must run before JAX starts its backends, which the
    # test session has done (the single-process blocks of the page do run)
    "multihost.md": (3, "jax.distributed.initialize needs several processes and a fresh JAX"),
    # three lines of a loss; tests/test_parameter_names.py runs them in a train step
    "activations.md": (1, "lines of a loss, run in a train step by tests/test_parameter_names.py"),
}
# page -> the optional library (and its extra) its programs need: a page whose library is
# not installed skips, saying which extra installs it (as the tests of that library do)
NEEDS: dict[str, tuple[str, str]] = {
    "cookbook/penzai.md": ("penzai", "pip install -e '.[penzai]'"),
    "cookbook/haliax.md": ("haliax", "pip install marin-haliax"),
}
# page -> a DeprecationWarning its optional library gives from inside, which is not the page's to fix
LIBRARY_DEPRECATIONS: dict[str, str] = {
    "cookbook/haliax.md": r"jax\.core\.is_constant_dim is deprecated",  # haliax 0.2.20's jax_utils
}


@dataclasses.dataclass
class Block:
    page: str
    line: int
    lang: str
    text: str
    skipped: str | None
    warns: str | None = None


def _blocks(page: Path) -> list[Block]:
    source = page.read_text(encoding="utf-8")
    out = []
    for match in FENCE.finditer(source):
        line = source.count("\n", 0, match.start()) + 1
        before = source[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        indent = len(match["indent"])
        text = "\n".join(row[indent:] for row in match["body"].split("\n"))
        name = page.relative_to(DOCS).as_posix()
        warns = WARNS.search(before)
        out.append(
            Block(
                name,
                line,
                match["lang"],
                text,
                skip["reason"] if skip else None,
                warns["code"] if warns else None,
            )
        )
    return out


PAGES = sorted(p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).as_posix() not in COMPARED)
PROGRAMS = [(p, b) for p in PAGES for b in _blocks(p) if b.lang == "python"]


def test_the_pages_have_programs() -> None:
    """The glob and the fence pattern find the blocks, so the test below cannot pass on none."""
    assert len(PROGRAMS) >= 40, [f"{b.page}:{b.line}" for _, b in PROGRAMS]
    assert any(b.page.startswith("cookbook/") for _, b in PROGRAMS)


def test_every_skip_is_listed_with_its_reason() -> None:
    skipped: dict[str, int] = {}
    for _, block in PROGRAMS:
        if block.skipped is not None:
            skipped[block.page] = skipped.get(block.page, 0) + 1
    assert skipped == {page: count for page, (count, _) in SKIPS.items()}


@pytest.mark.parametrize(("page", "block"), PROGRAMS, ids=[f"{b.page}:{b.line}" for _, b in PROGRAMS])
def test_block_runs_as_a_program(
    page: Path, block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if block.skipped is not None:
        pytest.skip(block.skipped)
    if block.page in NEEDS:
        module, how = NEEDS[block.page]
        pytest.importorskip(module, reason=f"{module} is not installed ({how})")
    monkeypatch.chdir(tmp_path)
    for other in _blocks(page):
        if other.line > block.line:
            break
        first = other.text.split("\n", 1)[0].strip()
        named = (other.lang == "shard" and re.fullmatch(r"#\s*[\w./-]+\.shard", first)) or (
            other.lang == "python" and other.line < block.line and re.fullmatch(r"#\s*[\w]+\.py", first)
        )
        if named:
            target = tmp_path / first.lstrip("#").strip()
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(other.text, encoding="utf-8")
            if target.suffix == ".py":  # a module the page's later programs import, fresh for each
                monkeypatch.syspath_prepend(str(tmp_path))
                monkeypatch.delitem(sys.modules, target.stem, raising=False)
    monkeypatch.setattr(sys, "argv", [f"{block.page}:{block.line}"])
    monkeypatch.setitem(os.environ, "XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    code = compile(block.text, f"docs/{block.page}:{block.line}", "exec")
    with (
        pytest.warns(sr.ShardRulesWarning, match=block.warns) if block.warns else contextlib.nullcontext(),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("error", DeprecationWarning)
        if block.page in LIBRARY_DEPRECATIONS:
            warnings.filterwarnings("ignore", LIBRARY_DEPRECATIONS[block.page], DeprecationWarning)
        exec(code, {"__name__": "__main__"})
