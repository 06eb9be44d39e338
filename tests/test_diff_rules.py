"""`diff --step` (and a diff of two dumps written by `dump --step`) shows the
collective bytes each rule line is for under A and under B, the two sides'
rules matched by their text, then their pattern, then their line; and the
plan file's version 4 records them (`by_rule` in `step_cost`)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path

import pytest
from test_cli_step import RULES, STEP

import shardrules as sr
from shardrules._cli._main import main
from shardrules._cli._rulediff import HEADER, matched
from shardrules._costs._attribute import RuleCost, Share
from shardrules._reports._dump import dumps
from shardrules._reports._dumpread import loads

REPLICATED = RULES.replace('"up$"   -> (_, model)', '"up$"   -> replicated').replace(
    '"down$" -> (model, _)', '"down$" -> replicated'
)
SHAPES = "\n\ndef param_shapes():\n    return shapes()[0]\n"

_names = itertools.count()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    module = f"rule_steps_{next(_names)}"
    (tmp_path / "tp.shard").write_text(RULES)
    (tmp_path / "rep.shard").write_text(REPLICATED)
    (tmp_path / f"{module}.py").write_text(STEP + SHAPES)
    monkeypatch.chdir(tmp_path)
    return module


def _cost(rule: str, text: str, nbytes: int, kind: str = "all-reduce") -> RuleCost:
    return RuleCost(rule, text, (Share(kind, 1, nbytes),), ("params/w",))


def test_rules_are_matched_by_text_then_pattern_then_line() -> None:
    a = [
        _cost("a.shard:4", '"up$" -> (_, model)', 100),
        _cost("a.shard:5", '"down$" -> replicated', 300),
        _cost("a.shard:9", '"head" -> (model, _)', 50),
        _cost("common.shard:2", '"norm" -> replicated', 10),
        _cost("inferred", "", 1000),
        _cost("a.shard:12", '"gone" -> (data)', 70),
    ]
    b = [
        _cost("b.shard:7", '"up$" -> (_, model)', 100),  # moved: the same text
        _cost("b.shard:5", '"down$" -> (model, _)', 900),  # its spec changed
        _cost("b.shard:9", '"lm_head" -> (model, _)', 20),  # rewritten in place
        _cost("common.shard:2", '"norms" -> replicated', 10),  # an include's line
        _cost("the model's code", "", 5),
        _cost("inferred", "", 400),
    ]
    found = matched(a, b, ("a.shard", "b.shard"))
    pairs = {(c.a.rule if c.a else None, c.b.rule if c.b else None): c.matched_by for c in found}
    assert pairs == {
        ("inferred", "inferred"): "owner",
        ("a.shard:4", "b.shard:7"): "text",
        ("a.shard:5", "b.shard:5"): "pattern",
        ("a.shard:9", "b.shard:9"): "line",
        ("common.shard:2", "common.shard:2"): "line",
        ("a.shard:12", None): None,
        (None, "the model's code"): None,
    }
    # most changed first (inferred's 600 fewer before down's 600 more: more bytes), then 70, 30, 5
    assert [c.change for c in found] == [-600, 600, -70, -30, 5, 0, 0]
    # one pattern in two groups: the pair nearest in line is taken
    a = [_cost("a.shard:8", '"up$" -> (data, model)', 200), _cost("a.shard:4", '"up$" -> replicated', 0)]
    b = [_cost("b.shard:4", '"up$" -> (_, model)', 0)]
    pairs = {
        (c.a.rule if c.a else None, c.b.rule if c.b else None) for c in matched(a, b, ("a.shard", "b.shard"))
    }
    assert pairs == {("a.shard:4", "b.shard:4"), ("a.shard:8", None)}
    a, b = (
        [_cost("a.shard:9", '"head" -> (model, _)', 50)],
        [_cost("b.shard:9", '"lm_head" -> (model, _)', 20)],
    )
    # without the top-level names, line 9 of two files of other names is not the same line
    assert ("a.shard:9", None) in {
        (c.a.rule if c.a else None, c.b.rule if c.b else None) for c in matched(a, b)
    }


def test_diff_step_shows_the_collectives_of_each_rule_line(project, capsys) -> None:
    argv = ["diff", "rep.shard", "tp.shard", "--step", f"{project}:check_step"]
    assert main([*argv, "--format", "json"]) == 1
    found = json.loads(capsys.readouterr().out)
    rows, costs = found["step_cost_by_rule"], found["step_cost"]
    for side in ("a", "b"):  # every collective is some rule's (or inferred, or the model's code)
        total = sum(c["bytes_per_device"] for c in costs[side]["collectives"])
        assert sum(r["bytes_per_device"][side] for r in rows) == total > 0
    changes = [abs(r["change"]) for r in rows]
    assert changes == sorted(changes, reverse=True) and changes[0] > 0
    down = next(r for r in rows if r["b"] is not None and r["b"]["rule"] == "tp.shard:5")
    assert down["matched_by"] == "pattern" and down["a"]["rule"] == "rep.shard:5"
    assert (down["a"]["text"], down["b"]["text"]) == ('"down$" -> replicated', '"down$" -> (model, _)')
    assert down["change"] == down["bytes_per_device"]["b"] - down["bytes_per_device"]["a"]
    # its products: the backward's and the forward's, split over `model` under B
    flops = down["matmul_flops_per_device"]
    assert 0 < flops["b"] < flops["a"]
    up = next(r for r in rows if r["b"] is not None and r["b"]["rule"] == "tp.shard:4")
    assert (
        up["a"]["rule"] == "rep.shard:4" and up["matched_by"] == "pattern"
    )  # not the activation rule's `up$`
    assert main(argv) == 1
    out = capsys.readouterr().out
    table = out[out.index("rule line  ") :].splitlines()
    assert re.split(r"\s{2,}", table[0].strip()) == list(HEADER)
    assert any(
        line.startswith("rep.shard:5 -> tp.shard:5")
        and '"down$" -> replicated  =>  "down$" -> (model, _)' in line
        for line in table
    ), table
    assert "FLOPs per device" in out  # the totals, before the rules


def test_two_dumps_compare_what_they_record_rule_by_rule(project, capsys) -> None:
    step = ["--step", f"{project}:check_step"]
    for name in ("rep", "tp"):
        assert (
            main(
                ["dump", f"{name}.shard", "--shapes", f"{project}:param_shapes", *step, "-o", f"{name}.json"]
            )
            == 0
        )
    text = Path("tp.json").read_text()
    assert '"version": 4,' in text and '    "by_rule": [' in text
    assert main(["diff", "rep.json", "tp.json", "--format", "json"]) == 1
    from_dumps = json.loads(capsys.readouterr().out)["step_cost_by_rule"]
    assert main(["diff", "rep.shard", "tp.shard", *step, "--format", "json"]) == 1
    from_rules = json.loads(capsys.readouterr().out)["step_cost_by_rule"]
    assert from_dumps == from_rules
    # a dump that records no rules (an earlier dump --step): the totals still compare, the rules do not
    table = loads(Path("rep.json").read_text())
    assert table.step_cost is not None
    older = {k: v for k, v in table.step_cost.items() if k != "by_rule"}
    Path("old.json").write_text(dumps(dataclasses.replace(table, step_cost=older)))
    assert '"version": 2,' in Path("old.json").read_text()
    assert main(["diff", "old.json", "tp.json", "--format", "json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["step_cost_by_rule"] is None
    assert "A's cost records no collectives per rule line" in captured.err


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace('"version": 4', '"version": 2', 1), 'has "by_rule", a key of version 4'),
        (lambda t: t.replace('"rule": "inferred"', '"rule": "tp.shard:5"', 1), "is listed twice"),
        (lambda t: t.replace('"rule": "inferred"', '"rule": ""', 1), 'has the rule ""'),
        (
            lambda t: t.replace('"kind": "all-reduce", "count": 1', '"kind": "all-sum", "count": 1', 1),
            "all-sum",
        ),
        (lambda t: t.replace('"arrays": ["', '"arrays": [1, "', 1), "are a list of names"),
    ],
    ids=["v2", "twice", "no-rule", "kind", "arrays"],
)
def test_a_hand_edited_by_rule_is_refused(project, edit, message) -> None:
    argv = ["dump", "tp.shard", "--shapes", f"{project}:param_shapes", "--step", f"{project}:check_step"]
    assert main([*argv, "-o", "tp.json"]) == 0
    text = Path("tp.json").read_text()
    sr.Plan.from_json(text)  # as written, it reads
    with pytest.raises(sr.PlanFileError, match="SR124") as info:
        sr.Plan.from_json(edit(text))
    assert message in str(info.value), str(info.value)
