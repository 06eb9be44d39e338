"""`shardrules lint` on a project: folders (top-level files only), settings in
`[tool.shardrules]` of pyproject.toml with flags winning, `--strict`,
`--replicated-tolerance`, and the pre-commit hooks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardrules._cli import _discover, _lint
from shardrules._cli._main import main
from shardrules._planning._check import DEFAULT_REPLICATED_TOLERANCE

REPO = Path(__file__).resolve().parent.parent

TOP = 'mesh fsdp, model\ninclude "common/aliases.shard"\n\nrules params:\n  "w" -> (embed, model)\n'
ALIASES = "alias embed = fsdp\n"  # no `rules params:`: planned alone for shapes, it is SR018
GOOD = 'mesh model=2\n\nrules params:\n  "w" -> (model, _)\n'
WARNS = 'mesh model=2\n\nrules params:\n  "w" -> (model, _)\n  "never" -> replicated\n'  # SR201
BROKEN = 'rules params:\n  "w" -> (model,\n'


def write(path: str | Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project in the current directory: a top-level file including another."""
    monkeypatch.chdir(tmp_path)
    write("sharding/llama.shard", TOP)
    write("sharding/common/aliases.shard", ALIASES)
    write("shapes.json", json.dumps({"w": [[8, 8], "float32"]}))
    return tmp_path


