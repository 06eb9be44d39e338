"""CI gates on communication, on `examples/transformer`: `lint --step
--max-collective-bytes` (SR129), `--max-collective-increase` against a
`--baseline` plan file written by `dump --step` (SR130), and
`assert_plan_matches(cost=)` naming the rule lines whose collectives moved.

Each costed compile takes seconds, so the step's module, the rule files and
the baseline are made once for the module."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import jax
import pytest

import shardrules as sr
from shardrules._cli._main import main
from shardrules._reports._dump import dumps
from shardrules._reports._dumpread import loads

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "transformer"
O_RULE = '"attn/o/kernel$"       -> (heads, embed)'
# o's kernel split 8 ways over its output: more to gather, and its result laid out again
EDITED = '"attn/o/kernel$"       -> (_, (embed, heads))'
STEP = "budget_step:check_step"

STEP_MODULE = f"""\
import importlib.util
import sys

import jax
import jax.numpy as jnp
import numpy as np

_spec = importlib.util.spec_from_file_location("_budget_transformer", {str(EXAMPLE / "train.py")!r})
train = importlib.util.module_from_spec(_spec)
sys.modules["_budget_transformer"] = train
_spec.loader.exec_module(train)
check_step = train.check_step


def shapes():
    return jax.tree.map(jnp.asarray, train.init_params(np.random.default_rng(0)))
