"""The gradients of gathers and scatters on Explicit meshes, laid out as their primal operands.

The gradient of a gather (`emb[tokens]`, `x[token_index]`) with respect to its
operand is a `scatter-add` into zeros, which JAX's transpose rule makes in the
operand's layout; the gradient of a scatter (`.at[i].add`) with respect to its
updates is a gather, in the updates' layout. `sr.jit` traces the step once
replicated and must give them those layouts itself (`_tracing/_cotangents.py`):
left replicated, an embedding's gradient is computed whole on every device.
A gradient's operation that would be replicated, of the shape of its scope's
output, takes the output's rule. Each case checks the layouts and the values
against plain `jax.jit` (one device, or the same mesh under `jax.set_mesh`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import shardrules as sr

# one rule file for several steps: each step leaves some of its rules matching nothing (SR201, SR211)
pytestmark = pytest.mark.filterwarnings("ignore::shardrules.ShardRulesWarning")

V, D, H, B, T = 64, 16, 32, 8, 12

RULES = """mesh fsdp, model
rules params:
  "emb$" -> (model, fsdp)
  "w$" -> (fsdp, model)
rules activations:
  "embed$" -> (fsdp, _, _)
  "mix$" -> (fsdp, _)
  "dispatch$" -> (model, _, _)
  "combine$" -> (fsdp, _)
rules inputs:
  "^tok$" -> (fsdp, _)
  "^x$" -> (fsdp, _)
  "^index$" -> replicated
"""


def _mesh(kind: AxisType = AxisType.Explicit) -> Any:
    return jax.make_mesh((4, 2), ("fsdp", "model"), axis_types=(kind,) * 2)


def _params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "emb": rng.normal(size=(V, D)).astype(np.float32),
        "w": (rng.normal(size=(D, H)) / 4).astype(np.float32),
    }


def _batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    # each of 2 "experts" takes 16 of the 32 rows of x (some twice, some never)
    index = rng.integers(0, 32, (2, 16)).astype(np.int32)
    return {
        "tok": rng.integers(0, V, (B, T)).astype(np.int32),
        "x": rng.normal(size=(32, D)).astype(np.float32),
        "index": index,
    }


def _lookup(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    with jax.named_scope("embed"):
        x = params["emb"][batch["tok"]]
    return (jnp.tanh(x @ params["w"]) ** 2).mean()


def _take_in_remat(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    def layer(p: dict[str, Any], tok: Any) -> Any:
        with jax.named_scope("embed"):
            x = jnp.take(p["emb"], tok, axis=0)  # an inner jit: its gradient is another jaxpr
        return jnp.tanh(x @ p["w"])

    return (jax.checkpoint(layer)(params, batch["tok"]) ** 2).mean()


def _moe(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    with jax.named_scope("mix"):
        x = jnp.tanh(batch["x"] @ params["w"][:, :D])  # an activation, (fsdp, _)
    index = batch["index"]
    with jax.named_scope("dispatch"):
        routed = x[index]  # (experts, slots, D): the tokens gathered into the experts' buffers
    out = jnp.tanh(routed) * 2.0
    with jax.named_scope("combine"):
        y = jnp.zeros_like(x).at[index].add(out)  # and scatter-added back
    return (y**2).mean()


def _step(loss: Any) -> Any:
    def step(params: dict[str, Any], batch: dict[str, Any]) -> Any:
        value, grads = jax.value_and_grad(loss)(params, batch)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), grads, value

    return step


def _run(loss: Any, strict: bool = False, kind: AxisType = AxisType.Explicit) -> tuple[Any, Any, Any]:
    rules, mesh = sr.loads(RULES), _mesh(kind)
    step = sr.jit(
        _step(loss), rules, mesh, in_groups=("params", "inputs"), out_groups=(None, None, None), strict=strict
    )
    params = sr.apply(_params(), rules, mesh)
    batch = sr.apply(_batch(), rules, mesh, group="inputs")
    return step, (params, batch), step(params, batch)


def _close(got: Any, want: Any) -> None:
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("loss", [_lookup, _take_in_remat], ids=["lookup", "take_in_remat"])
@pytest.mark.parametrize("strict", [False, True], ids=["", "strict"])
def test_an_embedding_gradient_is_laid_out_as_the_embedding(loss: Any, strict: bool) -> None:
    step, args, (updated, grads, value) = _run(loss, strict)
    assert jax.typeof(grads["emb"]).sharding.spec == P("model", "fsdp")
    assert jax.typeof(updated["emb"]).sharding.spec == P("model", "fsdp")
    scatters = [d for d in step.decisions(*args) if d.primitive == "scatter-add"]
    assert [(d.scope, d.spec) for d in scatters] == [("embed (backward)", P("model", "fsdp"))]
    _close((updated, grads, value), jax.jit(_step(loss))(_params(), _batch()))  # one device


def test_the_embedding_gradients_layout_divides_its_flops() -> None:
    """The scatter-add and the update are split over all 8 devices, not
    computed whole on each: with a (1024, 64) embedding, the compiled step's
    FLOPs per device are 1.04x one device's / 8 (1.41x with the gradient
    replicated)."""
    rules, mesh = sr.loads(RULES), _mesh()
    step = sr.jit(
        _step(_lookup), rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None, None)
    )
    params = {
        "emb": jax.ShapeDtypeStruct((1024, 64), jnp.float32),
        "w": jax.ShapeDtypeStruct((64, H), jnp.float32),
    }
    cost = step.cost(params, {"tok": jax.ShapeDtypeStruct((B, T), jnp.int32)})
    assert cost.ratio is not None and cost.ratio <= 1.2, cost


def test_gather_and_scatter_of_an_activation_are_laid_out_as_it() -> None:
    step, args, (updated, grads, value) = _run(_moe)
    by = {(d.scope, d.primitive): d for d in step.decisions(*args)}
    # the dispatch's cotangent: laid out as the activation it gathered from
    assert by[("dispatch (backward)", "scatter-add")].spec == P("fsdp", None)
    # the combine's updates' cotangent: laid out as the updates (the dispatch rule's layout)
    assert by[("dispatch", "gather")].spec == P("model", None, None)
    assert by[("combine (backward)", "gather")].spec == P("model", None, None)
    _close((updated, grads, value), jax.jit(_step(_moe))(_params(), _batch()))


def test_jax_jit_on_the_mesh_gives_the_same_numbers() -> None:
    """The same step, its layouts stated in its code as plain `jax.jit` needs
    them on Explicit axes, under `jax.jit` inside `jax.set_mesh`."""

    def stated(params: dict[str, Any], batch: dict[str, Any]) -> Any:
        x = params["emb"].at[batch["tok"]].get(out_sharding=P("fsdp", None, None))
        return (jnp.tanh(x @ params["w"]) ** 2).mean()

    _, (params, batch), got = _run(_lookup)
    with jax.set_mesh(_mesh()):
        want = jax.jit(_step(stated))(params, batch)
    assert jax.typeof(want[1]["emb"]).sharding.spec == jax.typeof(got[1]["emb"]).sharding.spec
    _close(got, want)


def test_auto_axes_give_the_same_numbers() -> None:
    _, _, explicit = _run(_lookup)
    step, args, auto = _run(_lookup, kind=AxisType.Auto)
    assert step.decisions(*args) == []  # nothing to decide: the partitioner lays it out
    _close(explicit, auto)


SMOOTH = """mesh data, model
rules params:
  "v$" -> replicated
  "w$" -> (_, model)
