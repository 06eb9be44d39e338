"""A step's cost for a target kept with its plan: `shardrules dump --step
--target NAME` writes version 3 of the plan file (version 2 and the target's
keys in `step_cost`), a reader checks it strictly, `diff` shows each side's
target, fit and estimated time, a golden plan (`assert_plan_matches(cost=)`)
fails when the target, the fit or the time moves, and the HTML report shows
the target's rows. GPU targets (`h100`) need nothing but the simulated CPU
devices; the TPU class needs libtpu."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import itertools
import json
import math
from pathlib import Path

import jax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType
from test_cost_in_plans import DATA_PARALLEL, REPLICATED, STEP  # the step and rules costed there

import shardrules as sr
from shardrules._cli._main import main
from shardrules._reports import _targetfile
from shardrules._reports._costfile import KINDS, checked, read_cost, recorded
from shardrules._reports._dump import dumps
from shardrules._reports._dumpread import loads
from shardrules._reports._html import page

REPO = Path(__file__).resolve().parents[1]
_names = itertools.count()
NO_LIBTPU = importlib.util.find_spec("libtpu") is None


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both rule files and a module of the step (a fresh name each time) in
    the current folder; returns the module's name."""
    module = f"target_steps_{next(_names)}"
    (tmp_path / "dp.shard").write_text(DATA_PARALLEL)
    (tmp_path / "replicated.shard").write_text(REPLICATED)
    (tmp_path / f"{module}.py").write_text(STEP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return module


def _dump(capsys: pytest.CaptureFixture[str], rules: str, module: str, *extra: str) -> str:
    assert main(["dump", rules, "--shapes", f"{module}:params", *extra]) == 0
    return capsys.readouterr().out


def _api_cost(module_name: str, rules_text: str, target: str) -> sr.StepCost:
    module = importlib.import_module(module_name)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    step, args = module.check_step(sr.loads(rules_text, name="dp.shard"), mesh)
    return step.cost(*args, target=target)


def _cost(
    target: str | None = "h100", *, peak: int = 8192, scale: float = 1.0, devices: int = 8
) -> sr.StepCost:
    """A made-up cost for `target`, its estimate's figures consistent."""
    estimate = sr.TimeEstimate(
        compute_s=2e-6 * scale,
        memory_s=1e-6 * scale,
        communication_s=5e-7,
        links=(("ici", 5e-7),) if target and target.startswith("v") else (("nvlink", 5e-7),),
        dtype="bf16",
        peak_flops=989e12,
        model_flops_per_device=1000.0,
    )
    on_tpu = bool(target and target.startswith("v"))
    return sr.StepCost(
        devices,
        2000.0,
        1000.0,
        4096.0,
        peak,
        4096,
        2048,
        2048,
        (sr.Collective("all-reduce", 2, 512, ("mlp",)),),
        target=target,
        compiler="tpu" if on_tpu else "cpu",
        code_bytes_per_device=1024 if on_tpu else 0,
        hbm_bytes_per_device=None if target is None else 80 * 2**30,
        estimate=None if target is None else estimate,
    )


def _plan() -> sr.Plan:
    return sr.plan({"w": jax.ShapeDtypeStruct((16, 4), "float32")}, sr.loads(DATA_PARALLEL), {"data": 8})


def _file(cost: sr.StepCost | dict | None = None) -> str:
    table = loads(_plan().to_json())
    return dumps(dataclasses.replace(table, step_cost=None if cost is None else recorded(cost, "train:step")))


# --- the file ------------------------------------------------------------------------------------


def _without_rules(text: str) -> str:
    """A version 4 file as versions 2 and 3 wrote it: `by_rule` left out."""
    table = loads(text)
    assert table.version == 4 and table.step_cost is not None
    cost = {key: value for key, value in table.step_cost.items() if key != "by_rule"}
    older = dumps(dataclasses.replace(table, step_cost=cost))
    rules = [line for line in text.splitlines() if line not in older.splitlines()]
    assert rules[0] == '  "version": 4,' and rules[1].endswith(","), rules  # the key before it, and by_rule
    assert rules[2] == '    "by_rule": [', rules  # the last key, one line per rule line
    rows = rules[3:-1] if rules[-1] == "    ]" else rules[3:]  # `]` is new after the estimate's `}`
    assert rows and all(line.startswith('      {"rule": ') for line in rows), rules
    return older


def test_dump_step_target_writes_version_3(project, capsys) -> None:
    step = ["--step", f"{project}:check_step"]
    v2 = _without_rules(_dump(capsys, "dp.shard", project, *step))  # both record by_rule: version 4
    text = _without_rules(_dump(capsys, "dp.shard", project, *step, "--target", "h100"))
    assert '"version": 3,' in text and '"version": 2,' in v2
    cost = json.loads(text)["step_cost"]
    assert list(cost)[-6:] == list(_targetfile.TARGET_KEYS)
    assert list(cost["estimate"]) == list(_targetfile.ESTIMATE_KEYS)
    expected = _api_cost(project, DATA_PARALLEL, "h100")  # the Python API's cost for the same target
    assert cost["target"] == "h100" and cost["compiler"] == "cpu" and cost["code_bytes_per_device"] == 0
    assert cost["hbm_bytes_per_device"] == expected.hbm_bytes_per_device == 80 * 2**30
    assert cost["fits"] is True
    assert expected.estimate is not None
    assert cost["estimate"]["total_s"] == expected.time_estimate_s
    assert cost["estimate"]["mfu"] == expected.estimate.mfu
    assert cost["estimate"]["links"] == dict(expected.estimate.links)
    # version 2's lines unchanged and in place; the target's after the collectives, one key per line
    new, old = text.splitlines(), v2.splitlines()
    start = new.index('    "target": "h100",')
    end = new.index("    }", start) + 1  # the estimate's last line
    assert new[end - 11 : end - 1] == [
        f'      "{key}": {json.dumps(cost["estimate"][key])}' + "," * (key != "model_flops_per_device")
        for key in _targetfile.ESTIMATE_KEYS
    ]
    assert new[: start - 1] == [line.replace('"version": 2', '"version": 3') for line in old[: start - 1]]
    assert new[start - 1] == old[start - 1] + ","  # the collectives: no longer the last key
    assert new[end:] == old[start:]
    # read back: the same table and cost; written again, the same bytes
    table = loads(text)
    assert table.step_cost == cost and dumps(table) == text
    assert sr.Plan.from_json(text).to_json() == _dump(capsys, "dp.shard", project)


def test_files_without_a_target_are_written_as_before() -> None:
    assert '"version": 1,' in _file() and "step_cost" not in _file()
    v2 = _file(_cost(None))
    assert '"version": 2,' in v2 and '"target"' not in v2 and '"estimate"' not in v2
    assert '"version": 3,' in _file(_cost("h100"))
    goldens = sorted((REPO / "tests" / "data" / "golden").glob("*.json"))
    assert goldens
    for golden in goldens:  # checked-in files of versions 1 and 2 read and write back byte for byte
        text = golden.read_text()
        assert dumps(loads(text)) == text, golden


def test_a_v3_file_reads_back_the_target_it_records() -> None:
    text = _file(_cost("v5e:2x4"))
    back = loads(text).step_cost
    assert back is not None
    assert back["target"] == "v5e:2x4" and back["compiler"] == "tpu" and back["code_bytes_per_device"] == 1024
    assert back["estimate"]["bound"] == "compute" and back["estimate"]["links"] == {"ici": 5e-7}
    assert back["estimate"]["total_s"] == pytest.approx(2.5e-6)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            '"version": 3',
            '"version": 2',
            '"target", a key of version 3 (a cost for a --target), but the file says version 2',
        ),
        ('"target": "h100"', '"target": "h1000"', '"target" is a TPU topology or a GPU (v4:SHAPE'),
        ('"target": "h100"', '"target": "v7x:2x2"', '"target" is a TPU topology or a GPU'),
        ('"target": "h100"', '"target": null', '"target" is a TPU topology or a GPU'),
        ('"target": "h100"', '"target": "H100"', '"target" is a TPU topology or a GPU'),
        (
            '"compiler": "cpu"',
            '"compiler": "gpu"',
            '"compiler" is "cpu" for h100 (a GPU: XLA\'s CPU compiler',
        ),
        ('"compiler": "cpu"', '"compiler": "tpu"', '"compiler" is "cpu"'),
        (
            '"code_bytes_per_device": 0',
            '"code_bytes_per_device": 64',
            '"code_bytes_per_device" is 0 for the CPU',
        ),
        (
            '"code_bytes_per_device": 0',
            '"code_bytes_per_device": -1',
            '"code_bytes_per_device" is a whole number',
        ),
        (
            '"hbm_bytes_per_device": 85899345920',
            '"hbm_bytes_per_device": 0',
            '"hbm_bytes_per_device" is a whole number from 1',
        ),
        (
            '"hbm_bytes_per_device": 85899345920',
            '"hbm_bytes_per_device": "80 GiB"',
            '"hbm_bytes_per_device" is a whole',
        ),
        (
            '"hbm_bytes_per_device": 85899345920',
            '"hbm_bytes_per_device": 4096',
            '"fits" is false: the peak (8192) is over',
        ),
        ('"fits": true', '"fits": false', '"fits" is true: the peak (8192) is at most'),
        ('"fits": true', '"fits": 1', '"fits" is true'),
        (
            f'"total_s": {2e-6 + 5e-7!r}',
            '"total_s": 3e-06',
            '"total_s" is 3e-06, but max(compute_s, memory_s) + communication_s',
        ),
        ('"compute_s": 2e-06', '"compute_s": -2e-06', '"estimate": "compute_s" is a number from 0 to 10^30'),
        ('"memory_s": 1e-06', '"memory_s": 1e+31', '"estimate": "memory_s" is a number from 0 to 10^30'),
        ('"memory_s": 1e-06', '"memory_s": NaN', '"memory_s" is a number'),
        ('"dtype": "bf16"', '"dtype": "bfloat16"', '"dtype" is one of bf16, f32, fp8, int8'),
        ('"bound": "compute"', '"bound": "memory"', '"bound" is "compute", the largest part'),
        (
            '"links": {"nvlink": 5e-07}',
            '"links": {"ici": 5e-07}',
            '"links" is an object of seconds by link (network, nvlink',
        ),
        ('"links": {"nvlink": 5e-07}', '"links": {"nvlink": 4e-07}', "but its links sum to 4e-07"),
        ('"links": {"nvlink": 5e-07}', '"links": {"nvlink": 5e-07, "network": 0.0}', "in that order"),
        ('"mfu": ', '"mfu": 0.5, "x": ', 'has the key "x"'),
        ('"peak_flops": 989000000000000.0', '"peak_flops": 0.0', '"peak_flops" is the chip\'s FLOPs'),
        ('"model_flops_per_device": 1000.0', '"model_flops_per_device": 2000.0', '"mfu" is '),
        ('      "dtype": "bf16",\n', "", "lacks the key 'dtype'"),
        ('    "fits": true,\n', "", "lacks the key 'fits'"),
        ('"bound": "compute",', '"bound": "compute", "speed": 1,', 'has the key "speed"'),
        ('"estimate": {', '"estimate": null, "e": {', 'has the key "e"'),
    ],
)
def test_a_hand_edited_target_is_refused_with_sr124(old: str, new: str, message: str) -> None:
    text = _file(_cost("h100"))
    assert old in text, old
    with pytest.raises(sr.PlanFileError) as info:
        sr.Plan.from_json(text.replace(old, new, 1))
    assert info.value.code == "SR124"
    assert message in str(info.value), str(info.value)


