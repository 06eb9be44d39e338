"""Nothing is passed over without a word: activation rules that match no scope
(SR211), slips in `in_groups`/`out_groups` (SR105 naming the argument and the
group that fits, SR212 for an argument left without a group), and a bare
group name for `in_groups`."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import shardrules as sr

RULES = sr.loads(
    "mesh data=8\n"
    "rules params:\n"
    '  "w$" -> (data, _)\n'
    '  "b$" -> replicated\n'
    "rules inputs:\n"
    '  "x" -> (data, _)\n'
    "rules activations:\n"
    '  "embedder$" -> (data, _)\n'
    '  "mlp$"      -> (data, _)\n',
    name="model.shard",
)
AXIS_TYPES = pytest.mark.parametrize("kind", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])


def _mesh(kind: AxisType = AxisType.Explicit) -> jax.sharding.Mesh:
    return jax.make_mesh((8,), ("data",), axis_types=(kind,))


def forward(params, batch):
    with jax.named_scope("embedder.encode"):  # the name Flax linen gives a method call
        h = batch["x"] @ params["w"]
    with jax.named_scope("mlp"):
        h = jnp.tanh(h + params["b"])
    return jnp.mean(h**2)


PARAMS = {"w": np.ones((8, 4), np.float32), "b": np.zeros((4,), np.float32)}
BATCH = {"x": np.ones((16, 8), np.float32)}


def _codes(caught) -> list[str]:
    return [getattr(w.message, "code", None) for w in caught]


@AXIS_TYPES
def test_an_activation_rule_that_matches_no_scope_is_sr211(kind) -> None:
    step = sr.jit(forward, RULES, _mesh(kind), in_groups=("params", "inputs"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = step(PARAMS, BATCH)
        step(PARAMS, BATCH)  # the same shapes: not traced again, not warned again
    assert float(loss) == pytest.approx(float(forward(PARAMS, BATCH)))
    (found,) = [w.message for w in caught if getattr(w.message, "code", None) == "SR211"]
    assert found.diagnostics[0].span.line == 8
    assert "`embedder$` matches no scope output of this step (2 scope outputs seen)" in str(found)
    assert 'did you mean "embedder.encode"?' in found.diagnostics[0].hint
    assert caught[0].filename == "model.shard" and caught[0].lineno == 8  # shown at the rule


def test_auto_constrain_warns_once_per_trace() -> None:
    fn = sr.auto_constrain(forward, RULES, _mesh(AxisType.Auto))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax.jit(fn)(PARAMS, BATCH)
    assert _codes(caught).count("SR211") == 1


def test_rules_that_all_match_say_nothing() -> None:
    fixed = sr.loads(
        RULES.sources["model.shard"].replace('"embedder$"', '"embedder\\.encode$"'), name="model.shard"
    )
    step = sr.jit(forward, fixed, _mesh(), in_groups=("params", "inputs"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", sr.ShardRulesWarning)
        step(PARAMS, BATCH)
    (encode,) = [s for s in step.scopes(PARAMS, BATCH) if s.name == "embedder.encode"]
    assert encode.shapes == ((16, 4),) and encode.dtype == "float32"
    assert encode.rule is not None and encode.rule.span.line == 8


def test_scopes_lists_every_output_with_its_rule() -> None:
    step = sr.jit(forward, RULES, _mesh(), in_groups=("params", "inputs"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)
        scopes = step.scopes(PARAMS, BATCH)
    assert [(s.name, s.shapes, s.rule and s.rule.pattern) for s in scopes] == [
        ("embedder.encode", ((16, 4),), None),
        ("mlp", ((16, 4),), "mlp$"),
    ]


def test_a_step_with_no_scope_says_how_to_name_one() -> None:
    step = sr.jit(lambda p, b: jnp.sum(b["x"] @ p["w"]), RULES, _mesh(), in_groups=("params", "inputs"))
    with pytest.warns(sr.ShardRulesWarning, match="SR211") as caught:
        step(PARAMS, BATCH)
    hints = {w.message.diagnostics[0].hint for w in caught if w.message.code == "SR211"}
    assert hints and all("makes no named scope at all" in h for h in hints)


def test_swapped_groups_name_the_argument_and_the_group_that_fits() -> None:
    step = sr.jit(lambda p, b: p, RULES, _mesh(), in_groups=("inputs", "params"))
    with pytest.raises(sr.PlanError) as info:
        step(PARAMS, BATCH)
    err = info.value
    assert err.code == "SR105"
    assert str(err).splitlines()[0].startswith("model.shard:5:1: SR105 in_groups[0] (argument `p`):")
    assert "did you mean `'params'` there" in err.diagnostics[0].hint
    assert "default -> replicated" not in err.diagnostics[0].hint  # which would hide the mistake


def test_a_wrong_output_group_names_the_output() -> None:
    step = sr.jit(
        lambda p, b: (p, jnp.sum(b["x"])), RULES, _mesh(), in_groups=("params", "inputs"),
        out_groups=("inputs", None),
    )  # fmt: skip
    with pytest.raises(sr.PlanError, match=r"SR105 out_groups\[0\] \(output 0\)") as info:
        step(PARAMS, BATCH)
    assert "did you mean `'params'` there" in info.value.diagnostics[0].hint


def test_a_group_that_fits_nothing_else_keeps_the_usual_hint() -> None:
    step = sr.jit(lambda b: b, RULES, _mesh(), in_groups=("inputs",))
    with pytest.raises(sr.PlanError) as info:
        step({"y": np.ones((8, 2), np.float32)})
    hint = info.value.diagnostics[0].hint
    assert "in_groups[0] (argument `b`) is the group meant for it" in hint and "rules inputs:" in hint


def test_an_argument_without_a_group_that_rules_would_shard_is_sr212() -> None:
    def sgd(params, momentum, batch):
        return params, momentum

    step = sr.jit(
        sgd,
        RULES,
        _mesh(),
        in_groups=("params", None, "inputs"),
        out_groups=("params", None),
        activations=None,
    )
    with pytest.warns(sr.ShardRulesWarning, match="SR212") as caught:
        _, momentum = step(PARAMS, PARAMS, BATCH)
    (found,) = [w.message for w in caught if w.message.code == "SR212"]
    assert "in_groups[1] (argument `momentum`) has no group" in str(found)
    assert "the rules of group `params` match all 2 of its arrays and shard 1 of them" in str(found)
    assert found.diagnostics[0].span.line == 3  # the rule that would shard it
    assert momentum["w"].sharding.spec != P("data", None)  # what the warning is about
    with warnings.catch_warnings():
        warnings.simplefilter("error", sr.ShardRulesWarning)
        fixed = sr.jit(sgd, RULES, _mesh(), in_groups=("params", "params", "inputs"), activations=None)
        fixed(PARAMS, PARAMS, BATCH)


def test_a_batch_without_a_group_is_not_warned_about() -> None:
    """Arrays no pattern rule matches (or only a default does) are JAX's to lay out: no SR212."""
    rules = sr.loads('rules params:\n  "w$" -> (data, _)\n  default -> replicated\n', name="d.shard")
    step = sr.jit(lambda p, b: jnp.sum(b["tokens"]), rules, _mesh(), in_groups=("params", None))
    with warnings.catch_warnings():
        warnings.simplefilter("error", sr.ShardRulesWarning)
        step({"w": PARAMS["w"]}, {"tokens": np.ones((8, 4), np.float32)})


