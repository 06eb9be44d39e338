"""On Explicit axes, every dimension of a result that comes from a sharded
dimension of an operand keeps that sharding, operation by operation (where JAX
cannot decide the result's layout, or would drop the axis), with the numbers
of one device; an axis dropped because it must be is SR210."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules._tracing._propagate import propagate, sources

RULES = sr.loads(
    """mesh data=4, model=2

rules inputs:
  "^x$"   -> (data, _, model)
  "^tok$" -> (data, _)
  "^emb$" -> (_, model)
  "^w$"   -> (_, _, model)
""",
    name="prop.shard",
)
rng = np.random.default_rng(0)
X = rng.standard_normal((8, 6, 4)).astype(np.float32)
TOK = rng.integers(0, 16, size=(8, 6)).astype(np.int32)
EMB = rng.standard_normal((16, 4)).astype(np.float32)
W = rng.standard_normal((3, 4, 4)).astype(np.float32)


def run(fn, mesh=None, **arrays):
    """`fn(**arrays)` under `sr.jit` on a (4, 2) Explicit mesh, the arrays laid out by
    the `inputs` rules; the result, and the same on one device."""
    mesh = mesh or jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)

    def called(tree):
        return fn(**tree)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)  # rules for inputs a case does not take
        placed = sr.apply(dict(arrays), RULES, mesh, group="inputs")
    step = sr.jit(called, RULES, mesh, in_groups=("inputs",))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = step(placed)
    assert [w for w in caught if getattr(w.message, "code", None) == "SR210"] == []  # nothing dropped
    return got, jax.jit(called)(arrays)


CASES = {
    # name: (function, the inputs it takes, the layout its result must keep)
    "embedding gather": (lambda emb, tok: emb[tok], ("emb", "tok"), P("data", None, "model")),
    "take_along_axis": (
        lambda x, tok: jnp.take_along_axis(x, (tok % 4)[..., None].repeat(4, -1), axis=1),
        ("x", "tok"),
        P("data", None, "model"),
    ),
    "one_hot": (lambda tok: jax.nn.one_hot(tok, 16), ("tok",), P("data", None, None)),
    # the table's dimension before the batch's (penzai's lookup): the batch keeps `data`
    "gather, offset dimension first": (
        lambda x, tok: jnp.take(x, tok % 6, axis=1),
        ("x", "tok"),
        P(None, "data", None, "model"),
    ),
    "concatenate": (lambda x: jnp.concatenate([x, 2 * x], axis=1), ("x",), P("data", None, "model")),
    "pad": (lambda x: jnp.pad(x, ((0, 0), (1, 1), (0, 0))), ("x",), P("data", None, "model")),
    "slice": (lambda x: x[:, 1:5], ("x",), P("data", None, "model")),
    "dynamic_slice": (
        lambda x, tok: lax.dynamic_slice_in_dim(x, tok[0, 0] % 3, 3, axis=1),
        ("x", "tok"),
        P("data", None, "model"),
    ),
    "reshape merge": (lambda x: x.reshape(48, 4), ("x",), P("data", "model")),
    "reshape split": (lambda x: x.reshape(4, 2, 6, 4), ("x",), P("data", None, None, "model")),
    "broadcast": (
        lambda x: jnp.broadcast_to(x[:, None], (8, 3, 6, 4)),
        ("x",),
        P("data", None, None, "model"),
    ),
    "reduction": (lambda x: x.sum(axis=1), ("x",), P("data", "model")),
    "cumsum": (lambda x: jnp.cumsum(x, axis=1), ("x",), P("data", None, "model")),
    "sort": (lambda x: jnp.sort(x, axis=1), ("x",), P("data", None, "model")),
    "top_k": (lambda x: lax.top_k(jnp.swapaxes(x, 1, 2), 2)[0], ("x",), P("data", "model", None)),
    "argmax": (lambda x: jnp.argmax(x, axis=1), ("x",), P("data", "model")),
    "where": (lambda x, tok: jnp.where(tok[..., None] > 7, x, 0.0), ("x", "tok"), P("data", None, "model")),
    "scatter": (lambda x: x.at[:, 0].set(1.0), ("x",), P("data", None, "model")),
    "conv": (
        lambda x, w: lax.conv_general_dilated(x, w, (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC")),
        ("x", "w"),
        P("data", None, "model"),
    ),
}
INPUTS = {"x": X, "tok": TOK, "emb": EMB, "w": W}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_operation_keeps_its_operands_axes(case: str) -> None:
    fn, takes, expected = CASES[case]
    got, reference = run(fn, **{k: INPUTS[k] for k in takes})
    assert got.sharding.spec == expected, f"{case}: {got.sharding.spec}"
    np.testing.assert_allclose(np.asarray(got), np.asarray(reference), rtol=1e-5, atol=1e-5)


def test_embedding_lookup_keeps_the_batch_split_in_a_train_step() -> None:
    """The issue's case: `emb[tokens]` with tokens `(data, _)` is not replicated, so
    the layer after it does 1/4 of the batch per device, not all of it."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    rules = sr.loads(
        'rules params:\n  "emb" -> (_, model)\n  "w" -> (model, _)\nrules inputs:\n  "tok" -> (data, _)\n'
    )
    params = {"emb": EMB, "w": rng.standard_normal((4, 4)).astype(np.float32)}

    def loss(p, tok):
        return jnp.mean(jnp.tanh(p["emb"][tok] @ p["w"]) ** 2)

    def sgd(p, tok):
        value, grads = jax.value_and_grad(loss)(p, tok)
        return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), value

    step = sr.jit(sgd, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    placed = sr.apply(params, rules, mesh), sr.apply({"tok": TOK}, rules, mesh, group="inputs")["tok"]
    gathers = [d for d in step.decisions(*placed) if d.primitive == "gather" and "backward" not in d.scope]
    assert [d.spec for d in gathers] == [P("data", None, "model")]
    new, value = step(*placed)
    ref_new, ref_value = jax.jit(sgd)(params, TOK)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(new["emb"]), np.asarray(ref_new["emb"]), rtol=1e-5, atol=1e-6)


