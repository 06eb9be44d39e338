"""Loading is bounded whatever the files: only regular files are read (a FIFO
does not block), links that loop and names that cannot be file names are
errors, and one load reads at most `MAX_TOTAL_BYTES`, `MAX_LINES` lines,
`MAX_RULES` rules and patterns of `MAX_TOTAL_PROGRAM` RE2 instructions over the
file and everything it includes, refused before the parser sees them (the
parser is replaced by one that fails, so these tests do not depend on timing),
while a file of `MAX_RULES` ordinary rules loads."""

from __future__ import annotations

import os
import threading
import time

import pytest

import shardrules as sr
from shardrules._language import _parse, _regex
from shardrules._language._build import MAX_TOTAL_PROGRAM, PatternBudget, pattern_problem
from shardrules._language._files import MAX_FILE_BYTES, MAX_TOTAL_BYTES
from shardrules._language._includes import MAX_LINES, MAX_RULES
from shardrules._language._parse import parse
from shardrules._language._syntax import RuleLine

ORDINARY = "layers/\\d+/block_{i}/attn/(q|k|v)_proj/kernel$"
"""An ordinary pattern (45 RE2 instructions; the benchmark's)."""


def _load_in_thread(path, timeout=20.0):
    """`sr.load(path)` in a daemon thread: (the exception it raised or None, whether it finished)."""
    outcome: dict[str, BaseException | None] = {}

    def run():
        try:
            sr.load(path)
            outcome["error"] = None
        except BaseException as err:
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome.get("error"), not thread.is_alive()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_an_included_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe.shard")
    (tmp_path / "top.shard").write_text('include "pipe.shard"\nrules params:\n  default -> replicated\n')
    error, finished = _load_in_thread(tmp_path / "top.shard")
    assert finished, "loading a file that includes a FIFO blocked"
    assert isinstance(error, sr.IncludeNotFoundError), error
    assert error.code == "SR005" and "a FIFO (named pipe), not a regular file" in str(error)
    assert error.span is not None and (error.span.line, error.span.col) == (1, 1)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_given_as_the_rule_file_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe.shard")
    error, finished = _load_in_thread(tmp_path / "pipe.shard")
    assert finished
    assert isinstance(error, sr.ShardRulesError) and error.code == "SR005", error
    assert "not a regular file" in str(error)


def test_a_loop_of_symbolic_links_is_an_error(tmp_path):
    (tmp_path / "a.shard").symlink_to(tmp_path / "b.shard")
    (tmp_path / "b.shard").symlink_to(tmp_path / "a.shard")
    (tmp_path / "top.shard").write_text('include "a.shard"\n')
    with pytest.raises(sr.IncludeNotFoundError) as info:
        sr.load(tmp_path / "top.shard")
    assert info.value.code == "SR005" and "loop of symbolic links" in str(info.value)
    assert info.value.span is not None and info.value.span.line == 1
    with pytest.raises(sr.IncludeNotFoundError) as info:
        sr.load(tmp_path / "a.shard")
    assert info.value.code == "SR005"


@pytest.mark.parametrize("name", ["\ud800", "rules/\ud83d.shard"])
def test_an_include_that_cannot_be_a_file_name_is_an_error(tmp_path, name):
    with pytest.raises(sr.IncludeNotFoundError) as info:
        sr.loads(f'include "{name}"\n', include_root=tmp_path)
    assert info.value.code == "SR005" and "lone surrogate" in str(info.value)


