"""haliax's named arrays, without haliax: a `NamedArray` is a box that adds no
path segment, and its axis names lay it out under a `logical` rule.

haliax's `NamedArray` is a frozen dataclass with `array` and `axis_names`,
registered with `jax.tree_util.register_pytree_node_class`: it flattens to
`((array,), axis_names)`, so JAX keys its one child `FlattenedIndexKey(0)`,
and unflattens without checking shapes (so it can hold a sharding or a spec).
shardrules recognises it by its type in `sys.modules["haliax.core"]`; the
tests below put a class built the same way there. tests/test_real_models.py
runs the same on haliax itself.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class NamedArray:
    """haliax's `NamedArray`, as JAX sees it."""

    array: Any
    axis_names: tuple[str, ...]

    def tree_flatten(self) -> tuple[tuple[Any], tuple[str, ...]]:
        return (self.array,), self.axis_names

    @classmethod
    def tree_unflatten(cls, aux: tuple[str, ...], children: Any) -> NamedArray:
        return cls(children[0], aux)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Linear:
    """haliax's `nn.Linear`: an Equinox module, keyed by attribute."""

    weight: NamedArray  # (Out, In)
    bias: NamedArray | None


@pytest.fixture
def haliax(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    package = types.ModuleType("haliax")
    core = types.ModuleType("haliax.core")
    core.NamedArray = NamedArray  # type: ignore[attr-defined]
    package.core = core  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "haliax", package)
    monkeypatch.setitem(sys.modules, "haliax.core", core)
    return core


@pytest.fixture
def mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("fsdp", "model"), axis_types=(AxisType.Explicit,) * 2)


def _model() -> dict[str, Any]:
    rng = np.random.default_rng(0)

    def named(names: tuple[str, ...], *shape: int) -> NamedArray:
        return NamedArray(jnp.asarray(0.1 * rng.normal(size=shape), jnp.float32), names)

    return {
        "embed": named(("vocab", "embed"), 64, 16),
        "blocks": [
            {
                "up": Linear(named(("mlp", "embed"), 32, 16), named(("mlp",), 32)),
                "down": Linear(named(("embed", "mlp"), 16, 32), None),
                "norm": named(("embed",), 16),
            }
            for _ in range(2)
        ],
        "head": Linear(named(("vocab", "embed"), 64, 16), None),
    }


RULES = sr.loads(
    """
alias embed = fsdp
alias mlp   = model
alias vocab = _

rules params:
  "norm$"       -> replicated
  "up/bias$"    -> (model)
  "head/weight" -> (model, fsdp)
  default       -> logical
""",
    name="named.shard",
)


def test_a_named_array_adds_no_path_segment(haliax) -> None:
    tree = _model()
    plan = sr.plan(tree, sr.loads("rules params:\n  default -> replicated\n"))
    assert [leaf.path for leaf in plan] == [
        "blocks/0/down/weight",
        "blocks/0/norm",
        "blocks/0/up/weight",
        "blocks/0/up/bias",
        "blocks/1/down/weight",
        "blocks/1/norm",
        "blocks/1/up/weight",
        "blocks/1/up/bias",
        "embed",
        "head/weight",
    ]
    # one named array alone, and one in a list: the array is the leaf, keyed from the box
    assert [
        leaf.path for leaf in sr.plan(tree["embed"], sr.loads("rules params:\n  default -> replicated\n"))
    ] == [""]
    assert [
        leaf.path for leaf in sr.plan([tree["embed"]], sr.loads("rules params:\n  default -> replicated\n"))
    ] == ["0"]


def test_without_haliax_loaded_the_class_is_an_ordinary_node() -> None:
    # the box is haliax's class: another class of that shape keeps JAX's key
    plan = sr.plan(
        {"w": NamedArray(np.zeros((4, 4)), ("a", "b"))}, sr.loads("rules params:\n  default -> replicated\n")
    )
    assert [leaf.path for leaf in plan] == ["w/0"]