@pytest.fixture
def linted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """Each `lint_file` call of the command: (path, keyword arguments and mesh)."""
    calls: list[tuple[str, dict[str, Any]]] = []
    real = _lint.lint_file

    def spy(path: str, tree: Any, mesh: Any, **kwargs: Any) -> _lint.Result:
        calls.append((path, {**kwargs, "mesh": mesh, "tree": tree}))
        return real(path, tree, mesh, **kwargs)

    monkeypatch.setattr(_lint, "lint_file", spy)
    return calls


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def files(calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [Path(path).as_posix() for path, _ in calls]


# ------------------------------------------------------------------ folders


def test_a_folder_lints_its_top_level_files_only(project, linted, capsys):
    code, out, err = run(["lint", "sharding"], capsys)
    assert (code, err) == (0, ""), out
    assert files(linted) == ["sharding/llama.shard"]
    assert "(1 file)" in out


def test_an_included_file_alone_would_fail(project, capsys):
    # What discovery saves a project from: the included file does not load on its own.
    assert run(["lint", "sharding", "--shapes", "shapes.json"], capsys)[0] == 0
    write("pyproject.toml", "[tool.shardrules]\nlint-included = true\n")
    code, out, _ = run(["lint", "sharding", "--shapes", "shapes.json"], capsys)
    assert code == 1 and "sharding/common/aliases.shard: SR018" in out


def test_lint_included_lints_included_files_as_well(project, linted, capsys):
    write("pyproject.toml", "[tool.shardrules]\nlint-included = true\n")
    run(["lint", "sharding"], capsys)
    assert sorted(files(linted)) == ["sharding/common/aliases.shard", "sharding/llama.shard"]


def test_a_named_included_file_is_linted_through_its_includers(project, linted, capsys):
    write("pyproject.toml", "[tool.shardrules]\n")
    code, out, _ = run(["lint", "sharding/common/aliases.shard", "--shapes", "shapes.json"], capsys)
    assert code == 0, out
    assert files(linted) == ["sharding/llama.shard"]
    # Without a config, the project is the file's folder: nothing there includes it.
    (project / "pyproject.toml").unlink()
    linted.clear()
    assert run(["lint", "sharding/common/aliases.shard", "--shapes", "shapes.json"], capsys)[0] == 1
    assert files(linted) == ["sharding/common/aliases.shard"]


def test_nested_folders_includes_of_includes_and_several_roots(tmp_path, monkeypatch, linted, capsys):
    monkeypatch.chdir(tmp_path)
    write("rules/a/top.shard", 'include "parts/mid.shard"\n')
    write("rules/a/parts/mid.shard", 'include "leaf.shard"\n')
    write("rules/a/parts/leaf.shard", GOOD)
    write("rules/b/other.shard", GOOD)
    write("rules/b/deeper/other.shard", GOOD)
    write("rules/second_top.shard", 'include "a/parts/leaf.shard"\n')
    write("rules/.hidden/skip.shard", BROKEN)
    write("rules/node_modules/skip.shard", BROKEN)
    assert run(["lint", "rules"], capsys)[0] == 0
    assert files(linted) == [
        "rules/a/top.shard",
        "rules/b/deeper/other.shard",
        "rules/b/other.shard",
        "rules/second_top.shard",
    ]
    # A file in a folder of its own, named: checked through both top-level files.
    linted.clear()
    run(["lint", "rules/a/parts"], capsys)
    assert files(linted) == ["rules/a/parts/mid.shard"]  # without a config, the project is the folder named
    write("pyproject.toml", "[tool.shardrules]\n")
    linted.clear()
    run(["lint", "rules/a/parts"], capsys)
    assert files(linted) == ["rules/a/top.shard", "rules/second_top.shard"]


def test_files_in_an_include_cycle_are_still_linted(tmp_path, monkeypatch, linted, capsys):
    monkeypatch.chdir(tmp_path)
    write("r/a.shard", 'include "b.shard"\n')
    write("r/b.shard", 'include "a.shard"\n')
    code, out, _ = run(["lint", "r"], capsys)
    assert code == 1 and "SR004" in out
    assert files(linted) == ["r/a.shard", "r/b.shard"]


def test_several_folders_and_files_give_one_summary(tmp_path, monkeypatch, linted, capsys):
    monkeypatch.chdir(tmp_path)
    write("x/good.shard", GOOD)
    write("y/bad.shard", BROKEN)
    write("z.shard", GOOD)
    code, out, _ = run(["lint", "x", "y", "z.shard", "x/good.shard"], capsys)
    assert code == 1
    assert files(linted) == ["x/good.shard", "y/bad.shard", "z.shard"]  # each once
    assert out.count("Found ") == 1 and "y/bad.shard:2:" in out


def test_excludes_from_flags_and_config(tmp_path, monkeypatch, linted, capsys):
    monkeypatch.chdir(tmp_path)
    write("sharding/good.shard", GOOD)
    write("tests/data/invalid/bad.shard", BROKEN)
    write("vendor/bad.shard", BROKEN)
    assert run(["lint", "."], capsys)[0] == 1
    linted.clear()
    assert run(["lint", ".", "--exclude", "tests/data/*", "--exclude", "vendor"], capsys)[0] == 0
    assert files(linted) == ["sharding/good.shard"]
    write("pyproject.toml", '[tool.shardrules]\nexclude = ["tests/data/invalid", "vendor/*.shard"]\n')
    linted.clear()
    assert run(["lint", "."], capsys)[0] == 0
    assert files(linted) == ["sharding/good.shard"]
    # A file named is linted even if excluded, unless --force-exclude (as ruff does).
    assert run(["lint", "vendor/bad.shard"], capsys)[0] == 1
    linted.clear()
    code, _, _ = run(["lint", "--force-exclude", "vendor/bad.shard", "sharding/good.shard"], capsys)
    assert code == 0 and files(linted) == ["sharding/good.shard"]
    assert run(["lint", "--force-exclude", "vendor/bad.shard"], capsys)[0] == 0  # nothing left to check


def test_a_folder_without_rule_files_and_a_missing_path_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    code, out, err = run(["lint", "empty"], capsys)
    assert (code, out) == (2, "") and "no rule files (*.shard) in empty" in err
    code, out, err = run(["lint", "missing"], capsys)
    assert (code, out) == (2, "") and "missing: no such rule file" in err


def test_discovery_helper_keeps_the_order_named(project):
    write("pyproject.toml", "[tool.shardrules]\n")
    write("z.shard", GOOD)
    assert _discover.lint_files(["z.shard", "sharding"]) == ["z.shard", "sharding/llama.shard"]
    assert _discover.lint_files(["sharding"], lint_included=True) == [
        "sharding/common/aliases.shard",
        "sharding/llama.shard",
    ]


# ------------------------------------------------------------------ config


def test_settings_come_from_pyproject_and_flags_win(project, linted, capsys):
    write(
        "pyproject.toml",
        "[tool.shardrules]\n"
        'mesh = "fsdp=4,model=2"\nshapes = "shapes.json"\ngroup = "params"\n'
        'device-memory = "1GiB"\nreplicated-threshold = 1024\nhosts = 2\nreplicated-tolerance = "50%"\n',
    )
    code, out, err = run(["lint", "sharding"], capsys)
    assert (code, err) == (0, ""), out
    (_, kw) = linted[-1]
    assert kw["mesh"] == {"fsdp": 4, "model": 2} and kw["tree"] is not None
    assert (kw["group"], kw["device_memory"], kw["replicated_threshold"], kw["hosts"]) == (
        "params",
        1 << 30,
        1024,
        2,
    )
    assert kw["replicated_tolerance"] == 0.5
    argv = ["lint", "sharding", "--mesh", "fsdp=2,model=4", "--device-memory", "2GiB", "--hosts", "1"]
    argv += ["--replicated-threshold", "1MiB", "--replicated-tolerance", "0.1", "--group", "params"]
    assert run(argv, capsys)[0] == 0
    (_, kw) = linted[-1]
    assert kw["mesh"] == {"fsdp": 2, "model": 4}
    assert (kw["device_memory"], kw["replicated_threshold"], kw["hosts"]) == (2 << 30, 1 << 20, 1)
    assert kw["replicated_tolerance"] == 0.1


def test_mesh_may_be_a_table_and_defaults_apply_without_config(project, linted, capsys):
    write("pyproject.toml", "[tool.shardrules]\nmesh = {fsdp = 4, model = 2}\n")
    run(["lint", "sharding"], capsys)
    assert linted[-1][1]["mesh"] == {"fsdp": 4, "model": 2}
    (project / "pyproject.toml").unlink()
    run(["lint", "sharding"], capsys)
    kw = linted[-1][1]
    assert kw["mesh"] is None and kw["tree"] is None and kw["group"] is None
    assert kw["replicated_tolerance"] == DEFAULT_REPLICATED_TOLERANCE == 0.25
    assert kw["replicated_threshold"] == 64 << 20


def test_relative_paths_in_config_are_relative_to_the_pyproject(project, monkeypatch, linted, capsys):
    write("pyproject.toml", '[tool.shardrules]\nmesh = "fsdp=4,model=2"\nshapes = "shapes.json"\n')
    monkeypatch.chdir(project / "sharding")
    assert run(["lint", "llama.shard"], capsys)[0] == 0
    assert linted[-1][1]["tree"] is not None
    elsewhere = project.parent / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert run(["lint", str(project / "sharding")], capsys)[0] == 0
    assert linted[-1][1]["tree"] is not None
    # The error for a missing shapes file says where the setting is.
    write(project / "pyproject.toml", '[tool.shardrules]\nshapes = "gone.json"\n')
    code, out, err = run(["lint", str(project / "sharding")], capsys)
    assert (code, out) == (2, "")
    assert "[tool.shardrules] shapes in " in err and "gone.json: no such file" in err


def test_the_nearest_pyproject_with_a_shardrules_table_wins(project, linted, capsys):
    write("pyproject.toml", '[tool.shardrules]\nmesh = "fsdp=4,model=2"\n')
    write("sharding/pyproject.toml", '[project]\nname = "x"\n')  # no table: looked past
    run(["lint", "sharding"], capsys)
    assert linted[-1][1]["mesh"] == {"fsdp": 4, "model": 2}
    write("sharding/pyproject.toml", '[tool.shardrules]\nmesh = "fsdp=2,model=1"\n')
    run(["lint", "sharding"], capsys)
    assert linted[-1][1]["mesh"] == {"fsdp": 2, "model": 1}


def test_unknown_keys_are_usage_errors_that_suggest_a_key(project, capsys):
    write("pyproject.toml", "[tool.shardrules]\nreplicated_tolerance = 0.5\n")
    code, out, err = run(["lint", "sharding"], capsys)
    assert (code, out) == (2, "")
    assert "unknown key `replicated_tolerance` in [tool.shardrules]" in err
    assert "did you mean `replicated-tolerance`?" in err
    assert (
        "(known keys: baseline, device-memory, exclude, group, hbm-headroom, hosts, lint-included, "
        "max-collective-bytes, max-collective-increase, max-flops-ratio, max-peak-bytes, "
        "max-step-time, mesh, replicated-threshold, replicated-tolerance, shapes, step, strict, target)"
    ) in err
    write("pyproject.toml", "[tool.shardrules]\nzzz = 1\n")
    assert "did you mean" not in run(["lint", "sharding"], capsys)[2]
    # fmt reads the same table, so it refuses it too.
    assert run(["fmt", "--check", "sharding"], capsys)[0] == 2


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('mesh = "fsdp:4"', "mesh in pyproject.toml 'fsdp:4': write axis sizes as NAME=SIZE"),
        ("mesh = 4", "mesh in pyproject.toml: must be axis sizes"),
        ('mesh = {fsdp = "4"}', "must be axis sizes"),
        ("mesh = {fsdp = 0}", "axis `fsdp` needs a size of at least 1"),
        ("shapes = 3", "shapes in pyproject.toml: must be a non-empty string, not an integer (3)"),
        ('shapes = ""', "must be a non-empty string"),
        ("group = true", "group in pyproject.toml: must be a non-empty string, not a boolean (True)"),
        ('replicated-tolerance = "lots"', "replicated-tolerance in pyproject.toml 'lots': write a fraction"),
        ("replicated-tolerance = 1.5", "must be a fraction from 0 to 1 (0.25) or a percentage"),
        ("replicated-tolerance = true", "must be a fraction from 0 to 1"),
        ('strict = "yes"', "strict in pyproject.toml: must be true or false, not a string ('yes')"),
        ("lint-included = 1", "lint-included in pyproject.toml: must be true or false"),
        ('exclude = "tests"', "exclude in pyproject.toml: must be a list of strings"),
        ("exclude = [1]", "must be a list of strings"),
        ('device-memory = "80gb"', "device-memory in pyproject.toml: not a size in bytes"),
        ("device-memory = 1.5", 'must be a size such as "80GiB" or a number of bytes, not a number (1.5)'),
        ("replicated-threshold = [1]", "replicated-threshold in pyproject.toml: must be a size"),
        ("hosts = 0", "hosts in pyproject.toml: must be a whole number of at least 1, not an integer (0)"),
        ('hosts = "2"', "must be a whole number of at least 1"),
    ],
)
def test_every_key_has_its_type_checked(project, capsys, line, fragment):
    write("pyproject.toml", f"[tool.shardrules]\n{line}\n")
    code, out, err = run(["lint", "sharding"], capsys)
    assert (code, out) == (2, ""), err
    assert err.startswith("shardrules lint: [tool.shardrules] ")
    assert fragment in err and "Traceback" not in err


