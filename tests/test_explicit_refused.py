"""What JAX refuses on a mesh with Explicit axes reaches the user of `sr.jit`
as a layout shardrules infers or as SR117 in its own words (the operation,
the operand and the argument leaf it is, the rule that sharded it, the fix),
never as a raw JAX error."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import shardrules as sr

STACKED = """mesh data, model

rules params:
  "layers/w" -> {spec}

rules inputs:
  "x" -> (_, model)
"""


def explicit_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


def stack(params: dict, x: jax.Array) -> jax.Array:
    def layer(h, w):
        return jnp.tanh(h @ w), None

    with jax.named_scope("stack"):
        return jax.lax.scan(layer, x, params["layers"]["w"])[0]


def layers() -> tuple[dict, np.ndarray]:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 16, 16)).astype(np.float32) * 0.2
    return {"layers": {"w": w}}, rng.normal(size=(8, 16)).astype(np.float32)


def test_a_scan_over_a_stacked_dimension_the_rules_shard_is_sr117_naming_leaf_rule_and_fix() -> None:
    rules = sr.loads(STACKED.format(spec="(data, _, model)"), name="stack.shard")
    params, x = layers()
    step = sr.jit(stack, rules, explicit_mesh(), in_groups=("params", "inputs"))
    with pytest.raises(sr.PlanError) as caught:
        step(params, x)
    said = str(caught.value)
    assert [d.code for d in caught.value.diagnostics] == ["SR117"]
    assert "`scan` in scope `stack`" in said and "test_explicit_refused.py:" in said  # the model's line
    assert "(4, 16, 16) P('data', None, 'model') (argument `params`, leaf `layers/w`)" in said
    assert "sharded over `data`" in said
    assert said.startswith("stack.shard:4:3: SR117")  # the rule that sharded it, with a caret
    assert '  4 |   "layers/w" -> (data, _, model)\n    |   ^^^' in said
    assert '"layers/w" -> (_, _, model)' in said  # the rule line that fixes it
    assert "jax.sharding.reshard(x, P(None, None, 'model'))" in said
    assert "dynamic_slice" not in said and "not implemented" not in said
    # the fix the message gives runs, with plain jax.jit's numbers
    fixed = sr.loads(STACKED.format(spec="(_, _, model)"), name="stack.shard")
    out = sr.jit(stack, fixed, explicit_mesh(), in_groups=("params", "inputs"))(params, x)
    np.testing.assert_allclose(out, jax.jit(stack)(params, x), rtol=1e-5, atol=1e-6)


def test_a_scan_over_a_sharded_dimension_of_a_computed_value_is_sr117_without_a_rule() -> None:
    rules = sr.loads(STACKED.format(spec="(data, _, model)"), name="stack.shard")
    params, x = layers()

    def scaled(params, x):
        return stack({"layers": {"w": params["layers"]["w"] * 2}}, x)

    step = sr.jit(scaled, rules, explicit_mesh(), in_groups=("params", "inputs"))
    with pytest.raises(sr.PlanError, match=r"SR117 `scan` in scope `stack`") as caught:
        step(params, x)
    said = str(caught.value)
    assert "(4, 16, 16) P('data', None, 'model'), which is sharded over `data`" in said  # no leaf to name
    assert "`(_, _, model)`" in said


def test_the_gradient_of_a_scan_over_a_sharded_stack_is_sr117_and_auto_constrain_names_the_argument() -> None:
    rules = sr.loads(
        STACKED.format(spec="(data, _, model)") + 'rules activations:\n  "nothing$" -> replicated\n',
        name="stack.shard",
    )
    params, x = layers()

    def loss(params, x):
        return (stack(params, x) ** 2).mean()

    step = sr.jit(jax.grad(loss), rules, explicit_mesh(), in_groups=("params", "inputs"))
    with pytest.raises(sr.PlanError, match="SR117 `scan`"):
        step(params, x)
    mesh = explicit_mesh()
    placed = sr.apply(params, rules, mesh)
    with jax.set_mesh(mesh), pytest.raises(sr.PlanError, match=r"\(argument 0, leaf `layers/w`\)"):
        jax.jit(sr.auto_constrain(stack, rules))(placed, x)


SPECTRUM = sr.loads('mesh data, model\nrules inputs:\n  "t" -> (data, model)\n', name="fft.shard")


def spectrum(t: jax.Array) -> jax.Array:
    with jax.named_scope("spectrum"):
        return jnp.abs(jnp.fft.rfft(t, axis=-1))


def test_an_fft_along_a_sharded_dimension_is_laid_out_or_sr117_under_strict() -> None:
    t = np.random.default_rng(1).normal(size=(8, 16)).astype(np.float32)
    mesh = explicit_mesh()
    step = sr.jit(spectrum, SPECTRUM, mesh, in_groups=("inputs",))
    out = step(t)  # 16 over 2 devices gives 9 results: the layout JAX keeps does not fit, so it is inferred
    np.testing.assert_allclose(out, np.abs(np.fft.rfft(t, axis=-1)), rtol=1e-4, atol=1e-4)
    assert jax.typeof(out).sharding.spec == P("data", None)
    (decision,) = [d for d in step.decisions(t) if d.primitive == "fft"]
    assert decision.scope == "spectrum" and decision.by in ("inferred", "auto_axes")
    assert (
        decision.hint
        == 'add `"spectrum$" -> (data, _)` under `rules activations:` (or pass strict=False to infer it)'
    )
    # its gradient too
    grad = sr.jit(jax.grad(lambda t: spectrum(t).sum()), SPECTRUM, mesh, in_groups=("inputs",))
    expected = jax.grad(lambda t: jnp.abs(jnp.fft.rfft(t, axis=-1)).sum())(t)
    np.testing.assert_allclose(grad(t), expected, rtol=1e-4, atol=1e-4)
    strict = sr.jit(spectrum, SPECTRUM, mesh, in_groups=("inputs",), strict=True)
    with pytest.raises(
        sr.PlanError, match=r"SR117 JAX cannot decide the layout of the result of `fft` in scope `spectrum`"
    ) as caught:
        strict(t)
    assert "(8, 16) P('data', 'model')" in str(caught.value)


def _cases() -> dict[str, Callable[[jax.Array], jax.Array]]:
    lax = jax.lax
    return {
        "sort": lambda t: jnp.sort(t, axis=1),
        "argsort": lambda t: jnp.argsort(t, axis=0),
        "cumsum": lambda t: jnp.cumsum(t, axis=1),
        "top_k": lambda t: lax.top_k(t, 3)[0],
        "gather": lambda t: t[:, jnp.array([0, 3, 5])],
        "take_rows": lambda t: jnp.take(t, jnp.array([0, 3, 5]), axis=0),
        "scatter": lambda t: t.at[:, jnp.array([1, 2])].set(0.0),
        "dynamic_update_slice": lambda t: lax.dynamic_update_slice(t, jnp.zeros((4, 2)), (1, 1)),
        "dynamic_index": lambda t: lax.dynamic_index_in_dim(t, 3, axis=1),
        "roll": lambda t: jnp.roll(t, 3, axis=1),
        "rfft": lambda t: jnp.abs(jnp.fft.rfft(t, axis=-1)),
        "rfftn": lambda t: jnp.abs(jnp.fft.rfftn(t)),
        "fft_rows": lambda t: jnp.abs(jnp.fft.fft(t, axis=0)),
        "concatenate_odd": lambda t: jnp.concatenate([t, t[:, :1]], axis=1),
        "fori_dynamic_slice": lambda t: lax.fori_loop(
            0, 8, lambda i, s: s + lax.dynamic_slice(t, (i, 0), (1, 16)).sum(), 0.0
        ),
        "scan_rows": lambda t: lax.scan(lambda c, r: (c + r, c * r), jnp.zeros(16), t)[1],
        "map_rows": lambda t: lax.map(jnp.sin, t),
        "scan_columns": lambda t: lax.scan(lambda c, r: (c + r, c * r), jnp.zeros(8), t.T)[1],
    }


@pytest.mark.filterwarnings("ignore:.*SR210")  # what some of them infer drops an axis
@pytest.mark.parametrize("case", sorted(_cases()))
def test_what_jax_refuses_on_a_sharded_dimension_is_inferred_or_sr117_never_raw(case: str) -> None:
    fn = _cases()[case]
    t = (np.arange(128, dtype=np.float32).reshape(8, 16) % 7) / 7
    step = sr.jit(lambda t: fn(t), SPECTRUM, explicit_mesh(), in_groups=("inputs",))
    try:
        out = step(t)
    except sr.ShardRulesError as err:  # in our words: the operation, the operand, the fix
        assert [d.code for d in err.diagnostics] == ["SR117"], err
        said = str(err)
        assert case.startswith(("scan", "map"))  # only a loop over a sharded dimension is refused
        assert "`scan`" in said and "sharded over" in said and "hint: leave the stacked dimension" in said
        assert ("(argument `t`)" in said) == (case != "scan_columns")  # `t.T` is no argument
    else:
        np.testing.assert_allclose(out, jax.jit(fn)(t), rtol=1e-4, atol=1e-5)
