"""Lint finds everything in one run and blames the right place: a broken alias
does not stop the other rules from being planned (SR302 says which were not);
a mesh that lacks the file's axes is one finding at the `mesh` line; a spec
written as Python gets its translation; a plan that replicates most of its
bytes is an error (SR116), and `apply` and `jit` warn (`ShardRulesWarning`)
about it and about rules that match nothing."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardrules as sr
from shardrules._cli import _lint
from shardrules._planning import _check

SIZES = {"data": 2, "fsdp": 4, "model": 8}


def S(*shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


def _llama_dotted(layers=4):
    """HF-style dotted names, as a safetensors header gives them."""
    tree = {"model.embed_tokens.weight": S(128256, 8192), "lm_head.weight": S(128256, 8192)}
    for i in range(layers):
        for name, shape in [("q_proj", (8192, 8192)), ("k_proj", (1024, 8192)), ("o_proj", (8192, 8192))]:
            tree[f"model.layers.{i}.self_attn.{name}.weight"] = S(*shape)
        tree[f"model.layers.{i}.input_layernorm.weight"] = S(8192)
    return tree


# ----------------------------------------------------------- every stage in one run


def test_a_broken_alias_does_not_hide_the_other_findings(tmp_path):
    """SR010 (alias typo), SR102 (axis twice), SR202 (shadowed), SR201 (dead):
    all in one run; the rule that uses the broken alias is named as not planned."""
    path = tmp_path / "model.shard"
    path.write_text(
        "mesh data, fsdp, model\n"
        "alias embed = fsdpp\n"
        "rules params:\n"
        '  "q_proj" -> (embed, model)\n'  # 4: uses the broken alias
        '  "o_proj" -> (model, model)\n'  # 5: SR102
        '  "proj" -> (_, model)\n'  # 6: shadowed by 4 and 5
        '  "nothing_here" -> (model, _)\n'  # 7: matches nothing
        "  default -> replicated\n"
    )
    tree = {"q_proj": S(64, 64), "o_proj": S(64, 64), "up": S(64, 64)}
    result = _lint.lint_file(str(path), tree, SIZES)
    codes = {d.code: d for d in result.diagnostics}
    assert {"SR010", "SR102", "SR202", "SR201", "SR302"} <= set(codes), [
        d.render() for d in result.diagnostics
    ]
    note = codes["SR302"]
    assert note.severity == "note" and note.span is not None and note.span.line == 4
    assert "alias `embed`" in note.message and ":2:1" in note.message
    # The rule with the broken spec keeps its place: `q_proj` is not reported against later rules.
    assert not any(d.path == "q_proj" for d in result.diagnostics if d.code != "SR302")
    assert result.errors == 2


def test_a_broken_pattern_lets_the_later_rules_plan_its_leaves(tmp_path):
    path = tmp_path / "model.shard"
    path.write_text(
        'mesh fsdp\nrules params:\n  "w(" -> (fsdp)\n  "w" -> (fsdp, _)\n  default -> replicated\n'
    )
    result = _lint.lint_file(str(path), {"w": S(8)}, {"fsdp": 4})
    codes = [d.code for d in result.diagnostics]
    assert "SR002" in codes and "SR302" in codes and "SR103" in codes  # rule 4 was planned: wrong rank


def test_syntax_errors_still_stop_lint_at_once(tmp_path):
    path = tmp_path / "model.shard"
    path.write_text('rules params:\n  "w" -> (fsdp\n')
    result = _lint.lint_file(str(path), {"w": S(8)}, {"fsdp": 4})
    assert [d.code for d in result.diagnostics] == ["SR001"]


def test_the_python_api_still_raises_every_load_error():
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads('mesh fsdp\nalias embed = fsdpp\nrules params:\n  "w" -> (embed)\n  "v" -> (nope)\n')
    assert [d.code for d in info.value.diagnostics] == ["SR010", "SR010"]


# ------------------------------------------------------------------- blame


def test_a_mesh_without_the_files_axes_is_one_finding_at_the_mesh_line(tmp_path):
    path = tmp_path / "model.shard"
    path.write_text(
        'mesh fsdp, model\nrules params:\n  "q" -> (fsdp, model)\n  "o" -> (model, fsdp)\n  "u" -> (_, model)\n'
    )
    tree = {"q": S(64, 64), "o": S(64, 64), "u": S(64, 64)}
    result = _lint.lint_file(str(path), tree, {"fsdp": 32, "modle": 8})
    errors = [d for d in result.diagnostics if d.severity == "error"]
    assert len(errors) == 1, [d.render() for d in errors]
    (d,) = errors
    assert d.code == "SR101" and d.span is not None and (d.span.line, d.span.col) == (1, 1)
    assert "lacks `model`" in d.message and "`modle` for `model`" in d.hint
    assert "--mesh fsdp=32,model=8" in d.hint
    assert "did you mean `modle`" not in " ".join(x.hint for x in result.diagnostics)


def test_without_a_mesh_line_each_rule_is_still_named():
    rules = sr.loads('rules params:\n  "q" -> (fsdp, model)\n')
    found = sr.plan({"q": S(64, 64)}, rules, {"fsdp": 4, "modle": 8}).errors
    assert [d.code for d in found] == ["SR101"] and found[0].span is not None and found[0].span.line == 2


@pytest.mark.parametrize(
    ("written", "spelled"),
    [
        ("P(None, 'model')", "(_, model)"),
        ('PartitionSpec("data", None)', "(data, _)"),
        ("jax.sharding.PartitionSpec(None, ('data', 'model'))", "(_, (data, model))"),
        ("(None, 'model')", "(_, model)"),
        ("P()", "replicated"),
        ("None", "`replicated`"),
    ],
)
def test_a_spec_written_as_python_gets_its_translation(written, spelled):
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads(f'mesh data, model\nrules params:\n  "w" -> {written}\n')
    assert info.value.code == "SR001"
    assert spelled in info.value.hint and "a spec is not Python" in info.value.hint


# ---------------------------------------------------------- replicated share


def test_slashed_rules_on_dotted_names_fail_lint(tmp_path):
    """The measured case: every rule misses, `default -> replicated` takes the
    whole model; that was "0 errors"."""
    path = tmp_path / "llama.shard"
    path.write_text(
        "mesh fsdp, model\nrules params:\n"
        '  "layers/\\d+/self_attn/(q|k|v)_proj/weight" -> (fsdp, model)\n'
        '  "layers/\\d+/self_attn/o_proj/weight" -> (model, fsdp)\n'
        "  default -> replicated\n"
    )
    result = _lint.lint_file(str(path), _llama_dotted(), {"fsdp": 32, "model": 8})
    (d,) = [d for d in result.diagnostics if d.code == "SR116"]
    assert d.severity == "error" and "100%" in d.message and "model.embed_tokens.weight" in d.message
    assert result.errors >= 1
    relaxed = _lint.lint_file(str(path), _llama_dotted(), {"fsdp": 32, "model": 8}, replicated_tolerance=1.0)
    assert not [d for d in relaxed.diagnostics if d.code == "SR116"]


def test_the_same_rules_with_dotted_patterns_pass():
    rules = sr.loads(
        "rules params:\n"
        '  "self_attn\\.(q|k|o)_proj\\.weight" -> (fsdp, model)\n'
        '  "(embed_tokens|lm_head)\\.weight" -> (model, fsdp)\n'
        "  default -> replicated\n"
    )
    plan = sr.plan(_llama_dotted(), rules, {"fsdp": 32, "model": 8})
    assert not [d for d in plan.diagnostics if d.code == "SR116"], plan.errors


def test_pure_data_parallelism_is_replicated_on_purpose():
    rules = sr.loads("rules params:\n  default -> replicated\n")
    plan = sr.plan(_llama_dotted(), rules, {"data": 8})
    assert not [d for d in plan.diagnostics if d.code == "SR116"]


def test_the_tolerance_and_threshold_are_arguments():
    rules = sr.loads('rules params:\n  "q_proj" -> (fsdp, model)\n  default -> replicated\n')
    tree = _llama_dotted(layers=1)
    assert [d.code for d in sr.check(tree, rules, {"fsdp": 32, "model": 8}) if d.code == "SR116"] == ["SR116"]
    assert not [
        d
        for d in sr.check(tree, rules, {"fsdp": 32, "model": 8}, replicated_tolerance=0.99)
        if d.code == "SR116"
    ]
    small = {"a": S(64, 64), "b": S(64)}  # all replicated, but under the 64 MiB threshold
    assert not [d for d in sr.plan(small, rules, {"fsdp": 4}).diagnostics if d.code == "SR116"]


# ------------------------------------------------------ warnings from apply and jit


@pytest.fixture
def mesh42():
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def test_apply_warns_about_a_rule_that_matches_nothing(mesh42):
    rules = sr.loads(
        'mesh data, model\nrules params:\n  "layers/\\d+/w" -> (_, model)\n  default -> replicated\n'
    )
    params = {"model.layers.0.w": np.ones((8, 8), np.float32)}
    with pytest.warns(sr.ShardRulesWarning) as caught:
        placed = sr.apply(params, rules, mesh42)
    assert [w.message.code for w in caught] == ["SR201"]
    assert caught[0].filename == __file__  # points at the caller
    assert np.array_equal(np.asarray(placed["model.layers.0.w"]), params["model.layers.0.w"])  # still placed


def test_a_mostly_replicated_plan_is_an_error_in_check_and_a_warning_in_apply(mesh42):
    rules = sr.loads('mesh data, model\nrules params:\n  "kernel" -> (_, model)\n  default -> replicated\n')
    big = {"kernel": S(8, 8), "embed": S(32768, 4096, dtype=jnp.float32)}  # 512 MiB, replicated
    assert [d.code for d in sr.check(big, rules, mesh42) if d.code == "SR116"] == ["SR116"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sr.apply(
            {"kernel": np.ones((8, 8), np.float32), "embed": np.ones((4, 4), np.float32)},
            rules,
            mesh42,
            replicated_tolerance=0.0,
        )  # every byte of `embed` over a tolerance of 0, but under the 64 MiB floor
    assert not [w for w in caught if getattr(w.message, "code", "") == "SR116"]
    # What apply and jit call after placing, on the big plan: SR116 as a warning.
    with pytest.warns(sr.ShardRulesWarning) as warned:
        _check.warn_about(sr.plan(big, rules, mesh42), stacklevel=2)
    assert [w.message.code for w in warned] == ["SR116"]
    assert warned[0].message.diagnostics[0].severity == "warning"


def test_warning_filters_control_them_and_an_error_is_one_of_ours(mesh42):
    rules = sr.loads('rules params:\n  "gone" -> (data)\n  default -> replicated\n')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)
        sr.apply({"w": np.ones(8)}, rules, mesh42)  # silenced
    with warnings.catch_warnings():
        warnings.simplefilter("error", sr.ShardRulesWarning)
        with pytest.raises(sr.ShardRulesError) as info:
            sr.apply({"w": np.ones(8)}, rules, mesh42)
    assert info.value.code == "SR201" and isinstance(info.value, UserWarning)


def test_jit_warns_once_per_signature(mesh42):
    rules = sr.loads(
        'mesh data, model\nrules params:\n  "layers/\\d+/w" -> (_, model)\n  default -> replicated\n'
    )
    step = sr.jit(
        lambda p: jax.tree.map(lambda a: a * 2, p), rules, mesh42, in_groups=("params",), out_groups="params"
    )
    params = {"model.layers.0.w": jnp.ones((8, 8))}
    with pytest.warns(sr.ShardRulesWarning) as caught:
        step(params)
    assert [w.message.code for w in caught] == ["SR201"] and caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(params)  # compiled already: no second warning


def test_no_unused_axis_noise_from_a_broken_rule_or_a_misspelt_mesh(tmp_path):
    path = tmp_path / "model.shard"
    path.write_text('mesh data, model\nrules params:\n  "w" -> (None, model)\n')
    result = _lint.lint_file(str(path), None, {"data": 1, "model": 8})
    assert [d.code for d in result.diagnostics if d.severity != "note"] == ["SR010"]  # no SR205 for `model`
    path.write_text('mesh fsdp, model\nrules params:\n  "w" -> (fsdp, model)\n')
    result = _lint.lint_file(str(path), None, {"fsdp": 4, "modle": 8})
    assert [d.code for d in result.diagnostics] == ["SR101"]  # not also SR205 for `modle`


def test_lint_command_line_details(tmp_path, capsys, monkeypatch):
    from shardrules._cli import main

    (tmp_path / "pyproject.toml").write_text('[tool.shardrules]\nmesh = "fsdp=4"\n')
    (tmp_path / "m.shard").write_text('mesh fsdp\nrules params:\n  "w" -> (fsdp)\n')
    monkeypatch.chdir(tmp_path)
    assert main(["lint"]) == 0  # no RULES: the current folder, as `shardrules lint .`
    assert "(1 file)" in capsys.readouterr().out
    assert main(["lint", "--statistics", "--format", "github"]) == 2
    assert "not GitHub annotations" in capsys.readouterr().err
    (tmp_path / "m.shard").write_text('mesh fsdp\nrules params:\n  "w" -> (fsdp)\n  "gone" -> (fsdp)\n')
    (tmp_path / "shapes.json").write_text('{"w": [[8], "float32"]}')
    assert main(["lint", "--shapes", "shapes.json", "--strict"]) == 1
    assert capsys.readouterr().out.rstrip().endswith("--strict: warnings fail the run.")


def test_a_division_hint_offers_no_axis_the_spec_already_uses():
    rules = sr.loads('mesh fsdp, model\nalias embed = fsdp\nrules params:\n  "w" -> (embed, model)\n')
    (err,) = sr.plan({"w": S(8192, 1024)}, rules, {"fsdp": 32, "model": 6}).errors
    assert err.code == "SR104" and "`fsdp`" not in err.hint.split(";")[0], err.hint
    assert "write `model?`" in err.hint
