"""`sr.jit` and `sr.auto_constrain` on meshes with Explicit axes (what
`jax.make_mesh` makes by default since JAX 0.8): unmodified model code trains,
with the numbers of one device, the rules settle the contractions JAX finds
ambiguous, and what JAX cannot decide is inferred, listed, or an error in our
words (SR117)."""

from __future__ import annotations

import re
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.core import ShardingTypeError
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr

RULES = sr.loads(
    r"""mesh data=4, model=2

rules params:
  "up$"   -> (_, model)   # column-parallel
  "down$" -> (model, _)   # row-parallel: the contraction over `model` is ambiguous on Explicit axes
  default -> replicated

rules activations:
  "block_\d+/up$" -> (data, model)

rules inputs:
  "x|y" -> (data, _)
""",
    name="tp.shard",
)
NO_ACTIVATIONS = sr.loads(
    RULES.sources["tp.shard"].split("rules activations:")[0] + 'rules inputs:\n  "x|y" -> (data, _)\n',
    name="plain.shard",
)


def explicit_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


def auto_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def forward(params: dict, x: jax.Array, blocks: int = 2) -> jax.Array:
    for i in range(blocks):
        with jax.named_scope(f"block_{i}"):
            with jax.named_scope("up"):
                h = x @ params[f"b{i}"]["up"]
            h = jax.nn.gelu(h)
            with jax.named_scope("down"):
                x = x + h @ params[f"b{i}"]["down"]
    return x


def loss_fn(params: dict, batch: dict) -> jax.Array:
    return jnp.mean((forward(params, batch["x"]) - batch["y"]) ** 2)


