"""A step's cost kept with its plan: `shardrules dump --step` records it in the
plan file (version 2's `step_cost`), a reader checks it strictly, `diff` of
two such dumps shows both costs, a golden plan (`assert_plan_matches(...,
cost=)`) fails when the cost moves, and `explain --format json` and the HTML
report show it."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import math
from pathlib import Path

import jax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType

import shardrules as sr
from shardrules._cli._main import main
from shardrules._reports._costfile import KINDS, cost_changes, read_cost, recorded
from shardrules._reports._dump import dumps
from shardrules._reports._dumpread import loads

STEP = """\
import jax
import jax.numpy as jnp

import shardrules as sr

S = jax.ShapeDtypeStruct


def sgd(params, batch):
    def loss_fn(p):
        h = jax.nn.gelu(batch["x"] @ p["up"])
        return jnp.mean((h @ p["down"] - batch["y"]) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def params():
    return {"up": S((64, 256), jnp.float32), "down": S((256, 64), jnp.float32)}


def shapes():
    return params(), {"x": S((32, 64), jnp.float32), "y": S((32, 64), jnp.float32)}


def check_step(rules, mesh):
    return sr.jit(sgd, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None)), shapes()
"""

# The parameters are replicated under both files (the same plan of `params`);
# the batch is split over `data` in one and whole on every device in the other.
DATA_PARALLEL = """\
mesh data=8

rules params:
  default -> replicated

rules inputs:
  "x|y" -> (data, _)