def test_axis_names_lay_out_leaves_under_a_logical_rule(haliax, mesh) -> None:
    plan = sr.plan(_model(), RULES, mesh)
    assert plan.ok, plan.errors
    specs = {leaf.path: leaf.spec for leaf in plan}
    assert specs["embed"] == P(None, "fsdp")  # (vocab, embed)
    assert specs["blocks/0/up/weight"] == P("model", "fsdp")  # (mlp, embed)
    assert specs["blocks/1/down/weight"] == P("fsdp", "model")  # (embed, mlp)
    # path rules above `logical` still decide their leaves
    assert specs["blocks/0/norm"] == P(None)  # `logical` would give P("fsdp")
    assert specs["blocks/1/up/bias"] == P("model")
    assert specs["head/weight"] == P("model", "fsdp")


def test_a_name_without_an_alias_is_unsharded_with_a_warning(haliax, mesh) -> None:
    rules = sr.loads("alias embed = fsdp\n\nrules params:\n  default -> logical\n")
    tree = {"w": NamedArray(jnp.zeros((8, 16)), ("layers", "embed"))}
    plan = sr.plan(tree, rules, mesh)
    assert plan.ok
    assert next(iter(plan)).spec == P(None, "fsdp")
    found = [d for d in plan.diagnostics if d.code == "SR206"]
    assert len(found) == 1 and "`layers`" in found[0].message
    assert "haliax also leaves an axis its mapping does not name unsharded" in found[0].hint
    assert "Flax" not in found[0].hint


def test_specs_and_shardings_are_named_arrays_jax_can_place_by(haliax, mesh) -> None:
    tree = _model()
    plan = {leaf.path: leaf.spec for leaf in sr.plan(tree, RULES, mesh)}
    shardings = sr.shardings(tree, RULES, mesh)
    specs = sr.specs(tree, RULES, mesh)
    # the same structure as the model: each named array holds its leaf's layout, with its axis names
    assert jax.tree_util.tree_structure(shardings) == jax.tree_util.tree_structure(tree)
    assert jax.tree_util.tree_structure(
        specs, is_leaf=lambda x: isinstance(x, P)
    ) == jax.tree_util.tree_structure(tree)
    assert isinstance(shardings["blocks"][0]["up"].weight, NamedArray)
    assert shardings["blocks"][0]["up"].weight.axis_names == ("mlp", "embed")
    assert specs["blocks"][1]["down"].weight.array == plan["blocks/1/down/weight"]

    placed = jax.device_put(tree, shardings)
    up = placed["blocks"][0]["up"].weight
    assert isinstance(up, NamedArray) and up.axis_names == ("mlp", "embed")
    assert up.array.sharding == NamedSharding(mesh, P("model", "fsdp"))


def test_apply_gives_named_arrays_holding_the_placed_arrays(haliax, mesh) -> None:
    tree = _model()
    placed = sr.apply(tree, RULES, mesh)
    paths = {leaf.path: leaf.spec for leaf in sr.plan(tree, RULES, mesh)}
    flat_in = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, NamedArray))
    flat_out = jax.tree_util.tree_leaves(placed, is_leaf=lambda x: isinstance(x, NamedArray))
    assert jax.tree_util.tree_structure(placed) == jax.tree_util.tree_structure(tree)
    for before, after in zip(flat_in, flat_out, strict=True):
        assert isinstance(after, NamedArray) and after.axis_names == before.axis_names
        np.testing.assert_array_equal(np.asarray(after.array), np.asarray(before.array))
    assert placed["embed"].array.sharding.spec == paths["embed"] == P(None, "fsdp")
    assert placed["blocks"][1]["up"].weight.array.sharding.spec == P("model", "fsdp")