def _flops(step, *args) -> float:
    cost = step.lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"])


def test_explicit_does_no_more_work_per_device_than_auto() -> None:
    """Per-device FLOPs of an embedding + MLP train step on Explicit axes against the
    same rules on Auto axes (recorded exactly in benchmarks/; asserted loosely here)."""
    rules = sr.loads(
        'rules params:\n  "emb" -> (_, model)\n  "up" -> (_, model)\n  "down" -> (model, _)\n'
        'rules inputs:\n  "tok" -> (data, _)\n'
    )
    params = {
        "emb": rng.standard_normal((64, 32)).astype(np.float32),
        "up": rng.standard_normal((32, 128)).astype(np.float32),
        "down": rng.standard_normal((128, 32)).astype(np.float32),
    }
    tok = rng.integers(0, 64, size=(32, 16)).astype(np.int32)

    def loss(p, tok):
        h = p["emb"][tok]
        h = jnp.concatenate([h[:, :1] * 0, h[:, :-1]], axis=1) + h  # a shift, as causal models have
        return jnp.mean((jax.nn.gelu(h @ p["up"]) @ p["down"]) ** 2)

    def sgd(p, tok):
        grads = jax.grad(loss)(p, tok)
        return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads)

    flops = {}
    for kind in (AxisType.Explicit, AxisType.Auto):
        mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind,) * 2)
        step = sr.jit(sgd, rules, mesh, in_groups=("params", "inputs"), out_groups="params")
        placed = sr.apply(params, rules, mesh), sr.apply({"tok": tok}, rules, mesh, group="inputs")["tok"]
        flops[kind] = _flops(step, *placed)
    assert flops[AxisType.Explicit] <= 1.10 * flops[AxisType.Auto], flops


def test_an_axis_used_by_another_dimension_still_splits_the_work() -> None:
    """An outer product of two vectors split over the same axis: the result keeps
    `data` on its first dimension only, so each device computes 1/8 of it; nothing
    is lost, and nothing is warned about. FSDP is the same: a batch and a weight
    split over `fsdp` make activations split by batch alone."""
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    rules = sr.loads('rules inputs:\n  "." -> (data)\n', name="outer.shard")
    a, b = (np.arange(8, dtype=np.float32) + i for i in (0, 1))
    placed = sr.apply({"a": a, "b": b}, rules, mesh, group="inputs")

    def outer(tree):
        return tree["a"][:, None] * tree["b"][None, :]

    with warnings.catch_warnings():
        warnings.simplefilter("error", sr.ShardRulesWarning)
        got = sr.jit(outer, rules, mesh, in_groups=("inputs",))(placed)
    np.testing.assert_allclose(np.asarray(got), np.outer(a, b))
    assert got.sharding.spec == P("data", None)