def test_a_v3_file_is_refused_without_its_keys_and_a_topology_of_other_chips() -> None:
    v2 = _file(_cost(None))
    with pytest.raises(sr.PlanFileError, match="lacks the key 'target'"):
        sr.Plan.from_json(v2.replace('"version": 2', '"version": 3', 1))
    tpu = _file(_cost("v5e:2x4"))
    with pytest.raises(sr.PlanFileError, match='the target v5e:4x4 has 16 chips, but "devices" is 8'):
        sr.Plan.from_json(tpu.replace('"target": "v5e:2x4"', '"target": "v5e:4x4"', 1))
    with pytest.raises(sr.PlanFileError, match='"compiler" is "tpu"'):
        sr.Plan.from_json(tpu.replace('"compiler": "tpu"', '"compiler": "cpu"', 1))
    with pytest.raises(sr.PlanFileError, match="reads versions 1, 2, 3 and 4"):
        sr.Plan.from_json(tpu.replace('"version": 3', '"version": 5', 1))
    with pytest.raises(sr.PlanFileError, match="\"step_cost\" lacks the key 'by_rule'"):
        sr.Plan.from_json(tpu.replace('"version": 3', '"version": 4', 1))  # version 4 records by_rule
    with pytest.raises(ValueError, match=r"cost= is not a step's cost: .*h1000"):
        checked(_cost("h100").to_json() | {"target": "h1000"})


