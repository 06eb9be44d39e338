"""Findings are grouped by cause: one rule wrong the same way for 160 leaves of a
Llama-3-70B-shaped checkpoint is one finding with a count and a few examples, in
`shardrules lint` (text, JSON, GitHub, `--statistics`), in raised errors and in
`sr.check`; `--all-leaves` lists every leaf; `sr.plan(...).diagnostics` stays per leaf."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import shardrules as sr
from shardrules._cli._main import main
from shardrules._errors import Diagnostic, Span, error_for, group

RULES = r"""mesh fsdp, model

alias embed = fsdp

rules params:
  "embed_tokens"             -> (model, embed)
  "(q|k|v)_proj\.weight$"    -> (model, embed)
  "o_proj\.weight$"          -> (embed, model)
  "(gate|up)_proj\.weight$"  -> (model, embed)
  "down_proj\.weight$"       -> (embed, model)
  "norm\.weight$"            -> replicated
  "lm_head"                  -> (model, embed)
"""
WRONG_RANK = RULES.replace(
    '"(gate|up)_proj\\.weight$"  -> (model, embed)', '"(gate|up)_proj\\.weight$"  -> (model, embed, _)'
)
MESH = {"fsdp": 32, "model": 8}


def llama3_70b_shapes() -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a Llama-3-70B checkpoint (723 tensors)."""
    d, ff, vocab, kv = 8192, 28672, 128256, 1024
    shapes = {
        "model.embed_tokens.weight": (vocab, d),
        "model.norm.weight": (d,),
        "lm_head.weight": (vocab, d),
    }
    for i in range(80):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (d, d),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, d),
            p + "mlp.gate_proj.weight": (ff, d),
            p + "mlp.up_proj.weight": (ff, d),
            p + "mlp.down_proj.weight": (d, ff),
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
        }
    return shapes


def tree() -> dict[str, jax.ShapeDtypeStruct]:
    return {k: jax.ShapeDtypeStruct(v, jnp.bfloat16) for k, v in llama3_70b_shapes().items()}


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("llama.shard").write_text(RULES)
    Path("rank.shard").write_text(WRONG_RANK)
    Path("shapes.json").write_text(json.dumps({k: [v, "bfloat16"] for k, v in llama3_70b_shapes().items()}))
    return tmp_path


def lint(capsys, *argv: str, rules: str = "rank.shard", mesh: str = "fsdp=32,model=8") -> tuple[int, str]:
    code = main(["lint", rules, "--mesh", mesh, "--shapes", "shapes.json", *argv])
    out, err = capsys.readouterr()
    assert err == ""
    return code, out


def test_a_rule_wrong_for_160_leaves_is_one_short_text_finding(project, capsys):
    code, out = lint(capsys)
    assert code == 1
    lines = out.splitlines()
    assert len(lines) == 6, out  # finding, source line, caret, the others, hint, summary
    assert lines[0] == (
        "rank.shard:9:33: SR103 spec (model, embed, _) has 3 entries but `model.layers.0.mlp.gate_proj.weight` "
        "has 2 dimensions (shape (28672, 8192))"
    )
    assert lines[3] == (
        "  (and 159 more leaves like it: `model.layers.0.mlp.up_proj.weight` (28672, 8192), "
        "`model.layers.1.mlp.gate_proj.weight` (28672, 8192), `model.layers.1.mlp.up_proj.weight` (28672, 8192), ...)"
    )
    assert lines[4].startswith("  hint: write one entry per dimension")
    assert lines[-1] == "Found 1 error and 0 warnings."


def test_all_leaves_lists_every_leaf(project, capsys):
    _, out = lint(capsys, "--all-leaves")
    assert "  and 159 more leaves like it:\n" in out
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("    model.layers.")]
    expected = sorted(k for k in llama3_70b_shapes() if "gate_proj" in k or "up_proj" in k)
    assert listed == expected[1:]  # the first is the one the message names
    assert out.rstrip().endswith("Found 1 error and 0 warnings.")


def test_json_has_one_finding_with_count_and_example_paths(project, capsys):
    _, out = lint(capsys, "--format", "json")
    (finding,) = json.loads(out)
    assert (finding["code"], finding["line"], finding["count"]) == ("SR103", 9, 160)
    assert finding["path"] == "model.layers.0.mlp.gate_proj.weight"
    assert finding["paths"] == [
        {"path": "model.layers.0.mlp.gate_proj.weight", "shape": [28672, 8192]},
        {"path": "model.layers.0.mlp.up_proj.weight", "shape": [28672, 8192]},
        {"path": "model.layers.1.mlp.gate_proj.weight", "shape": [28672, 8192]},
        {"path": "model.layers.1.mlp.up_proj.weight", "shape": [28672, 8192]},
    ]
    _, out = lint(capsys, "--format", "json", "--all-leaves")
    (finding,) = json.loads(out)
    assert finding["count"] == len(finding["paths"]) == 160
    assert len({p["path"] for p in finding["paths"]}) == 160