def sgd(params: dict, batch: dict) -> tuple[dict, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def data(seed: int = 0) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    params = {
        f"b{i}": {
            "up": (rng.standard_normal((16, 32)) * 0.2).astype(np.float32),
            "down": (rng.standard_normal((32, 16)) * 0.2).astype(np.float32),
        }
        for i in range(2)
    }
    batch = {k: rng.standard_normal((32, 16)).astype(np.float32) for k in ("x", "y")}
    return params, batch


def one_device(steps: int = 3) -> list[float]:
    params, batch = data()
    step = jax.jit(sgd)
    losses = []
    for _ in range(steps):
        params, loss = step(params, batch)
        losses.append(float(loss))
    return losses


def test_plain_jit_fails_on_explicit_axes() -> None:
    """The problem: JAX itself refuses the row-parallel contraction."""
    mesh = explicit_mesh()
    params, batch = data()
    params, batch = sr.apply(params, RULES, mesh), sr.apply(batch, RULES, mesh, group="inputs")
    with jax.set_mesh(mesh), pytest.raises(ShardingTypeError):
        jax.jit(sgd)(params, batch)


@pytest.mark.parametrize("rules", [RULES, NO_ACTIVATIONS], ids=["with-activations", "without"])
@pytest.mark.parametrize("make_mesh", [explicit_mesh, auto_mesh], ids=["explicit", "auto"])
def test_sr_jit_trains_with_the_numbers_of_one_device(rules: sr.RuleSet, make_mesh) -> None:
    mesh = make_mesh()
    params, batch = data()
    params, batch = sr.apply(params, rules, mesh), sr.apply(batch, rules, mesh, group="inputs")
    step = sr.jit(sgd, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    losses = []
    for _ in range(3):  # each step's outputs feed the next unchanged
        params, loss = step(params, batch)
        losses.append(float(loss))
    np.testing.assert_allclose(losses, one_device(), rtol=2e-5)
    up = params["b0"]["up"]
    assert up.sharding.spec == P(None, "model") and up.sharding.mesh == mesh
    assert jax.typeof(up).sharding.spec == (P(None, "model") if make_mesh is explicit_mesh else P(None, None))


def test_the_rule_gives_the_contraction_its_layout() -> None:
    mesh = explicit_mesh()
    params, batch = data()
    params, batch = sr.apply(params, RULES, mesh), sr.apply(batch, RULES, mesh, group="inputs")
    step = sr.jit(sgd, RULES, mesh, in_groups=("params", "inputs"))
    decisions = step.decisions(params, batch)
    up = [d for d in decisions if d.scope == "block_0/up"]
    assert [(d.by, d.spec, d.rule) for d in up] == [("rule", P("data", "model"), "tp.shard:9:3")]
    assert up[0].operands == (((32, 16), P("data", None)), ((16, 32), P(None, "model")))
    down = [d for d in decisions if d.scope == "block_0/down" and d.primitive == "dot_general"]
    assert down and down[0].by == "inferred" and down[0].spec == P("data", None)
    assert {d.by for d in decisions} <= {"rule", "jax", "inferred", "auto_axes"}
    backward = [d for d in decisions if d.scope == "block_0/down (backward)" and d.primitive == "dot_general"]
    assert backward, [d.scope for d in decisions]  # the gradient's contractions, named by their forward scope
    assert sr.jit(sgd, RULES, auto_mesh(), in_groups=("params", "inputs")).decisions(params, batch) == []


def test_strict_names_the_scope_the_operands_and_the_rule_to_add() -> None:
    mesh = explicit_mesh()
    params, batch = data()
    params, batch = sr.apply(params, RULES, mesh), sr.apply(batch, RULES, mesh, group="inputs")
    step = sr.jit(sgd, RULES, mesh, in_groups=("params", "inputs"), strict=True)
    with pytest.raises(sr.PlanError) as info:
        step(params, batch)
    err = info.value
    assert err.code == "SR117"
    text = str(err)
    assert "`dot_general` in scope `block_0/down`" in text
    assert "(32, 32) P('data', 'model'), (32, 16) P('model', None)" in text
    assert 'add `"block_0/down$" -> (data, _)` under `rules activations:`' in text
    assert "Contracting dimensions are sharded" in text  # JAX's own words, as the cause


def test_auto_constrain_under_plain_jit_needs_no_mesh_context() -> None:
    mesh = explicit_mesh()
    params, batch = data()
    params, batch = sr.apply(params, RULES, mesh), sr.apply(batch, RULES, mesh, group="inputs")
    step = jax.jit(sr.auto_constrain(sgd, RULES, mesh))
    _, loss = step(params, batch)
    np.testing.assert_allclose(float(loss), one_device(1)[0], rtol=2e-5)


def test_scan_while_and_cond_bodies_are_laid_out() -> None:
    """A loop over stacked layers: its carry keeps one layout from step to step."""
    mesh = explicit_mesh()
    rules = sr.loads(
        'rules params:\n  "up$" -> (_, _, model)\n  "down$" -> (_, model, _)\nrules inputs:\n  "x" -> (data, _)\n'
    )
    rng = np.random.default_rng(1)
    stacked = {
        "up": (rng.standard_normal((3, 16, 32)) * 0.2).astype(np.float32),
        "down": (rng.standard_normal((3, 32, 16)) * 0.2).astype(np.float32),
    }
    x = rng.standard_normal((32, 16)).astype(np.float32)

    def fn(p: dict, x: jax.Array) -> jax.Array:
        def layer(h: jax.Array, w: dict) -> tuple[jax.Array, None]:
            h = h + jax.nn.relu(h @ w["up"]) @ w["down"]
            h = jax.lax.cond(h.sum() > 0, lambda v: v * 0.5, lambda v: v, h)
            return h, None

        h = jax.lax.scan(layer, x, p)[0]
        first = {"up": p["up"][0], "down": p["down"][0]}  # a while loop over one layer
        h = jax.lax.fori_loop(0, 2, lambda _, v: v + jnp.tanh(v @ first["up"]) @ first["down"], h)
        return h.sum()

    expected = float(jax.jit(fn)(stacked, x))
    placed = sr.apply(stacked, rules, mesh)
    got = sr.jit(fn, rules, mesh, in_groups=("params", None))(
        placed, sr.apply({"x": x}, rules, mesh, group="inputs")["x"]
    )
    np.testing.assert_allclose(float(got), expected, rtol=2e-5)


def test_flax_linen_dense_stack_with_tensor_parallel_kernels() -> None:
    nn = pytest.importorskip("flax.linen")

    class Mlp(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            h = nn.gelu(nn.Dense(32, name="up")(x))
            return nn.Dense(16, name="down")(h)

    rules = sr.loads(
        r"""rules params:
  "up/kernel$"   -> (_, model)
  "up/bias$"     -> (model)
  "down/kernel$" -> (model, _)
  default        -> replicated
rules activations:
  "up$" -> (data, model)
rules inputs:
  "x" -> (data, _)
"""
    )
    model = Mlp()
    x = np.random.default_rng(2).standard_normal((32, 16)).astype(np.float32)
    variables = model.init(jax.random.key(0), x)

    def loss(v: dict, x: jax.Array) -> jax.Array:
        return jnp.mean(model.apply(v, x) ** 2)

    expected = jax.jit(jax.value_and_grad(loss))(variables, x)
    mesh = explicit_mesh()
    placed = sr.apply(variables, rules, mesh)
    xs = sr.apply({"x": x}, rules, mesh, group="inputs")["x"]
    got = sr.jit(jax.value_and_grad(loss), rules, mesh, in_groups=("params", None))(placed, xs)
    np.testing.assert_allclose(float(got[0]), float(expected[0]), rtol=2e-5)
    for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(expected[1]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_a_step_with_a_replicated_mesh_keeps_explicit_types() -> None:
    """Inputs and outputs carry NamedShardings of the explicit mesh."""
    mesh = explicit_mesh()
    params, batch = data()
    params, batch = sr.apply(params, RULES, mesh), sr.apply(batch, RULES, mesh, group="inputs")
    new, _ = sr.jit(sgd, RULES, mesh, in_groups=("params", "inputs"), out_groups=("params", None))(
        params, batch
    )
    for leaf in jax.tree.leaves(new):
        assert (
            isinstance(leaf.sharding, NamedSharding)
            and leaf.sharding.mesh.axis_types == (AxisType.Explicit,) * 2
        )


def test_a_closed_over_array_is_named_as_the_cause() -> None:
    """Arguments are traced replicated at first: an array the function closes over keeps
    its Explicit layout, JAX settles it where it can, and its refusal comes back in our words."""
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    rules = sr.loads('rules params:\n  "w$" -> replicated\nrules inputs:\n  "." -> (data, _)\n')
    params = sr.apply({"w": jnp.ones((64, 16))}, rules, mesh)
    x = sr.apply({"x": jnp.ones((128, 64))}, rules, mesh, group="inputs")["x"]

    def grad_w(p: dict, x: jax.Array) -> dict:
        return jax.grad(lambda p: (x @ p["w"]).sum())(p)

    step = sr.jit(grad_w, rules, mesh, in_groups=("params", "inputs"))
    expected = jax.jit(grad_w)(jax.device_get(params), jax.device_get(x))["w"]
    np.testing.assert_allclose(step(params, x)["w"], expected)  # as an argument: settled
    # closed over, it keeps its layout in the first trace, which JAX settles here
    closed = sr.jit(lambda p: grad_w(p, x), rules, mesh, in_groups=("params",))(params)["w"]
    np.testing.assert_allclose(closed, expected)
    # two closed-over arrays whose layouts JAX cannot combine: its refusal in our words
    a = jax.device_put(jnp.ones((64, 16)), NamedSharding(mesh, P("data", None)))
    b = jax.device_put(jnp.ones((16, 64)), NamedSharding(mesh, P(None, "data")))
    with pytest.raises(sr.PlanError) as info:
        sr.jit(lambda x: x @ (a @ b), rules, mesh, in_groups=("inputs",))(x)
    assert info.value.code == "SR117"
    assert "closes over" in str(info.value) and "pass the arrays the function uses" in str(info.value)


def test_unplaced_arguments_are_moved_to_their_groups_layout() -> None:
    """On Explicit axes the layout is the argument's type: a NumPy array passed for a
    group is moved to that group's layout first, so the batch stays split."""
    mesh = explicit_mesh()
    rules = sr.loads(
        'rules params:\n  "up$" -> (_, model)\n  "down$" -> (model, _)\nrules inputs:\n  "x" -> (data, _)\n'
    )
    params = sr.apply({"up": jnp.ones((16, 64)) / 16, "down": jnp.ones((64, 16)) / 64}, rules, mesh)

    def forward(params: dict, x: jax.Array) -> jax.Array:
        return (x @ params["up"]) @ params["down"]

    x = np.ones((8, 16), np.float32)
    out = sr.jit(forward, rules, mesh, in_groups=("params", "inputs"))(params, x)
    np.testing.assert_allclose(
        np.asarray(out), x @ np.ones((16, 64)) / 16 @ np.ones((64, 16)) / 64, rtol=1e-6
    )
    assert out.sharding.spec == P("data", None)


def test_constrain_inside_sr_jit_on_explicit_axes_is_named() -> None:
    """A layout set inside the step (traced first without layouts) comes back as SR117
    saying so, with the way out: activation rules and out_groups."""
    mesh = explicit_mesh()
    rules = sr.loads('rules params:\n  "up$" -> (_, model)\n  "down$" -> (model, _)\n')
    params = sr.apply({"up": jnp.ones((16, 64)), "down": jnp.ones((64, 16))}, rules, mesh)

    def forward(params: dict, x: jax.Array) -> jax.Array:
        params = sr.constrain(params, rules, mesh)
        return (x @ params["up"]) @ params["down"]

    with pytest.raises(sr.PlanError) as info:
        sr.jit(forward, rules, mesh, in_groups=("params", None))(params, jnp.ones((8, 16)))
    assert info.value.code == "SR117" and "shardrules.constrain" in str(info.value)


def test_a_broadcast_mask_does_not_replicate_what_it_masks() -> None:
    """An element-wise operation on a sharded array and a broadcast (unsharded)
    mask keeps the sharded layout; `decisions` traces with the `in_groups` layouts
    even for unplaced arguments."""
    mesh = explicit_mesh()
    rules = sr.loads('rules inputs:\n  "s" -> (data, model, _, _)\n')

    def f(s: jax.Array) -> jax.Array:
        with jax.named_scope("attn"):
            return jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((16, 16), bool)), s, -1e9), -1)

    s = np.random.default_rng(3).standard_normal((8, 4, 16, 16)).astype(np.float32)
    step = sr.jit(f, rules, mesh, in_groups=("inputs",))
    out = step(s)
    assert jax.typeof(out).sharding.spec == P("data", "model", None, None)
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(f)(s)), rtol=1e-6)
    # Nothing was left to decide: the mask and the fill value, made from constants alone
    # and so replicated by the layout-free first trace, take the one sharded operand's
    # layout (as JAX, tracing with layouts, gives them); `decisions` traces NumPy
    # arguments as their group lays them out.
    assert step.decisions(s) == []