"""


def _line_of(path: Path, pattern: str) -> int:
    for n, text in enumerate(path.read_text().splitlines(), 1):
        if text.strip().startswith(f'"{pattern}"'):
            return n
    raise AssertionError(pattern)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory):
    """A folder with the example's rule file, a copy with `attn/o/kernel$`
    edited, the step's module and a baseline dumped under the example's rules."""
    folder = tmp_path_factory.mktemp("gates")
    text = (EXAMPLE / "transformer.shard").read_text()
    assert O_RULE in text
    (folder / "transformer.shard").write_text(text)
    (folder / "edited.shard").write_text(text.replace(O_RULE, EDITED))
    (folder / "budget_step.py").write_text(STEP_MODULE)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.syspath_prepend(str(folder))
        argv = ["dump", "transformer.shard", "--shapes", "budget_step:shapes", "--step", STEP]
        assert main([*argv, "-o", "baseline.json"]) == 0
        yield folder


def _lint(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["lint", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_the_baseline_records_the_collectives_per_rule_line(project: Path) -> None:
    text = (project / "baseline.json").read_text()
    cost = json.loads(text)["step_cost"]
    assert json.loads(text)["version"] == 4
    rows = cost["by_rule"]
    assert sum(r["bytes_per_device"] for r in rows) == sum(c["bytes_per_device"] for c in cost["collectives"])
    line = _line_of(project / "transformer.shard", "attn/o/kernel$")
    assert {"rule": f"transformer.shard:{line}", "text": O_RULE.replace("       ", " ")}.items() <= next(
        r for r in rows if "attn/o" in r["text"]
    ).items()
    assert dumps(loads(text)) == text  # read back strictly, written again byte for byte


def test_a_step_over_its_collective_budget_fails_naming_the_rule_line_sr129(project: Path, capsys) -> None:
    rules = project / "transformer.shard"  # named by its absolute path: findings say it so
    status, out, _ = _lint(capsys, str(rules), "--step", STEP, "--max-collective-bytes", "64KiB")
    assert status == 1
    found = [line for line in out.splitlines() if " SR129 " in line]
    assert len(found) == 1, out
    top = json.loads((project / "baseline.json").read_text())["step_cost"]["by_rule"][0]
    line = int(top["rule"].rsplit(":", 1)[1])
    assert found[0].startswith(f"{rules}:{line}:3: SR129 the step's collectives move ")  # at the rule line
    assert "per device per step (at most 64.0 KiB allowed by --max-collective-bytes)" in found[0]
    assert f"by rule line, most first: {rules}:{line} `{top['text']}` " in found[0]
    assert re.search(r"\(params/blocks/\d/\S+ [\d.]+ KiB, ", found[0]), found[0]  # its arrays, with bytes
    assert f"hint: change the rule line {rules}:{line} `{top['text']}`" in out
    assert "raise the budget (--max-collective-bytes)" in out


def test_under_both_budgets_the_run_passes(project: Path, capsys) -> None:
    status, out, err = _lint(
        capsys,
        "transformer.shard",
        "--step",
        STEP,
        "--max-collective-bytes",
        "1.5 GB",
        "--baseline",
        "baseline.json",
        "--max-collective-increase",
        "0%",  # the rules the baseline was dumped with: not a byte more
    )
    assert status == 0, out + err
    assert "SR129" not in out and "SR130" not in out


def test_the_budgets_can_be_set_in_pyproject(project: Path, capsys) -> None:
    configured = project / "configured"
    configured.mkdir()
    (configured / "transformer.shard").write_text((project / "transformer.shard").read_text())
    (configured / "pyproject.toml").write_text(
        f'[tool.shardrules]\nstep = "{STEP}"\nmax-collective-bytes = "64KiB"\n'
    )
    status, out, _ = _lint(capsys, "configured/transformer.shard")
    assert status == 1
    assert "allowed by [tool.shardrules] max-collective-bytes in configured/pyproject.toml)" in out
    assert "raise the budget ([tool.shardrules] max-collective-bytes in configured/pyproject.toml)" in out


def test_an_edit_that_adds_communication_fails_against_the_baseline_sr130(project: Path, capsys) -> None:
    status, out, _ = _lint(
        capsys,
        "edited.shard",
        "--step",
        STEP,
        "--baseline",
        "baseline.json",
        "--max-collective-increase",
        "5%",
    )
    assert status == 1
    found = [line for line in out.splitlines() if " SR130 " in line]
    assert len(found) == 1, out
    finding = found[0]
    assert re.search(
        r"the step's collectives grew from [\d.]+ [MK]iB to [\d.]+ [MK]iB per device per step \(\+\d+\.\d%\) "
        r"over the baseline baseline\.json \(at most \+5\.0% allowed by --max-collective-increase\)",
        finding,
    ), finding
    o_line = _line_of(project / "edited.shard", "attn/o/kernel$")
    edited = EDITED.replace("       ", " ")
    was = O_RULE.replace("       ", " ")
    # the edited rule line, matched to the baseline's by its pattern, grew: before -> after, and what it was
    assert re.search(
        rf"edited\.shard:{o_line} `{re.escape(edited)}`: [\d.]+ KiB -> [\d.]+ KiB \(\+[\d.]+ KiB; was `{re.escape(was)}`\)",
        finding,
    ), finding
    grown = finding.split("grown most, by rule line (before -> after): ", 1)[1]
    first = re.match(r"edited\.shard:(\d+) ", grown)
    assert first is not None, finding
    assert finding.startswith(f"edited.shard:{first[1]}:3: SR130 "), finding  # at the line grown most
    assert "-o baseline.json`" in out and "record the baseline again" in out


def test_a_baseline_without_by_rule_says_the_rule_lines_are_not_recorded(project: Path, capsys) -> None:
    table = loads((project / "baseline.json").read_text())
    assert table.step_cost is not None
    older = {key: value for key, value in table.step_cost.items() if key != "by_rule"}
    text = dumps(dataclasses.replace(table, step_cost=older))
    assert '"version": 2,' in text  # as dump --step wrote it before by_rule
    (project / "older.json").write_text(text)
    status, out, _ = _lint(
        capsys, "edited.shard", "--step", STEP, "--baseline", "older.json", "--max-collective-increase", "5%"
    )
    assert status == 1
    finding = next(line for line in out.splitlines() if " SR130 " in line)
    assert "older.json does not record the collectives per rule line" in finding
    assert "so which rule lines grew is not known; now most by rule line: edited.shard:" in finding
    assert (
        "to record it again: `shardrules dump edited.shard --step budget_step:check_step -o older.json`"
        in out
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--max-collective-increase", "5%"], "--max-collective-increase needs --baseline FILE"),
        (["--baseline", "baseline.json"], "--baseline needs --max-collective-increase PCT"),
        (
            ["--baseline", "missing.json", "--max-collective-increase", "5%"],
            "--baseline: missing.json: no such file",
        ),
        (["--max-collective-bytes", "64 MiBs"], "--max-collective-bytes: not a size in bytes: '64 MiBs'"),
    ],
)
def test_options_wrong_or_alone_stop_the_run_before_any_compile(project: Path, capsys, argv, said) -> None:
    status, _, err = _lint(capsys, "transformer.shard", "--step", STEP, *argv)
    assert status == 2 and said in err, err


def test_a_baseline_without_a_cost_or_a_budget_without_a_step_is_a_usage_error(project: Path, capsys) -> None:
    assert main(["dump", "transformer.shard", "--shapes", "budget_step:shapes", "-o", "plain.json"]) == 0
    argv = ["--baseline", "plain.json", "--max-collective-increase", "5%"]
    status, _, err = _lint(capsys, "transformer.shard", "--step", STEP, *argv)
    assert (
        status == 2 and "--baseline: plain.json records no step cost: write it with `shardrules dump" in err
    )
    status, _, err = _lint(capsys, "transformer.shard", "--max-collective-bytes", "1MiB")
    assert status == 2 and "--max-collective-bytes is a budget for a step" in err


@pytest.mark.parametrize("value", ["150", "-5%", "lots"])
def test_an_increase_is_a_percentage_or_a_fraction(project: Path, capsys, value: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["lint", "transformer.shard", "--step", STEP, "--max-collective-increase", value])
    assert exited.value.code == 2
    assert "--max-collective-increase" in capsys.readouterr().err


# --- golden plans ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def costed(project: Path):
    """The plan and the step's cost under the example's rules and under the edited ones."""
    import importlib

    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(project))
        module = importlib.import_module("budget_step")
    mesh = jax.make_mesh((4, 2), ("fsdp", "model"))
    shapes = jax.eval_shape(module.shapes)
    out = {}
    for name in ("transformer", "edited"):
        rules = sr.load(project / f"{name}.shard")
        step, args = module.check_step(rules, mesh)
        out[name] = (sr.plan(shapes, rules, mesh), step.cost(*args, ideal=False))
    return out


def test_a_golden_plan_names_the_rule_lines_whose_collectives_moved(project: Path, costed) -> None:
    golden = project / "golden" / "transformer.json"
    plan, cost = costed["transformer"]
    sr.assert_plan_matches(plan, golden, cost=cost, update=True)
    sr.assert_plan_matches(plan, golden, cost=cost)  # the same: passes
    with pytest.raises(AssertionError) as failed:
        sr.assert_plan_matches(costed["edited"][0], golden, cost=costed["edited"][1])
    message = str(failed.value)
    assert "collective bytes per device per step by rule line, golden -> plan, most changed first:" in message
    moved = message.split("most changed first:", 1)[1].splitlines()[1:]
    o_line = _line_of(project / "edited.shard", "attn/o/kernel$")
    edited = f"edited.shard:{o_line} `{EDITED.replace('       ', ' ')}`: "  # relative, as the file writes it
    row = next((line for line in moved if line.strip().startswith(edited)), None)
    assert row is not None, message
    assert f"was `{O_RULE.replace('       ', ' ')}`" in row and "(+" in row


def test_an_older_golden_without_by_rule_still_works_and_says_how_to_record_it(project: Path, costed) -> None:
    golden = project / "golden" / "older.json"
    plan, cost = costed["transformer"]
    sr.assert_plan_matches(plan, golden, cost=cost, update=True)
    table = loads(golden.read_text())
    assert table.step_cost is not None and "by_rule" in table.step_cost
    older = {key: value for key, value in table.step_cost.items() if key != "by_rule"}
    golden.write_text(dumps(dataclasses.replace(table, step_cost=older)))  # as written before version 4
    sr.assert_plan_matches(plan, golden, cost=cost)  # the same plan and cost: passes
    with pytest.raises(AssertionError) as failed:
        sr.assert_plan_matches(costed["edited"][0], golden, cost=costed["edited"][1])
    message = str(failed.value)
    assert f"{golden} does not record the collectives per rule line" in message
    assert "run the test with SHARDRULES_UPDATE_GOLDEN=1" in message


def test_a_baseline_in_the_settings_is_relative_to_its_pyproject(project: Path, capsys) -> None:
    settled = project / "settled"
    (settled / "sharding").mkdir(parents=True)
    (settled / "sharding" / "model.shard").write_text((project / "transformer.shard").read_text())
    (settled / "pyproject.toml").write_text(
        f'[tool.shardrules]\nstep = "{STEP}"\nbaseline = "plans/missing.json"\nmax-collective-increase = "5%"\n'
    )
    status, _, err = _lint(capsys, "settled/sharding/model.shard")
    assert status == 2, err  # read before any compile: the file is looked for next to the settings
    assert (
        "[tool.shardrules] baseline in settled/pyproject.toml: settled/plans/missing.json: no such file"
        in err
    )


@pytest.mark.parametrize(
    ("value", "said"),
    [("2", "must be an increase of 0 or more"), ('"lots"', "must be an increase"), ("0.1", None)],
)
def test_the_increase_setting_is_checked(project: Path, capsys, value: str, said: str | None) -> None:
    folder = project / f"increase-{''.join(c for c in value if c.isalnum())}"
    folder.mkdir()
    (folder / "model.shard").write_text((project / "transformer.shard").read_text())
    (folder / "pyproject.toml").write_text(f"[tool.shardrules]\nmax-collective-increase = {value}\n")
    status, _, err = _lint(capsys, str(folder / "model.shard"))
    assert status == 2
    if said is None:  # a good value, but a budget for a step and without its baseline
        assert "max-collective-increase in" in err and "is a budget for a step" in err
    else:
        assert f"[tool.shardrules] max-collective-increase in {folder.name}/pyproject.toml: {said}" in err