def test_github_has_one_annotation_per_cause(project, capsys):
    _, out = lint(capsys, "--format", "github")
    (line,) = out.splitlines()
    assert line.startswith("::error file=rank.shard,line=9,col=33,endLine=9,endColumn=50,title=SR103::spec ")
    assert "%0A(and 159 more leaves like it: `model.layers.0.mlp.up_proj.weight` (28672, 8192), " in line
    assert "%0Ahint: write one entry" in line
    _, out = lint(capsys, "--format", "github", "--all-leaves")
    (line,) = out.splitlines()
    assert line.count("%0Amodel.layers.") == 159


def test_different_causes_and_rules_stay_apart(project, capsys):
    # On model=6 four rules fail to divide; the q/k/v rule for two sizes (8192 and 1024): 560 leaves.
    code, out = lint(capsys, "--format", "json", rules="llama.shard", mesh="fsdp=32,model=6")
    found = json.loads(out)
    assert code == 1
    assert [(f["code"], f["line"], f["paths"][0]["shape"], f["count"]) for f in found] == [
        ("SR104", 7, [1024, 8192], 160),
        ("SR104", 7, [8192, 8192], 80),
        ("SR104", 8, [8192, 8192], 80),
        ("SR104", 9, [28672, 8192], 160),
        ("SR104", 10, [8192, 28672], 80),
    ]
    assert sum(f["count"] for f in found) == 560
    _, out = lint(capsys, rules="llama.shard", mesh="fsdp=32,model=6")
    assert len(out.splitlines()) == 5 * 5 + 1
    assert out.rstrip().endswith("Found 5 errors and 0 warnings.")


def test_statistics_count_findings_and_leaves_per_code(project, capsys):
    Path("two.shard").write_text(WRONG_RANK.replace('"norm\\.weight$"            -> replicated\n', ""))
    code, out = lint(capsys, "--statistics", rules="two.shard")
    assert code == 1
    assert (
        out
        == "1  SR105  error    (161 leaves)\n1  SR103  error    (160 leaves)\nFound 2 errors and 0 warnings.\n"
    )
    _, out = lint(capsys, "--statistics", "--format", "json", rules="two.shard")
    assert json.loads(out) == [
        {"code": "SR105", "severity": "error", "count": 1, "leaves": 161},
        {"code": "SR103", "severity": "error", "count": 1, "leaves": 160},
    ]


def test_unmatched_leaves_are_one_finding_with_a_count(project, capsys):
    Path("few.shard").write_text(RULES.replace('  "(gate|up)_proj\\.weight$"  -> (model, embed)\n', ""))
    _, out = lint(capsys, rules="few.shard")
    assert len(out.splitlines()) == 6, out
    assert (
        "SR105 array leaf `model.layers.0.mlp.gate_proj.weight` (shape (28672, 8192), bfloat16) matches"
        in out
    )
    assert "(and 159 more leaves like it: " in out


def test_raised_errors_and_check_group_but_plan_stays_per_leaf():
    rules = sr.loads(WRONG_RANK, name="rank.shard")
    with pytest.raises(sr.PlanError) as info:
        sr.specs(tree(), rules, MESH)
    (d,) = info.value.diagnostics
    assert (d.code, d.count, d.path) == ("SR103", 160, "model.layers.0.mlp.gate_proj.weight")
    text = str(info.value)
    assert len(text.splitlines()) == 5 and "(and 159 more leaves like it: " in text
    assert "... and" not in text
    (c,) = sr.check(tree(), rules, MESH)
    assert c == d and c.paths[1] == ("model.layers.0.mlp.up_proj.weight", (28672, 8192))
    per_leaf = sr.plan(tree(), rules, MESH).errors
    assert len(per_leaf) == 160 and {e.count for e in per_leaf} == {1}


def test_a_rule_wrong_for_leaves_of_two_ranks_gives_two_findings():
    rules = sr.loads('mesh x\nrules params:\n  "w" -> (x, _, _)\n', name="r.shard")
    t = {f"l{i}": {"w": jax.ShapeDtypeStruct((8,) * (1 + i % 2), jnp.float32)} for i in range(6)}
    found = sr.check(t, rules, {"x": 2})
    assert [(d.code, d.count, d.path) for d in found] == [("SR103", 3, "l0/w"), ("SR103", 3, "l1/w")]


def test_findings_without_a_cause_group_only_when_they_differ_by_the_path_alone():
    span = Span("r.shard", 2, 3, 2, 9)
    found = [
        Diagnostic("SR106", "error", "`a` is committed to device 9", span, "a"),
        Diagnostic("SR106", "error", "`b` is committed to device 9", span, "b"),
        Diagnostic("SR106", "error", "`c` is committed to device 7", span, "c"),
        Diagnostic("SR205", "warning", "axis `x` unused", span),
        Diagnostic("SR205", "warning", "axis `x` unused", span),
    ]
    grouped = group(found)
    assert [(d.path, d.count) for d in grouped] == [("a", 2), ("c", 1), (None, 1), (None, 1)]
    assert grouped[0].paths == (("a", None), ("b", None))
    assert "(and 1 more leaf like it: `b`)" in str(error_for(found))