def test_the_dtype_classes_a_file_knows_are_the_chip_tables() -> None:
    from shardrules._planning import _chips

    assert {_chips.dtype_class(d) for d in ("bf16", "f32", "f8e4m3fn", "s8")} == set(_targetfile.DTYPES)


# --- a round trip of any cost --------------------------------------------------------------------

finite = st.floats(min_value=0, max_value=1e18, allow_nan=False)
whole = st.integers(min_value=0, max_value=2**62)
COSTLY = _file()


@st.composite
def any_cost(draw: st.DrawFn) -> dict | None:
    """A `step_cost` of version 1 (`None`), 2 or 3, as a writer records it."""
    version = draw(st.sampled_from((1, 2, 3)))
    if version == 1:
        return None
    # FLOPs are counts: an ideal is none, 0, or at least one FLOP (a tiny float would make a ratio
    # beyond any figure a file may hold, which no step gives)
    flops, ideal = draw(finite), draw(st.one_of(st.none(), st.just(0.0), st.floats(1, 1e18)))
    kinds = sorted(draw(st.lists(st.sampled_from(KINDS), unique=True, max_size=5)), key=KINDS.index)
    target = draw(st.sampled_from(["h100", "b200", "a100-80g", "v5e:2x4", "v5p:2x2x2", "v4:2x2x2"]))
    on_tpu = target.startswith("v")
    devices = (
        math.prod(int(n) for n in target.split(":")[1].split("x")) if on_tpu else draw(st.integers(1, 2**20))
    )
    peak, memory = draw(whole), draw(st.integers(min_value=1, max_value=2**62))
    cost = sr.StepCost(
        devices,
        flops,
        ideal,
        draw(finite),
        peak,
        draw(whole),
        draw(whole),
        draw(whole),
        tuple(
            sr.Collective(
                kind,
                draw(st.integers(1, 2**62)),
                draw(whole),
                tuple(draw(st.lists(st.text(max_size=12), max_size=3))),
            )
            for kind in kinds
        ),
        target=target if version == 3 else None,
        compiler="tpu" if on_tpu else "cpu",
        code_bytes_per_device=draw(whole) if on_tpu else 0,
        hbm_bytes_per_device=memory if version == 3 else None,
        estimate=sr.TimeEstimate(
            draw(finite),
            draw(finite),
            0.0,
            tuple(
                sorted(
                    dict.fromkeys(
                        draw(st.lists(st.sampled_from(("ici",) if on_tpu else ("network", "nvlink")))), 0.0
                    ).items()
                )
            ),
            draw(st.sampled_from(_targetfile.DTYPES)),
            draw(st.floats(min_value=1, max_value=1e18)),
            draw(finite),
        )
        if version == 3
        else None,
    )
    links = cost.estimate.links if cost.estimate else ()
    if cost.estimate is not None and links:  # the communication its links sum to
        seconds = tuple((link, draw(finite)) for link, _ in links)
        cost = dataclasses.replace(
            cost,
            estimate=dataclasses.replace(
                cost.estimate, links=seconds, communication_s=math.fsum(s for _, s in seconds)
            ),
        )
    return recorded(cost, draw(st.one_of(st.none(), st.text(min_size=1, max_size=20))))


