"""Activation rules reach an auto-named module's output by its weight's name
(a Flax linen `Einsum` made without a name is `mlp/Einsum_0`; its weight,
kept in its parent's scope, is `mlp/gating_einsum`), where that name is
unambiguous; `explain --step` says which scopes have none and why, and
which operations no scope reaches (a loss's gathers and a mask's selects
outside every module), with their source lines."""

from __future__ import annotations

import inspect
import json
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

import shardrules as sr
from shardrules._cli._main import main

linen = pytest.importorskip("flax.linen", reason="flax is not installed")


class Einsum(linen.Module):
    """A linen module with a weight of a given name: made in a parent
    without a name, it is named `Einsum_N`."""

    shape: tuple[int, ...]
    weight_name: str

    @linen.compact
    def __call__(self, eq, x):
        w = self.param(self.weight_name, linen.initializers.normal(), self.shape)
        return jnp.einsum(eq, x, w.astype(x.dtype))


class Mlp(linen.Module):
    @linen.compact
    def __call__(self, x):
        gating = Einsum((2, 16, 32), "gating_einsum")
        linen.share_scope(self, gating)  # the weight is `mlp/gating_einsum`, the call `mlp/Einsum_0`
        gate = gating("btf,nfh->btnh", x)
        down = Einsum((32, 16), "linear")
        linen.share_scope(self, down)
        return down("bth,hf->btf", linen.gelu(gate[..., 0, :]) * gate[..., 1, :])


class Lm(linen.Module):
    @linen.compact
    def __call__(self, tokens):
        table = self.param("embed", linen.initializers.normal(), (64, 16))
        x = table[tokens]
        return (x + Mlp(name="mlp")(x)) @ table.T


def sgd(params, batch):
    def loss_fn(p):
        logits = Lm().apply(p, batch["tokens"])
        logp = jax.nn.log_softmax(jnp.where(batch["mask"][..., None], logits, -1e9))  # MASK LINE
        return -jnp.mean(jnp.take_along_axis(logp, batch["labels"][..., None], axis=-1))  # LABEL LINE

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def _line(marker: str) -> int:
    lines, start = inspect.getsourcelines(sgd)
    return start + next(i for i, line in enumerate(lines) if marker in line)


def _args():
    tokens = np.arange(8 * 16, dtype=np.int32).reshape(8, 16) % 64
    params = Lm().init(jax.random.key(0), tokens)
    batch = {"tokens": tokens, "labels": (tokens + 1) % 64, "mask": tokens % 3 > 0}
    return params, batch


def _rules(activations: str) -> sr.RuleSet:
    return sr.loads(
        "mesh data=4, model=2\n"
        'rules params:\n  "gating_einsum$" -> (_, _, model)\n  "linear$" -> (model, _)\n'
        "  default -> replicated\n"
        "rules inputs:\n  default -> (data, _)\n"
        f"rules activations:\n{textwrap.indent(activations, '  ')}",
        name="lm.shard",
    )


def _step(rules: sr.RuleSet, types=AxisType.Explicit):
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(types,) * 2)
    return sr.jit(sgd, rules, mesh, in_groups=("params", "inputs"))


def test_a_rule_written_with_the_weights_name_reaches_the_auto_named_module():
    rules = _rules('"mlp/gating_einsum$" -> (data, _, _, model)\n')
    step, args = _step(rules), _args()
    with warnings.catch_warnings():
        warnings.simplefilter("error", sr.ShardRulesWarning)  # the rule matches: no SR211
        scopes = {s.name: s for s in step.scopes(*args)}
        decisions = step.decisions(*args)
        _, loss = step(*args)
    gating = scopes["Lm/mlp/Einsum_0"]
    assert gating.alias == "params/mlp/gating_einsum"
    assert gating.rule is not None and gating.rule.pattern == "mlp/gating_einsum$"
    assert scopes["Lm/mlp/Einsum_1"].alias == "params/mlp/linear"
    assert scopes["Lm/mlp"].alias is None and scopes["Lm"].alias is None  # named scopes keep their names
    (d,) = [d for d in decisions if d.scope == "Lm/mlp/Einsum_0" and d.primitive == "dot_general"]
    assert (d.by, d.rule, d.spec) == (
        "rule",
        "lm.shard:9:3",
        jax.sharding.PartitionSpec("data", None, None, "model"),
    )
    np.testing.assert_allclose(float(loss), float(jax.jit(sgd)(*args)[1]), rtol=1e-5)


