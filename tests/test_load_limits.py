"""Loading is bounded whatever the files: only regular files are read (a FIFO
does not block), links that loop and names that cannot be file names are
errors, and one load reads at most `MAX_TOTAL_BYTES`, `MAX_LINES` lines and
`MAX_RULES` rules over the file and everything it includes, refused before the
parser sees them."""

from __future__ import annotations

import os
import threading
import time

import pytest

import shardrules as sr
from shardrules._language._files import MAX_FILE_BYTES, MAX_TOTAL_BYTES
from shardrules._language._includes import MAX_LINES, MAX_RULES


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


def test_a_file_at_the_limits_loads():
    text = (
        "rules params:\n"
        + "".join(f'  "a{i}" -> (_)\n' for i in range(MAX_RULES - 1))
        + "  default -> replicated\n"
    )
    rules = sr.loads(text)
    assert len(rules.group("params")) == MAX_RULES - 1


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
