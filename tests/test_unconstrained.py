"""The spec entry `unconstrained`: the compiler chooses the dimension's layout.

Specs and shardings hold `PartitionSpec.UNCONSTRAINED`; activation
constraints on Auto axes pass it to `with_sharding_constraint` (`{?}` in the
lowered program); on Explicit axes the dimension keeps the value's layout, and
a contraction's `out_sharding` (or an ambiguous operation's layout) from the
rule takes the one JAX or the inference gives it;
placing arrays refuses it (SR120, at the rule's entry); plans count it as
unsharded, and dump and diff write and compare it.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules._cli._main import main as cli_main
from shardrules._planning import _mesh
from shardrules._reports._plandiff import compare as diff_tables

S = jax.ShapeDtypeStruct
U = P.UNCONSTRAINED

RULES = """\
mesh data, model

rules params:
  "w"     -> (data, model)
  "b"     -> (unconstrained)

rules activations:
  "attn$" -> (data, unconstrained, model)
  "mlp$"  -> (unconstrained, model)
  "both$" -> (unconstrained, data)
  "all$"  -> (..., unconstrained)
"""


@pytest.fixture
def rules() -> sr.RuleSet:
    return sr.loads(RULES, name="m.shard")


def auto_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def explicit_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


# ------------------------------------------------------------------ language


def test_the_entry_is_resolved_and_formatted(rules: sr.RuleSet) -> None:
    (attn, *_) = rules.group("activations")
    assert [e.kind for e in attn.spec.entries] == ["axes", "unconstrained", "axes"]
    assert attn.spec.axes == ("data", "model")
    assert (
        sr.format_text('rules a:\n  "x"->(unconstrained,_ , ...)\n')
        == 'rules a:\n  "x" -> (unconstrained, _, ...)\n'
    )


@pytest.mark.parametrize(
    ("text", "code", "message"),
    [
        (
            "mesh data, unconstrained\n",
            "SR014",
            "`unconstrained` is a spec keyword and cannot name a mesh axis",
        ),
        ("alias unconstrained = data\n", "SR013", "`unconstrained` is a spec keyword and cannot be an alias"),
        ("alias x = unconstrained\n", "SR010", "`unconstrained` cannot be what an alias stands for"),
        (
            "alias x = data | unconstrained | _\n",
            "SR010",
            "`unconstrained` cannot be an alternative of alias `x`",
        ),
        ('rules a:\n  "x" -> ((data, unconstrained))\n', "SR016", "cannot be one of its mesh axes"),
        ('rules a:\n  "x" -> auto(unconstrained)\n', "SR016", "cannot be one of its mesh axes"),
    ],
)
def test_unconstrained_is_reserved(text: str, code: str, message: str) -> None:
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads(text)
    assert info.value.code == code and message in info.value.diagnostics[0].message


def test_unconstrained_with_a_question_mark_is_a_syntax_error() -> None:
    with pytest.raises(sr.RuleSyntaxError):
        sr.loads('rules a:\n  "x" -> (unconstrained?)\n')


def test_names_that_start_with_the_keyword_are_names() -> None:
    rules = sr.loads('rules a:\n  "x" -> (unconstrained_dims, _)\n')
    assert rules.group("a")[0].spec.axes == ("unconstrained_dims",)


# ------------------------------------------------------------------ specs and shardings


def test_specs_and_shardings_hold_partitionspec_unconstrained(rules: sr.RuleSet) -> None:
    acts = {"attn": S((8, 4, 6), jnp.float32), "all": S((8, 4), jnp.float32)}
    assert sr.specs(acts, rules, {"data": 4, "model": 2}, group="activations") == {
        "attn": P("data", U, "model"),
        "all": P(None, U),
    }
    shardings = sr.shardings(acts, rules, auto_mesh(), group="activations")
    assert shardings["attn"] == NamedSharding(auto_mesh(), P("data", U, "model"))


# ------------------------------------------------------------------ activation constraints


def test_on_auto_axes_with_sharding_constraint_gets_unconstrained(rules: sr.RuleSet) -> None:
    mesh = auto_mesh()

    def block(x: Any) -> Any:
        return sr.constrain(x * 2, rules, mesh, name="attn")

    text = jax.jit(block).lower(jnp.ones((8, 4, 6))).as_text()
    assert 'sdy.sharding_constraint %1 <@mesh, [{"data"}, {?}, {"model"}]>' in text, text
    jaxpr = jax.make_jaxpr(block)(jnp.ones((8, 4, 6)))
    (eqn,) = [e for e in jaxpr.eqns if e.primitive.name == "sharding_constraint"]
    assert eqn.params["sharding"].spec == P("data", U, "model")


def test_sr_jit_on_auto_axes_constrains_scope_outputs_with_unconstrained(rules: sr.RuleSet) -> None:
    def f(w: Any, x: Any) -> Any:
        with jax.named_scope("mlp"):
            return x @ w

    step = sr.jit(f, rules, auto_mesh(), in_groups=("params", None))
    with pytest.warns(sr.ShardRulesWarning, match="SR211"):  # the other activation rules: no such scopes here
        text = step.lower(jnp.ones((8, 8)), jnp.ones((16, 8))).as_text()
    assert '<@mesh, [{?}, {"model"}]>' in text, text


@pytest.mark.parametrize(
    ("held", "name", "expected"),
    [
        (P("data", None), "mlp", P("data", "model")),  # dimension 0 keeps `data`
        (P(None, None), "mlp", P(None, "model")),
        (P("model", None), "mlp", P(None, "model")),  # `model` is the other entry's: unsharded
        (P("data", None), "both", P(None, "data")),  # `data` likewise
        (P("data", "model"), "all", P(None, "model")),  # `...`: the leading dimension unsharded
    ],
)
def test_on_explicit_axes_the_dimension_keeps_its_layout(
    rules: sr.RuleSet, held: P, name: str, expected: P
) -> None:
    mesh = explicit_mesh()

    @jax.jit
    def f(x: Any) -> Any:
        return sr.constrain(x, rules, name=name)

    with jax.set_mesh(mesh):
        x = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, held))
        out = f(x)
        assert jax.typeof(out).sharding.spec == expected
        assert out.sharding.spec == expected


def test_pin_settles_an_unsettled_layout_on_explicit_axes() -> None:
    mesh = explicit_mesh()
    target = _mesh.sharding_for(mesh, P(U, "model"))
    assert isinstance(target, _mesh.Unsettled)  # JAX refuses the NamedSharding on Explicit axes
    assert isinstance(_mesh.sharding_for(auto_mesh(), P(U, "model")), NamedSharding)
    with jax.set_mesh(mesh):
        x = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P("data", None)))
        out = jax.jit(lambda v: _mesh.pin(v, target))(x)
    assert out.sharding.spec == P("data", "model")


def test_sr_jit_on_explicit_axes_keeps_the_layout_of_an_unconstrained_dimension(rules: sr.RuleSet) -> None:
    def f(w: Any, x: Any) -> Any:
        with jax.named_scope("mlp"):
            return x @ w

    step = sr.jit(f, rules, explicit_mesh(), in_groups=("params", None))
    x = jax.device_put(jnp.ones((16, 8)), NamedSharding(explicit_mesh(), P("data", None)))
    with pytest.warns(sr.ShardRulesWarning, match="SR211"):  # the other activation rules: no such scopes here
        assert step(jnp.ones((8, 8)), x).sharding.spec == P("data", "model")


@pytest.mark.parametrize("how", ["constrain", "auto_constrain"])
def test_a_concrete_explicit_mesh_keeps_the_layout_of_an_unconstrained_dimension(
    rules: sr.RuleSet, how: str
) -> None:
    """`mesh=` an Explicit mesh, no `jax.set_mesh`: the scope output is resharded, not refused."""
    mesh = explicit_mesh()

    def f(x: Any) -> Any:
        if how == "constrain":
            return sr.constrain(x * 2, rules, mesh, name="mlp")
        with jax.named_scope("mlp"):
            return x * 2

    fn = jax.jit(f if how == "constrain" else sr.auto_constrain(f, rules, mesh))
    x = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("data", None)))
    # auto_constrain: the other activation rules match no scope here
    with (
        pytest.warns(sr.ShardRulesWarning, match="SR211")
        if how == "auto_constrain"
        else contextlib.nullcontext()
    ):
        out = fn(x)
    assert out.sharding.spec == P("data", "model") and jax.typeof(out).sharding.spec == P("data", "model")
    np.testing.assert_array_equal(np.asarray(out), np.arange(64.0).reshape(8, 8) * 2)


@pytest.mark.parametrize(
    ("name", "x_spec", "w_spec", "expected"),
    [
        ("mlp", P("data", None), P(), P("data", "model")),  # dimension 0: JAX's `data`
        ("both", P("data", None), P(), P(None, "data")),  # `data` is the other entry's: unsharded
        ("mlp", P(None, "data"), P("data", None), P(None, "model")),  # JAX refuses: the inference's
    ],
)
def test_a_contraction_takes_the_settled_layout_of_an_unconstrained_dimension_as_out_sharding(
    rules: sr.RuleSet, name: str, x_spec: P, w_spec: P, expected: P
) -> None:
    mesh = explicit_mesh()

    def f(x: Any, w: Any) -> Any:
        with jax.named_scope(name):
            return x @ w

    rng = np.random.default_rng(4)
    x_host, w_host = (rng.standard_normal(s).astype(np.float32) for s in ((16, 8), (8, 8)))
    x = jax.device_put(x_host, NamedSharding(mesh, x_spec))
    w = jax.device_put(w_host, NamedSharding(mesh, w_spec))
    step = sr.jit(f, rules, mesh, in_groups=(None, None))
    line = 1 + RULES.splitlines().index(next(ln for ln in RULES.splitlines() if f'"{name}$"' in ln))
    with pytest.warns(sr.ShardRulesWarning, match="SR211"):  # the other activation rules: no such scopes here
        assert [(d.primitive, d.spec, d.by, d.rule) for d in step.decisions(x, w)] == [
            ("dot_general", expected, "rule", f"m.shard:{line}:3")
        ]
        out = step(x, w)
    assert jax.typeof(out).sharding.spec == expected
    np.testing.assert_allclose(np.asarray(out), x_host @ w_host, rtol=1e-5, atol=1e-6)


def test_an_ambiguous_operation_takes_the_settled_layout_of_an_unconstrained_dimension(
    rules: sr.RuleSet,
) -> None:
    """Not only contractions: a `jnp.where` over operands laid out differently,
    which JAX cannot lay out, takes the rule's layout with the inferred one
    for its unconstrained dimension (its most sharded operand's)."""
    mesh = explicit_mesh()

    def f(a: Any, b: Any) -> Any:
        with jax.named_scope("mlp"):
            return jnp.where(a > 0, a, b)

    rng = np.random.default_rng(5)
    a_host, b_host = (rng.standard_normal((16, 8)).astype(np.float32) for _ in range(2))
    a = jax.device_put(a_host, NamedSharding(mesh, P("data", None)))
    b = jax.device_put(b_host, NamedSharding(mesh, P()))
    step = sr.jit(f, rules, mesh, in_groups=(None, None), strict=True)
    with pytest.warns(sr.ShardRulesWarning, match="SR211"):  # the other activation rules: no such scopes here
        assert [(d.primitive, d.spec, d.by) for d in step.decisions(a, b)] == [
            ("select_n", P("data", "model"), "rule")
        ]
        out = step(a, b)
    assert jax.typeof(out).sharding.spec == P("data", "model")
    np.testing.assert_array_equal(np.asarray(out), np.where(a_host > 0, a_host, b_host))


# ------------------------------------------------------------------ placing: SR120


def test_apply_refuses_an_unconstrained_dimension_with_the_rule_entry(rules: sr.RuleSet) -> None:
    tree = {"w": np.ones((8, 8), np.float32), "b": np.ones((8,), np.float32)}
    with pytest.raises(sr.PlanError) as info:
        sr.apply(tree, rules, auto_mesh())
    (d,) = info.value.diagnostics
    assert d.code == "SR120" and d.path == "b"
    assert d.message == (
        "dimension 0 of `b` (shape (8,), float32) is `unconstrained`, but placing arrays needs a concrete layout"
    )
    line = RULES.splitlines()[4]
    col = line.index("unconstrained") + 1
    assert str(d.span) == f"m.shard:5:{col}" and d.span.end_col - d.span.col == len("unconstrained")  # type: ignore[union-attr]
    assert f"  5 | {line}\n    | {' ' * (col - 1)}{'^' * len('unconstrained')}\n" in str(info.value)
    assert "use `_` or a mesh axis" in d.hint


def test_jit_in_shardings_refuse_an_unconstrained_dimension(rules: sr.RuleSet) -> None:
    step = sr.jit(lambda acts: acts, rules, auto_mesh(), in_groups=("activations",))
    with pytest.raises(sr.PlanError) as info:
        step({"attn": jnp.ones((8, 4, 6)), "mlp": jnp.ones((8, 6))})
    d = info.value.diagnostics[0]
    assert (
        d.code == "SR120" and str(d.span) == f"m.shard:8:{RULES.splitlines()[7].index('unconstrained') + 1}"
    )
    assert {p for p, _ in d.paths} == {"attn"}


def test_jit_out_shardings_refuse_an_unconstrained_dimension(rules: sr.RuleSet) -> None:
    step = sr.jit(lambda w: {"b": w[0]}, rules, auto_mesh(), in_groups=(None,), out_groups="params")
    with pytest.raises(sr.PlanError) as info:
        step(jnp.ones((8, 8)))
    assert info.value.code == "SR120"


@pytest.mark.parametrize("call", ["reshard", "init", "shard_map"])
def test_other_placing_calls_refuse_it(rules: sr.RuleSet, call: str) -> None:
    mesh = auto_mesh()
    with pytest.raises(sr.PlanError) as info:
        if call == "reshard":
            placed = jax.device_put(jnp.ones((8,)), NamedSharding(mesh, P()))
            sr.reshard({"b": placed}, rules, mesh)
        elif call == "init":
            sr.init(lambda: {"b": jnp.ones((8,))}, rules, mesh)()
        else:
            sr.shard_map(lambda t: t, rules, mesh, in_groups=("params",), out_groups="params")(
                {"b": jnp.ones((8,))}
            )
    assert info.value.code == "SR120"


def test_load_checkpoint_refuses_it(rules: sr.RuleSet, tmp_path) -> None:
    header = json.dumps({"b": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}}).encode()
    data = len(header).to_bytes(8, "little") + header + np.ones(8, np.float32).tobytes()
    (tmp_path / "c.safetensors").write_bytes(data)
    with pytest.raises(sr.PlanError) as info:
        sr.load_checkpoint(tmp_path / "c.safetensors", rules, auto_mesh())
    assert info.value.code == "SR120"