@settings(max_examples=80, deadline=None)
@given(cost=any_cost())
def test_any_file_of_any_version_is_written_and_read_back_unchanged(cost: dict | None) -> None:
    table = dataclasses.replace(loads(COSTLY), step_cost=cost)
    text = dumps(table)
    assert f'"version": {1 if cost is None else 3 if "target" in cost else 2},' in text
    back = loads(text)
    assert back.step_cost == cost and dumps(back) == text
    if cost is not None:
        assert read_cost(json.loads(text)["step_cost"], 3 if "target" in cost else 2) == cost


# --- diff ----------------------------------------------------------------------------------------


def _row(out: str, name: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith(name))
    return [cell for cell in line[len(name) :].split("  ") if cell.strip()]


def test_diff_of_two_target_dumps_shows_each_sides_target(project, capsys, tmp_path: Path) -> None:
    step = ["--step", f"{project}:check_step"]
    (tmp_path / "dp.json").write_text(_dump(capsys, "dp.shard", project, *step, "--target", "h100"))
    (tmp_path / "rep.json").write_text(_dump(capsys, "replicated.shard", project, *step, "--target", "h100"))
    (tmp_path / "plain.json").write_text(_dump(capsys, "dp.shard", project, *step))
    assert main(["diff", "rep.json", "dp.json"]) == 0
    captured = capsys.readouterr()
    assert "note" not in captured.err  # the same target: nothing to say
    out = captured.out
    assert [c.strip() for c in _row(out, "target")] == ["h100", "h100", "same"]
    assert [c.strip() for c in _row(out, "compiler")] == ["cpu", "cpu", "-"]
    assert _row(out, "fits the chip's memory")[0].strip().startswith("yes (0.0% of 80.0 GiB)")
    time = [c.strip() for c in _row(out, "step time (estimate)")]
    recorded_a = json.loads((tmp_path / "rep.json").read_text())["step_cost"]["estimate"]
    recorded_b = json.loads((tmp_path / "dp.json").read_text())["step_cost"]["estimate"]
    assert time[2] == f"{recorded_b['total_s'] / recorded_a['total_s']:.2f}x"
    assert "MFU (estimate)" in out
    assert main(["diff", "rep.json", "dp.json", "--format", "json"]) == 0
    found = json.loads(capsys.readouterr().out)["step_cost"]
    assert found["a"]["target"] == found["b"]["target"] == "h100" and found["b"]["fits"] is True
    assert found["b"]["estimate"]["total_s"] == recorded_b["total_s"]
    # one side without a target: its cells say so, and a note says why the figures may differ
    assert main(["diff", "plain.json", "dp.json"]) == 0
    captured = capsys.readouterr()
    assert [c.strip() for c in _row(captured.out, "target")] == ["-", "h100", "differs"]
    assert "note: only B is costed for a target (h100)" in captured.err


