"""Every kind of leaf: PRNG key arrays are planned and placed; leaves that hide
arrays shardrules cannot see are an error (SR121) or a warning (SR213) naming
their type and path, never passed over in silence."""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import shardrules as sr

KEY_RULES = sr.loads('mesh data\nrules params:\n  "keys" -> (data)\n', name="keys.shard")
REPLICATED = sr.loads("rules params:\n  default -> replicated\n", name="all.shard")


def _keys() -> dict[str, jax.Array]:
    return {"key": jax.random.key(0), "keys": jax.random.split(jax.random.key(1), 8)}


@pytest.mark.parametrize("kind", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])
def test_key_arrays_are_placed_and_still_work(kind) -> None:
    mesh = jax.make_mesh((8,), ("data",), axis_types=(kind,))
    tree = _keys()
    plan = sr.plan(tree, KEY_RULES, mesh)
    assert plan.ok, plan.errors
    assert (plan["key"].spec, plan["key"].why) == (P(), "scalar")
    assert (plan["keys"].spec, plan["keys"].why) == (P("data"), "rule")
    assert str(plan["keys"].dtype) == "key<fry>" and plan["keys"].shape == (8,)
    # bytes: the key data (two uint32 words per threefry key), one key per device
    assert plan["keys"].nbytes == 64 and plan["keys"].bytes_per_device == 8
    assert plan["key"].bytes_per_device == 8

    placed = sr.apply(tree, KEY_RULES, mesh)

    assert placed["keys"].sharding.spec == P("data") and placed["keys"].sharding.mesh == mesh
    assert placed["key"].sharding.spec == P()
    assert jax.dtypes.issubdtype(placed["keys"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(placed["keys"]), jax.random.key_data(tree["keys"]))
    np.testing.assert_array_equal(
        jax.random.normal(placed["key"], (4,)), jax.random.normal(tree["key"], (4,))
    )
    assert jax.random.split(placed["key"]).shape == (2,)
    samples = jax.vmap(lambda k: jax.random.normal(k, (3,)))(placed["keys"])
    np.testing.assert_array_equal(samples, jax.vmap(lambda k: jax.random.normal(k, (3,)))(tree["keys"]))
    assert jax.vmap(jax.random.split)(placed["keys"]).shape == (8, 2)
    assert sr.specs(tree, KEY_RULES, mesh) == {"key": P(), "keys": P("data")}


def test_keys_no_rule_matches_are_replicated_not_unmatched() -> None:
    rules = sr.loads('rules params:\n  "w" -> (data, _)\n')
    tree = {"w": np.ones((8, 2), np.float32), "rng": jax.random.split(jax.random.key(0), 4)}
    plan = sr.plan(tree, rules, {"data": 8})
    assert plan.ok, plan.errors
    assert (plan["rng"].spec, plan["rng"].why) == (P(None), "key")
    # a default rule is a rule: it applies to keys as to any array
    with_default = sr.loads('rules params:\n  "w" -> (data, _)\n  default -> (data)\n')
    assert sr.plan({"rng": tree["rng"]}, with_default, {"data": 4})["rng"].spec == P("data")


def test_old_style_keys_are_ordinary_arrays() -> None:
    plan = sr.plan({"seed": jax.random.PRNGKey(0)}, REPLICATED, {"data": 8})
    assert (plan["seed"].shape, str(plan["seed"].dtype)) == ((2,), "uint32")


def test_abstract_keys_and_other_implementations() -> None:
    tree = jax.eval_shape(lambda: {"keys": jax.random.split(jax.random.key(0, impl="rbg"), 8)})
    plan = sr.plan(tree, KEY_RULES, {"data": 8})
    assert str(plan["keys"].dtype) == "key<rbg>"
    assert plan["keys"].bytes_per_device == 16  # four uint32 words per rbg key
    mesh = jax.make_mesh((8,), ("data",))
    made = jax.jit(
        lambda: {"keys": jax.random.split(jax.random.key(0, impl="rbg"), 8)},
        out_shardings=sr.shardings(tree, KEY_RULES, mesh),
    )()
    assert made["keys"].sharding.spec == P("data")


def test_a_plan_with_keys_survives_a_dump() -> None:
    plan = sr.plan(_keys(), KEY_RULES, {"data": 8})
    back = sr.Plan.from_json(plan.to_json())
    assert back.to_json() == plan.to_json()
    assert str(back["keys"].dtype) == "key<fry>"


def test_keys_inside_jit_are_constrained() -> None:
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))

    @jax.jit
    def step(tree):
        return sr.constrain(tree, KEY_RULES, mesh)

    out = step(_keys())
    assert out["keys"].sharding.spec == P("data")