"""
REPLICATED = DATA_PARALLEL.replace('"x|y" -> (data, _)', "default -> replicated")

_names = itertools.count()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A folder with both rule files and a module of the step (a fresh module
    name each time), as the current folder; returns the module's name."""
    module = f"cost_steps_{next(_names)}"
    (tmp_path / "dp.shard").write_text(DATA_PARALLEL)
    (tmp_path / "replicated.shard").write_text(REPLICATED)
    (tmp_path / f"{module}.py").write_text(STEP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return module


def _dump(capsys: pytest.CaptureFixture[str], rules: str, module: str, *extra: str) -> str:
    argv = ["dump", rules, "--shapes", f"{module}:params", *extra]
    assert main(argv) == 0
    return capsys.readouterr().out


def _step_cost(module_name: str, rules_text: str) -> sr.StepCost:
    """The Python API's cost of the step under `rules_text` on 8 Explicit devices."""
    module = importlib.import_module(module_name)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    step, args = module.check_step(sr.loads(rules_text, name="dp.shard"), mesh)
    return step.cost(*args)


def test_dump_step_records_the_cost_the_step_has(project, capsys) -> None:
    plain = _dump(capsys, "dp.shard", project)
    assert '"version": 1,' in plain and "step_cost" not in plain  # no cost: version 1, as before
    text = _dump(capsys, "dp.shard", project, "--step", f"{project}:check_step")
    assert '"version": 4,' in text  # a cost whose collectives are attributed to rule lines
    data = json.loads(text)
    assert list(data)[-2:] == ["step_cost", "leaves"]
    cost = data["step_cost"]
    assert cost["step"] == f"{project}:check_step"
    expected = _step_cost(project, DATA_PARALLEL)  # the Python API's cost of the same step and rules
    assert cost["devices"] == 8 and cost["flops_per_device"] == expected.flops_per_device
    assert cost["peak_bytes_per_device"] == expected.peak_bytes_per_device
    assert cost["ratio"] == pytest.approx(expected.ratio)
    assert [(c["kind"], c["count"]) for c in cost["collectives"]] == [
        (c.kind, c.count) for c in expected.collectives
    ]
    # the collectives per rule line (version 4), the rule file as the leaves name it
    assert [(r["rule"], r["text"], r["bytes_per_device"]) for r in cost["by_rule"]] == [
        (
            r.rule.replace(r.rule.rpartition(":")[0], "dp.shard") if r.text else r.rule,
            r.text,
            r.bytes_per_device,
        )
        for r in expected.by_rule
    ]
    assert sum(r["bytes_per_device"] for r in cost["by_rule"]) == sum(
        c["bytes_per_device"] for c in cost["collectives"]
    )
    # the plan part is the plan without a cost, line for line
    without = [line for line in text.splitlines() if line not in plain.splitlines()]
    assert without[0] == '  "version": 4,' and all(
        line.startswith(('  "step_cost"', "    ", "  },")) for line in without[1:]
    ), without
    # read back: the same table and cost; written again, the same bytes
    table = loads(text)
    assert table.step_cost == cost and dumps(table) == text
    assert sr.Plan.from_json(text).to_json() == plain  # a Plan holds the layouts, not the cost


def _edited(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def _costly(text: str) -> str:
    table = loads(text)
    cost = {
        "step": "train:step",
        "devices": 8,
        "flops_per_device": 2000.0,
        "ideal_flops_per_device": 1000.0,
        "ratio": 2.0,
        "bytes_accessed_per_device": 4096.0,
        "peak_bytes_per_device": 8192,
        "argument_bytes_per_device": 4096,
        "output_bytes_per_device": 2048,
        "temp_bytes_per_device": 2048,
        "collectives": [{"kind": "all-reduce", "count": 2, "bytes_per_device": 512, "scopes": ["mlp"]}],
    }
    return dumps(dataclasses.replace(table, step_cost=cost))


def _costly_plan() -> str:
    mesh = {"data": 8}
    rules = sr.loads(DATA_PARALLEL, name="dp.shard")
    plan = sr.plan({"w": jax.ShapeDtypeStruct((16, 4), "float32")}, rules, mesh)
    return _costly(plan.to_json())


@pytest.fixture
def costly() -> str:
    return _costly_plan()


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('"ratio": 2.0', '"ratio": 1.5', '"ratio" is 1.5, but its FLOPs make 2.0'),
        ('"devices": 8', '"devices": 0', '"devices" is a whole number from 1 to 10^30, not 0'),
        ('"devices": 8', '"devices": true', '"devices" is a whole number from 1 to 10^30, not true'),
        ('"count": 2', '"count": -2', "the count of all-reduce is a whole number from 1 to 10^30"),
        ('"count": 2', '"count": 0', "the count of all-reduce is a whole number from 1"),
        ('"count": 2', '"count": 2.5', "the count of all-reduce is a whole number"),
        (
            '"peak_bytes_per_device": 8192',
            '"peak_bytes_per_device": 8192.5',
            '"peak_bytes_per_device" is a whole',
        ),
        ('"flops_per_device": 2000.0', '"flops_per_device": NaN', '"flops_per_device" is a number'),
        ('"flops_per_device": 2000.0', '"flops_per_device": Infinity', '"flops_per_device" is a number'),
        ('"kind": "all-reduce"', '"kind": "all-reduse"', 'has the kind "all-reduse"; kinds are all-gather'),
        ('"kind": "all-reduce"', '"kind": ["all-reduce"]', 'has the kind ["all-reduce"]'),
        (
            '"flops_per_device": 2000.0',
            '"flops_per_device": 1' + "0" * 400,
            '"flops_per_device" is a number from 0 to 10^30',
        ),
        ('"ratio": 2.0', '"ratio": 1' + "0" * 400, '"ratio" is a number from 0 to 10^30'),
        (
            '"peak_bytes_per_device": 8192',
            '"peak_bytes_per_device": 1' + "0" * 40,
            "is a whole number from 0",
        ),
        ('"ideal_flops_per_device": 1000.0', '"ideal_flops_per_device": null', '"ratio" is null when'),
        ('"scopes": ["mlp"]', '"scopes": "mlp"', "the scopes of all-reduce are a list"),
        ('"step": "train:step"', '"step": 3', '"step" is null or'),
        ('"step": "train:step",', '"step": "train:step", "steps": 1,', 'has the key "steps"'),
        ('    "step": "train:step",\n', "", "lacks the key 'step'"),
        ('"version": 2', '"version": 1', '"step_cost", a key of version 2, but says version 1'),
        ('"collectives": [', '"collectives": {"x": [', "not JSON"),
    ],
)
def test_a_hand_edited_cost_is_refused_with_sr124(costly: str, old: str, new: str, message: str) -> None:
    with pytest.raises(sr.PlanFileError) as info:
        sr.Plan.from_json(_edited(costly, old, new))
    assert info.value.code == "SR124"
    assert message in str(info.value), str(info.value)