def test_softmax_and_a_causal_mask_under_grad_are_no_decision_even_strict() -> None:
    """The gradient of a masked softmax (`select_n` of broadcast constants and a
    sharded array, forward and backward) runs with `strict=True`, lists no
    decision, and gives the numbers of plain `jax.jit` on the same mesh."""
    mesh = explicit_mesh()
    rules = sr.loads('rules inputs:\n  "s" -> (data, model, _, _)\n')

    def loss(s: jax.Array) -> jax.Array:
        with jax.named_scope("attn"):
            masked = jnp.where(jnp.tril(jnp.ones((16, 16), bool)), s, -1e9)
            return jnp.sum(jax.nn.relu(jax.nn.softmax(masked) - 0.01) ** 2)

    s = np.random.default_rng(4).standard_normal((8, 4, 16, 16)).astype(np.float32)
    placed = jax.device_put(s, NamedSharding(mesh, P("data", "model")))
    with jax.set_mesh(mesh):
        value, grad = jax.jit(jax.value_and_grad(loss))(placed)
    step = sr.jit(jax.value_and_grad(loss), rules, mesh, in_groups=("inputs",), strict=True)
    ours, our_grad = step(s)
    np.testing.assert_allclose(float(ours), float(value), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(our_grad), np.asarray(grad), rtol=1e-5, atol=1e-7)
    assert jax.typeof(our_grad).sharding.spec == P("data", "model", None, None)
    assert [d for d in step.decisions(s) if d.primitive != "dot_general"] == []


