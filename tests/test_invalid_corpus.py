"""Snapshot tests over a corpus of malformed rule files (tests/data/invalid).

Each case is a small `.shard` file that is wrong in one way, or a folder
`include_*/` whose `main.shard` is loaded. The expected error, exactly as
`str(err)` renders it, lies next to it (`NAME.expected`, `include_*/expected`).
Adding a file adds a case; run with `SHARDRULES_UPDATE_SNAPSHOTS=1` to write the
snapshots (see tests/data/invalid/README.md), and read the diff before keeping it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import shardrules as sr

CORPUS = Path(__file__).resolve().parent / "data" / "invalid"
UPDATE = os.environ.get("SHARDRULES_UPDATE_SNAPSHOTS") == "1"
MIN_CASES = 40

# The only machine-dependent text a snapshot may hold (SR006 names the include
# root as an absolute path) is written with this placeholder instead.
CORPUS_PLACEHOLDER = "$CORPUS"

# The source line printed under a location should be the line it names. Known
# exceptions (library bugs, kept visible here until fixed): the excerpt splits the
# file with `str.splitlines`, which also breaks lines at form feeds and U+2028,
# while locations count `\n` only.
WRONG_EXCERPT: dict[str, str] = {}  # case -> why its excerpt is known to be wrong


def _cases() -> dict[str, tuple[str, Path]]:
    """Case id -> (path to load, relative to CORPUS; snapshot file)."""
    cases = {p.stem: (p.name, p.with_suffix(".expected")) for p in sorted(CORPUS.glob("*.shard"))}
    for folder in sorted(p for p in CORPUS.glob("include_*") if p.is_dir()):
        cases[folder.name] = (f"{folder.name}/main.shard", folder / "expected")
    return cases


CASES = _cases()


def _load_error(entry: str) -> sr.ShardRulesError:
    try:
        sr.load(entry)
    except sr.ShardRulesError as err:
        return err
    except Exception as err:  # any other exception is a bug in shardrules
        pytest.fail(f"{entry} raised {type(err).__name__}, not a ShardRulesError: {err}")
    pytest.fail(f"{entry} loaded without an error")


def _rendered(err: sr.ShardRulesError) -> str:
    return str(err).replace(str(CORPUS), CORPUS_PLACEHOLDER)


def _read(snapshot: Path) -> str:
    return snapshot.read_bytes().decode("utf-8")  # bytes: keep `\r` and other oddities exact


@pytest.fixture
def in_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load from the corpus folder, so the snapshots hold short relative paths."""
    monkeypatch.chdir(CORPUS)


@pytest.mark.usefixtures("in_corpus")
@pytest.mark.parametrize("case", sorted(CASES))
def test_error_matches_snapshot(case: str) -> None:
    entry, snapshot = CASES[case]
    err = _load_error(entry)
    text = _rendered(err)
    if UPDATE:
        snapshot.write_bytes(text.encode("utf-8"))
    assert snapshot.is_file(), f"no snapshot {snapshot.name}; run with SHARDRULES_UPDATE_SNAPSHOTS=1"
    assert text == _read(snapshot)
    assert re.fullmatch(r"SR0\d\d", err.code), err.code  # a load-time code
    first = text.split("\n")[0]
    if err.span is None:
        assert first.startswith(f"{err.code} ")
    else:
        assert first.startswith(f"{err.span.file}:{err.span.line}:{err.span.col}: {err.code} ")
        assert _caret_columns(text), "an error with a location shows a caret line"


def _caret_columns(text: str) -> list[int]:
    """The 1-based source column each caret line of `text` starts at."""
    return [len(m.group(1)) + 1 for m in re.finditer(r"^   *\| ( *)\^+$", text, re.M)]