def test_diff_of_dumps_for_two_targets_notes_it() -> None:
    tables = {"a": _file(_cost("h100")), "b": _file(_cost("v5e:2x4"))}
    from shardrules._cli import _stepcost
    from shardrules._costs._cost import cost_from_json

    costs = {side: cost_from_json(loads(text).step_cost or {}) for side, text in tables.items()}
    note = _stepcost.target_note(costs)
    assert note is not None and "A is costed for h100 and B for v5e:2x4" in note
    rows = {row[0]: row[1:] for row in _stepcost.cost_rows(costs)}
    assert rows["target"] == ("h100", "v5e:2x4", "differs") and rows["compiler"] == ("cpu", "tpu", "-")
    assert rows["step time (estimate)"] == ("2.5 µs", "2.5 µs", "1.00x")
    assert _stepcost.target_note({"a": costs["a"], "b": costs["a"]}) is None


def test_diff_step_target_costs_both_sides_for_it(project, capsys) -> None:
    argv = ["diff", "replicated.shard", "dp.shard", "--shapes", f"{project}:params"]
    assert main([*argv, "--step", f"{project}:check_step", "--target", "h100"]) == 0
    captured = capsys.readouterr()
    assert [c.strip() for c in _row(captured.out, "target")] == ["h100", "h100", "same"]
    expected = _api_cost(project, DATA_PARALLEL, "h100")
    assert expected.time_estimate_s is not None
    from shardrules._planning._units import format_seconds as seconds_text

    assert _row(captured.out, "step time (estimate)")[1].strip() == seconds_text(expected.time_estimate_s)
    assert "note" not in captured.err


# --- golden plans --------------------------------------------------------------------------------


def test_a_golden_plan_compares_the_target_the_fit_and_the_time(tmp_path: Path) -> None:
    plan, golden = _plan(), tmp_path / "golden.json"
    sr.assert_plan_matches(plan, golden, cost=_cost("h100"), update=True)
    assert json.loads(golden.read_text())["version"] == 3
    sr.assert_plan_matches(plan, golden, cost=_cost("h100"), update=False)
    sr.assert_plan_matches(plan, golden, cost=_cost("h100", scale=1.01), update=False)  # within 2%
    with pytest.raises(AssertionError, match=r"estimated step time: 2.5 µs -> 2.9 µs \(1.16x\)"):
        sr.assert_plan_matches(plan, golden, cost=_cost("h100", scale=1.2), update=False)
    sr.assert_plan_matches(plan, golden, cost=_cost("h100", scale=1.2), rtol=0.2, update=False)
    with pytest.raises(AssertionError, match="target: h100 -> v5e:2x4"):
        sr.assert_plan_matches(plan, golden, cost=_cost("v5e:2x4"), rtol=10, update=False)
    with pytest.raises(AssertionError, match="target: h100 -> none"):
        sr.assert_plan_matches(plan, golden, cost=_cost(None), rtol=10, update=False)
    over = _cost("h100", peak=81 * 2**30)
    with pytest.raises(AssertionError) as info:
        sr.assert_plan_matches(plan, golden, cost=over, rtol=10**12, update=False)
    assert "fits the chip's memory: yes -> no" in str(info.value)
    assert "peak bytes per device" not in str(info.value)  # within this rtol: only the fit moved
    sr.assert_plan_matches(plan, golden, cost=_cost(None), update=True)  # version 2
    with pytest.raises(AssertionError, match="target: none -> h100"):
        sr.assert_plan_matches(plan, golden, cost=_cost("h100"), update=False)