def test_a_step_inside_another_trace_and_a_closed_over_array_with_out_groups() -> None:
    mesh = explicit_mesh()
    params, batch = data()
    params, batch = sr.apply(params, RULES, mesh), sr.apply(batch, RULES, mesh, group="inputs")
    step = sr.jit(sgd, RULES, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    _, loss = jax.jit(step)(params, batch)  # inside jax.jit: no set_mesh there
    np.testing.assert_allclose(float(loss), one_device(1)[0], rtol=2e-5)
    closed = sr.jit(lambda p: sgd(p, batch), RULES, mesh, in_groups=("params",), out_groups=("params", None))
    # the closed-over batch keeps its layout in the first trace (traced under the mesh)
    np.testing.assert_allclose(float(closed(params)[1]), one_device(1)[0], rtol=2e-5)


def test_a_vmapped_equinox_linear_takes_the_rule_in_its_own_dimension_order() -> None:
    """`jax.vmap(eqx.nn.Linear)` contracts to (out, batch) and transposes to the
    scope's (batch, out): the rule, written for the output, gives the contraction
    its spec reordered; with strict=True the hint names a rule that settles it."""
    eqx = pytest.importorskip("equinox")
    mesh = explicit_mesh()
    text = 'rules params:\n  "weight$" -> (_, model)\n  default -> replicated\nrules inputs:\n  "x" -> (data, model)\n'
    linear = eqx.nn.Linear(16, 8, key=jax.random.key(0))  # weight (8, 16): its contraction runs over `model`
    x = np.random.default_rng(4).standard_normal((32, 16)).astype(np.float32)

    def f(m, x: jax.Array) -> jax.Array:
        with jax.named_scope("lin"):
            return jax.vmap(m)(x)

    expected = np.asarray(jax.jit(f)(linear, x))

    def run(rules: sr.RuleSet, strict: bool = False) -> tuple[jax.Array, list]:
        placed = sr.apply(linear, rules, mesh)
        xs = sr.apply({"x": x}, rules, mesh, group="inputs")["x"]
        step = sr.jit(f, rules, mesh, in_groups=("params", None), strict=strict)
        return step(placed, xs), step.decisions(placed, xs)

    out, decided = run(sr.loads(text + 'rules activations:\n  "lin$" -> (data, _)\n', name="eqx.shard"))
    dot = [d for d in decided if d.primitive == "dot_general"]
    assert [(d.shape, d.spec, d.by) for d in dot] == [((8, 32), P(None, "data"), "rule")]
    assert jax.typeof(out).sharding.spec == P("data", None)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-6)

    with pytest.raises(sr.PlanError) as info:  # no activation rule: strict says which to add
        run(sr.loads(text + 'rules activations:\n  "unused" -> replicated\n', name="eqx.shard"), strict=True)
    assert info.value.code == "SR117" and "`dot_general` in scope `lin/eqx.nn.Linear`" in str(info.value)
    hinted = re.search(r"add `(.*)` under `rules activations:`", info.value.hint)
    assert hinted is not None and hinted.group(1).endswith("-> (data, _)"), (
        info.value.hint
    )  # the output's order
    rules = sr.loads(text + f"rules activations:\n  {hinted.group(1)}\n", name="eqx.shard")
    out, decided = run(rules, strict=True)  # the hinted rule settles it: no SR117 again
    assert [(d.spec, d.by) for d in decided if d.primitive == "dot_general"] == [(P(None, "data"), "rule")]
    assert jax.typeof(out).sharding.spec == P("data", None)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-6)


def test_a_contraction_used_only_inside_its_scope_takes_no_rule() -> None:
    """A rule describes its scope's output: a contraction of the same rank whose
    result stays inside the scope (attention scores) is left to JAX or inferred,
    and strict=True says which scope to wrap it in."""
    mesh = explicit_mesh()
    rules = sr.loads(
        'rules inputs:\n  "q|k" -> (data, model)\nrules activations:\n  "attn$" -> (data, model)\n',
        name="attn.shard",
    )
    rng = np.random.default_rng(5)
    q, k = (rng.standard_normal((32, 16)).astype(np.float32) for _ in range(2))

    def f(q: jax.Array, k: jax.Array) -> jax.Array:
        with jax.named_scope("attn"):
            scores = q @ k.T  # (32, 32), contracted over `model`: ambiguous
            return jax.nn.softmax(scores, -1) @ k

    step = sr.jit(f, rules, mesh, in_groups=("inputs", "inputs"))
    dots = [d for d in step.decisions(q, k) if d.primitive == "dot_general"]
    assert [d.by for d in dots] == ["inferred", "rule"], dots
    np.testing.assert_allclose(np.asarray(step(q, k)), np.asarray(jax.jit(f)(q, k)), rtol=1e-5, atol=1e-6)
    with pytest.raises(sr.PlanError) as info:
        sr.jit(f, rules, mesh, in_groups=("inputs", "inputs"), strict=True)(q, k)
    assert info.value.code == "SR117" and "not an output of scope `attn`" in info.value.hint
    assert 'jax.named_scope(NAME)` and add `"attn/NAME$" -> (data, _)`' in info.value.hint


