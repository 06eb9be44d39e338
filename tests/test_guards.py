"""Guards on rules: `"pattern" -> SPEC if elements >= 16384 and dtype in (float32, bfloat16)`.

Loading (SR019), formatting, matching (fall-through to later rules and to
`default`, SR105 when a guarded default refuses, scalars), lint (SR201 and
SR202 with guards), and the size and dtype policies of eformer and scalax
written as rule files and compared with a plain Python statement of those
libraries' semantics on a real Flax transformer's parameters.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules._cli._main import main as cli_main
from shardrules._language._parse import parse
from shardrules._planning._match import Matcher

S = jax.ShapeDtypeStruct
f32, bf16, i8 = jnp.float32, jnp.bfloat16, jnp.int8


def specs(text: str, tree: Any, mesh: Any = None) -> Any:
    return sr.specs(tree, sr.loads(text), mesh or {"fsdp": 4, "model": 2})


# ------------------------------------------------------------------ syntax and loading


def test_a_guard_is_parsed_into_conditions_with_values() -> None:
    (line,) = parse(
        'rules p:\n  "w" -> (fsdp) if elements >= 16384 and bytes < 1MiB and dtype not in (int8)\n'
    ).statements[1:]
    assert [(c.variable, c.op, c.values) for c in line.guard] == [  # type: ignore[union-attr]
        ("elements", ">=", (16384,)),
        ("bytes", "<", (2**20,)),
        ("dtype", "not in", ("int8",)),
    ]


def test_the_rule_carries_its_guard_and_its_text() -> None:
    rules = sr.loads(
        'rules p:\n  "w" -> (fsdp) if bytes>=1048576 and dtype in (float32,bfloat16)\n  default -> replicated\n'
    )
    (rule,) = rules.group("p")
    assert str(rule.guard) == "if bytes >= 1MiB and dtype in (float32, bfloat16)"
    assert rule.guard is not None and rule.guard.holds((1024, 256), np.dtype("float32"))
    assert not rule.guard.holds((1024, 256), np.dtype("int8"))
    assert rules.defaults["p"].guard is None


def test_rules_differing_only_in_their_guard_differ() -> None:
    a = sr.loads('rules p:\n  "w" -> (fsdp) if elements >= 8\n')
    b = sr.loads('rules p:\n  "w" -> (fsdp) if elements >= 9\n')
    assert a != b
    assert a == sr.loads('rules p:\n  "w"   ->   (fsdp)   if   elements>=8\n')


@pytest.mark.parametrize(
    ("guard", "caret", "message", "hint"),
    [
        ("if elemnts > 3", "elemnts", "unknown variable `elemnts`", "did you mean `elements`?"),
        ("if dtype < float32", "<", "`dtype` is not compared with `<`", "dtype in (NAME, ...)"),
        ("if dtype == flaot32", "flaot32", "unknown dtype `flaot32`", "did you mean `float32`?"),
        ("if dtype in (float32, bf16)", "bf16", "unknown dtype `bf16`", "did you mean `bfloat16`?"),
        ("if dtype == float", "float", "unknown dtype `float`", "`float32` or `float64`"),
        ("if elements in (1, 2)", "in", "`elements` is not compared with `in`", "one number"),
        ("if elements not in (1)", "not in", "`elements` is not compared with `not in`", "one number"),
        ("if elements >= 16KiB", "16KiB", "compared with a number, not `16KiB`", "`bytes >= 16KiB`"),
        ("if elements >= big", "big", "compared with a number, not `big`", "whole number"),
        ("if bytes >= big", "big", "`bytes` is compared with a number, not `big`", "1MiB"),
        ("if dtype == 8", "8", "unknown dtype `8`", "float32, bfloat16"),
    ],
)
def test_an_invalid_guard_is_sr019_with_a_caret_and_a_hint(
    guard: str, caret: str, message: str, hint: str
) -> None:
    line = f'  "a" -> replicated {guard}'
    col = line.rindex(caret) + 1
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads(f"rules p:\n{line}\n", name="m.shard")
    d = info.value.diagnostics[0]
    assert d.code == "SR019" and message in d.message and hint in d.hint, d
    assert (d.span.line, d.span.col, d.span.end_col) == (2, col, col + len(caret))  # type: ignore[union-attr]
    rendered = str(info.value)
    assert rendered.startswith(f"m.shard:2:{col}: SR019 invalid guard: ")
    assert f"  2 | {line}\n    | {' ' * (col - 1)}{'^' * len(caret)}\n" in rendered


def test_every_invalid_guard_of_a_file_is_reported_together_with_other_errors() -> None:
    text = 'mesh fsdp\nrules p:\n  "a" -> (fdsp) if elemnts > 1\n  "b" -> replicated if dtype == f32\n'
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads(text)
    assert [d.code for d in info.value.diagnostics] == ["SR010", "SR019", "SR019"]


def test_a_bad_size_unit_in_a_bytes_guard_is_sr003_as_elsewhere() -> None:
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads('rules p:\n  "a" -> replicated if bytes >= 2XB\n')
    assert info.value.code == "SR003"


@pytest.mark.parametrize(
    "bad", ["if", "if elements", "if elements >=", "if elements >= 1 and", "if dtype in float32"]
)
def test_an_incomplete_guard_is_a_syntax_error(bad: str) -> None:
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads(f'rules p:\n  "a" -> replicated {bad}\n')
    assert info.value.code == "SR001"


def test_the_guard_words_are_names_elsewhere() -> None:
    rules = sr.loads("mesh if, and, not, in\nalias x = in\nrules p:\n  default -> (if, and, not, x)\n")
    assert rules.defaults["p"].spec.axes == ("if", "and", "not", "in")


def test_lint_keeps_planning_the_rules_after_a_rule_with_a_bad_guard(tmp_path, capsys) -> None:
    path = tmp_path / "m.shard"
    path.write_text('rules params:\n  "w" -> (fsdp) if elements >= lots\n  default -> replicated\n')
    assert cli_main(["lint", str(path), "--mesh", "fsdp=4"]) == 1
    out = capsys.readouterr().out
    assert "m.shard:2:32: SR019" in out and "SR302 rule not planned: its guard has an error" in out


# ------------------------------------------------------------------ formatting


def test_the_formatter_aligns_the_ifs_of_a_run_of_guarded_rules() -> None:
    text = (
        "rules params:\n"
        '"embed"->(fsdp,_)   if elements>=16384\n'
        '"kernel" -> (fsdp, model) if bytes >= 1048576 and dtype in (float32,bfloat16)  # big ones\n'
        '"scale" -> replicated if dtype==float32\n'
        '"bias" -> (unconstrained_is_a_name, _)\n'
        "default -> (fsdp?) if elements>=16384 and dtype not in (int8, int4)\n"
        "\n"
        '"z" -> replicated if elements < 7\n'
    )
    assert sr.format_text(text) == (
        "rules params:\n"
        '  "embed"  -> (fsdp, _)     if elements >= 16384\n'
        '  "kernel" -> (fsdp, model) if bytes >= 1MiB and dtype in (float32, bfloat16)  # big ones\n'
        '  "scale"  -> replicated    if dtype == float32\n'
        '  "bias"   -> (unconstrained_is_a_name, _)\n'
        "  default  -> (fsdp?)       if elements >= 16384 and dtype not in (int8, int4)\n"
        "\n"
        '  "z" -> replicated if elements < 7\n'
    )


def test_a_guard_that_does_not_load_still_formats_as_written() -> None:
    text = 'rules p:\n  "a" -> replicated if elemnts >= 16KiB and dtype == bf16\n'
    assert sr.format_text(text) == text


# ------------------------------------------------------------------ matching


TREE = {
    "embed": S((512, 64), f32),  # 32768 elements, 128 KiB
    "small_embed": S((4, 8), f32),
    "kernel": S((1024, 512), bf16),  # 1 MiB
    "kernel_i8": S((1024, 512), i8),
    "kernel_s": S((8, 8), f32),
}


@pytest.mark.parametrize(
    ("guard", "admitted"),
    [
        ("if elements >= 16384", {"embed", "kernel", "kernel_i8"}),
        ("if elements < 16384", {"small_embed", "kernel_s"}),
        ("if elements == 32", {"small_embed"}),
        ("if elements != 32", {"embed", "kernel", "kernel_i8", "kernel_s"}),
        ("if elements > 32768", {"kernel", "kernel_i8"}),
        ("if elements <= 32768", {"embed", "small_embed", "kernel_s"}),
        ("if bytes >= 1MiB", {"kernel"}),
        ("if bytes >= 128KiB", {"embed", "kernel", "kernel_i8"}),
        ("if bytes < 256", {"small_embed"}),
        ("if bytes <= 256", {"small_embed", "kernel_s"}),
        ("if dtype == float32", {"embed", "small_embed", "kernel_s"}),
        ("if dtype != float32", {"kernel", "kernel_i8"}),
        ("if dtype in (bfloat16, int8)", {"kernel", "kernel_i8"}),
        ("if dtype not in (bfloat16, int8)", {"embed", "small_embed", "kernel_s"}),
        ("if elements >= 16384 and dtype in (float32, bfloat16)", {"embed", "kernel"}),
        ("if bytes > 100 and bytes < 1000 and dtype == float32", {"small_embed", "kernel_s"}),
    ],
)
def test_each_condition_admits_exactly_the_leaves_it_should(guard: str, admitted: set[str]) -> None:
    got = specs(f'rules params:\n  "." -> (fsdp, _) {guard}\n  default -> replicated\n', TREE)
    assert {path for path, spec in got.items() if spec == P("fsdp", None)} == admitted


def test_a_refused_leaf_falls_through_to_the_next_rule_then_the_default() -> None:
    text = (
        "rules params:\n"
        '  "kernel" -> (fsdp, model) if bytes >= 1MiB\n'
        '  "kernel" -> (_, model)    if dtype == float32\n'
        '  "embed"  -> (fsdp, _)     if elements >= 16384\n'
        "  default  -> replicated\n"
    )
    assert specs(text, TREE) == {
        "kernel": P("fsdp", "model"),  # the first rule
        "kernel_s": P(None, "model"),  # refused by the first, taken by the second
        "kernel_i8": P(None, None),  # refused by both: the default
        "embed": P("fsdp", None),
        "small_embed": P(None, None),  # matched by "embed", refused: the default
    }


def test_a_guarded_default_applies_where_its_guard_holds() -> None:
    text = 'rules params:\n  "kernel_s" -> replicated\n  default -> (fsdp?, ...) if elements >= 16384\n'
    tree = {k: v for k, v in TREE.items() if k != "small_embed"}
    assert specs(text, tree) == {
        "embed": P("fsdp", None),
        "kernel": P("fsdp", None),
        "kernel_i8": P("fsdp", None),
        "kernel_s": P(None, None),
    }


def test_leaves_a_guarded_default_refuses_are_sr105_naming_the_guard() -> None:
    text = 'rules params:\n  "kernel$" -> (fsdp, _)\n  default -> (fsdp?, ...) if elements >= 16384\n'
    with pytest.raises(sr.PlanError) as info:
        specs(text, TREE)
    (d,) = info.value.diagnostics
    assert d.code == "SR105"
    assert {p for p, _ in d.paths} == {"small_embed", "kernel_s"}
    assert "the guard of its `default` (`if elements >= 16384`, at <string>:3:3) does not hold" in d.message
    assert '`"." -> (fsdp?, ...) if elements >= 16384`' in d.hint and "default -> replicated" in d.hint


def test_scalars_and_size_1_arrays_need_no_rule_whatever_the_guards() -> None:
    text = 'rules params:\n  "." -> (fsdp) if elements >= 16384\n  default -> (fsdp) if dtype == int8\n'
    got = specs(text, {"step": S((), jnp.int32), "one": S((1, 1), f32), "scale": np.float32(2.0)})
    assert got == {"step": P(), "one": P(None, None), "scale": P()}


def test_a_guarded_digit_blind_rule_does_not_end_the_rules_tried_for_a_key() -> None:
    """`layers_\\d+` is decided once per path key; with a guard, later rules
    must still be tried for the same key, leaf by leaf."""
    text = 'rules params:\n  "layers_\\d+/w" -> (fsdp, _) if elements >= 64\n  "w" -> (_, model)\n'
    tree = {
        "layers_0": {"w": S((8, 8), f32)},
        "layers_1": {"w": S((4, 4), f32)},
        "layers_2": {"w": S((16, 4), f32)},
    }
    assert specs(text, tree) == {
        "layers_0": {"w": P("fsdp", None)},
        "layers_1": {"w": P(None, "model")},
        "layers_2": {"w": P("fsdp", None)},
    }
    rules = sr.loads(text)
    matcher = Matcher(rules.group("params"))
    assert matcher.first("layers_1/w") is rules.group("params")[0]  # `first` ignores guards
    assert matcher.first_fitting("layers_1/w", (4, 4), np.dtype("float32")) is rules.group("params")[1]


def test_the_plan_names_the_rule_that_took_each_leaf() -> None:
    text = 'rules params:\n  "kernel" -> (fsdp, model) if bytes >= 1MiB\n  "kernel" -> (_, model)\n  default -> replicated\n'
    plan = sr.plan(TREE, sr.loads(text, name="m.shard"), {"fsdp": 4, "model": 2})
    assert plan["kernel"].rule.span.line == 2  # type: ignore[union-attr]
    assert plan["kernel_i8"].rule.span.line == 3  # type: ignore[union-attr]
    assert "m.shard:3:3" in str(plan)


def test_the_html_report_shows_the_guard_with_the_pattern() -> None:
    text = 'rules params:\n  "kernel" -> (fsdp, model) if bytes >= 1MiB\n  default -> replicated\n'
    html = sr.plan(TREE, sr.loads(text), {"fsdp": 4, "model": 2})._repr_html_()
    assert "<td>kernel if bytes &gt;= 1MiB</td>" in html


# ------------------------------------------------------------------ activation constraints

ACTIVATIONS = """\
mesh data=4, model=2