def test_a_malformed_pyproject_or_table_is_a_usage_error(project, capsys):
    write("pyproject.toml", "[tool.shardrules\n")
    assert "pyproject.toml: not valid TOML" in run(["lint", "sharding"], capsys)[2]
    write("pyproject.toml", '[tool]\nshardrules = "x"\n')
    code, _, err = run(["lint", "sharding"], capsys)
    assert code == 2 and "[tool.shardrules] must be a table" in err


# ------------------------------------------------------------------ --strict


def test_strict_makes_warnings_fail_but_not_notes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write("w.shard", WARNS)
    write("s.json", json.dumps({"w": [[8, 8], "float32"]}))
    write("n.shard", 'mesh model\n\nrules params:\n  "w" -> (model, _)\n')  # SR301 note only
    assert run(["lint", "w.shard", "--shapes", "s.json"], capsys)[0] == 0
    code, out, _ = run(["lint", "w.shard", "--shapes", "s.json", "--strict"], capsys)
    assert code == 1 and "SR201" in out
    code, out, _ = run(["lint", "n.shard", "--strict"], capsys)
    assert code == 0 and "SR301" in out
    write("pyproject.toml", "[tool.shardrules]\nstrict = true\n")
    assert run(["lint", "w.shard", "--shapes", "s.json"], capsys)[0] == 1
    assert run(["lint", "w.shard", "--shapes", "s.json", "--no-strict"], capsys)[0] == 0
    write("pyproject.toml", "[tool.shardrules]\nstrict = false\n")
    assert run(["lint", "w.shard", "--shapes", "s.json", "--strict"], capsys)[0] == 1