@pytest.mark.parametrize("remat", [False, True], ids=["scan", "scan-of-remat"])
def test_the_gradient_inside_a_scan_is_backward_and_takes_no_rule(remat: bool) -> None:
    """Rules describe the forward pass: inside a scanned (and rematerialised)
    layer, the gradient's contractions are listed as `(backward)`, none takes a
    rule's spec, and the numbers are those of one device."""
    mesh = explicit_mesh()
    rules = sr.loads(
        r"""rules params:
  "up$"   -> (_, _, model)
  "down$" -> (_, model, _)
rules activations:
  "layer/up$" -> (data, model)
rules inputs:
  "x|y" -> (data, _)
""",
        name="scan.shard",
    )
    rng = np.random.default_rng(6)
    params = {
        "up": (rng.standard_normal((3, 16, 32)) * 0.2).astype(np.float32),
        "down": (rng.standard_normal((3, 32, 16)) * 0.2).astype(np.float32),
    }
    batch = {k: rng.standard_normal((32, 16)).astype(np.float32) for k in ("x", "y")}

    def loss(p: dict, batch: dict) -> jax.Array:
        def layer(h: jax.Array, w: dict) -> tuple[jax.Array, None]:
            with jax.named_scope("layer"):
                with jax.named_scope("up"):
                    u = jax.nn.relu(h @ w["up"])
                with jax.named_scope("down"):
                    return h + u @ w["down"], None

        h = jax.lax.scan(jax.checkpoint(layer) if remat else layer, batch["x"], p)[0]
        return jnp.mean((h - batch["y"]) ** 2)

    step = sr.jit(jax.value_and_grad(loss), rules, mesh, in_groups=("params", "inputs"))
    decided = [d for d in step.decisions(params, batch) if d.primitive == "dot_general"]
    forward = [(d.scope, d.by) for d in decided if not d.scope.endswith("(backward)")]
    assert forward == [("layer/up", "rule"), ("layer/down", "inferred")]  # one each
    backward = [d for d in decided if d.scope.endswith("(backward)")]
    assert {d.scope for d in backward} == {"layer/up (backward)", "layer/down (backward)"}, decided
    assert len(backward) >= 4 and not [d for d in backward if d.by == "rule"], backward
    got = step(sr.apply(params, rules, mesh), sr.apply(batch, rules, mesh, group="inputs"))
    want = jax.jit(jax.value_and_grad(loss))(params, batch)
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=2e-5)
    for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    # On Auto axes too, the gradient gets no constraints: one per forward layer output.
    auto = sr.jit(jax.value_and_grad(loss), rules, auto_mesh(), in_groups=("params", "inputs"))
    assert auto.lower(params, batch).as_text().count("sdy.sharding_constraint") == 1


@pytest.mark.parametrize("residual", ["outside", "inside"])
def test_a_scope_repeated_by_a_loop_has_each_use_matched(residual: str) -> None:
    """`with jax.named_scope("attn")` in a Python loop, without per-layer names:
    each use's output is matched as `attn`, whether the residual add is outside
    the scope or inside it (the next use then takes the output in)."""
    rules = sr.loads('rules activations:\n  "attn$" -> (data, model)\n', name="loop.shard")
    rng = np.random.default_rng(7)
    w, x = (
        rng.standard_normal((16, 16)).astype(np.float32) / 4,
        rng.standard_normal((32, 16)).astype(np.float32),
    )

    def f(w: jax.Array, x: jax.Array) -> jax.Array:
        for _ in range(2):
            with jax.named_scope("attn"):
                h = jnp.tanh(x @ w)
                if residual == "inside":
                    x = x + h
            if residual == "outside":
                x = x + h
        return x

    auto = jax.jit(sr.auto_constrain(f, rules, auto_mesh()))
    assert auto.lower(w, x).as_text().count("sdy.sharding_constraint") == 2
    step = sr.jit(f, rules, explicit_mesh())
    dots = [(d.scope, d.spec, d.by) for d in step.decisions(w, x) if d.primitive == "dot_general"]
    assert dots == [("attn", P("data", "model"), "rule")] * 2
    np.testing.assert_allclose(np.asarray(step(w, x)), np.asarray(jax.jit(f)(w, x)), rtol=1e-5, atol=1e-6)


def test_a_rule_for_a_scope_whose_outputs_are_numbered_warns() -> None:
    """One use of a scope that makes several outputs has them matched as `S/0`,
    `S/1`: a rule for `S` alone would match none, which is said, not silent."""
    rules = sr.loads('rules activations:\n  "attn$" -> (data, model)\n', name="two.shard")

    def f(x: jax.Array) -> jax.Array:
        with jax.named_scope("attn"):
            a, b = x * 2, x + 1
        return a @ b

    with pytest.warns(sr.ShardRulesWarning, match=r"`attn/0`, `attn/1`") as caught:
        jax.jit(sr.auto_constrain(f, rules, auto_mesh())).lower(jnp.ones((8, 8)))
    warning = caught[0].message
    assert isinstance(warning, sr.ShardRulesWarning) and warning.code == "SR201"
    assert warning.span is not None and (warning.span.file, warning.span.line) == ("two.shard", 2)
    assert '"attn/\\d+$"' in warning.hint
    # one mistake, one warning: not also SR211 (the rule matching no output) for the same rule
    assert [getattr(w.message, "code", None) for w in caught] == ["SR201"]