def test_a_step_under_sr_jit_keeps_the_named_arrays_laid_out(haliax, mesh) -> None:
    tree = sr.apply(_model(), RULES, mesh)

    def step(params: Any) -> Any:
        def loss(p: Any) -> jax.Array:
            x = p["embed"].array[:8]  # (8, embed)
            for block in p["blocks"]:
                h = jnp.tanh(x @ block["up"].weight.array.T + block["up"].bias.array)
                x = x + h @ block["down"].weight.array.T
            return jnp.mean((x @ p["head"].weight.array.T) ** 2)

        grads = jax.grad(loss)(params)
        return jax.tree_util.tree_map(lambda w, g: w - 0.5 * g, params, grads), loss(params)

    jitted = sr.jit(step, RULES, mesh, in_groups="params", out_groups=("params", None))
    with jax.set_mesh(mesh):
        new, first = jitted(tree)
        new, second = jitted(new)
    assert float(second) < float(first)
    assert isinstance(new["blocks"][0]["up"].weight, NamedArray)
    assert new["blocks"][0]["up"].weight.array.sharding.spec == P("model", "fsdp")
    assert new["embed"].array.sharding.spec == P(None, "fsdp")


def _levanter_like(names: bool) -> dict[str, Any]:
    """Levanter's names and axis orders: a stacked block of attention, a gated MLP and norms."""

    def a(axes: tuple[str, ...], *shape: int) -> Any:
        array = jax.ShapeDtypeStruct(shape, jnp.float32)
        return NamedArray(array, axes) if names else array

    def linear(axes: tuple[str, ...], *shape: int) -> Any:
        return Linear(a(axes, *shape), None)

    block = {
        "input_layernorm": {"weight": a(("layers", "embed"), 2, 256)},
        "self_attn": {
            name: linear(("layers", "heads", "head_size", "embed"), 2, 8, 32, 256)
            for name in ("q_proj", "k_proj", "v_proj")
        }
        | {"o_proj": linear(("layers", "embed", "heads", "head_size"), 2, 256, 8, 32)},
        "post_attention_layernorm": {"weight": a(("layers", "embed"), 2, 256)},
        "mlp": {
            "gate_proj": linear(("layers", "mlp", "embed"), 2, 1024, 256),
            "up_proj": linear(("layers", "mlp", "embed"), 2, 1024, 256),
            "down_proj": linear(("layers", "embed", "mlp"), 2, 256, 1024),
        },
    }
    return {
        "token_embeddings": {"weight": a(("vocab", "embed"), 1024, 256)},
        "layers": {"stacked": block},
        "norm": {"weight": a(("embed",), 256)},
        "lm_head": linear(("vocab", "embed"), 1024, 256),
    }


def test_suggest_lays_haliax_norms_out_by_their_embed_axis(haliax) -> None:
    mesh = {"data": 4, "model": 2}
    text = sr.suggest(_levanter_like(names=True), mesh, strategy="fsdp+tp")
    specs = {leaf.path: leaf.spec for leaf in sr.plan(_levanter_like(names=True), sr.loads(text), mesh)}
    # haliax's mapping (embed -> data, mlp/heads/vocab -> model) splits every `embed` axis, norms' too
    assert specs["layers/stacked/input_layernorm/weight"] == P(None, "data")
    assert specs["norm/weight"] == P("data")
    assert specs["token_embeddings/weight"] == P("model", "data")  # recognised by Levanter's name
    assert specs["layers/stacked/self_attn/q_proj/weight"] == P(None, "model", None, "data")
    assert specs["layers/stacked/mlp/down_proj/weight"] == P(None, "data", "model")
    # the same paths and shapes as plain arrays: no axis names, so norms stay whole as elsewhere
    plain = sr.suggest(_levanter_like(names=False), mesh, strategy="fsdp+tp")
    specs = {leaf.path: leaf.spec for leaf in sr.plan(_levanter_like(names=False), sr.loads(plain), mesh)}
    assert specs["norm/weight"] == P(None)
    assert specs["token_embeddings/weight"] == P("model", "data")