def test_the_bytes_of_one_load_are_bounded_over_its_includes(tmp_path):
    # Each file is under the per-file limit; together they are over the total.
    part = ("#" + "x" * 998 + "\n") * ((MAX_FILE_BYTES - 100) // 1000)  # few lines, many bytes
    count = MAX_TOTAL_BYTES // len(part) + 1
    for i in range(count):
        (tmp_path / f"part{i}.shard").write_text(part)
    (tmp_path / "top.shard").write_text("".join(f'include "part{i}.shard"\n' for i in range(count)))
    start = time.perf_counter()
    with pytest.raises(sr.ShardRulesError) as info:
        sr.load(tmp_path / "top.shard")
    assert info.value.code == "SR009", info.value
    assert f"over {MAX_TOTAL_BYTES >> 20} MiB in all" in str(info.value)
    assert info.value.span is not None and info.value.span.line < count + 1
    assert time.perf_counter() - start < 30  # a hang guard: this took minutes before the bound


def test_rules_over_the_limit_are_refused_before_parsing():
    text = "rules params:\n" + '  "a" -> (_)\n' * (MAX_RULES + 1)
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads(text, name="many.shard")
    assert info.value.code == "SR009" and f"more than {MAX_RULES:,} rules" in str(info.value)


def test_rules_of_several_files_count_together(tmp_path):
    half = MAX_RULES // 2 + 1
    for name in ("a", "b"):
        (tmp_path / f"{name}.shard").write_text("rules params:\n" + f'  "{name}" -> (_)\n' * half)
    (tmp_path / "top.shard").write_text('include "a.shard"\ninclude "b.shard"\n')
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.load(tmp_path / "top.shard")
    assert info.value.code == "SR009" and "with the files it is included with" in str(info.value)
    assert info.value.span is not None and info.value.span.line == 2  # the include that went over


def test_lines_over_the_limit_are_refused():
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads("\n" * MAX_LINES + "rules params:\n")
    assert info.value.code == "SR009" and f"more than {MAX_LINES:,} lines" in str(info.value)


def test_a_file_of_max_rules_ordinary_rules_loads():
    """`MAX_RULES` rules of ordinary patterns are within every limit: the RE2
    budget is what they need (a budget of 200,000 refused this file at rule
    4,475, after parsing all of it)."""
    text = (
        "mesh data, fsdp, model\nalias embed = fsdp\nrules params:\n"
        + "".join(
            f'  "{ORDINARY.format(i=i)}" -> (..., embed, model?)  # rule {i}\n' for i in range(MAX_RULES - 1)
        )
        + "  default -> replicated\n"
    )
    assert len(text.encode()) <= MAX_FILE_BYTES
    rules = sr.loads(text)
    assert len(rules.group("params")) == MAX_RULES - 1 and "params" in rules.defaults
    used = sum(pattern_problem(r.pattern)[0] for r in rules.group("params") if r.pattern is not None)
    assert 200_000 < used <= MAX_TOTAL_PROGRAM
    assert pattern_problem(ORDINARY.format(i=MAX_RULES))[0] * MAX_RULES <= MAX_TOTAL_PROGRAM


def _no_parsing(monkeypatch, allowed=()):
    """Make the parser fail for every file but those named in `allowed`."""
    real = _parse.parse  # the includes reader imports it from there when it reads a file

    def parse_only_allowed(text, name="<string>"):
        assert name in allowed, f"{name} was parsed"
        return real(text, name)

    monkeypatch.setattr(_parse, "parse", parse_only_allowed)


def _heavy(count: int, first: int = 0) -> str:
    """Rules of 8,009 RE2 instructions each: 124 fit in the budget, the 125th crosses it."""
    return "".join(f'  "[^a]{{1000}}{i:05d}" -> replicated\n' for i in range(first, first + count))


@pytest.mark.parametrize(
    "text, says",
    [
        ("rules params:\n" + '  "a" -> (_)\n' * (MAX_RULES + 1), f"more than {MAX_RULES:,} rules"),
        ("\n" * MAX_LINES + "rules params:\n", f"more than {MAX_LINES:,} lines"),
        ("#" * MAX_FILE_BYTES + "\n", "larger than 1 MiB"),
        ("rules params:\n" + _heavy(9_999), f"more than {MAX_TOTAL_PROGRAM:,} RE2 instructions"),
    ],
    ids=["rules", "lines", "bytes", "instructions"],
)
def test_a_file_over_a_limit_is_refused_without_parsing_it(monkeypatch, text, says):
    _no_parsing(monkeypatch)
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads(text, name="big.shard")
    assert info.value.code == "SR009" and says in str(info.value)
    assert info.value.diagnostics[0].hint


def test_the_budget_refuses_at_the_first_pattern_over_it_and_compiles_no_more(monkeypatch):
    _no_parsing(monkeypatch)
    compiled: list[str] = []
    real = _regex.compiled_size
    monkeypatch.setattr(_regex, "compiled_size", lambda p: compiled.append(p) or real(p))
    text = "mesh data\nrules params:\n" + _heavy(9_999)
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads(text, name="heavy.shard")
    sizes = [pattern_problem(p)[0] for p in compiled]
    assert sum(sizes) > MAX_TOTAL_PROGRAM >= sum(sizes[:-1])  # nothing compiled after the crossing
    assert len(compiled) == 125
    error = info.value
    assert error.code == "SR009" and error.span is not None
    line = 2 + len(compiled)
    assert (error.span.file, error.span.line, error.span.col) == ("heavy.shard", line, 3)
    shown = str(error)
    assert shown.startswith(f"heavy.shard:{line}:3: SR009 ") and f"{sum(sizes):,} with this one" in shown
    assert "\n      |   " + "^" * len('"[^a]{1000}00124"') + "\n" in shown  # the caret under the pattern
    assert f"hint: at most {MAX_TOTAL_PROGRAM // MAX_RULES} instructions per rule" in shown


def test_the_budget_points_where_the_parser_would():
    """The span of the pre-scan's error is the parsed rule's `pattern_span`
    (tabs, guards, trailing comments and `\\"` inside a pattern included)."""
    lines = [
        "rules params:",
        '\t"a\\"b" -> (_) if dtype == float32  # x -> y',
        "  default -> replicated",
        *(f'  \t "[^a]{{1000}}{i:05d}"\t->  replicated # "q" -> (_)' for i in range(200)),
    ]
    text = "\n".join(lines) + "\n"
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads(text, name="tabs.shard")
    span = info.value.span
    assert span is not None
    parsed = [s for s in parse(text, "tabs.shard").statements if isinstance(s, RuleLine)]
    assert span in [s.pattern_span for s in parsed]
    assert span == next(s.pattern_span for s in parsed if s.span is not None and s.span.line == span.line)


def test_the_budget_counts_over_includes_and_stops_before_parsing_the_include(tmp_path, monkeypatch):
    (tmp_path / "top.shard").write_text('include "part.shard"\nrules params:\n' + _heavy(100))
    (tmp_path / "part.shard").write_text("# shared rules\nrules params:\n" + _heavy(100, first=100))
    _no_parsing(monkeypatch, allowed=(str(tmp_path / "top.shard"),))
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.load(tmp_path / "top.shard")
    span = info.value.span
    assert info.value.code == "SR009" and span is not None
    assert (os.path.basename(span.file), span.line, span.col) == ("part.shard", 2 + 25, 3)
    assert '27 |   "[^a]{1000}00124"' in str(info.value)


def test_the_budget_counts_what_the_rules_are_built_from():
    """The pre-scan finds the parser's rule lines and counts their patterns as
    `build_rules` does: not those outside a group (SR007), nor in comments."""
    text = (
        '"[^a]{1000}" -> replicated\n' * 200  # outside a group: SR007, never compiled
        + "rules params:\n"
        + '  # "[^a]{1000}" -> replicated\n' * 200
        + "".join(f'  "{ORDINARY.format(i=i)}" -> (_) if dtype == float32\n' for i in range(50))
    )
    budget = PatternBudget()
    budget.scan(text, "x.shard", {})
    assert budget.used == sum(pattern_problem(ORDINARY.format(i=i))[0] for i in range(50))
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads(text)
    assert [d.code for d in info.value.diagnostics] == ["SR007"] * 200


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fmt_refuses_a_fifo_without_blocking(tmp_path, capsys):
    from shardrules._cli import main

    os.mkfifo(tmp_path / "pipe.shard")
    outcome: dict[str, int] = {}
    thread = threading.Thread(
        target=lambda: outcome.update(code=main(["fmt", "--check", str(tmp_path / "pipe.shard")]))
    )
    thread.daemon = True
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "fmt blocked on a FIFO"
    assert outcome["code"] == 2
    assert "not a regular file" in capsys.readouterr().err


def test_loads_counts_bytes_not_characters():
    text = (
        "# " + "\U0001f600" * 300_000 + "\nrules params:\n  default -> replicated\n"
    )  # 1.2 MB, 300k characters
    with pytest.raises(sr.ShardRulesError) as info:
        sr.loads(text)
    assert info.value.code == "SR009"


def test_a_top_level_loop_of_links_says_so(tmp_path):
    (tmp_path / "a.shard").symlink_to(tmp_path / "b.shard")
    (tmp_path / "b.shard").symlink_to(tmp_path / "a.shard")
    with pytest.raises(sr.ShardRulesError) as info:
        sr.load(tmp_path / "a.shard")
    assert info.value.code == "SR005" and "loop of symbolic links" in str(info.value)


def test_the_rule_count_says_it_counts_arrows():
    text = "rules params:\n  default -> replicated\n" + "# a -> b\n" * MAX_RULES
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads(text)
    assert "lines with `->`" in str(info.value)


def test_many_names_and_many_rules_load_in_linear_time():
    """A file within the limits with 20,000 mesh axes and 9,999 rules: each
    rule's entries looked the mesh's names up afresh (54 s for the output of
    `convert regex` on 9,999 rules of two axes each), and each unknown name
    compared itself with every known name and listed them all in its hint
    (minutes, and a message of megabytes)."""
    mesh = "mesh " + ", ".join(f"axis{i}" for i in range(20_000)) + "\n"
    good = "".join(f'  "l{i}" -> (axis{2 * i}, axis{2 * i + 1}, ...)\n' for i in range(9_999))
    start = time.perf_counter()
    rules = sr.loads(mesh + "rules params:\n" + good)
    assert len(rules.group("params")) == 9_999
    assert time.perf_counter() - start < 20  # a hang guard: about a second
    bad = "".join(f'  "l{i}" -> (zz{i})\n' for i in range(9_000))
    start = time.perf_counter()
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads(mesh + "rules params:\n" + bad)
    assert time.perf_counter() - start < 20  # a hang guard: about two seconds
    assert len(info.value.diagnostics) == 9_000
    assert max(len(d.hint or "") for d in info.value.diagnostics) < 400
    assert "known names: axis0, axis1, axis10, " in (info.value.diagnostics[0].hint or "")
    assert "(20,000 in all)" in (info.value.diagnostics[0].hint or "")
