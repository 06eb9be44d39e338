"""`shardrules diff A B --step MODULE:FUNCTION` with no `--shapes`: the step's
own example arguments give the trees each group its `sr.jit` names is
planned for, as `explain --step` takes them; `--shapes` still wins."""

from __future__ import annotations

import itertools
import json
import textwrap
from pathlib import Path

import pytest
from test_cli_step import RULES, STEP

from shardrules._cli._main import main

MORE_STEPS = textwrap.dedent(
    """
    def with_moments(params, moments, x):
        return sgd(params, {"x": x, "y": x})[0], moments


    def moments_step(rules, mesh):
        params, batch = shapes()
        step = sr.jit(with_moments, rules, mesh, in_groups=("params", "params", "inputs"))
        return step, (params, params, batch["x"])


    def ungrouped_step(rules, mesh):
        return sr.jit(sgd, rules, mesh), shapes()


    def param_shapes():
        return shapes()[0]
    """
)

REPLICATED = RULES.replace('"up$"   -> (_, model)', '"up$"   -> replicated').replace(
    '"down$" -> (model, _)', '"down$" -> replicated'
)

_names = itertools.count()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """tp.shard, rep.shard (every parameter replicated) and a module of steps
    (a fresh name each time), in the current folder."""
    module = f"diff_steps_{next(_names)}"
    (tmp_path / "tp.shard").write_text(RULES)
    (tmp_path / "rep.shard").write_text(REPLICATED)
    (tmp_path / f"{module}.py").write_text(STEP + MORE_STEPS)
    monkeypatch.chdir(tmp_path)
    return tmp_path, module


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(["diff", *argv, "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_steps_arguments_give_each_groups_plan(project, capsys) -> None:
    _, module = project
    step = f"{module}:check_step"
    assert main(["diff", "rep.shard", "tp.shard", "--step", step]) == 1  # the parameters' layouts differ
    out = capsys.readouterr().out
    params, inputs, costs, by_rule = out.split("\n\n")
    assert params.splitlines()[:3] == [
        "A: rep.shard (params) on data=4, model=2",
        "B: tp.shard (params) on data=4, model=2",
        "changed: 2 leaves",
    ]
    assert "P(None, None) -> P(None, 'model')  (tp.shard:4): 1 leaf" in params
    assert inputs.splitlines()[:3] == [
        "A: rep.shard (inputs) on data=4, model=2",
        "B: tp.shard (inputs) on data=4, model=2",
        "no changes: 2 leaves laid out the same",
    ]
    assert costs.startswith("step cost") and "FLOPs per device" in costs
    assert by_rule.startswith("collectives per rule line")
    code, found = _json(capsys, "rep.shard", "tp.shard", "--step", step)
    assert code == 1 and found["equal"] is False
    assert [(g["a"]["group"], g["equal"]) for g in found["groups"]] == [("params", False), ("inputs", True)]
    assert set(found["step_cost"]) == {"a", "b"}
    # the parameters' diff is the one --shapes gives for the same tree
    code, given = _json(capsys, "rep.shard", "tp.shard", "--step", step, "--shapes", f"{module}:param_shapes")
    assert code == 1 and "groups" not in given
    assert {k: v for k, v in given.items() if not k.startswith("step_cost")} == found["groups"][0]


def test_group_picks_one_of_the_steps_groups(project, capsys) -> None:
    _, module = project
    step = f"{module}:check_step"
    code, found = _json(capsys, "rep.shard", "tp.shard", "--step", step, "--group", "inputs")
    assert code == 0  # the inputs are laid out the same by both files
    assert [g["a"]["group"] for g in found["groups"]] == ["inputs"]
    assert main(["diff", "rep.shard", "tp.shard", "--step", step, "--group", "activations"]) == 2
    err = capsys.readouterr().err
    assert "the step" in err and "gives no argument the group `activations`" in err
    assert "`params`, `inputs`" in err and "--shapes" in err


def test_arguments_of_one_group_are_planned_each_under_its_name(project, capsys) -> None:
    """Parameters and their moments both `params`: one table, each argument's
    paths under its parameter's name; a lone array under its own name."""
    _, module = project
    code, found = _json(capsys, "rep.shard", "tp.shard", "--step", f"{module}:moments_step")
    assert code == 1
    params, inputs = found["groups"]
    paths = sorted(p for change in params["changed"] for p in change["paths"])
    assert paths == ["moments/down", "moments/up", "params/down", "params/up"]
    assert params["a"]["leaves"] == params["b"]["leaves"] == 4
    assert inputs["a"]["leaves"] == 1 and inputs["equal"]


def test_without_shapes_or_a_step_it_says_what_to_give(project, capsys) -> None:
    assert main(["diff", "rep.shard", "tp.shard"]) == 2
    err = capsys.readouterr().err
    assert "give the shapes to plan for: --shapes SOURCE" in err
    assert "--step MODULE:FUNCTION" in err


def test_a_step_that_names_no_groups_asks_for_shapes(project, capsys) -> None:
    _, module = project
    assert main(["diff", "rep.shard", "tp.shard", "--step", f"{module}:ungrouped_step"]) == 2
    err = capsys.readouterr().err
    assert "gives none of its arguments a group (in_groups)" in err
    assert "--shapes SOURCE" in err


def test_rules_that_do_not_plan_the_steps_arguments_are_shown_as_lint_shows_them(project, capsys) -> None:
    folder, module = project
    (folder / "bad.shard").write_text(RULES.replace('"up$"   -> (_, model)', '"up$"   -> (_, _, model)'))
    assert main(["diff", "rep.shard", "bad.shard", "--step", f"{module}:check_step"]) == 2
    captured = capsys.readouterr()
    assert "bad.shard:4:" in captured.err and "SR10" in captured.err
    assert captured.out == ""


def test_dump_step_without_shapes_records_the_plan_of_the_steps_parameters(tmp_path, monkeypatch) -> None:
    """`dump --step` with no `--shapes`: the step's example argument of the group
    (`params`) is the tree planned, and the file records the step's cost."""
    import json as _json

    from shardrules._cli._main import main as _main

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "dump_steps.py").write_text(
        "import jax, jax.numpy as jnp\nimport shardrules as sr\n\n"
        "def step(params, x):\n"
        "    g = jax.grad(lambda p: jnp.tanh(x @ p['w']).sum())(params)\n"
        "    return jax.tree.map(lambda a, b: a - 0.1 * b, params, g)\n\n"
        "def check_step(rules, mesh):\n"
        "    S = jax.ShapeDtypeStruct\n"
        "    jitted = sr.jit(step, rules, mesh, in_groups=('params', 'inputs'), out_groups='params')\n"
        "    return jitted, ({'w': S((64, 32), jnp.float32)}, S((16, 64), jnp.float32))\n"
    )
    (tmp_path / "r.shard").write_text(
        'mesh fsdp=8\nrules params:\n  "w$" -> (fsdp, _)\nrules inputs:\n  "x" -> (fsdp, _)\n'
    )
    assert _main(["dump", "r.shard", "--step", "dump_steps:check_step", "-o", "plan.json"]) == 0
    data = _json.loads((tmp_path / "plan.json").read_text())
    assert (
        data["group"] == "params"
        and data["arrays"] == 1
        and data["step_cost"]["step"] == "dump_steps:check_step"
    )
    assert _main(["dump", "r.shard", "-o", "none.json"]) == 2  # neither shapes nor a step: a usage error