# ---------------------------------------------------------------- leaves hiding arrays


class Boxed:  # a wrapper no one registered as a pytree node
    def __init__(self, w: np.ndarray):
        self.w = w


class TensorLike:  # another library's tensor: a shape and dtype, but not an array
    def __init__(self) -> None:
        self.shape = [8, 4]
        self.dtype = "float32"


class ArrayLike:  # converts to a JAX array, with no shape or dtype to read
    def __jax_array__(self) -> jax.Array:
        return jnp.ones(8)


@dataclasses.dataclass
class StaticArrays:
    w: jax.Array
    table: np.ndarray


jax.tree_util.register_dataclass(StaticArrays, data_fields=["w"], meta_fields=["table"])


def _codes(tree: object) -> dict[str, str]:
    plan = sr.plan(tree, REPLICATED, {"data": 8})
    return {d.path: d.code for d in plan.diagnostics if d.code in ("SR121", "SR213")}


def test_leaves_hiding_arrays_are_named_with_their_type_and_path() -> None:
    tree = {
        "boxed": Boxed(np.ones((8, 4), np.float32)),
        "tensor": TensorLike(),
        "node": StaticArrays(jnp.ones(8), np.arange(4.0)),
    }
    plan = sr.plan(tree, REPLICATED, {"data": 8})
    found = {d.path: d for d in plan.diagnostics if d.code == "SR213"}
    assert set(found) == {"boxed", "tensor", "node"}
    assert all(d.severity == "warning" for d in found.values())
    here = __name__  # types are named with their module
    assert f"`{here}.Boxed`" in found["boxed"].message and "(`w`)" in found["boxed"].message
    assert f"register `{here}.Boxed` as a pytree node" in found["boxed"].hint
    assert f"`{here}.TensorLike`" in found["tensor"].message and "shape and dtype" in found["tensor"].message
    assert "static (auxiliary) data" in found["node"].message and "meta_fields" in found["node"].hint
    assert plan["node/w"].spec == P(None)  # its data field is planned as usual


def test_apply_and_specs_warn_and_leave_them_as_they_are() -> None:
    boxed = Boxed(np.ones((8, 4), np.float32))
    tree = {"boxed": boxed, "w": np.ones((8,), np.float32)}
    mesh = jax.make_mesh((8,), ("data",))
    with pytest.warns(sr.ShardRulesWarning, match=f"SR213 `boxed` is a `{__name__}.Boxed`") as caught:
        placed = sr.apply(tree, REPLICATED, mesh)
    assert [w.message.code for w in caught if isinstance(w.message, sr.ShardRulesWarning)] == ["SR213"]
    assert placed["boxed"] is boxed
    with pytest.warns(sr.ShardRulesWarning, match="SR213"):
        assert sr.specs(tree, REPLICATED, mesh)["boxed"] is None
    with pytest.warns(sr.ShardRulesWarning, match="SR213"):
        assert sr.shardings(tree, REPLICATED, mesh)["boxed"] is None


def test_an_object_that_claims_to_be_an_array_is_an_error() -> None:
    tree = {"x": ArrayLike(), "w": np.ones(8, np.float32)}
    assert _codes(tree) == {"x": "SR121"}
    with pytest.raises(
        sr.PlanError, match=f"SR121 `x` is a `{__name__}.ArrayLike` that converts to a JAX array"
    ) as err:
        sr.apply(tree, REPLICATED, jax.make_mesh((8,), ("data",)))
    assert "jnp.asarray(x)" in str(err.value)


def test_ordinary_leaves_that_are_not_arrays_say_nothing() -> None:
    tree = {
        "act": jax.nn.gelu,
        "n": 3,
        "name": "mlp",
        "f": 0.5,
        "partial": jax.tree_util.Partial(jnp.add),
        "mesh": jax.make_mesh((8,), ("data",)),  # holds an array of devices, not of numbers
        "dtype": jnp.float32,
        "w": np.ones(8, np.float32),
    }
    assert _codes(tree) == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", sr.ShardRulesWarning)
        sr.specs(tree, REPLICATED, {"data": 8})
