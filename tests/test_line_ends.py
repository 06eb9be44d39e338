"""Line ends: a rule file's lines end at `\\n` or `\\r\\n` and nowhere else, and
every other character that `str.splitlines` (and so some editor or viewer)
takes for a line break is refused where it stands, in a comment, in quotes or
between tokens: SR001 at that character, with a caret under it. So the lines a
reader sees are the lines the parser reads: no rule hides after a lone `\\r` in
a comment, and `fmt` never writes a file that hides one.

The campaign draws rule files whose lines, and whose comments, are broken by
random mixes of `\\n`, `\\r\\n`, lone `\\r` and the other line breaks: what loads
holds exactly the rules a line-by-line reader (`str.splitlines`) sees, and
what does not load fails at the first line break that ends no line; `fmt`
(the function and the command) agrees, and what it writes loads to the same
rules."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, event, example, given, note, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules._cli._main import main

BREAKS = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
"""The line breaks of `str.splitlines` other than `\\n` (and `\\r\\n`)."""

HIDDEN = 'rules p:\n  "a" -> replicated  # reviewed\r  "b" -> (model)\n  default -> replicated\n'
"""A rule (`b`) that an editor shows on a line of its own, after a lone `\\r` in a comment."""


def test_breaks_are_those_of_str_splitlines() -> None:
    found = [chr(c) for c in range(sys.maxunicode + 1) if len(f"a{chr(c)}b".splitlines()) > 1]
    assert found == sorted(["\n", *BREAKS])


def _error(text: str) -> sr.RuleSyntaxError:
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads(text, name="x.shard")
    return info.value


def _first_break(text: str) -> int:
    """The index of the first line break that ends no line (`-1`: none)."""
    for i, char in enumerate(text):
        if char in BREAKS and not (char == "\r" and text.startswith("\n", i + 1)):
            return i
    return -1


def _line_col(text: str, index: int) -> tuple[int, int]:
    return text.count("\n", 0, index) + 1, index - text.rfind("\n", 0, index)


def _check_refused_at(err: sr.ShardRulesError, text: str, index: int) -> None:
    """`err` is SR001 at `text[index]`, the line shown, a caret under the character."""
    line, col = _line_col(text, index)
    assert err.code == "SR001"
    assert err.span is not None and (err.span.line, err.span.col, err.span.end_col) == (line, col, col + 1)
    assert "a line of a rule file ends only at `\\n` or `\\r\\n`" in str(err)
    rendered = str(err).split("\n")
    at = rendered.index(next(r for r in rendered if r.startswith(f"  {line} | ")))
    gutter = " " * len(str(line))
    assert rendered[at + 1] == f"  {gutter} | " + " " * (col - 1) + "^"
    assert err.hint


def test_a_rule_after_a_lone_carriage_return_in_a_comment_is_refused() -> None:
    err = _error(HIDDEN)
    _check_refused_at(err, HIDDEN, HIDDEN.index("\r"))
    assert str(err).startswith("x.shard:2:32: SR001 a carriage return (`\\r`) without `\\n` after it")
    assert '  2 |   "a" -> replicated  # reviewed\ufffd  "b" -> (model)' in str(err)
    assert "write a newline" in err.hint
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.format_text(HIDDEN, "x.shard")
    assert str(info.value) == str(err)


@pytest.mark.parametrize("brk", BREAKS, ids=repr)
@pytest.mark.parametrize(
    "where",
    [
        'mesh model\nrules p:  # reviewed{}  "b" -> (model)\n',  # in a comment
        'mesh model\nrules p:\n  "a{}b" -> replicated\n',  # in quotes
        'mesh model\nrules p:\n  "a\\{}" -> replicated\n',  # escaped in quotes
        'mesh model\nrules p:\n  "a" ->{}replicated\n',  # between tokens
        "mesh model{}rules p:\n",  # for a line end
        "mesh model\r\nrules p:{}\r\n",  # before a `\r\n`
        "# a{}b\n",  # a comment line
        "mesh model\n{}",  # at the end, no newline after it
    ],
)
def test_each_break_is_refused_where_it_stands(brk: str, where: str) -> None:
    text = where.format(brk)
    assert _first_break(text) == where.index("{}")  # the `\r` of a `\r\n` ends a line
    _check_refused_at(_error(text), text, _first_break(text))


def test_crlf_and_lf_end_lines_alike() -> None:
    text = 'mesh model  # axes\r\nrules p:\r\n  "a" -> replicated  # kept whole; noqa: SR204\n  default -> (model)\r\n'
    rules = sr.loads(text, name="x.shard")
    assert rules == sr.loads(text.replace("\r\n", "\n"), name="x.shard")
    assert rules.acknowledged == {("x.shard", 3): frozenset({"SR204"})}
    assert sr.format_text(text) == sr.format_text(text.replace("\r\n", "\n"))


def test_old_mac_line_ends_are_named_in_the_hint() -> None:
    text = "mesh model\rrules p:\r  default -> replicated\r"
    err = _error(text)
    _check_refused_at(err, text, 10)
    assert "old Mac line ends" in err.hint


def test_a_file_is_refused_as_its_text_is(tmp_path: Path) -> None:
    path = tmp_path / "x.shard"
    path.write_bytes(HIDDEN.encode())
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.load(path)
    assert (info.value.span.line, info.value.span.col) == (2, 32)  # type: ignore[union-attr]


def test_a_converted_name_holding_a_line_separator_loads_and_matches() -> None:
    """Converters write U+2028 and U+2029 of an input name as `\\S`: the rule
    file holds no raw line break, and its rule still matches the name."""
    from shardrules._convert._common import pattern_literal

    literal = pattern_literal("^a\u2028b$")
    assert literal == '"^a\\Sb$"' and not _first_break(literal) >= 0
    rules = sr.loads(f"mesh x\nrules params:\n  {literal} -> (x)\n  default -> replicated\n")
    leaf = jax.ShapeDtypeStruct((4,), jnp.float32)
    assert sr.specs({"a\u2028b": leaf}, rules, {"x": 2}) == {"a\u2028b": P("x")}


# ------------------------------------------------------------------ the campaign

_NAMES = st.integers(0, 99).map(lambda n: f"w{n}")
_LINE_ENDS = st.sampled_from(["\n", "\n", "\r\n"])
_SEPARATORS = st.sampled_from(["\n", "\n", "\n", "\r\n", "\r\n", *BREAKS])
_COMMENT_TEXT = st.text(st.sampled_from(list("abc ;:#-")), max_size=8)


@st.composite
def _lines(draw: st.DrawFn, separators: st.SearchStrategy[str]) -> str:
    """One line as its writer meant it; a comment may go on, after a line
    break, with text a reader takes for a line of its own (a rule, mostly)."""
    kind = draw(st.sampled_from(["rule", "rule", "rule", "comment", "blank"]))
    indent = draw(st.sampled_from(["", "  ", "\t"]))
    if kind == "rule":
        spec = draw(st.sampled_from(["replicated", "(model)", "(_, model)"]))
        line = f'{indent}"{draw(_NAMES)}" -> {spec}'
        if draw(st.booleans()):
            return line
        line += "  "
    elif kind == "blank":
        return indent
    else:
        line = indent
    line += "#" + draw(_COMMENT_TEXT)
    if draw(st.booleans()):  # the comment goes on after a break: a reader sees a line of its own
        hidden = f'  "{draw(_NAMES)}" -> (model)' if draw(st.booleans()) else "# " + draw(_COMMENT_TEXT)
        line += draw(separators) + hidden
    return line


@st.composite
def _texts(draw: st.DrawFn) -> str:
    """`mesh` and a header, then lines joined by a random mix of line ends and
    breaks (in half the files, of `\\n` and `\\r\\n` only)."""
    separators = draw(st.sampled_from([_LINE_ENDS, _SEPARATORS]))
    body = draw(st.lists(_lines(separators), max_size=8))
    lines = ["mesh model", "rules params:", *body, "  default -> replicated"]
    text = lines[0]
    for line in lines[1:]:
        text += draw(separators) + line
    return text + draw(st.one_of(st.just(""), separators))


def _read_by_lines(text: str) -> list[str]:
    """The rules a reader sees: a line (as `str.splitlines` splits) that starts
    with a quoted pattern and `->` is a rule."""
    return [m.group(1) for line in text.splitlines() if (m := re.match(r'\s*"([^"]*)"\s*->', line))]


def _loaded(rules: sr.RuleSet) -> list[str]:
    return [str(rule.pattern) for rule in rules.group("params")]  # no `default` among them


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(text=_texts())
@example(text=HIDDEN.replace("rules p:", "mesh model\nrules params:"))
@example(text='mesh model\r\nrules params:\r\n  "w1" -> (model)  # ok\r\r\n  "w2" -> (model)\r\n')
def test_what_loads_is_what_a_reader_sees(text: str) -> None:
    note(repr(text))
    first = _first_break(text)
    try:
        rules = sr.loads(text, name="x.shard")
    except sr.RuleSyntaxError as err:
        event(f"refused at {text[first]!r}" if first >= 0 else "refused")
        assert first >= 0, str(err)  # refused only for a line break that ends no line
        _check_refused_at(err, text, first)
        with pytest.raises(sr.RuleSyntaxError) as info:
            sr.format_text(text, "x.shard")
        assert str(info.value) == str(err)
        return
    event("loaded, a comment going on after a line end" if "#" in text else "loaded")
    assert first < 0
    assert _loaded(rules) == _read_by_lines(text)
    formatted = sr.format_text(text)
    assert _first_break(formatted) < 0 and "\r" not in formatted
    assert sr.loads(formatted, name="x.shard") == rules
    assert _read_by_lines(formatted) == _read_by_lines(text)


@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(text=_texts())
@example(text=HIDDEN.replace("rules p:", "mesh model\nrules params:"))
def test_fmt_writes_only_what_loads_as_read(text: str) -> None:
    """`shardrules fmt` on the file: a file that does not load is left as it
    was (exit 2); one that does is left or rewritten to text that loads to the
    same rules, which a line-by-line reader sees too."""
    data = text.encode("utf-8")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x.shard"
        path.write_bytes(data)
        try:
            before = sr.load(path)
        except sr.RuleSyntaxError:
            before = None
        status = main(["fmt", str(path)])
        after = path.read_bytes()
        if before is None:
            assert (status, after) == (2, data)
            return
        assert status == 0
        written = after.decode("utf-8")
        assert _first_break(written) < 0
        assert sr.load(path) == before
        assert _read_by_lines(written) == _loaded(before)