def test_a_golden_plan_with_a_real_target_cost(project, tmp_path: Path) -> None:
    params = {
        "up": jax.ShapeDtypeStruct((64, 256), "float32"),
        "down": jax.ShapeDtypeStruct((256, 64), "float32"),
    }
    plan = sr.plan(params, sr.loads(DATA_PARALLEL, name="dp.shard"), {"data": 8})
    golden = tmp_path / "step.json"
    cost = _api_cost(project, DATA_PARALLEL, "h100")
    sr.assert_plan_matches(plan, golden, cost=cost, update=True)
    assert json.loads(golden.read_text())["step_cost"]["target"] == "h100"
    sr.assert_plan_matches(plan, golden, cost=cost, update=False)
    with pytest.raises(AssertionError, match="estimated step time"):
        sr.assert_plan_matches(plan, golden, cost=_api_cost(project, REPLICATED, "h100"), update=False)


# --- the HTML report -----------------------------------------------------------------------------


def test_the_html_report_shows_the_target() -> None:
    html = page(_plan(), cost=_cost("v5e:2x4"))
    assert '<td>target</td><td class="num">v5e:2x4</td>' in html
    assert '<td>compiled by</td><td class="num">the TPU compiler</td>' in html
    assert '<td>generated code per device</td><td class="num">1.0 KiB (in the peak)</td>' in html
    assert "yes: peak 8.0 KiB of 80.0 GiB (0.0%)" in html
    assert '<td>step time (estimate)</td><td class="num">2.5 µs, compute-bound</td>' in html
    assert "2.0 µs at bf16 peak" in html and "500.0 ns (ici 500.0 ns)" in html
    expected_mfu = 1000.0 / (2.5e-6 * 989e12)
    assert f'<td>MFU (estimate)</td><td class="num">{expected_mfu:.1%}</td>' in html
    over = page(_plan(), cost=_cost("h100", peak=81 * 2**30))
    assert "no: peak 81.0 GiB of 80.0 GiB, over by 1.0 GiB" in over and "XLA&#x27;s CPU compiler" in over
    assert "<td>target</td>" not in page(_plan(), cost=_cost(None))


def test_explain_html_with_a_target(project, capsys, tmp_path: Path) -> None:
    argv = ["explain", "dp.shard", "--shapes", f"{project}:params", "--step", f"{project}:check_step"]
    assert main([*argv, "--target", "h100", "--html", "report.html"]) == 0
    capsys.readouterr()
    html = (tmp_path / "report.html").read_text()
    assert '<td>target</td><td class="num">h100</td>' in html and "fits the chip&#x27;s memory" in html
    assert "step time (estimate)" in html and "MFU (estimate)" in html


# --- a TPU target: the TPU compiler --------------------------------------------------------------


@pytest.mark.skipif(NO_LIBTPU, reason="libtpu is not installed: pip install 'shardrules[tpu]'")
class TestTpuTarget:
    def test_dump_and_diff_for_a_tpu_topology(self, project, capsys, tmp_path: Path) -> None:
        step = ["--step", f"{project}:check_step", "--target", "v5e:2x4"]
        text = _dump(capsys, "dp.shard", project, *step)
        cost = json.loads(text)["step_cost"]
        # a target's keys (version 3) and the collectives per rule line (4): the gradients' all-reduce
        assert json.loads(text)["version"] == 4 and cost["by_rule"]
        assert cost["target"] == "v5e:2x4" and cost["compiler"] == "tpu"
        assert cost["code_bytes_per_device"] > 0 and cost["fits"] is True
        assert cost["hbm_bytes_per_device"] == 16 * 2**30
        assert set(cost["estimate"]["links"]) <= {"ici"}
        assert dumps(loads(text)) == text
        (tmp_path / "tpu.json").write_text(text)
        (tmp_path / "gpu.json").write_text(_dump(capsys, "dp.shard", project, *step[:-1], "h100"))
        assert main(["diff", "gpu.json", "tpu.json"]) == 0
        captured = capsys.readouterr()
        assert [c.strip() for c in _row(captured.out, "compiler")] == ["cpu", "tpu", "-"]
        assert "A is costed for h100 and B for v5e:2x4" in captured.err