def test_on_auto_axes_the_weights_name_constrains_the_output():
    rules = _rules('"mlp/gating_einsum$" -> (data, _, _, model)\n')
    text = _step(rules, AxisType.Auto).lower(*_args()).as_text()
    constraints = [line for line in text.splitlines() if "sharding_constraint" in line]
    assert any('[{"data"}, {}, {}, {"model"}]' in line and "8x16x2x32" in line for line in constraints), text


def test_the_scopes_own_name_is_matched_first():
    rules = _rules('"Einsum_0$" -> (data, _, _, _)\n"mlp/gating_einsum$" -> (data, _, _, model)\n')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)  # the second rule is shadowed
        scopes = {s.name: s for s in _step(rules).scopes(*_args())}
    assert scopes["Lm/mlp/Einsum_0"].rule.pattern == "Einsum_0$"


def test_python_hints_name_the_weight_of_an_auto_named_scope():
    """`step.decisions` and the SR117 error of `strict=True` suggest the rule
    for an auto-named scope's output under its weight's name, as `lint
    --step` does, and that rule settles it."""
    rules = _rules('"mlp/gating_einsum$" -> (data, _, _, model)\n')
    args = _args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)
        (down,) = [
            d
            for d in _step(rules).decisions(*args)
            if d.scope == "Lm/mlp/Einsum_1" and d.primitive == "dot_general"
        ]
    assert down.by == "inferred"
    assert '`"params/mlp/linear$" -> (data, _, _)`' in down.hint and "Einsum_1" not in down.hint
    # strict: the MLP alone (the loss's gathers outside every scope are refused first otherwise)
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    x = np.ones((8, 16, 16), np.float32)
    mlp = Mlp()
    rules = sr.loads(
        str(rules.sources["lm.shard"]).replace("default -> (data, _)", "default -> (data, _, _)")
    )
    strict = sr.jit(
        lambda p, x: jnp.mean(mlp.apply(p, x) ** 2), rules, mesh, in_groups=("params", "inputs"), strict=True
    )
    with pytest.raises(sr.ShardRulesError) as raised:
        strict(mlp.init(jax.random.key(0), x), x)
    assert raised.value.diagnostics[0].code == "SR117" and "`Mlp/Einsum_1`" in str(raised.value)
    assert '`"params/linear$" -> (data, _, _)`' in raised.value.diagnostics[0].hint, str(raised.value)
    settled = _rules('"mlp/gating_einsum$" -> (data, _, _, model)\n"params/mlp/linear$" -> (data, _, _)\n')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)
        (down,) = [
            d
            for d in _step(settled).decisions(*args)
            if d.scope == "Lm/mlp/Einsum_1" and d.primitive == "dot_general"
        ]
    assert (down.by, down.rule) == ("rule", "lm.shard:10:3")


class Pair(linen.Module):
    """One auto-named module with two weights."""

    @linen.compact
    def __call__(self, x):
        a = self.param("a", linen.initializers.normal(), (16, 16))
        b = self.param("b", linen.initializers.normal(), (16, 16))
        return (x @ a) @ b


class Tied(linen.Module):
    """An auto-named module whose weight is its parent's table, which
    another auto-named module uses too."""

    @linen.compact
    def __call__(self, x, table):
        return x @ table.T @ table