def test_an_activation_rule_over_an_explicit_and_an_auto_axis_is_sr207_at_call_time() -> None:
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Auto))
    text = 'rules params:\n  "up$" -> (_, model)\nrules activations:\n  "up$" -> {}\nrules inputs:\n  "x" -> (data, _)\n'
    rng = np.random.default_rng(8)
    params, x = (
        {"up": rng.standard_normal((16, 32)).astype(np.float32)},
        rng.standard_normal((32, 16)).astype(np.float32),
    )

    def f(p: dict, x: jax.Array) -> jax.Array:
        with jax.named_scope("up"):
            return jnp.tanh(x @ p["up"])

    rules = sr.loads(text.format("(data, model)"), name="mixed.shard")
    with pytest.raises(sr.PlanError) as info:
        sr.jit(f, rules, mesh, in_groups=("params", "inputs"))(params, x)
    err = info.value
    assert err.code == "SR207" and err.span is not None and (err.span.line, err.span.col) == (4, 12)
    assert "mixed.shard:4:12" in str(err) and "Explicit axes (data) and Auto axes (model)" in str(err)
    assert "`(data, _)`" in err.hint and "axis_types" in err.hint
    rules = sr.loads(text.format("(data, _)"), name="mixed.shard")  # the fix the hint gives
    out = sr.jit(f, rules, mesh, in_groups=("params", "inputs"))(params, x)
    assert jax.typeof(out).sharding.spec == P("data", None)
    np.testing.assert_allclose(np.asarray(out), np.tanh(x @ params["up"]), rtol=1e-5, atol=1e-6)


def test_the_hinted_rule_settles_an_ambiguous_elementwise_operation_under_strict() -> None:
    """Not only contractions: a `jnp.where` over cases laid out differently is
    ambiguous to JAX; the rule SR117 hints at gives it its layout, and strict=True
    then raises no more."""
    mesh = explicit_mesh()
    text = 'rules inputs:\n  "a" -> (data, _)\n  "b" -> replicated\nrules activations:\n'
    rng = np.random.default_rng(9)
    a, b = (rng.standard_normal((32, 16)).astype(np.float32) for _ in range(2))

    def f(a: jax.Array, b: jax.Array) -> jax.Array:
        with jax.named_scope("pick"):
            return jnp.where(a > 0, a, b)

    def run(rules: sr.RuleSet) -> tuple[jax.Array, list]:
        step = sr.jit(f, rules, mesh, in_groups=("inputs", "inputs"), strict=True)
        return step(a, b), step.decisions(a, b)

    with pytest.raises(sr.PlanError) as info:
        run(sr.loads(text + '  "unused" -> replicated\n', name="pick.shard"))
    assert info.value.code == "SR117" and "`select_n` in scope `pick`" in str(info.value)
    hinted = re.search(r"add `(.*)` under `rules activations:`", info.value.hint)
    assert hinted is not None and hinted.group(1) == '"pick$" -> (data, _)', info.value.hint
    out, decided = run(sr.loads(text + f"  {hinted.group(1)}\n", name="pick.shard"))
    assert [(d.primitive, d.spec, d.by, d.rule) for d in decided] == [
        ("select_n", P("data", None), "rule", "pick.shard:5:3")
    ]
    assert jax.typeof(out).sharding.spec == P("data", None)
    np.testing.assert_allclose(np.asarray(out), np.where(a > 0, a, b))


# A contraction's gradient with respect to an argument of the step (or its cast) is laid out as
# that argument is (JAX's transpose rule), so an update `w - lr * g` with `strict=True` meets layouts that agree, as it
# does under plain `jax.jit` (MaxText's SGD step: a weight laid out (tensor, fsdp), its gradient
# was inferred (None, tensor) and the update was SR117).
GRADIENT_CASES = {
    "maxtext-einsum": ("bsm,me->bse", (8, 4, 8), (8, 16), P("fsdp", None, "tensor"), P("tensor", "fsdp")),
    "weight-transposed": ("bsm,em->bse", (8, 4, 8), (16, 8), P("fsdp", None, "tensor"), P("fsdp", "tensor")),
    "plain-matmul": ("bm,me->be", (16, 8), (8, 16), P("fsdp", "tensor"), P("tensor", None)),
    "batched-weight": (
        "bsm,bme->bse",
        (8, 4, 8),
        (8, 8, 16),
        P("fsdp", None, None),
        P("fsdp", None, "tensor"),
    ),
    "weight-cast": ("bsm,me->bse", (8, 4, 8), (8, 16), P("fsdp", None, "tensor"), P("tensor", "fsdp")),
}