@pytest.mark.filterwarnings("ignore::shardrules.ShardRulesWarning")  # SR201: the rule for `b`
def test_a_group_without_unconstrained_places_as_before(rules: sr.RuleSet) -> None:
    out = sr.apply({"w": np.ones((8, 8), np.float32)}, rules, auto_mesh())
    assert out["w"].sharding.spec == P("data", "model")


# ------------------------------------------------------------------ plans, dump, diff


def test_the_plan_counts_it_unsharded_and_shows_it(rules: sr.RuleSet) -> None:
    plan = sr.plan({"attn": S((8, 4, 6), jnp.float32)}, rules, {"data": 4, "model": 2}, group="activations")
    (leaf,) = plan.leaves
    assert leaf.spec == P("data", U, "model")
    assert leaf.bytes_per_device == 8 // 4 * 4 * 6 // 2 * 4  # dimension 1 whole
    assert "P('data', unconstrained, 'model')" in str(plan)
    assert plan.ok


def test_dump_writes_it_and_from_json_reads_it_back(rules: sr.RuleSet) -> None:
    plan = sr.plan({"attn": S((8, 4, 6), jnp.float32)}, rules, {"data": 4, "model": 2}, group="activations")
    text = plan.to_json()
    (leaf,) = json.loads(text)["leaves"]
    assert leaf["spec"] == ["data", "unconstrained", "model"] and leaf["bytes"] == 96
    back = sr.Plan.from_json(text)
    assert back.specs() == {"attn": P("data", U, "model")}
    assert back.to_json() == text