rules activations:
  "mlp$"  -> (data, model) if dtype == bfloat16
  "cast$" -> (data, model) if dtype == bfloat16
  default -> (data, _)     if dtype == float32
"""


def _mlp(x: jax.Array, w: jax.Array) -> jax.Array:
    with jax.named_scope("mlp"):
        return jnp.tanh(x @ w)


def _activation_mesh(explicit: bool) -> jax.sharding.Mesh:
    kind = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind,) * 2)


def _operands(dtype: Any, mesh: jax.sharding.Mesh) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(3)
    x, w = (jnp.asarray(rng.standard_normal(s) / 4, dtype) for s in ((16, 8), (8, 8)))
    replicated = jax.sharding.NamedSharding(mesh, P())
    return jax.device_put(x, replicated), jax.device_put(w, replicated)


def _constraints(fn: Any, *args: Any) -> list[P]:
    jaxpr = jax.make_jaxpr(fn)(*args)
    return [e.params["sharding"].spec for e in jaxpr.eqns if e.primitive.name == "sharding_constraint"]


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [(bf16, [P("data", "model")]), (f32, [P("data", None)])],  # f32: the rule refuses, the default takes it
    ids=["bf16", "f32"],
)
def test_a_guarded_activation_rule_is_inserted_only_where_its_guard_holds_on_auto_axes(
    dtype: Any, expected: list[P]
) -> None:
    rules, mesh = sr.loads(ACTIVATIONS), _activation_mesh(explicit=False)
    x, w = _operands(dtype, mesh)
    with pytest.warns(sr.ShardRulesWarning, match="SR211"):  # `cast$`: no such scope here
        assert _constraints(sr.auto_constrain(_mlp, rules, mesh), x, w) == expected
        out = sr.jit(_mlp, rules, mesh, in_groups=(None, None))(x, w)
    assert out.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, expected[0]), 2)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(_mlp(x, w), np.float32), rtol=1e-2)


def test_a_guarded_default_constrains_only_the_outputs_its_guard_admits() -> None:
    rules, mesh = sr.loads(ACTIVATIONS), _activation_mesh(explicit=False)

    def other(x: jax.Array) -> jax.Array:
        with jax.named_scope("other"):
            return x * 2

    with pytest.warns(sr.ShardRulesWarning, match="SR211"):  # `mlp$` and `cast$`: no such scopes here
        assert _constraints(sr.auto_constrain(other, rules, mesh), jnp.ones((16, 8))) == [P("data", None)]
        assert _constraints(sr.auto_constrain(other, rules, mesh), jnp.ones((16, 8), bf16)) == []


@pytest.mark.parametrize("dtype", [bf16, f32], ids=["bf16", "f32"])
@pytest.mark.parametrize("how", ["jit", "auto_constrain"])
def test_a_guarded_activation_rule_lays_out_contractions_only_where_its_guard_holds_on_explicit_axes(
    dtype: Any, how: str
) -> None:
    rules, mesh = sr.loads(ACTIVATIONS, name="g.shard"), _activation_mesh(explicit=True)
    x, w = _operands(dtype, mesh)
    with pytest.warns(sr.ShardRulesWarning, match="SR211"):  # `cast$`: no such scope here
        if how == "jit":
            step = sr.jit(_mlp, rules, mesh, in_groups=(None, None))
            decided = [(d.primitive, d.spec, d.by, d.rule) for d in step.decisions(x, w)]
            if dtype == bf16:
                assert decided == [("dot_general", P("data", "model"), "rule", "g.shard:4:3")]
            else:  # left to JAX, and the default's constraint follows the scope output
                assert decided == [("dot_general", P(None, None), "jax", None)]
            out = step(x, w)
        else:
            out = jax.jit(sr.auto_constrain(_mlp, rules, mesh))(x, w)
    assert jax.typeof(out).sharding.spec == (P("data", "model") if dtype == bf16 else P("data", None))
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(_mlp(x, w), np.float32), rtol=1e-2)


@pytest.mark.parametrize(("given", "made"), [(f32, bf16), (bf16, f32)], ids=["f32-to-bf16", "bf16-to-f32"])
def test_the_guard_of_a_contractions_rule_is_asked_about_the_scope_output(given: Any, made: Any) -> None:
    """A contraction cast before it leaves its scope: the guard is asked about
    the scope output's dtype, not the contraction's."""
    rules, mesh = sr.loads(ACTIVATIONS, name="g.shard"), _activation_mesh(explicit=True)

    def cast(x: jax.Array, w: jax.Array) -> jax.Array:
        with jax.named_scope("cast"):
            return (x @ w).astype(made)

    x, w = _operands(given, mesh)
    step = sr.jit(cast, rules, mesh, in_groups=(None, None))
    with pytest.warns(sr.ShardRulesWarning, match="SR211"):  # `mlp$`: no such scope here
        decided = [(d.primitive, d.spec, d.by, d.rule) for d in step.decisions(x, w)]
        if made == bf16:
            assert decided == [("dot_general", P("data", "model"), "rule", "g.shard:5:3")]
        else:  # the rule refuses the f32 output; the default constrains it after the contraction
            assert decided == [("dot_general", P(None, None), "jax", None)]
        out = step(x, w)
    assert out.dtype == made
    assert jax.typeof(out).sharding.spec == (P("data", "model") if made == bf16 else P("data", None))
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(cast(x, w), np.float32), rtol=1e-2)


# ------------------------------------------------------------------ lint: SR201, SR202


def lint_findings(text: str, tree: Any) -> list[sr.Diagnostic]:
    plan = sr.plan(tree, sr.loads(text), {"fsdp": 4, "model": 2})
    return [d for d in plan.diagnostics if d.code in ("SR201", "SR202")]


def test_a_rule_whose_guard_refuses_every_leaf_it_matches_is_sr201_at_the_guard() -> None:
    text = 'rules params:\n  "kernel" -> (fsdp, model) if bytes >= 2MiB\n  default -> replicated\n'
    (d,) = lint_findings(text, TREE)
    assert d.code == "SR201" and d.severity == "warning"
    assert "its guard (`if bytes >= 2MiB`) refuses all 3 leaves its pattern matches" in d.message
    assert "the largest: `kernel`, shape (1024, 512), bfloat16, 1.0 MiB" in d.message
    assert (d.span.line, d.span.col) == (2, text.splitlines()[1].index(" if ") + 2)  # type: ignore[union-attr]


def test_a_guarded_rule_does_not_shadow_the_leaves_its_guard_refuses() -> None:
    text = 'rules params:\n  "kernel" -> (fsdp, model) if bytes >= 1MiB\n  "kernel" -> (_, model)\n'
    assert lint_findings(text, TREE) == []


def test_an_unguarded_rule_still_shadows_a_later_one() -> None:
    text = 'rules params:\n  "kernel" -> (_, model)\n  "kernel" -> (fsdp, model) if bytes >= 1MiB\n'
    (d,) = lint_findings(text, TREE)
    assert d.code == "SR202"
    assert "the one leaf it matches and its guard admits is taken first by <string>:2:3" in d.message


def test_a_later_guarded_rule_is_shadowed_only_for_the_leaves_it_admits() -> None:
    """`kernel_s` (f32) is the only leaf the guard admits; an earlier rule takes it."""
    text = 'rules params:\n  "kernel_s" -> replicated\n  "kernel" -> (_, model) if dtype == float32\n  default -> replicated\n'
    (d,) = lint_findings(text, TREE)
    assert d.code == "SR202" and "the one leaf it matches and its guard admits" in d.message


def test_lint_reports_guard_findings_from_the_command_line(tmp_path, capsys) -> None:
    (tmp_path / "shapes.json").write_text('{"kernel": [[1024, 512], "bfloat16"], "bias": [[512], "float32"]}')
    path = tmp_path / "m.shard"
    path.write_text('rules params:\n  "kernel" -> (fsdp, _) if bytes >= 2MiB\n  default -> replicated\n')
    assert cli_main(["lint", str(path), "--mesh", "fsdp=4", "--shapes", str(tmp_path / "shapes.json")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"m\.shard:2:25: SR201 rule `kernel` applies to no leaf: its guard", out), out


# ------------------------------------------------------------------ other libraries' policies


def _flax_transformer_params() -> Any:
    """The parameters of a small Flax (linen) decoder, shapes only."""
    nn = pytest.importorskip("flax.linen")

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            h = nn.LayerNorm(name="attn_norm")(x)
            h = nn.MultiHeadDotProductAttention(num_heads=4, name="attn")(h, h)
            x = x + h
            h = nn.LayerNorm(name="mlp_norm")(x)
            h = nn.Dense(512, name="up")(h)
            return x + nn.Dense(128, name="down")(nn.gelu(h))

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, tokens: Any) -> Any:
            x = nn.Embed(1000, 128, name="embed")(tokens)
            for i in range(2):
                x = Block(name=f"layers_{i}")(x)
            return nn.Dense(1000, name="lm_head", use_bias=False)(nn.LayerNorm(name="final_norm")(x))

    tokens = jnp.zeros((2, 16), jnp.int32)
    params = jax.eval_shape(Decoder().init, jax.random.key(0), tokens)
    # A mixed-precision copy and integer and boolean leaves, as optimizer and quantised states have.
    bf16_params = jax.tree.map(lambda x: S(x.shape, bf16), params)
    extras = {"step": S((), jnp.int32), "codes": S((1000, 128), i8), "mask": S((16, 1024), jnp.bool_)}
    return {"f32": params, "bf16": bf16_params, "extras": extras}


def _paths_and_leaves(tree: Any) -> list[tuple[str, Any]]:
    keyed, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [("/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in kp), leaf) for kp, leaf in keyed]


def _same(ours: Any, theirs: P, ndim: int) -> bool:
    """Equal up to trailing `None`s (`P()` and `P(None, None)` lay an array out alike)."""
    pad = lambda s: tuple(s) + (None,) * (ndim - len(s))  # noqa: E731
    return pad(ours) == pad(theirs)


EFORMER_RULES = [  # (regex, PartitionSpec), first hit wins, as EasyDeL writes them
    ("embed/embedding", P("model", "fsdp")),
    ("attn/(query|key|value)/kernel", P("fsdp", "model", None)),
    ("attn/out/kernel", P("model", None, "fsdp")),
    ("up/kernel", P("fsdp", "model")),
    ("down/kernel", P("model", "fsdp")),
    ("lm_head/kernel", P("fsdp", "model")),
    ("codes", P("fsdp", None)),
    ("mask", P(None, "fsdp")),
    (".*", P(None)),
]


def _eformer(path: str, leaf: Any) -> P:
    """eformer's `match_partition_rules`: scalars replicated; the first rule
    whose regex is found decides; an array under 16,384 elements that it
    matches is replicated (its MIN_SHARDING_SIZE)."""
    if len(leaf.shape) == 0:
        return P()
    for regex, spec in EFORMER_RULES:
        if re.search(regex, path) is not None:
            return P() if np.prod(leaf.shape) < 16384 else spec
    raise ValueError(f"no rule for {path}")


EFORMER_FILE = """\
mesh fsdp, model