def test_a_collective_kind_twice_is_refused(costly: str) -> None:
    row = '{"kind": "all-reduce", "count": 2, "bytes_per_device": 512, "scopes": ["mlp"]}'
    with pytest.raises(sr.PlanFileError, match="all-reduce is listed twice or out of order"):
        sr.Plan.from_json(_edited(costly, row, row + ",\n      " + row))


COSTLY = _costly_plan()
finite = st.floats(min_value=0, max_value=1e18, allow_nan=False)
whole = st.integers(min_value=0, max_value=2**62)


@st.composite
def costs(draw: st.DrawFn) -> dict:
    flops, ideal = draw(finite), draw(st.one_of(st.none(), finite))
    kinds = sorted(draw(st.lists(st.sampled_from(KINDS), unique=True, max_size=5)), key=KINDS.index)
    return {
        "step": draw(st.one_of(st.none(), st.text(min_size=1, max_size=20))),
        "devices": draw(st.integers(min_value=1, max_value=2**20)),
        "flops_per_device": flops,
        "ideal_flops_per_device": ideal,
        "ratio": flops / ideal if ideal else None,
        "bytes_accessed_per_device": draw(finite),
        "peak_bytes_per_device": draw(whole),
        "argument_bytes_per_device": draw(whole),
        "output_bytes_per_device": draw(whole),
        "temp_bytes_per_device": draw(whole),
        "collectives": [
            {
                "kind": kind,
                "count": draw(st.integers(min_value=1, max_value=2**62)),
                "bytes_per_device": draw(whole),
                "scopes": draw(st.lists(st.text(max_size=12), max_size=3)),
            }
            for kind in kinds
        ],
    }


@settings(max_examples=60, deadline=None)
@given(cost=costs())
def test_any_cost_is_written_and_read_back_unchanged(cost: dict) -> None:
    table = dataclasses.replace(loads(COSTLY), step_cost=cost)
    text = dumps(table)
    back = loads(text)
    assert back.step_cost == cost and dumps(back) == text
    assert read_cost(json.loads(text)["step_cost"]) == cost