@pytest.mark.parametrize("case", sorted(GRADIENT_CASES))
def test_a_contractions_gradient_is_laid_out_as_its_operand_under_strict(case: str) -> None:
    equation, h_shape, w_shape, h_spec, w_spec = GRADIENT_CASES[case]
    mesh = jax.make_mesh((4, 2), ("fsdp", "tensor"), axis_types=(AxisType.Explicit,) * 2)
    out = P("fsdp", None, "tensor") if len(h_shape) == 3 else P("fsdp", "tensor")
    text = f'mesh fsdp, tensor\nrules params:\n  "w" -> {tuple(w_spec)}\nrules inputs:\n  "h" -> {tuple(h_spec)}\n'
    rules = sr.loads(text.replace("'", "").replace("None", "_"))

    def loss(params, batch):
        w = params["w"].astype(jnp.bfloat16).astype(jnp.float32) if case == "weight-cast" else params["w"]
        return (jnp.einsum(equation, batch["h"], w, out_sharding=out) ** 2).sum()

    def sgd(params, batch):
        grads, batch_grads = jax.grad(loss, argnums=(0, 1))(params, batch)  # both operands' cotangents
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), (grads, batch_grads)

    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=w_shape).astype(np.float32)}
    batch = {"h": rng.normal(size=h_shape).astype(np.float32)}
    step = sr.jit(sgd, rules, mesh, in_groups=("params", "inputs"), strict=True)
    new, (grads, batch_grads) = step(params, batch)
    with jax.set_mesh(mesh):
        placed = jax.device_put(params, {"w": NamedSharding(mesh, w_spec)})
        fed = jax.device_put(batch, {"h": NamedSharding(mesh, h_spec)})
        want_new, (want_grads, want_batch_grads) = jax.jit(sgd)(placed, fed)
    assert grads["w"].sharding.spec == want_grads["w"].sharding.spec == w_spec
    assert batch_grads["h"].sharding.spec == want_batch_grads["h"].sharding.spec == h_spec
    assert new["w"].sharding.spec == want_new["w"].sharding.spec
    np.testing.assert_allclose(np.asarray(new["w"]), np.asarray(want_new["w"]), rtol=1e-4, atol=1e-4)
    backward = [d for d in step.decisions(params, batch) if d.scope.endswith("(backward)")]
    assert any(d.by == "jax" and d.spec is not None for d in backward), backward


def test_gradients_of_weights_sharing_an_input_keep_their_own_layouts() -> None:
    # `h @ wq` and `h @ wk` of one shape, laid out differently: each gradient is its own weight's
    # layout (the forward contraction is told apart by the line that made it), and a replicated
    # weight's gradient stays replicated, as under plain `jax.jit`
    mesh = jax.make_mesh((4, 2), ("fsdp", "tensor"), axis_types=(AxisType.Explicit,) * 2)
    layouts = {"wq": P("fsdp", "tensor"), "wk": P("tensor", "fsdp"), "wv": P(None, None)}
    rules = sr.loads(
        'mesh fsdp, tensor\nrules params:\n  "wq" -> (fsdp, tensor)\n  "wk" -> (tensor, fsdp)\n'
        '  "wv" -> replicated\nrules inputs:\n  "h" -> (fsdp, _)\n'
    )

    def loss(p, b):
        q = jnp.dot(b["h"], p["wq"], out_sharding=P("fsdp", None))
        k = jnp.dot(b["h"], p["wk"], out_sharding=P("fsdp", None))
        v = jnp.dot(b["h"], p["wv"], out_sharding=P("fsdp", None))
        return (q * k * v).sum()

    def sgd(p, b):
        grads = jax.grad(loss)(p, b)
        return jax.tree.map(lambda w, g: w - 0.1 * g, p, grads), grads

    rng = np.random.default_rng(1)
    params = {name: rng.normal(size=(8, 8)).astype(np.float32) for name in layouts}
    batch = {"h": rng.normal(size=(16, 8)).astype(np.float32)}
    new, grads = sr.jit(sgd, rules, mesh, in_groups=("params", "inputs"), strict=True)(params, batch)
    with jax.set_mesh(mesh):
        placed = jax.device_put(params, {k: NamedSharding(mesh, s) for k, s in layouts.items()})
        fed = jax.device_put(batch, {"h": NamedSharding(mesh, P("fsdp", None))})
        want_new, want_grads = jax.jit(sgd)(placed, fed)
    for name, spec in layouts.items():
        assert grads[name].sharding.spec == want_grads[name].sharding.spec == spec, name
        assert new[name].sharding.spec == spec, name
        np.testing.assert_allclose(np.asarray(new[name]), np.asarray(want_new[name]), rtol=1e-4, atol=1e-4)


def rotary_loss(params: dict, batch: dict) -> jax.Array:
    # rotary frequencies computed from Python ints while the step is traced, as
    # model libraries make them (`jax.ensure_compile_time_eval`: a constant, not
    # part of the step's program)
    with jax.ensure_compile_time_eval():
        inv = 1.0 / (10000.0 ** (jnp.arange(0, 16, 2) / 16))
        angles = jnp.outer(jnp.arange(32), inv)
        cos = jnp.concatenate([jnp.cos(angles)] * 2, axis=-1)
    return jnp.mean((forward(params, batch["x"] * cos) - batch["y"]) ** 2)


def rotary_sgd(params: dict, batch: dict) -> tuple[dict, jax.Array]:
    loss, grads = jax.value_and_grad(rotary_loss)(params, batch)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