@pytest.mark.usefixtures("in_corpus")
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.xfail(reason=WRONG_EXCERPT[c], strict=True))
        if c in WRONG_EXCERPT
        else c
        for c in sorted(CASES)
    ],
)
def test_excerpt_shows_the_located_line(case: str) -> None:
    """Each shown finding prints the line its location names, caret at its column."""
    err = _load_error(CASES[case][0])
    for diagnostic in err.diagnostics[:12]:
        span = diagnostic.span
        if span is None:
            continue
        block = diagnostic.render({span.file: _source(span.file)})
        source_line = _source(span.file).split("\n")[span.line - 1].removesuffix("\r").expandtabs(1)
        shown = re.search(rf"^  {span.line} \| (.*)$", block, re.M)
        assert shown is not None, block
        (caret,) = _caret_columns(block)
        if "\r" in source_line:  # a file with `\r` line ends is one line to the parser
            continue
        if len(source_line) <= 100:  # short lines are shown whole, invisible characters as U+FFFD
            assert shown.group(1) == "".join(
                c if c.isprintable() or c == " " else "\ufffd" for c in source_line
            )
            assert caret == span.col
        else:  # long lines are cut around the span, marked with `…`; the caret stays on its character
            assert shown.group(1).startswith("…") or caret == span.col
            assert (
                shown.group(1)[caret - 1] == source_line[span.col - 1]
                if span.col <= len(source_line)
                else True
            )


def _source(name: str) -> str:
    return (CORPUS / name).read_bytes().decode("utf-8")


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= MIN_CASES


def test_every_snapshot_has_its_case_and_every_case_its_snapshot() -> None:
    cases = {snapshot for _, snapshot in CASES.values()}
    snapshots = set(CORPUS.glob("*.expected")) | set(CORPUS.glob("*/expected"))
    assert sorted(str(p.relative_to(CORPUS)) for p in snapshots - cases) == [], "snapshots without a case"
    if not UPDATE:
        assert sorted(str(p.relative_to(CORPUS)) for p in cases - snapshots) == [], "cases without a snapshot"
    folders = {p for p in CORPUS.iterdir() if p.is_dir()}
    assert sorted(p.name for p in folders if not (p / "main.shard").is_file()) == [], (
        "every folder is an include_* case with a main.shard"
    )
    assert all(p.name.startswith("include_") for p in folders)


@pytest.mark.usefixtures("in_corpus")
def test_every_syntax_error_has_a_hint() -> None:
    """A syntax error says how to write the line, not only what was expected."""
    bare = []
    for case, (entry, _) in sorted(CASES.items()):
        err = _load_error(entry)
        bare += [case for d in err.diagnostics if d.code == "SR001" and not d.hint]
    assert bare == []


_VALID = """mesh data=2, fsdp=*, model=8
alias batch = (data, fsdp)
rules params:
  "embed/embedding"          -> (model, fsdp)
  "attn/(q|k|v)_proj/kernel" -> (..., fsdp, model)
  "lm_head/kernel"           -> (fsdp, model?)
  default                    -> auto(fsdp, min_bytes=1MiB)
rules inputs:
  "tokens|targets" -> (batch, _)  # the batch
"""
_PIECES = [*"\"'()[]{},.;:-=>?*_#/\\ \t\n…“”\u00a0aZ09", "->", "...", "rules", "mesh", "alias", "default"]


@given(
    edits=st.lists(
        st.tuples(
            st.integers(0, len(_VALID)),
            st.sampled_from(["insert", "delete", "replace"]),
            st.sampled_from(_PIECES),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_edited_files_get_syntax_errors_with_hints(edits: list[tuple[int, str, str]]) -> None:
    """Small edits of a valid file (a character or keyword inserted, deleted or
    replaced) either still load, or fail with errors of ours; every syntax
    error among them says how to write the line (a hint), not just what the
    parser expected."""
    text = list(_VALID)
    for at, op, piece in edits:
        at = min(at, len(text))
        if op == "insert":
            text.insert(at, piece)
        elif text:
            text[min(at, len(text) - 1) : min(at, len(text) - 1) + 1] = [] if op == "delete" else [piece]
    source = "".join(text)
    try:
        sr.loads(source)
    except sr.ShardRulesError as err:
        for d in err.diagnostics:
            if d.code == "SR001":
                assert d.hint, f"no hint for: {d.message}\n{source}"