def test_diff_compares_it_like_an_axis(rules: sr.RuleSet) -> None:
    other = sr.loads(RULES.replace('"attn$" -> (data, unconstrained, model)', '"attn$" -> (data, _, model)'))
    tree = {"attn": S((8, 4, 6), jnp.float32)}
    a = sr.plan(tree, rules, {"data": 4, "model": 2}, group="activations")
    b = sr.plan(tree, other, {"data": 4, "model": 2}, group="activations")
    found = diff_tables(_table(a), _table(b))
    (change,) = found.changes
    assert (change.old, change.new) == ("P('data', unconstrained, 'model')", "P('data', None, 'model')")
    assert diff_tables(_table(a), _table(a)).equal


def _table(plan: sr.Plan) -> Any:
    from shardrules._reports._dump import table_of

    return table_of(plan)


def test_the_dump_and_diff_commands_show_it(rules: sr.RuleSet, tmp_path, capsys) -> None:
    (tmp_path / "a.shard").write_text(RULES)
    (tmp_path / "b.shard").write_text(RULES.replace("(unconstrained, model)", "(data, model)"))
    (tmp_path / "shapes.json").write_text('{"mlp": [[8, 6], "float32"]}')
    common = ["--mesh", "data=4,model=2", "--shapes", str(tmp_path / "shapes.json"), "--group", "activations"]
    assert cli_main(["dump", str(tmp_path / "a.shard"), *common, "-o", str(tmp_path / "a.json")]) == 0
    assert '"spec": ["unconstrained", "model"]' in (tmp_path / "a.json").read_text()
    capsys.readouterr()
    cli_main(["diff", str(tmp_path / "a.shard"), str(tmp_path / "b.shard"), *common])
    out = capsys.readouterr().out
    assert "P(unconstrained, 'model') -> P('data', 'model')" in out, out


def test_shardings_on_a_mesh_without_auto_axes_is_sr120_not_a_jax_error(rules: sr.RuleSet) -> None:
    with pytest.raises(sr.PlanError) as info:
        sr.shardings({"mlp": S((8, 6), jnp.float32)}, rules, explicit_mesh(), group="activations")
    d = info.value.diagnostics[0]
    assert d.code == "SR120" and "a `NamedSharding` on a mesh without Auto axes" in d.message
    assert sr.specs({"mlp": S((8, 6), jnp.float32)}, rules, explicit_mesh(), group="activations") == {
        "mlp": P(U, "model")
    }


@pytest.mark.parametrize("written", ["UNCONSTRAINED", "unconstraind", "Unconstrained"])
def test_a_slip_of_the_keyword_is_named(written: str) -> None:
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads(f'mesh data, model\nrules a:\n  "x" -> (data, {written})\n')
    (d,) = info.value.diagnostics
    assert d.code == "SR010" and f"`{written}`" in d.message and "did you mean `unconstrained`" in d.hint
