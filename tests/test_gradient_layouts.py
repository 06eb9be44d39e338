"""Gradient layouts on Explicit meshes, differentially against `jax.jit` under `jax.set_mesh`.

JAX's transpose rule lays a contraction's cotangent out as its primal operand,
so under plain `jax.jit` an FSDP weight's gradient is laid out as the weight.
`sr.jit` traces the step once replicated and must give the gradient that
layout itself (`_tracing/_transpose.py`), also where the forward contraction
and its gradient are in different sub-computations (remat, `lax.cond`, an
inner `jax.jit`, loops) and where the weight is transposed or reshaped before
its contraction. Each case compares every output's layout (the gradients and
an SGD update) and value with `jax.jit`'s, with and without `strict=True`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import shardrules as sr

D, H, B = 16, 32, 8

RULES = """mesh fsdp, model
rules params:
  "w1$" -> (fsdp, model)
  "w2$" -> (model, _)
  "w3$" -> (_, model)
  "stack$" -> (_, fsdp, model)
  "layers$" -> (_, fsdp, _)
  "merged$" -> (fsdp, model, _)
  "split$" -> (fsdp, model)
rules inputs:
  "x$" -> (fsdp, _)
"""


def _mlp(params: dict[str, Any], x: Any) -> Any:
    h = jnp.tanh(x @ params["w1"])
    return jnp.matmul(h, params["w1"].T, out_sharding=P("fsdp", None))


def _remat(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    return (jax.checkpoint(_mlp)(params, batch["x"]) ** 2).sum()


def _remat_nothing_saveable(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    policy = jax.checkpoint_policies.nothing_saveable
    return (jax.checkpoint(_mlp, policy=policy)(params, batch["x"]) ** 2).sum()


def _remat_dots_saveable(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    policy = jax.checkpoint_policies.dots_saveable
    return (jax.checkpoint(_mlp, policy=policy)(params, batch["x"]) ** 2).sum()


def _cond(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    x = batch["x"]
    return (lax.cond(x.sum() > 0, _mlp, lambda p, v: -_mlp(p, v), params, x) ** 2).sum()


def _inner_jit(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    return (jax.jit(_mlp)(params, batch["x"]) ** 2).sum()


def _scan_over_layers(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    def layer(h: Any, w: Any) -> tuple[Any, None]:
        return jnp.tanh(jnp.matmul(h, w, out_sharding=P("fsdp", None))), None

    h, _ = lax.scan(layer, batch["x"], params["stack"])
    return (h**2).sum()


def _scan_over_remat_layers(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    def layer(h: Any, w: Any) -> tuple[Any, None]:
        return jnp.tanh(h @ w), None  # (fsdp, _) @ (fsdp, _): the carry keeps its layout

    h, _ = lax.scan(jax.checkpoint(layer), batch["x"], params["layers"])
    return (h**2).sum()


def _fori_loop(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    w = params["w1"]  # closed over by the loop's body

    def body(i: Any, h: Any) -> Any:
        return jnp.tanh(jnp.matmul(h @ w, w.T, out_sharding=P("fsdp", None)))

    return (lax.fori_loop(0, 3, body, batch["x"]) ** 2).sum()


def _fori_loop_indexing(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    def body(i: Any, h: Any) -> Any:
        return jnp.tanh(h @ params["layers"][i])  # one layer of the stack, a dynamic slice

    return (lax.fori_loop(0, 3, body, batch["x"]) ** 2).sum()


def _einsum_remat(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    def mlp(p: dict[str, Any], x: Any) -> Any:
        h = jnp.einsum("bd,dh->bh", x, p["w1"])
        return jnp.einsum("bh,dh->bd", jnp.tanh(h), p["w1"], out_sharding=P("fsdp", None))

    policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    return (jax.checkpoint(mlp, policy=policy)(params, batch["x"]) ** 2).sum()


def _transposed(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    h = batch["x"]
    a = jnp.tanh(h @ params["w1"])  # w1: (D, H), (fsdp, model)
    b = jnp.tanh(h @ params["w2"].T)  # w2: (H, D), (model, _); w2.T has w1's shape, not its layout
    return ((a * b) ** 2).sum()


def _one_line(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    h = batch["x"]  # two same-shaped weights laid out differently, contracted with one input on one line
    return (jnp.tanh(h @ params["w1"]) * jnp.tanh(h @ params["w3"])).sum()


def _reshaped_merge(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    w = params["merged"].reshape(D, 2 * H)  # (D, 2, H) (fsdp, model, _) merged to (D, 2H)
    return ((batch["x"] @ w) ** 2).sum()


def _reshaped_split(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    w = params["split"].reshape(D, 2, H)  # (D, 2H) (fsdp, model) split into two heads
    return (jnp.einsum("bd,dnh->bnh", batch["x"], w) ** 2).sum()


CASES: dict[str, tuple[Callable[..., Any], dict[str, tuple[int, ...]]]] = {
    "remat": (_remat, {"w1": (D, H)}),
    "remat-nothing-saveable": (_remat_nothing_saveable, {"w1": (D, H)}),
    "remat-dots-saveable": (_remat_dots_saveable, {"w1": (D, H)}),
    "cond": (_cond, {"w1": (D, H)}),
    "inner-jit": (_inner_jit, {"w1": (D, H)}),
    "scan-over-layers": (_scan_over_layers, {"stack": (3, D, D)}),
    "scan-over-remat-layers": (_scan_over_remat_layers, {"layers": (3, D, D)}),
    "fori-loop-closed-over": (_fori_loop, {"w1": (D, H)}),
    "fori-loop-indexing-a-stack": (_fori_loop_indexing, {"layers": (3, D, D)}),
    "einsum-remat-policy": (_einsum_remat, {"w1": (D, H)}),
    "transposed-beside-another": (_transposed, {"w1": (D, H), "w2": (H, D)}),
    "two-on-one-line": (_one_line, {"w1": (D, H), "w3": (D, H)}),
    "reshaped-merge": (_reshaped_merge, {"merged": (D, 2, H)}),
    "reshaped-split": (_reshaped_split, {"split": (D, 2 * H)}),
}


@pytest.fixture(scope="module")
def mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("fsdp", "model"), axis_types=(AxisType.Explicit,) * 2)


def _inputs(shapes: dict[str, tuple[int, ...]]) -> tuple[dict[str, Any], dict[str, Any]]:
    rng = np.random.default_rng(0)
    params = {k: (0.1 * rng.normal(size=s)).astype(np.float32) for k, s in sorted(shapes.items())}
    return params, {"x": rng.normal(size=(B, D)).astype(np.float32)}


def _sgd(loss: Callable[..., Any]) -> Callable[..., Any]:
    def step(params: dict[str, Any], batch: dict[str, Any]) -> Any:
        grads = jax.grad(loss)(params, batch)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), grads

    return step


def _specs(tree: Any) -> Any:
    return jax.tree.map(lambda a: a.sharding.spec, tree)


def _reference(step: Callable[..., Any], rules: Any, mesh: Any, params: Any, batch: Any) -> Any:
    """`jax.jit(step)` under `jax.set_mesh(mesh)`, on arguments placed by the
    rules, and the parameters' layouts."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)  # rules for other cases' weights match nothing
        placed = sr.apply(params, rules, mesh, group="params")
        fed = sr.apply(batch, rules, mesh, group="inputs")
    with jax.set_mesh(mesh):
        return jax.jit(step)(placed, fed), _specs(placed)