# ------------------------------------------------------------------ --replicated-tolerance

TOLERANCE_RULES = 'mesh fsdp=4\n\nrules params:\n  "kernel" -> (fsdp, _)\n  default -> replicated\n'
TOLERANCE_SHAPES = {
    "kernel": [[8, 8], "float32"],
    "embed": [[4096, 4096], "float32"],  # 64 MiB: SR116 leaves out smaller replicated bytes
    "bias": [[256], "float32"],
}


@pytest.fixture
def replicated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A group whose rules shard, where `default -> replicated` catches most bytes."""
    monkeypatch.chdir(tmp_path)
    write("r.shard", TOLERANCE_RULES)
    write("s.json", json.dumps(TOLERANCE_SHAPES))
    return tmp_path


def test_the_default_tolerance_catches_a_mostly_replicated_plan(replicated, capsys):
    code, out, _ = run(["lint", "r.shard", "--shapes", "s.json"], capsys)
    assert code == 1 and "r.shard:3:1: SR116" in out, out


@pytest.mark.parametrize("value", ["1.0", "1", "100%", " 100% "])
def test_a_high_tolerance_lets_it_pass(replicated, capsys, value):
    code, out, _ = run(["lint", "r.shard", "--shapes", "s.json", "--replicated-tolerance", value], capsys)
    assert (code, "SR116" in out) == (0, False), out


@pytest.mark.parametrize(("value", "expected"), [("0.25", 0.25), ("25%", 0.25), ("0", 0.0), ("12.5%", 0.125)])
def test_the_tolerance_is_passed_to_lint_file(replicated, linted, capsys, value, expected):
    run(["lint", "r.shard", "--replicated-tolerance", value], capsys)
    assert linted[-1][1]["replicated_tolerance"] == expected


@pytest.mark.parametrize("value", ["lots", "1.5", "-0.1", "150%", "nan", "%", "inf"])
def test_a_bad_tolerance_is_a_usage_error(replicated, capsys, value):
    code, out, err = run(["lint", "r.shard", f"--replicated-tolerance={value}"], capsys)
    assert (code, out) == (2, "")
    assert f"--replicated-tolerance {value!r}: write a fraction from 0 to 1 or a percentage" in err


def test_the_tolerance_in_config(replicated, capsys):
    write("pyproject.toml", '[tool.shardrules]\nreplicated-tolerance = 1.0\nshapes = "s.json"\n')
    assert run(["lint", "r.shard"], capsys)[0] == 0
    assert run(["lint", "r.shard", "--replicated-tolerance", "25%"], capsys)[0] == 1
    # explain reads the config too: shapes from it, no --shapes needed.
    code, out, _ = run(["explain", "r.shard"], capsys)
    assert code == 0 and "embed" in out


def test_explain_without_shapes_anywhere_is_a_usage_error(replicated, capsys):
    code, out, err = run(["explain", "r.shard"], capsys)
    assert (code, out) == (2, "") and "--shapes SOURCE, or shapes in [tool.shardrules]" in err


# ------------------------------------------------------------------ pre-commit


def hook(name: str) -> dict[str, Any]:
    hooks = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    return next(h for h in hooks if h["id"] == name)


def test_the_lint_hook_works_on_changed_files_with_config(project, capsys):
    """pre-commit runs `entry` + `args` + the changed files that match `files`."""
    write(
        "pyproject.toml",
        '[tool.shardrules]\nmesh = "fsdp=4,model=2"\nshapes = "shapes.json"\nexclude = ["tests/data"]\n',
    )
    write("tests/data/broken.shard", BROKEN)
    entry = hook("shardrules-lint")["entry"].split()
    assert entry[0] == "shardrules"
    # An included file changed: its includer is checked, with the config's shapes.
    changed = ["sharding/common/aliases.shard", "tests/data/broken.shard"]
    code, out, _ = run([*entry[1:], *changed], capsys)
    assert code == 0, out
    assert out == "All checks passed (1 file).\n"
    # Only excluded files changed: nothing to check, and that passes.
    assert run([*entry[1:], "tests/data/broken.shard"], capsys)[0] == 0


def test_the_fmt_hook_skips_excluded_files(project, capsys):
    write("pyproject.toml", '[tool.shardrules]\nexclude = ["tests/data"]\n')
    write("tests/data/broken.shard", BROKEN)
    entry = hook("shardrules-fmt")["entry"].split()
    code, out, err = run([*entry[1:], "tests/data/broken.shard"], capsys)
    assert (code, out, err) == (0, "", "")


def test_a_loop_of_links_beside_the_file_does_not_stop_lint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another file of the folder includes a loop of symbolic links: the file
    linted is still checked, and the loop is that other file's own SR005."""
    monkeypatch.chdir(tmp_path)
    Path("a.shard").symlink_to("b.shard")
    Path("b.shard").symlink_to("a.shard")
    write("top.shard", 'include "a.shard"\nrules params:\n  default -> replicated\n')
    write("ok.shard", GOOD)
    status, out, err = run(["lint", "ok.shard"], capsys)
    assert (status, out.strip()) == (0, "All checks passed (1 file)."), err
    status, out, _ = run(["lint", "top.shard"], capsys)
    assert status == 1 and "SR005" in out and "loop of symbolic links" in out
