"""`diff --step` (and a diff of two dumps written by `dump --step`, version 4
of the plan file) shows the collective bytes each rule line is for under A
and under B, the two sides' rules matched by their text, then their
pattern, then their line, most changed first."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path

import pytest
from test_cli_step import RULES, STEP

from shardrules._cli._main import main
from shardrules._cli._rulediff import HEADER, changes, matched_by
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


class _Cost:
    """What `changes` reads of a cost: its `to_json()`'s collectives and `by_rule`."""

    def __init__(self, *rows: tuple[str, str, int]) -> None:
        self.rows = rows

    def to_json(self) -> dict:
        by_rule = [
            {
                "rule": r,
                "text": t,
                "bytes_per_device": n,
                "collectives": [{"kind": "all-reduce", "count": 1, "bytes_per_device": n}],
            }
            for r, t, n in self.rows
        ]
        total = sum(n for _, _, n in self.rows)
        return {
            "collectives": [{"kind": "all-reduce", "count": 1, "bytes_per_device": total}],
            "by_rule": by_rule,
        }


def _pairs(found) -> dict:
    return {
        (m.before["rule"] if m.before else None, m.after["rule"] if m.after else None): matched_by(m)
        for m in found
    }


def test_rules_are_matched_by_text_then_pattern_then_line_most_changed_first() -> None:
    a = _Cost(
        ("a.shard:4", '"up$" -> (_, model)', 100),
        ("a.shard:5", '"down$" -> replicated', 300),
        ("a.shard:9", '"head" -> (model, _)', 50),
        ("inferred", "", 1000),
        ("a.shard:12", '"gone" -> (data)', 70),
    )
    b = _Cost(
        ("b.shard:7", '"up$" -> (_, model)', 100),  # moved: the same text
        ("b.shard:5", '"down$" -> (model, _)', 900),  # its spec changed
        ("b.shard:9", '"lm_head" -> (model, _)', 20),  # rewritten in place
        ("the model's code", "", 5),
        ("inferred", "", 400),
    )
    found = changes({"a": a, "b": b})
    assert found is not None
    assert _pairs(found) == {
        ("inferred", "inferred"): "owner",
        ("a.shard:4", "b.shard:7"): "text",
        ("a.shard:5", "b.shard:5"): "pattern",
        ("a.shard:9", "b.shard:9"): "line",
        ("a.shard:12", None): None,
        (None, "the model's code"): None,
    }
    # most changed first (inferred's 600 fewer before down's 600 more: more bytes), then 70, 30, 5
    assert [m.change for m in found] == [-600, 600, -70, -30, 5, 0]
    # one pattern in two groups: the rule nearest in line is taken
    a = _Cost(("a.shard:8", '"up$" -> (data, model)', 200), ("a.shard:4", '"up$" -> replicated', 10))
    found = changes({"a": a, "b": _Cost(("b.shard:4", '"up$" -> (_, model)', 10))})
    assert found is not None and _pairs(found) == {
        ("a.shard:4", "b.shard:4"): "pattern",
        ("a.shard:8", None): None,
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
    # a rule line is listed where it moves bytes or its matrix products' FLOPs changed (which rule a
    # pattern in two groups is matched to is the unit test's above)
    flops = [(r["matmul_flops_per_device"]["a"], r["matmul_flops_per_device"]["b"]) for r in rows]
    assert all(
        r["bytes_per_device"]["a"] or r["bytes_per_device"]["b"] or a != b
        for r, (a, b) in zip(rows, flops, strict=True)
    )
    assert down["matmul_flops_per_device"]["b"] < down["matmul_flops_per_device"]["a"]  # split over `model`
    assert main(argv) == 1
    out = capsys.readouterr().out
    table = out[out.index("collectives per rule line") :].splitlines()
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