rules params:
  "."                             -> replicated        if elements < 16384
  "embed/embedding"               -> (model, fsdp)
  "attn/(query|key|value)/kernel" -> (fsdp, model, _)
  "attn/out/kernel"               -> (model, _, fsdp)
  "up/kernel"                     -> (fsdp, model)
  "down/kernel"                   -> (model, fsdp)
  "lm_head/kernel"                -> (fsdp, model)
  "codes"                         -> (fsdp, _)
  "mask"                          -> (_, fsdp)
  default                         -> replicated
"""


def test_eformer_replicate_under_16384_elements_as_a_rule_file() -> None:
    tree = _flax_transformer_params()
    got = sr.specs(tree, sr.loads(EFORMER_FILE), {"fsdp": 4, "model": 2})
    pairs = _paths_and_leaves(tree)
    ours = dict(
        zip([p for p, _ in pairs], jax.tree.leaves(got, is_leaf=lambda x: isinstance(x, P)), strict=True)
    )
    small = sharded = 0
    for path, leaf in pairs:
        theirs = _eformer(path, leaf)
        assert _same(ours[path], theirs, len(leaf.shape)), (path, leaf.shape, ours[path], theirs)
        small += 0 < np.prod(leaf.shape) < 16384 and len(leaf.shape) > 0
        sharded += any(e is not None for e in theirs)
    assert small >= 10 and sharded >= 10  # both sides of the threshold are exercised


def _scalax(leaf: Any, min_size: int, axis_size: int, floats_only: bool) -> P:
    """scalax's `FSDPShardingRule(fsdp_axis_size=..., min_fsdp_size=...)`: an
    array of at least `min_size` elements is sharded over `fsdp` on its largest
    dimension that divides by the axis size; the rest replicated. With
    `floats_only`, the policy its comment states ("we only shard the float
    weights"): other dtypes replicated."""
    if floats_only and leaf.dtype not in (jnp.dtype(f32), jnp.dtype(bf16)):
        return P()
    if np.prod(leaf.shape) >= min_size:
        spec: list[str | None] = [None] * len(leaf.shape)
        for i in np.argsort([-x for x in leaf.shape], kind="stable"):
            if leaf.shape[i] % axis_size == 0:
                spec[i] = "fsdp"
                return P(*spec)
    return P()


@pytest.mark.parametrize("floats_only", [False, True])
@pytest.mark.parametrize("min_size", [1024, 65536])
def test_scalax_min_size_and_dtype_policies_as_rule_files(min_size: int, floats_only: bool) -> None:
    dtypes = " and dtype in (float32, bfloat16)" if floats_only else ""
    text = f'mesh fsdp\nrules params:\n  "." -> auto(fsdp) if elements >= {min_size}{dtypes}\n  default -> replicated\n'
    tree = _flax_transformer_params()
    got = jax.tree.leaves(sr.specs(tree, sr.loads(text), {"fsdp": 8}), is_leaf=lambda x: isinstance(x, P))
    outcomes = set()
    for (path, leaf), ours in zip(_paths_and_leaves(tree), got, strict=True):
        theirs = _scalax(leaf, min_size, 8, floats_only)
        assert _same(ours, theirs, len(leaf.shape)), (path, leaf.shape, leaf.dtype, ours, theirs)
        outcomes.add((str(leaf.dtype), any(e is not None for e in theirs)))
    assert ("float32", True) in outcomes and ("float32", False) in outcomes
    assert ("int8", not floats_only) in outcomes  # the dtype policy decides the int8 codes


@pytest.mark.parametrize(
    ("guard", "fragment"),
    [
        ("if elements >= 16384 or dtype == float32", "joined with `and` only"),
        ("if dtype in float32", "`dtype in (NAME, ...)`"),
        ("if elements => 5", "OP: <, <=, >, >=, ==, !="),
        ("if (elements > 3)", "a guard is `if CONDITION`"),
    ],
)
def test_a_syntax_error_in_a_guard_gets_a_hint_about_guards(guard: str, fragment: str) -> None:
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads(f'rules p:\n  "a" -> replicated {guard}\n')
    assert info.value.code == "SR001" and fragment in info.value.hint


@pytest.mark.parametrize(
    ("guard", "said"),
    [
        ("elements >= 1e6", "without an exponent (`1000000`, not `1e6`"),
        ('dtype == "float32"', "write dtype names without quotes"),
        ("dtype in ('int8', float32)", "write dtype names without quotes"),
        ("elements >= 16_384", "without `_` separators (`16384`)"),
    ],
)
def test_a_guard_written_as_python_would_write_it_is_translated(guard: str, said: str) -> None:
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads(f'rules p:\n  "w" -> (x) if {guard}\n')
    assert info.value.code == "SR001" and said in info.value.hint