rules activations:
  "smooth$" -> (data, _)
rules inputs:
  "x$" -> (data, _)
"""


@jax.custom_vjp
def _smooth(x: Any) -> Any:
    return x


def _smooth_fwd(x: Any) -> tuple[Any, None]:
    return x, None


def _smooth_bwd(_: None, g: Any) -> tuple[Any]:
    return (jnp.broadcast_to(jnp.mean(g, axis=0), g.shape),)  # every row: the batch's mean gradient


_smooth.defvjp(_smooth_fwd, _smooth_bwd)


def _smoothed(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    with jax.named_scope("smooth"):
        h = _smooth(batch["x"] @ params["v"])
    return (jnp.tanh(h @ params["w"]) ** 2).mean()


@pytest.mark.parametrize("ruled", [True, False], ids=["rule", "no_rule"])
def test_a_rule_lays_out_its_scopes_replicated_gradient_operations(ruled: bool) -> None:
    text = SMOOTH if ruled else SMOOTH.replace('  "smooth$" -> (data, _)\n', "")
    rules, mesh = (
        sr.loads(text),
        jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2),
    )
    rng = np.random.default_rng(2)
    raw = {"v": rng.normal(size=(D, D)).astype(np.float32), "w": rng.normal(size=(D, H)).astype(np.float32)}
    params = sr.apply(raw, rules, mesh)
    batch = sr.apply({"x": rng.normal(size=(B, D)).astype(np.float32)}, rules, mesh, group="inputs")
    step = sr.jit(
        _step(_smoothed), rules, mesh, in_groups=("params", "inputs"), out_groups=(None, None, None)
    )
    back = [d for d in step.decisions(params, batch) if d.scope == "smooth (backward)" and d.shape == (B, D)]
    if ruled:  # the broadcast the custom gradient makes, (B, D) as the scope's output: the rule's layout
        assert [(d.primitive, d.spec, d.by) for d in back] == [("broadcast_in_dim", P("data", None), "rule")]
        assert back[0].rule == "<string>:6:3"
    else:  # replicated, as before: no rule reaches it
        assert back == []
    # (plain `jax.jit` on the mesh refuses the custom gradient: its broadcast is
    # replicated where the primal input is split over `data`)
    _close(step(params, batch), jax.jit(_step(_smoothed))(raw, {"x": np.asarray(batch["x"])}))