class Shared(linen.Module):
    @linen.compact
    def __call__(self, x):
        table = self.param("table", linen.initializers.normal(), (8, 16))
        return Tied()(Pair()(x), table) + Tied()(x, table)


def test_ambiguous_weights_give_no_name_and_say_why():
    model, x = Shared(), np.ones((8, 16), np.float32)
    params = model.init(jax.random.key(0), x)
    rules = sr.loads(
        "rules params:\n  default -> replicated\nrules inputs:\n  default -> (data, _)\n"
        'rules activations:\n  "Pair_0/a$" -> (data, _)\n  "table$" -> (data, _)\n',
        name="s.shard",
    )
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    step = sr.jit(lambda p, x: jnp.mean(model.apply(p, x) ** 2), rules, mesh, in_groups=("params", "inputs"))
    with pytest.warns(sr.ShardRulesWarning, match="SR211"):  # neither rule matches
        traced = step.traced(params, x)
    names = {s.name: s for s in traced.scopes}
    assert {"Shared/Pair_0", "Shared/Tied_0", "Shared/Tied_1"} <= set(names)
    assert all(names[n].alias is None and names[n].rule is None for n in ("Shared/Pair_0", "Shared/Tied_0"))
    refused = traced.reach.refused
    assert (
        refused["Shared/Pair_0"]
        == "its operations take 2 parameters as weights: `params/Pair_0/a`, `params/Pair_0/b`"
    )
    assert refused["Shared/Tied_0"] == "its weight `params/table` is also used as a weight in `Shared/Tied_1`"
    assert "Shared" not in refused  # a named scope: its own name is enough
    from shardrules._cli._explain import reach_lines

    lines = reach_lines(traced.reach, traced.scopes)
    assert lines[0].startswith("auto-named scopes with no parameter name")
    assert f"  Shared/Pair_0: {refused['Shared/Pair_0']}" in lines
    assert f"  Shared/Tied_0: {refused['Shared/Tied_0']}" in lines
    unmatched = sorted(d.message.split("`")[1] for d in traced.unmatched)
    assert unmatched == ["Pair_0/a$", "table$"]  # neither rule reaches anything


def test_operations_outside_every_scope_are_listed_by_kind_with_their_lines():
    traced = _step(_rules('"mlp/gating_einsum$" -> (data, _, _, model)\n')).traced(*_args())
    kinds = {u.kind: u for u in traced.reach.unreached}
    here = f"{__file__}:"
    assert kinds["gather"].count == 1 and kinds["gather"].sources == (f"{here}{_line('LABEL LINE')}",)
    assert f"{here}{_line('MASK LINE')}" in kinds["select"].sources
    assert "contraction" not in kinds  # every contraction is inside a module


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "lm_step.py").write_text(
        "from tests.test_parameter_names import _args, _step\n\n"
        "def check_step(rules, mesh):\n    return _step(rules), _args()\n"
    )
    (tmp_path / "lm.shard").write_text(
        _rules('"mlp/gating_einsum$" -> (data, _, _, model)\n').sources["lm.shard"]
    )
    yield tmp_path
    sys.modules.pop("lm_step", None)