def test_an_axis_that_does_not_divide_is_sr210() -> None:
    """Six rows of a dimension split four ways: the result cannot keep `data`, and
    the warning names the operation, the user's line, both layouts and why."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    with pytest.warns(sr.ShardRulesWarning) as caught:
        got, reference = _run_allowing(lambda x: x[:6], mesh, x=X)
    assert got.sharding.spec == P(None, None, "model")
    np.testing.assert_allclose(np.asarray(got), np.asarray(reference))
    (found,) = [w.message for w in caught if getattr(w.message, "code", None) == "SR210"]
    text = str(found)
    assert "`slice`" in text and "`data` on dimension 0 (does not divide)" in text
    assert "test_propagation.py:" in text and "(8, 6, 4) P('data', None, 'model')" in text
    assert "P(None, None, 'model')" in text
    with pytest.warns(sr.ShardRulesWarning, match="SR201"):  # rules for inputs it does not take
        placed = sr.apply({"x": X}, RULES, mesh, group="inputs")
    # strict: an error, in the same words
    with pytest.warns(sr.ShardRulesWarning, match="SR201"), pytest.raises(sr.PlanError) as info:
        sr.jit(lambda tree: tree["x"][:6], RULES, mesh, in_groups=("inputs",), strict=True)(placed)
    assert info.value.code == "SR210" and "does not divide" in str(info.value)


def _run_allowing(fn, mesh, **arrays):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)  # rules for inputs it does not take
        placed = sr.apply(dict(arrays), RULES, mesh, group="inputs")
    step = sr.jit(lambda tree: fn(**tree), RULES, mesh, in_groups=("inputs",))
    return step(placed), fn(**arrays)


def test_layouts_the_model_states_are_kept_and_listed() -> None:
    """Model code that speaks Explicit sharding (`reshard`, `out_sharding=`,
    `.at[...].get(out_sharding=...)`, `jax.typeof`) runs under `sr.jit` as under
    `jax.jit` in `jax.set_mesh`, even with no activation rules."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    rules = sr.loads("rules params:\n  default -> (_, model)\nrules inputs:\n  default -> (_, _)\n")
    w = rng.standard_normal((4, 8)).astype(np.float32)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    seen = []

    def f(w, x):
        x = jax.sharding.reshard(x, P("data", None))
        seen.append(jax.typeof(x).sharding.spec)
        y = jnp.einsum("bd,df->bf", x, w, out_sharding=P("data", "model"))
        z = y.at[jnp.array([0, 1])].get(out_sharding=P(None, "model"))
        return y, z

    step = sr.jit(f, rules, mesh, in_groups=("params", "inputs"), activations=None)
    placed = sr.apply(w, rules, mesh), sr.apply(x, rules, mesh, group="inputs")
    y, z = step(*placed)
    assert seen[0] == P("data", None)
    assert y.sharding.spec == P("data", "model") and z.sharding.spec == P(None, "model")
    with jax.set_mesh(mesh):
        ry, rz = jax.jit(f)(*placed)
    np.testing.assert_allclose(np.asarray(y), np.asarray(ry), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(z), np.asarray(rz), rtol=1e-6)
    by_model = [(d.primitive, d.spec) for d in step.decisions(*placed) if d.by == "model"]
    assert ("reshard", P("data", None)) in by_model and ("dot_general", P("data", "model")) in by_model


# --- the propagation itself, on its own ---------------------------------------------------------------

SIZES = {"a": 2, "b": 4, "c": 8}


@st.composite
def reshapes(draw):
    """A shape, a spec over it, and a shape with the same number of elements."""
    dims = draw(st.lists(st.sampled_from([1, 2, 3, 4, 6, 8, 16]), min_size=1, max_size=4))
    axes = draw(st.permutations(list(SIZES)))
    spec = [draw(st.sampled_from([None, axes[i]])) if i < len(axes) else None for i in range(len(dims))]
    flat = int(np.prod(dims))
    out, rest = [], flat
    while rest > 1 and len(out) < 4:
        d = draw(st.sampled_from([x for x in (1, 2, 3, 4, 8, rest) if rest % x == 0]))
        out.append(d)
        rest //= d
    out.append(rest)
    return tuple(dims), P(*spec), tuple(out)


@given(reshapes())
def test_reshape_layouts_are_valid_and_come_from_the_operand(case) -> None:
    """Whatever the reshape: no axis twice, every kept dimension divides, each axis
    kept on a dimension is one the operand carried, and what is dropped says why."""
    shape, spec, out = case
    got = propagate("reshape", [(shape, spec)], {"new_sizes": out, "dimensions": None}, out, SIZES)
    used = [a for entry in got.spec for a in ((entry,) if isinstance(entry, str) else entry or ())]
    assert len(used) == len(set(used))
    carried = {a for entry in spec for a in ((entry,) if isinstance(entry, str) else entry or ())}
    assert set(used) <= carried
    for size, entry in zip(out, got.spec, strict=True):
        axes = (entry,) if isinstance(entry, str) else entry or ()
        assert size % int(np.prod([SIZES[a] for a in axes])) == 0
    assert all(why in ("used twice", "does not divide") for _, _, why in got.dropped)