def test_diff_of_two_dumps_shows_the_costs_they_record(project, capsys, tmp_path: Path) -> None:
    step = ["--step", f"{project}:check_step"]
    (tmp_path / "dp.json").write_text(_dump(capsys, "dp.shard", project, *step))
    (tmp_path / "rep.json").write_text(_dump(capsys, "replicated.shard", project, *step))
    assert main(["diff", "rep.json", "dp.json"]) == 0  # the same layouts of the parameters
    out = capsys.readouterr().out
    assert "no changes" in out
    flops = next(line for line in out.splitlines() if line.startswith("FLOPs per device"))
    ratio = float(flops.split()[-1].rstrip("x"))
    assert ratio < 0.2  # B splits the batch over 8 devices (its replicated update aside), A does not
    assert main(["diff", "rep.json", "dp.json", "--format", "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert set(found["step_cost"]) == {"a", "b"}
    assert found["step_cost"]["a"]["ratio"] == pytest.approx(8, rel=0.05)  # all the work, everywhere
    assert found["step_cost"]["b"]["ratio"] < 1.2
    (tmp_path / "plain.json").write_text(_dump(capsys, "dp.shard", project))
    assert main(["diff", "plain.json", "dp.json"]) == 0
    captured = capsys.readouterr()
    assert "step cost" not in captured.out
    assert "only B records a step cost" in captured.err


def test_dump_step_whose_rules_do_not_trace_writes_nothing(project, capsys, tmp_path: Path) -> None:
    (tmp_path / "bad.shard").write_text(DATA_PARALLEL.replace('"x|y" -> (data, _)', '"x|y" -> (data, data)'))
    code = main(["dump", "bad.shard", "--shapes", f"{project}:params", "--step", f"{project}:check_step"])
    captured = capsys.readouterr()
    assert code in (1, 2) and captured.out == ""
    assert "bad.shard" in captured.err


def test_a_golden_plan_fails_when_the_cost_moves_and_the_layouts_do_not(project, tmp_path: Path) -> None:
    params = {
        "up": jax.ShapeDtypeStruct((64, 256), "float32"),
        "down": jax.ShapeDtypeStruct((256, 64), "float32"),
    }
    mesh = {"data": 8}
    dp_plan = sr.plan(params, sr.loads(DATA_PARALLEL, name="dp.shard"), mesh)
    rep_plan = sr.plan(params, sr.loads(REPLICATED, name="dp.shard"), mesh)
    assert dp_plan.to_json() == rep_plan.to_json()  # the parameters' layouts agree
    golden = tmp_path / "golden" / "step.json"
    dp_cost = _step_cost(project, DATA_PARALLEL)
    sr.assert_plan_matches(dp_plan, golden, cost=dp_cost, update=True)
    assert json.loads(golden.read_text())["step_cost"]["flops_per_device"] == dp_cost.flops_per_device
    sr.assert_plan_matches(dp_plan, golden, cost=dp_cost, update=False)  # the same cost passes
    with pytest.raises(AssertionError) as info:
        sr.assert_plan_matches(rep_plan, golden, cost=_step_cost(project, REPLICATED), update=False)
    message = str(info.value)
    assert "the step's cost changed by more than 2%" in message
    assert "FLOPs per device" in message and "FLOPs against the ideal" in message
    assert "SHARDRULES_UPDATE_GOLDEN=1" in message
    with pytest.raises(AssertionError, match="records a step's cost: pass it"):
        sr.assert_plan_matches(dp_plan, golden, update=False)


def test_a_golden_cost_allows_rtol_and_no_more(tmp_path: Path) -> None:
    plan = sr.plan({"w": jax.ShapeDtypeStruct((16, 4), "float32")}, sr.loads(DATA_PARALLEL), {"data": 8})
    cost = json.loads(_costly(plan.to_json()))["step_cost"]
    golden = tmp_path / "golden.json"
    sr.assert_plan_matches(plan, golden, cost=cost, update=True)

    def moved(factor: float) -> dict:
        flops = cost["flops_per_device"] * factor
        return cost | {"flops_per_device": flops, "ratio": flops / cost["ideal_flops_per_device"]}

    sr.assert_plan_matches(plan, golden, cost=moved(1.01), update=False)  # within the default 2%
    with pytest.raises(AssertionError, match=r"FLOPs per device: 2,000 -> 2,100 \(1.05x\)"):
        sr.assert_plan_matches(plan, golden, cost=moved(1.05), update=False)
    sr.assert_plan_matches(plan, golden, cost=moved(1.05), rtol=0.1, update=False)
    fewer = cost | {"collectives": []}  # a collective gone is a change whatever the tolerance
    with pytest.raises(AssertionError, match="all-reduce count: 2 -> 0"):
        sr.assert_plan_matches(plan, golden, cost=fewer, rtol=0.5, update=False)


def test_cost_changes_name_each_figure_that_moved() -> None:
    old = recorded(
        {
            "devices": 8,
            "flops_per_device": 100.0,
            "ideal_flops_per_device": 100.0,
            "ratio": 1.0,
            "bytes_accessed_per_device": 10.0,
            "peak_bytes_per_device": 1000,
            "argument_bytes_per_device": 500,
            "output_bytes_per_device": 500,
            "temp_bytes_per_device": 0,
            "collectives": [],
        }
    )
    new = old | {"peak_bytes_per_device": 2000, "devices": 16}
    new["collectives"] = [{"kind": "all-gather", "count": 1, "bytes_per_device": 64, "scopes": []}]
    changes = cost_changes(old, new)
    assert changes == [
        "devices: 8 -> 16",
        "peak bytes per device: 1,000 -> 2,000 (2.00x)",
        "all-gather count: 0 -> 1",
        "all-gather bytes per device: 0 -> 64",
    ]
    assert cost_changes(old, old) == []


def test_explain_json_holds_the_plan_the_step_and_its_cost(project, capsys, tmp_path: Path) -> None:
    argv = ["explain", "dp.shard", "--shapes", f"{project}:params", "--step", f"{project}:check_step"]
    assert main([*argv, "--cost", "--format", "json", "--html", "report.html"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["file"] == "dp.shard" and found["group"] == "params" and found["mesh"] == {"data": 8}
    assert [leaf["path"] for leaf in found["leaves"]] == ["down", "up"]
    assert found["leaves"][0] == {
        "path": "down",
        "shape": [256, 64],
        "dtype": "float32",
        "spec": [None, None],
        "rule": "dp.shard:4:3",
        "bytes_per_device": 256 * 64 * 4,
    }
    assert found["totals"] == {
        "arrays": 2,
        "bytes_per_device": 2 * 256 * 64 * 4,
        "total_bytes": 2 * 256 * 64 * 4,
    }
    expected = _step_cost(project, DATA_PARALLEL)
    assert found["step_cost"]["flops_per_device"] == expected.flops_per_device
    assert found["step_cost"]["ratio"] == pytest.approx(expected.ratio)
    assert {s["name"] for s in found["scopes"]} >= set() and found["decisions"], found["decisions"]
    first = found["decisions"][0]
    assert first["primitive"] == "dot_general" and first["spec"] == ["data", None]
    html = (tmp_path / "report.html").read_text()
    assert "<h3>Step cost</h3>" in html and f"{project}:check_step" in html and "all-reduce" in html
    # without --step: no step, no cost, the same plan
    assert main(["explain", "dp.shard", "--shapes", f"{project}:params", "--format", "json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["step_cost"] is None and plain["decisions"] is None and plain["scopes"] is None
    assert plain["leaves"] == found["leaves"] and plain["findings"] == []
    # with --step and no shapes: no plan, no group, but the mesh the step was traced on
    assert main(["explain", "dp.shard", "--step", f"{project}:check_step", "--format", "json"]) == 0
    traced = json.loads(capsys.readouterr().out)
    assert traced["group"] is None and traced["leaves"] == [] and traced["totals"] is None
    assert traced["mesh"] == {"data": 8} and traced["decisions"] == found["decisions"]


def test_explain_html_without_shapes_plans_the_steps_own_argument(project, capsys, tmp_path: Path) -> None:
    argv = ["explain", "dp.shard", "--step", f"{project}:check_step", "--cost", "--html", "report.html"]
    assert main(argv) == 0
    capsys.readouterr()
    html = (tmp_path / "report.html").read_text()
    assert "<h3>Step cost</h3>" in html and f"{project}:check_step" in html
    assert "shardrules plan: dp.shard (params)" in html
    assert "<td>up</td>" in html and "<td>down</td>" in html  # the step's `params` argument
    assert "<td>x</td>" not in html
    # the group asked for: the step's `inputs` argument, split over `data`
    assert main([*argv[:-1], "inputs.html", "--group", "inputs"]) == 0
    capsys.readouterr()
    inputs = (tmp_path / "inputs.html").read_text()
    assert "shardrules plan: dp.shard (inputs)" in inputs and "<td>x</td>" in inputs
    assert "<td>up</td>" not in inputs


def test_explain_html_with_no_plan_to_write_says_why(project, capsys, tmp_path: Path) -> None:
    (tmp_path / "ungrouped.py").write_text(
        "import jax, jax.numpy as jnp\nimport shardrules as sr\n"
        "def check_step(rules, mesh):\n"
        "    return sr.jit(lambda w: w * 2, rules, mesh), (jax.ShapeDtypeStruct((8, 4), jnp.float32),)\n"
    )
    argv = ["explain", "dp.shard", "--step", "ungrouped:check_step", "--cost", "--html", "none.html"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--html none.html: no plan to write" in err and "--shapes" in err and "`params`" in err
    assert not (tmp_path / "none.html").exists()
    # rules that do not load: their errors (status 1), and why the page is missing
    (tmp_path / "broken.shard").write_text('rules params:\n  "w" -> (data,\n')
    assert main(["explain", "broken.shard", "--shapes", f"{project}:params", "--html", "b.html"]) == 1
    err = capsys.readouterr().err
    assert "SR001" in err and "--html b.html: not written: the rules have errors" in err
    assert not (tmp_path / "b.html").exists()


def test_explain_json_carries_the_findings_lint_gives(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.shard").write_text('mesh data=8\n\nrules params:\n  "w" -> (data, _)\n')
    (tmp_path / "s.json").write_text(json.dumps({"w": [[12, 4], "float32"]}))
    assert main(["explain", "r.shard", "--shapes", "s.json", "--format", "json"]) == 1
    found = json.loads(capsys.readouterr().out)
    assert [f["code"] for f in found["findings"]] == ["SR104"]  # 12 does not divide by 8
    assert found["findings"][0]["line"] == 4
    (leaf,) = found["leaves"]  # as the text shows it: the leaf the error is about, with no spec
    assert leaf["path"] == "w" and leaf["spec"] is None and leaf["rule"] == "error", leaf


def test_the_html_report_shows_a_cost_given_as_a_step_cost() -> None:
    from shardrules._reports._html import page

    plan = sr.plan({"w": jax.ShapeDtypeStruct((16, 4), "float32")}, sr.loads(DATA_PARALLEL), {"data": 8})
    cost = sr.StepCost(
        8, 2e9, 1e9, 4e9, 3 * 2**20, 2**20, 2**20, 2**20, (sr.Collective("all-gather", 3, 4096, ("mlp",)),)
    )
    html = page(plan, cost=cost)
    assert "2.00 GFLOP (2.00x the ideal 1.00 GFLOP)" in html
    assert '<td>all-gather</td><td class="num">3</td><td class="num">4.0 KiB</td><td>mlp</td>' in html
    assert "Step cost" not in page(plan)
    assert math.isclose(cost.ratio or 0, 2.0)


def test_a_step_in_the_settings_leaves_dump_as_it_was(project, capsys, tmp_path: Path) -> None:
    plain = _dump(capsys, "dp.shard", project)
    (tmp_path / "pyproject.toml").write_text(f'[tool.shardrules]\nstep = "{project}:check_step"\n')
    assert _dump(capsys, "dp.shard", project) == plain  # lint's step: dump records a cost only when asked
    assert '"version": 4,' in _dump(capsys, "dp.shard", project, "--step", f"{project}:check_step")


def test_collectives_out_of_the_writers_order_are_refused(costly: str) -> None:
    row = '{"kind": "all-reduce", "count": 2, "bytes_per_device": 512, "scopes": ["mlp"]}'
    gather = '{"kind": "all-gather", "count": 1, "bytes_per_device": 64, "scopes": []}'
    assert sr.Plan.from_json(_edited(costly, row, gather + ",\n      " + row))  # the writer's order
    with pytest.raises(sr.PlanFileError, match="all-gather is listed twice or out of order"):
        sr.Plan.from_json(_edited(costly, row, row + ",\n      " + gather))


def test_a_cost_no_reader_would_take_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    plan = sr.plan({"w": jax.ShapeDtypeStruct((16, 4), "float32")}, sr.loads(DATA_PARALLEL), {"data": 8})
    cost = json.loads(_costly(plan.to_json()))["step_cost"]
    golden = tmp_path / "golden.json"
    bad = [
        ({}, ValueError),
        ("x", TypeError),
        (0, TypeError),
        (cost | {"ratio": 99.0}, ValueError),
        (cost | {"flops_per_device": math.nan}, ValueError),
        (cost | {"peak_bytes_per_device": -5}, ValueError),
        (cost | {"flops_per_device": 10**400}, ValueError),
        (cost | {"collectives": [{"kind": "all-reduce", "count": 1, "bytes_per_device": 1}]}, TypeError),
    ]
    for value, error in bad:
        with pytest.raises(error, match="cost="):
            sr.assert_plan_matches(plan, golden, cost=value, update=True)
        assert not golden.exists(), value
    for rtol in (-1, math.nan, "0.1", True):
        with pytest.raises(ValueError, match="rtol= is a relative tolerance"):
            sr.assert_plan_matches(plan, golden, cost=cost, rtol=rtol, update=True)  # type: ignore[arg-type]
    assert not golden.exists()


def test_a_golden_file_without_a_cost_given_one_says_so(tmp_path: Path) -> None:
    plan = sr.plan({"w": jax.ShapeDtypeStruct((16, 4), "float32")}, sr.loads(DATA_PARALLEL), {"data": 8})
    cost = json.loads(_costly(plan.to_json()))["step_cost"]
    golden = tmp_path / "golden.json"
    sr.assert_plan_matches(plan, golden, update=True)
    with pytest.raises(AssertionError, match="records no step cost, and cost= was given"):
        sr.assert_plan_matches(plan, golden, cost=cost, update=False)


def test_a_ratio_that_comes_or_goes_is_said_as_none() -> None:
    old = json.loads(COSTLY)["step_cost"]
    new = old | {"ideal_flops_per_device": None, "ratio": None}
    assert "FLOPs against the ideal: 2 -> none" in cost_changes(old, new)
    zero = sr.StepCost(8, 0.0, 1e6, 0.0, 0, 0, 0, 0)
    assert "(0.00x the ideal 1.00 MFLOP)" in str(zero)  # a ratio of 0 is a ratio, not none