def test_explain_step_says_what_no_scope_reaches(project, capsys):
    assert main(["explain", "lm.shard", "--step", "lm_step:check_step"]) == 0
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert any(line.startswith("Lm/mlp/Einsum_0 (params/mlp/gating_einsum) ") for line in out)
    start = out.index("operations outside every named scope, which no activation rule reaches:")
    rows = {line.split()[0]: line for line in out[start + 1 :] if line.startswith("  ")}
    assert (
        rows["gather"].split()[1] == "1"
        and f"test_parameter_names.py:{_line('LABEL LINE')}" in rows["gather"]
    )
    assert (
        rows["to"]
        .strip()
        .startswith("to reach one, wrap that operation alone in `with jax.named_scope(NAME):`")
    )
    # the SR208 hint for the down projection names its weight; the rule it hints at settles it
    assert '`"params/mlp/linear$" -> (data, _, _)`' in captured.err
    (project / "lm.shard").write_text(
        _rules('"mlp/gating_einsum$" -> (data, _, _, model)\n"params/mlp/linear$" -> (data, _, _)\n').sources[
            "lm.shard"
        ]
    )
    assert main(["explain", "lm.shard", "--step", "lm_step:check_step", "--format", "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert not [
        f for f in found["findings"] if f["code"] in ("SR208", "SR211") and "Einsum_1" in f["message"]
    ]
    assert found["reach"]["aliases"] == {
        "Lm/mlp/Einsum_0": "params/mlp/gating_einsum",
        "Lm/mlp/Einsum_1": "params/mlp/linear",
    }
    assert [u["kind"] for u in found["reach"]["unreached"]][:2] == ["gather", "select"]
    (einsum_1,) = [s for s in found["scopes"] if s["name"] == "Lm/mlp/Einsum_1"]
    assert einsum_1["alias"] == "params/mlp/linear" and einsum_1["rule"] == "lm.shard:10:3"


class Layer(linen.Module):
    @linen.compact
    def __call__(self, x, _):
        return x + Mlp(name="mlp")(x), None


class Stack(linen.Module):
    """Layers stacked by `nn.scan`: each trip's weight is a slice of the stack."""

    @linen.compact
    def __call__(self, x):
        layers = linen.scan(Layer, variable_axes={"params": 0}, split_rngs={"params": True}, length=2)
        return layers(name="layers")(x, None)[0]


def test_a_scanned_layers_weight_is_named_by_its_stack():
    model, x = Stack(), np.ones((8, 4, 16), np.float32)
    params = model.init(jax.random.key(0), x)
    rules = sr.loads(
        "rules params:\n  default -> replicated\nrules inputs:\n  default -> (data, ...)\n"
        'rules activations:\n  "mlp/gating_einsum$" -> (data, _, _, _)\n',
        name="s.shard",
    )
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    fn = lambda p, x: jnp.mean(model.apply(p, x) ** 2)  # noqa: E731
    step = sr.jit(fn, rules, mesh, in_groups=("params", "inputs"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", sr.ShardRulesWarning)  # the rule matches: no SR211
        scopes = {s.name: s for s in step.scopes(params, x)}
        got = step(params, x)
    gating = scopes["Stack/layers/mlp/Einsum_0"]
    assert gating.alias == "params/layers/mlp/gating_einsum" and gating.rule.pattern == "mlp/gating_einsum$"
    np.testing.assert_allclose(float(got), float(jax.jit(fn)(params, x)), rtol=1e-5)


def sgd_picked(params, batch):
    """`sgd` with the label gather alone in a named scope, as docs/activations.md
    advises for an operation no scope reaches."""

    def loss_fn(p):
        logits = Lm().apply(p, batch["tokens"])
        logp = jax.nn.log_softmax(jnp.where(batch["mask"][..., None], logits, -1e9))
        with jax.named_scope("picked"):
            picked = jnp.take_along_axis(logp, batch["labels"][..., None], axis=-1)
        return -jnp.mean(picked)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def test_the_one_operation_wrapped_in_a_scope_is_reached_by_its_rule():
    rules = _rules('"picked$" -> (data, _, _)\n')
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    step, args = sr.jit(sgd_picked, rules, mesh, in_groups=("params", "inputs")), _args()
    with warnings.catch_warnings():
        warnings.simplefilter("error", sr.ShardRulesWarning)  # the rule matches: no SR211
        traced = step.traced(*args)
        _, loss = step(*args)
    (picked,) = [s for s in traced.scopes if s.name == "picked"]
    assert picked.rule is not None and picked.rule.pattern == "picked$"
    assert "gather" not in {u.kind for u in traced.reach.unreached}  # listed by `sgd`'s test above
    np.testing.assert_allclose(float(loss), float(jax.jit(sgd_picked)(*args)[1]), rtol=1e-5)