@pytest.mark.parametrize("strict", [False, True], ids=["inferred", "strict"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_gradient_layouts_equal_jax_jit(case: str, strict: bool, mesh: Any) -> None:
    loss, shapes = CASES[case]
    rules = sr.loads(RULES)
    params, batch = _inputs(shapes)
    step = _sgd(loss)
    want, weights = _reference(step, rules, mesh, params, batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)
        ours = sr.jit(step, rules, mesh, in_groups=("params", "inputs"), strict=strict)
        got = ours(params, batch)
    assert _specs(got) == _specs(want)
    assert _specs(want[1]) == weights  # each gradient laid out as its weight, as JAX's rule does
    for mine, theirs in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(theirs), rtol=1e-5, atol=1e-5)
    backward = [d for d in ours.decisions(params, batch) if d.scope.endswith("(backward)")]
    assert any(d.primitive == "dot_general" and d.by == "jax" for d in backward), backward


def _two_from_one_expression(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    h = batch["x"]  # one expression makes both contractions: nothing tells their gradients apart
    return sum(jnp.tanh(h @ w).sum() for w in (params["w1"], params["w3"]))


def test_strict_refuses_a_gradient_it_cannot_match_to_its_weight(mesh: Any) -> None:
    rules = sr.loads(RULES)
    params, batch = _inputs({"w1": (D, H), "w3": (D, H)})
    step = _sgd(_two_from_one_expression)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)
        with pytest.raises(sr.PlanError) as info:
            sr.jit(step, rules, mesh, in_groups=("params", "inputs"), strict=True)(params, batch)
    text = str(info.value)
    assert "SR117" in text and "gradient" in text and "test_gradient_layouts.py:" in text, text
    assert "P('fsdp', 'model')" in text and "P(None, 'model')" in text, text  # the layouts it could be
    assert "line of its own" in text and "strict=False" in text, text


def test_gradients_are_matched_where_jax_names_only_the_line(mesh: Any, monkeypatch: Any) -> None:
    """Where JAX's frames give no columns (`source_info_util.user_frames`),
    the line the model's code made a contraction on still matches its
    gradient to it."""
    from collections import namedtuple

    from jax._src import source_info_util

    frame = namedtuple("frame", "file_name function_name start_line")
    frames = source_info_util.user_frames

    def lines_only(traceback: Any) -> Any:
        return (frame(f.file_name, f.function_name, f.start_line) for f in frames(traceback))

    monkeypatch.setattr(source_info_util, "user_frames", lines_only)
    rules = sr.loads(RULES)
    for case in ("transposed-beside-another", "scan-over-layers"):
        loss, shapes = CASES[case]
        params, batch = _inputs(shapes)
        step = _sgd(loss)
        want, _ = _reference(step, rules, mesh, params, batch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sr.ShardRulesWarning)
            got = sr.jit(step, rules, mesh, in_groups=("params", "inputs"), strict=True)(params, batch)
        assert _specs(got) == _specs(want), case


def test_a_loop_body_traced_again_records_its_decisions_once(mesh: Any) -> None:
    """The gradient's loop accumulates a closed-over weight's gradient into
    zeros the trace made replicated; the body is traced again with the
    carry laid out as the body gives it, and what the first pass recorded
    is forgotten."""
    rules = sr.loads(RULES)
    params, batch = _inputs({"w1": (D, H)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)
        step = sr.jit(_sgd(_fori_loop), rules, mesh, in_groups=("params", "inputs"))
        decisions = step.decisions(params, batch)
    backward = [d for d in decisions if d.scope.endswith("(backward)")]
    assert any(d.primitive == "dot_general" and d.spec == P("fsdp", "model") for d in backward), backward
    assert len(set(decisions)) == len(decisions), decisions
