"""`shardrules fmt`: rewriting, --check, --diff, folders, errors and exit codes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import shardrules as sr
from shardrules._cli._main import main

REPO = Path(__file__).resolve().parent.parent

MESSY = r"""mesh data,model
alias batch=data

rules params:
"layers/\d+/w$"->(_,model)   # column-parallel kernels
"layers/\d+/b$" -> (model)
default -> auto(data, min_bytes=1048576)
"""

CANONICAL = r"""mesh data, model
alias batch = data

rules params:
  "layers/\d+/w$" -> (_, model)  # column-parallel kernels
  "layers/\d+/b$" -> (model)
  default         -> auto(data, min_bytes=1MiB)
"""

BROKEN = 'rules params:\n  "kernel" -> (_, model\n'
BROKEN_MESSAGE = """\
sharding/broken.shard:2:24: SR001 unexpected end of line; expected `)`, `,` or `?`
  2 |   "kernel" -> (_, model
    |                        ^
  hint: close the parenthesis; a rule fits on one line
"""


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder `sharding/` in the current directory, so paths print short."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sharding").mkdir()
    return tmp_path


def write(path: str | Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def read(path: str | Path) -> str:
    return Path(path).read_text(encoding="utf-8")


def test_the_canonical_example_is_what_format_text_gives() -> None:
    assert sr.format_text(MESSY) == CANONICAL


# ------------------------------------------------------------------ rewriting


def test_fmt_rewrites_in_place(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write("sharding/mlp.shard", MESSY)
    assert main(["fmt", "sharding/mlp.shard"]) == 0
    assert read("sharding/mlp.shard") == CANONICAL
    out, err = capsys.readouterr()
    assert (out, err) == ("reformatted sharding/mlp.shard\n", "")

    assert main(["fmt", "sharding/mlp.shard"]) == 0  # already canonical: not mentioned
    assert capsys.readouterr() == ("", "")
    assert read("sharding/mlp.shard") == CANONICAL


def test_fmt_leaves_a_canonical_file_untouched(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write("sharding/mlp.shard", CANONICAL)
    os.utime(path, (1_000_000, 1_000_000))
    assert main(["fmt", str(path)]) == 0
    assert path.stat().st_mtime == 1_000_000
    assert capsys.readouterr() == ("", "")


def test_crlf_line_ends_count_as_formatted(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    crlf = Path("sharding/crlf.shard")
    crlf.write_bytes(CANONICAL.replace("\n", "\r\n").encode())
    assert main(["fmt", "--check", str(crlf)]) == 0
    assert main(["fmt", str(crlf)]) == 0
    assert crlf.read_bytes() == CANONICAL.replace("\n", "\r\n").encode()

    messy = Path("sharding/messy.shard")
    messy.write_bytes(MESSY.replace("\n", "\r\n").encode())
    assert main(["fmt", str(messy)]) == 0
    assert messy.read_bytes() == CANONICAL.encode()  # rewritten with \n line ends
    assert capsys.readouterr().out == "reformatted sharding/messy.shard\n"


def test_a_byte_order_mark_is_accepted_and_dropped(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bom = Path("sharding/bom.shard")
    bom.write_bytes(b"\xef\xbb\xbf" + CANONICAL.encode())
    assert main(["lint", str(bom)]) == 0  # lint and sr.load read it, the mark left out
    capsys.readouterr()
    assert main(["fmt", "--check", str(bom)]) == 1  # canonical but for the mark: it would change
    assert capsys.readouterr() == ("would reformat sharding/bom.shard\n", "")
    assert bom.read_bytes() == b"\xef\xbb\xbf" + CANONICAL.encode()
    assert main(["fmt", str(bom)]) == 0
    assert capsys.readouterr() == ("reformatted sharding/bom.shard\n", "")
    assert bom.read_bytes() == CANONICAL.encode()
    assert main(["fmt", "--check", str(bom)]) == 0

    messy = Path("sharding/messy.shard")
    messy.write_bytes(b"\xef\xbb\xbf" + MESSY.encode())
    assert main(["fmt", str(messy)]) == 0
    assert messy.read_bytes() == CANONICAL.encode()


# ------------------------------------------------------------------ --check and --diff


def test_check_reports_and_changes_nothing(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write("sharding/mlp.shard", MESSY)
    assert main(["fmt", "--check", "sharding/mlp.shard"]) == 1
    assert capsys.readouterr() == ("would reformat sharding/mlp.shard\n", "")
    assert read("sharding/mlp.shard") == MESSY


def test_check_passes_on_canonical_files(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write("sharding/mlp.shard", CANONICAL)
    assert main(["fmt", "--check", "sharding/mlp.shard"]) == 0
    assert capsys.readouterr() == ("", "")


EXPECTED_DIFF = (
    r"""--- sharding/mlp.shard (original)
+++ sharding/mlp.shard (formatted)
@@ -1,7 +1,7 @@
-mesh data,model
-alias batch=data
+mesh data, model
+alias batch = data
"""
    + " \n"
    + r""" rules params:
-"layers/\d+/w$"->(_,model)   # column-parallel kernels
-"layers/\d+/b$" -> (model)
-default -> auto(data, min_bytes=1048576)
+  "layers/\d+/w$" -> (_, model)  # column-parallel kernels
+  "layers/\d+/b$" -> (model)
+  default         -> auto(data, min_bytes=1MiB)
"""
)


@pytest.mark.parametrize("flags", [["--diff"], ["--diff", "--check"], ["--check", "--diff"]])
def test_diff_prints_a_unified_diff_and_changes_nothing(
    workdir: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    write("sharding/mlp.shard", MESSY)
    assert main(["fmt", *flags, "sharding/mlp.shard"]) == 1
    assert capsys.readouterr() == (EXPECTED_DIFF, "")
    assert read("sharding/mlp.shard") == MESSY


def test_diff_of_a_canonical_file_is_empty(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write("sharding/mlp.shard", CANONICAL)
    assert main(["fmt", "--diff", "sharding/mlp.shard"]) == 0
    assert capsys.readouterr() == ("", "")


def test_diff_marks_a_missing_final_newline(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write("sharding/x.shard", "mesh a\nalias b=a")
    assert main(["fmt", "--diff", "sharding/x.shard"]) == 1
    assert capsys.readouterr().out == (
        "--- sharding/x.shard (original)\n"
        "+++ sharding/x.shard (formatted)\n"
        "@@ -1,2 +1,2 @@\n"
        " mesh a\n"
        "-alias b=a\n"
        "\\ No newline at end of file\n"
        "+alias b = a\n"
    )


@pytest.mark.parametrize("flag", [[], ["--check"], ["--diff"]])
@pytest.mark.parametrize(
    ("text", "where"),
    [
        # a lone `\r` in a comment: to an editor, a rule on a line of its own
        ('mesh a, b\nrules p:\n  "x" -> replicated  # reviewed\r  "y" -> (a)\n', "3:32"),
        ('mesh a, b\r\nrules p:\r\n  "x"->replicated # ok\r\r\n  "y" -> (a)\r\n', "3:23"),
        ("mesh a,b  # one\x0ctwo\u2028three\n", "1:16"),  # \f and \u2028: line breaks to str.splitlines
        ('rules p:\n  "x\u2029y" -> replicated\n', "2:5"),
    ],
)
def test_fmt_refuses_line_breaks_that_end_no_line(
    workdir: Path, capsys: pytest.CaptureFixture[str], text: str, where: str, flag: list[str]
) -> None:
    """fmt reads a file as `load` does: a line break other than `\\n` and `\\r\\n`
    is SR001 at its place and the file is left as it was (formatting it would
    keep text that a reader takes for a line of its own and the parser does not)."""
    path = write("sharding/x.shard", text)
    assert main(["fmt", *flag, "sharding/x.shard"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"sharding/x.shard:{where}: SR001 ") and "line of a rule file ends only at" in err
    assert path.read_bytes() == text.encode("utf-8")
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.load(path)
    assert str(info.value) in err


def test_cli_docs_example_matches(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The example in docs/cli.md: the file shown, then `--diff` and `--check` as shown."""
    doc = read(REPO / "docs" / "cli.md")
    example = doc[doc.index("**Example.**") :]
    shard = re.search(r"```shard\n(.*?)```", example, re.S)
    console = re.search(r"```console\n(.*?)```", example, re.S)
    assert shard is not None and console is not None
    assert shard.group(1) == MESSY
    documented = console.group(1).split("$ shardrules fmt --diff sharding/mlp.shard\n")[1].split("$ ")[0]
    assert documented == EXPECTED_DIFF

    write("sharding/mlp.shard", shard.group(1))
    assert main(["fmt", "--diff", "sharding/mlp.shard"]) == 1
    assert capsys.readouterr().out == documented


# ------------------------------------------------------------------ folders


def test_a_folder_is_searched_recursively_for_shard_files(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write("sharding/b.shard", MESSY)
    write("sharding/a/deep/z.shard", MESSY)
    write("sharding/a/ok.shard", CANONICAL)
    write("sharding/notes.txt", MESSY)
    write("sharding/rules.shard.bak", MESSY)

    assert main(["fmt", "--check", "sharding"]) == 1
    assert capsys.readouterr().out == (
        "would reformat sharding/a/deep/z.shard\nwould reformat sharding/b.shard\n"
    )

    assert main(["fmt", "sharding"]) == 0
    assert capsys.readouterr().out == "reformatted sharding/a/deep/z.shard\nreformatted sharding/b.shard\n"
    assert read("sharding/b.shard") == read("sharding/a/deep/z.shard") == CANONICAL
    assert read("sharding/notes.txt") == read("sharding/rules.shard.bak") == MESSY

    assert main(["fmt", "--check", "sharding/"]) == 0
    assert capsys.readouterr() == ("", "")


def test_hidden_folders_and_installed_packages_are_skipped(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(".venv/lib/python3.11/site-packages/pkg/x.shard", MESSY)
    write("build/.cache/y.shard", MESSY)
    write("vendor/site-packages/z.shard", MESSY)
    write("sharding/a.shard", CANONICAL)
    assert main(["fmt", "--check", "."]) == 0
    assert capsys.readouterr() == ("", "")
    # Named explicitly, a folder is searched even if it would be skipped.
    assert main(["fmt", "--check", "build/.cache"]) == 1
    assert "y.shard" in capsys.readouterr().out


def test_a_file_named_explicitly_is_formatted_whatever_its_extension(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write("sharding/notes.txt", MESSY)
    assert main(["fmt", "sharding/notes.txt"]) == 0
    assert read("sharding/notes.txt") == CANONICAL


def test_an_empty_folder_is_fine(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fmt", "--check", "sharding"]) == 0
    assert capsys.readouterr() == ("", "")


# ------------------------------------------------------------------ errors


def test_a_syntax_error_exits_2_with_location_and_caret(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write("sharding/broken.shard", BROKEN)
    assert main(["fmt", "sharding/broken.shard"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == BROKEN_MESSAGE
    assert read("sharding/broken.shard") == BROKEN


def test_the_other_files_are_still_processed(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write("sharding/broken.shard", BROKEN)
    write("sharding/mlp.shard", MESSY)
    assert main(["fmt", "sharding"]) == 2
    out, err = capsys.readouterr()
    assert out == "reformatted sharding/mlp.shard\n"
    assert err == BROKEN_MESSAGE
    assert read("sharding/mlp.shard") == CANONICAL
    assert read("sharding/broken.shard") == BROKEN


def test_status_2_wins_over_1(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write("sharding/broken.shard", BROKEN)
    write("sharding/mlp.shard", MESSY)
    assert main(["fmt", "--check", "sharding"]) == 2
    out, err = capsys.readouterr()
    assert out == "would reformat sharding/mlp.shard\n"
    assert err == BROKEN_MESSAGE
    assert read("sharding/mlp.shard") == MESSY


def test_a_bad_number_exits_2(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write("sharding/n.shard", "rules p:\n  default -> auto(a, min_bytes=1XB)\n")
    assert main(["fmt", "sharding/n.shard"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sharding/n.shard:2:32: SR003 bad number `1XB`")
    assert "^^^" in err and "Traceback" not in err


def test_a_missing_file_exits_2_with_a_clear_message(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write("sharding/mlp.shard", MESSY)
    assert main(["fmt", "sharding/missing.shard", "sharding/mlp.shard"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("sharding/missing.shard: cannot read: ")
    assert "No such file or directory" in err
    assert "Traceback" not in err
    assert out == "reformatted sharding/mlp.shard\n"


def test_a_file_that_is_not_utf8_exits_2(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Path("sharding/latin1.shard").write_bytes("mesh données\n".encode("latin-1"))
    assert main(["fmt", "--check", "sharding/latin1.shard"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sharding/latin1.shard: cannot read: ")
    assert "utf-8" in err


def test_a_file_that_cannot_be_written_exits_2(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write("sharding/mlp.shard", MESSY)

    def refuse(self: Path, *args: object, **kwargs: object) -> int:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "write_text", refuse)
    assert main(["fmt", "sharding/mlp.shard"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("sharding/mlp.shard: cannot write: ")
    assert "Permission denied" in err


# ------------------------------------------------------------------ the command line itself


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: shardrules")
    assert "fmt" in out and "rewrite rule files in the canonical layout" in out

    with pytest.raises(SystemExit) as info:
        main(["fmt", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: shardrules fmt" in out and "--check" in out and "--diff" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"shardrules {sr.__version__}\n"


@pytest.mark.parametrize("argv", [[], ["fmt"], ["fmt", "--bogus", "x.shard"], ["frobnicate", "x.shard"]])
def test_a_bad_command_line_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage: shardrules" in capsys.readouterr().err


# ------------------------------------------------------------------ as a program


@pytest.mark.slow
def test_python_dash_m_shardrules(tmp_path: Path) -> None:
    path = write(tmp_path / "mlp.shard", MESSY)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "shardrules", "fmt", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=120,
        )

    check = run("--check", "mlp.shard", "missing.shard")
    assert check.returncode == 2
    assert check.stdout == "would reformat mlp.shard\n"
    assert check.stderr.startswith("missing.shard: cannot read: ")
    assert "Traceback" not in check.stderr
    assert read(path) == MESSY

    fmt = run(".")
    assert (fmt.returncode, fmt.stdout, fmt.stderr) == (0, "reformatted mlp.shard\n", "")
    assert read(path) == CANONICAL


def test_folders_can_be_excluded_on_the_command_line_and_in_pyproject(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write("sharding/a.shard", CANONICAL)
    write("tests/data/bad/x.shard", BROKEN)
    write("other/y.shard", MESSY)
    assert main(["fmt", "--check", "--exclude", "tests/data/*", "--exclude", "other", "."]) == 0
    assert capsys.readouterr() == ("", "")
    write("pyproject.toml", '[tool.shardrules]\nexclude = ["tests/data", "other/*.shard"]\n')
    assert main(["fmt", "--check", "."]) == 0
    assert main(["fmt", "--check", "sharding"]) == 0  # found from the folder searched, not the cwd
    # A file named explicitly is always formatted.
    assert main(["fmt", "--check", "other/y.shard"]) == 1


def test_the_repository_itself_passes_fmt_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fmt", "--check", str(REPO)]) == 0, capsys.readouterr()