@given(reshapes())
def test_propagated_layouts_are_ones_jax_accepts(case) -> None:
    """Differential against JAX: every layout the propagation gives is one
    `jax.device_put` places without complaint on a mesh of those sizes."""
    shape, spec, out = case
    got = propagate("reshape", [(shape, spec)], {}, out, SIZES)
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
    usable = P(
        *[
            None if entry is not None and "c" in ((entry,) if isinstance(entry, str) else entry) else entry
            for entry in got.spec
        ]
    )
    placed = jax.device_put(np.zeros(out, np.float32), NamedSharding(mesh, usable))
    assert placed.sharding.spec == usable


def test_a_gathers_batch_keeps_an_axis_its_table_also_carries() -> None:
    """A lookup whose table is split over the batch's axis (FSDP: `(_, fsdp)` for an
    embedding, tokens `(fsdp, _)`): the axis can shard one result dimension only,
    and it is the batch's, wherever the offset dimension stands. With the table's
    dimension first (`(embedding, batch, seq)`, as penzai's named-axis lookup
    makes it), taking the axis for the table's dimension would leave every layer
    after the lookup computing the whole batch on each device."""
    table = jax.ShapeDtypeStruct((64, 256), jnp.float32)  # (embedding, vocabulary)
    tokens = jax.ShapeDtypeStruct((16, 32, 1), jnp.int32)
    jaxpr = jax.make_jaxpr(lambda t, i: jnp.take(t, i[..., 0], axis=1))(table, tokens)
    (eqn,) = [e for e in _all_eqns(jaxpr.jaxpr) if e.primitive.name == "gather"]
    operands = [((64, 256), P("fsdp", None)), ((16, 32, 1), P("fsdp", None, None))]
    got = propagate("gather", operands, eqn.params, eqn.outvars[0].aval.shape, {"fsdp": 4})
    assert tuple(eqn.outvars[0].aval.shape) == (64, 16, 32)
    assert got.spec == P(None, "fsdp", None) and got.dropped == ()


def test_sources_of_a_batched_gather_name_both_operands() -> None:
    """`take_along_axis` gathers with batching dimensions: the result's batch
    dimension comes from the indices' and from the operand's batching dimension."""
    x = jax.ShapeDtypeStruct((8, 6, 4), jnp.float32)
    idx = jax.ShapeDtypeStruct((8, 6, 1), jnp.int32)
    jaxpr = jax.make_jaxpr(lambda x, i: jnp.take_along_axis(x, i, axis=2))(x, idx)
    inner = next(e for e in _all_eqns(jaxpr.jaxpr) if e.primitive.name == "gather")
    shapes = [tuple(v.aval.shape) for v in inner.invars]
    found = sources("gather", shapes, inner.params, inner.outvars[0].aval.shape)
    assert (1, 0) in found[0] and (0, 0) in found[0]
    assert (1, 1) in found[1] and (0, 1) in found[1]


def _all_eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", None)
            if inner is not None:
                yield from _all_eqns(getattr(inner, "jaxpr", inner) if not hasattr(inner, "eqns") else inner)


def test_the_gradient_of_a_gather_that_states_its_layout():
    """`.at[tokens].get(out_sharding=...)` (MaxText's embedding lookup) runs
    under `auto_axes`; its gradient scatters into zeros the trace typed on the
    Auto copy of the mesh, which must be made there too."""
    mesh = jax.make_mesh((4, 2), ("fsdp", "tensor"), axis_types=(AxisType.Explicit,) * 2)
    rules = sr.loads('rules params:\n  "emb" -> (tensor, fsdp)\nrules inputs:\n  "tok" -> (fsdp, _)\n')

    def loss(p, b):
        return (p["emb"].at[b["tok"]].get(out_sharding=P("fsdp", None, None)) ** 2).sum()

    emb = rng.standard_normal((256, 64)).astype(np.float32)
    tok = rng.integers(0, 256, size=(8, 16)).astype(np.int32)
    params = sr.apply({"emb": emb}, rules, mesh)
    batch = sr.apply({"tok": tok}, rules, mesh, group="inputs")
    value, grads = sr.jit(jax.value_and_grad(loss), rules, mesh, in_groups=("params", "inputs"))(
        params, batch
    )
    with jax.set_mesh(mesh):  # the layout the model states names the mesh's axes
        ref_value, ref_grads = jax.jit(jax.value_and_grad(loss))({"emb": emb}, {"tok": tok})
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grads["emb"]), np.asarray(ref_grads["emb"]), rtol=1e-5, atol=1e-5)