@pytest.mark.parametrize("which", ["jit", "shard_map"])
def test_one_group_name_is_that_group_for_every_argument(which) -> None:
    rules = sr.loads('rules params:\n  "w" -> (data, _)\n', name="p.shard")
    mesh = _mesh()
    a, b = {"w": np.ones((8, 4), np.float32)}, {"w2": np.full((8, 2), 2.0, np.float32)}
    if which == "jit":
        step = sr.jit(lambda x, y: (x, y), rules, mesh, in_groups="params", out_groups="params")
        got = step(a, b)
    else:
        step = sr.shard_map(lambda x, y: (x, y), rules, mesh, in_groups="params", out_groups="params")
        assert step.specs(a, b)[0] == ({"w": P("data", None)}, {"w2": P("data", None)})
        got = step(a, b)
    assert got[0]["w"].sharding.spec == P("data", None) and got[1]["w2"].sharding.spec == P("data", None)
    np.testing.assert_array_equal(np.asarray(got[1]["w2"]), b["w2"])


def test_a_group_count_that_does_not_fit_says_so() -> None:
    step = sr.jit(lambda x: x, RULES, _mesh(), in_groups=("params", "inputs"))
    with pytest.raises(
        TypeError, match=r"in_groups has 2 entries for 1 arguments of `.*<lambda>`.*or one group"
    ):
        step(PARAMS)


def test_groups_for_an_output_that_is_not_a_sequence_say_to_give_one_name() -> None:
    step = sr.jit(lambda p, b: p, RULES, _mesh(), in_groups=("params", "inputs"), out_groups=("params", None))
    with pytest.raises(
        TypeError, match=r"2 groups given for a dict, which is not a tuple or list: give one group name"
    ):
        step(PARAMS, BATCH)


def test_a_rule_that_matches_no_leaf_of_an_argument_names_the_argument() -> None:
    rules = sr.loads(
        'rules params:\n  "w$" -> (data, _)\n  "nothing_here$" -> replicated\n  default -> replicated\n'
    )
    step = sr.jit(lambda p: p, rules, _mesh(), in_groups=("params",), activations=None)
    with pytest.warns(sr.ShardRulesWarning, match="SR201") as caught:
        step(PARAMS)
    (found,) = [str(w.message) for w in caught if w.message.code == "SR201"]
    assert "in_groups[0] (argument `p`) in group `params`: rule `nothing_here$` matches no leaf" in found