@pytest.mark.parametrize("make_mesh", [explicit_mesh, auto_mesh], ids=["explicit", "auto"])
def test_a_constant_computed_while_tracing_is_computed_on_the_meshs_devices(make_mesh) -> None:
    # on Explicit axes the step is traced under the mesh's abstract form; the
    # constant is compiled then, on the mesh's devices, as under `jax.set_mesh`
    params, batch = data()
    want = []
    step = jax.jit(rotary_sgd)
    one = params
    for _ in range(2):
        one, loss = step(one, batch)
        want.append(float(loss))
    mesh = make_mesh()
    step = sr.jit(rotary_sgd, RULES, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    placed = sr.apply(params, RULES, mesh)
    losses = []
    for _ in range(2):
        placed, loss = step(placed, batch)
        losses.append(float(loss))
    np.testing.assert_allclose(losses, want, rtol=2e-5)
    _, loss = jax.jit(step)(sr.apply(params, RULES, mesh), sr.apply(batch, RULES, mesh, group="inputs"))
    np.testing.assert_allclose(float(loss), want[0], rtol=2e-5)  # inside another trace too
    if make_mesh is explicit_mesh:  # the rules still give the contractions their layouts
        assert [d.scope for d in step.decisions(params, batch) if d.by == "rule"]


# ---------------------------------------------------------------- with_sharding_constraint
# On Explicit axes JAX makes `jax.lax.with_sharding_constraint` an assert: the value must be
# laid out so already. The step's first trace sees its values replicated; the assert is made
# on the layouts they have when the step runs, as `jax.jit` makes it.

DATA_ROWS = sr.loads("rules params:\n  default -> (data, _)\n", name="rows.shard")


def test_a_constraint_an_argument_is_laid_out_as_already_passes() -> None:
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))

    def step(w):
        w = jax.lax.with_sharding_constraint(w, P("data", None))
        return (w * 2).sum()

    w = jax.device_put(jnp.arange(64.0).reshape(16, 4), NamedSharding(mesh, P("data", None)))
    got = sr.jit(step, DATA_ROWS, mesh, in_groups=("params",))(w)
    with jax.set_mesh(mesh):
        expected = jax.jit(step)(w)  # plain `jax.jit` runs it: the layouts agree
    assert float(got) == float(expected) == 2 * float(np.arange(64.0).sum())


def constrained_forward(params: dict, x: jax.Array, where: str) -> jax.Array:
    """`forward`, stating with `with_sharding_constraint` the layout the rule
    `block_\\d+/up$ -> (data, model)` gives each block's `up` output."""
    for i in range(2):
        with jax.named_scope(f"block_{i}"):
            with jax.named_scope("up"):
                h = x @ params[f"b{i}"]["up"]
            if where == "activation":
                h = jax.lax.with_sharding_constraint(h, P("data", "model"))
            elif where == "remat":
                h = jax.checkpoint(lambda h: jax.lax.with_sharding_constraint(h, P("data", "model")))(h)
            else:  # each row under `jax.vmap`: the batch dimension is not asserted
                h = jax.vmap(lambda row: jax.lax.with_sharding_constraint(row, P("model")))(h)
            h = jax.nn.gelu(h)
            with jax.named_scope("down"):
                x = x + h @ params[f"b{i}"]["down"]
    return x


@pytest.mark.parametrize("where", ["activation", "remat", "vmap"])
def test_a_constraint_on_an_activation_the_rules_lay_out_so_passes(where: str) -> None:
    """The activation's layout comes from the rule (its contraction's
    `out_sharding`); the step trains with the numbers of one device."""
    mesh = explicit_mesh()
    params, batch = data()
    params, batch = sr.apply(params, RULES, mesh), sr.apply(batch, RULES, mesh, group="inputs")

    def sgd_constrained(params, batch):
        def loss(params):
            return jnp.mean((constrained_forward(params, batch["x"], where) - batch["y"]) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    step = sr.jit(sgd_constrained, RULES, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    losses = []
    for _ in range(3):
        params, loss = step(params, batch)
        losses.append(float(loss))
    np.testing.assert_allclose(losses, one_device(), rtol=2e-5)
    assert jax.typeof(params["b0"]["up"]).sharding.spec == P(None, "model")


@pytest.mark.parametrize("where", ["argument", "activation under jax.grad"])
def test_a_constraint_that_disagrees_is_jaxs_assert_on_the_layout_the_value_has(where: str) -> None:
    """JAX's `AssertionError`, naming the layout the value has when the step
    runs (not the replicated one of the first trace) and the model's line."""
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    w = jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P("data", None)))

    def step(w):
        def loss(w):
            h = jnp.tanh(w) if where != "argument" else w
            h = jax.lax.with_sharding_constraint(h, P(None, "data"))  # the line named
            return (h * 2).sum()

        return loss(w) if where == "argument" else jax.grad(loss)(w)

    with jax.set_mesh(mesh), pytest.raises(AssertionError):
        jax.jit(step)(w)  # as plain `jax.jit` refuses it
    f = sr.jit(step, DATA_ROWS, mesh, in_groups=("params",))
    with pytest.raises(AssertionError) as caught:
        f(w)
    message = str(caught.value)
    assert "acts as an assert when all axes of mesh are of type `Explicit`" in message
    said = "The array sharding: P('data', None) did not match the sharding provided: P(None, 'data')"
    assert said in message.replace("PartitionSpec(", "P("), message  # JAX 0.8 writes `PartitionSpec(...)`
    assert "jax.sharding.reshard" in message  # the fix JAX suggests
    cause = caught.value.__cause__  # where the model's code made the constraint
    frames = [frame.name for frame in traceback.extract_tb(cause.__traceback__)] if cause else []
    assert "loss" in frames, frames
