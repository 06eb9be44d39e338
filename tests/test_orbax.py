"""Orbax checkpoints restored straight into the planned shardings, onto another mesh shape."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr

ocp = pytest.importorskip("orbax.checkpoint")

RULES = sr.loads(
    "mesh data, model\n"
    "rules params:\n"
    '  "embed$"          -> (_, model)\n'
    '  "layers/\\d+/w$"  -> (data, model)\n'
    '  "norm"            -> replicated\n'
    "  default           -> auto(data)\n",
    name="orbax.shard",
)


def mesh(shape: tuple[int, int]) -> jax.sharding.Mesh:
    return jax.make_mesh(shape, ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def fresh_tree() -> dict:
    rng = np.random.default_rng(0)
    return {
        "embed": rng.standard_normal((16, 8)).astype(np.float32),
        "layers": [
            {"w": rng.standard_normal((8, 8)).astype(np.float32)},
            {"w": rng.standard_normal((8, 8)).astype(jnp.bfloat16)},
        ],
        "norm": np.ones(8, np.float32),
        "head": rng.integers(-9, 9, (24, 3)).astype(np.int32),
        "step": 7,
    }


@pytest.fixture
def saved(tmp_path):
    """A checkpoint written from arrays sharded on a 4×2 mesh; returns (path, the values)."""
    values = fresh_tree()
    path = tmp_path / "ckpt"
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, sr.apply(values, RULES, mesh((4, 2))))
    checkpointer.wait_until_finished()
    return path, values


def assert_values_equal(got: dict, want: dict) -> None:
    for (path, g), w in zip(
        jax.tree_util.tree_flatten_with_path(got)[0], jax.tree_util.tree_leaves(want), strict=True
    ):
        assert np.asarray(g).dtype == np.asarray(w).dtype, path
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=str(path))


def assert_planned(got: dict, rules: sr.RuleSet, on: jax.sharding.Mesh) -> None:
    planned = sr.shardings(got, rules, on)
    for (path, array), sharding in zip(
        jax.tree_util.tree_flatten_with_path(got)[0], jax.tree_util.tree_leaves(planned), strict=True
    ):
        assert array.sharding == sharding, path


@pytest.mark.parametrize("shape", [(2, 4), (8, 1)])
def test_restore_with_shardings_as_abstract_targets_on_another_mesh(saved, shape):
    path, values = saved
    target_mesh = mesh(shape)
    abstract = jax.eval_shape(lambda: {k: v for k, v in values.items() if k != "step"})
    planned = sr.shardings(abstract, RULES, target_mesh)
    targets = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), abstract, planned
    )
    targets["step"] = 0

    got = ocp.StandardCheckpointer().restore(path, targets)
    assert_values_equal(got, values)
    arrays = {k: v for k, v in got.items() if k != "step"}
    assert_planned(arrays, RULES, target_mesh)
    assert got["layers"][0]["w"].sharding == NamedSharding(target_mesh, P("data", "model"))
    assert got["step"] == 7


def test_checkpoint_manager_with_standard_restore_args(tmp_path):
    values = {k: v for k, v in fresh_tree().items() if k != "step"}
    with ocp.CheckpointManager(tmp_path / "run") as manager:
        manager.save(3, args=ocp.args.StandardSave(sr.apply(values, RULES, mesh((4, 2)))))
        manager.wait_until_finished()
    target_mesh = mesh((2, 4))
    abstract = jax.eval_shape(lambda: values)
    targets = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        abstract,
        sr.shardings(abstract, RULES, target_mesh),
    )
    with ocp.CheckpointManager(tmp_path / "run") as manager:
        got = manager.restore(manager.latest_step(), args=ocp.args.StandardRestore(targets))
    assert_values_equal(got, values)
    assert_planned(got, RULES, target_mesh)


@pytest.mark.parametrize("shape", [(2, 4), (8, 1)])
def test_load_orbax_plans_from_the_checkpoint_metadata(saved, shape):
    path, values = saved
    target_mesh = mesh(shape)
    got = sr.load_orbax(path, RULES, target_mesh)
    assert_values_equal(got, values)
    assert got["step"] == 7 and isinstance(got["step"], int)
    arrays = {k: v for k, v in got.items() if k != "step"}
    assert_planned(arrays, RULES, target_mesh)
    # 8 × 1: `auto(data)` splits head (24, 3) 8 ways; 2 × 4: 2 ways.
    assert {s.data.shape for s in got["head"].addressable_shards} == {(24 // shape[0], 3)}


def test_load_orbax_with_a_target_tree(saved):
    path, values = saved
    target = jax.eval_shape(lambda: {k: v for k, v in values.items() if k != "step"})
    target["step"] = 0
    got = sr.load_orbax(str(path), RULES, mesh((2, 4)), target=target)
    assert_values_equal(got, values)
    assert got["embed"].sharding.spec == P(None, "model")


def test_load_orbax_raises_plan_errors_with_the_rule(saved):
    path, _ = saved
    three = jax.make_mesh(
        (1, 3), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=jax.devices()[:3]
    )
    with pytest.raises(sr.PlanError, match=r"SR104 .*`embed` \(shape \(16, 8\)\)"):
        sr.load_orbax(path, RULES, three)


def test_load_orbax_without_orbax_names_the_extra(monkeypatch, saved):
    path, _ = saved
    monkeypatch.setitem(sys.modules, "orbax", None)
    monkeypatch.setitem(sys.modules, "orbax.checkpoint", None)
    with pytest.raises(ImportError, match=r'pip install "shardrules\[orbax\]"'):
        sr.load_orbax(path, RULES, mesh((2, 4)))


def test_load_orbax_refuses_a_mesh_without_devices(saved):
    path, _ = saved
    with pytest.raises(TypeError, match=r"load_orbax needs a jax\.sharding\.Mesh with devices, not dict"):
        sr.load_orbax(path, RULES, {"data": 2, "model": 4})  # type: ignore[arg-type]


# ------------------------------------------------------------------ NNX checkpoints

NNX_RULES = sr.loads(
    "mesh data, model\n"
    "rules params:\n"
    '  "up/kernel$"   -> (_, model)\n'
    '  "down/kernel$" -> (model, _)\n'
    '  "bias$"        -> replicated\n'
    "  default        -> auto(data)\n",
    name="nnx.shard",
)


def nnx_model():
    nnx = pytest.importorskip("flax.nnx")

    class Mlp(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(16, 32, rngs=rngs)
            self.down = nnx.Linear(32, 16, rngs=rngs)

    return nnx, Mlp(nnx.Rngs(0))


@pytest.fixture
def nnx_saved(tmp_path):
    """An `nnx.state(model)` saved by Orbax: each Variable is a `{"value": array}`."""
    nnx, model = nnx_model()
    state = nnx.state(model)
    path = tmp_path / "nnx"
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, state)
    checkpointer.wait_until_finished()
    return path, state


def test_an_nnx_checkpoint_is_matched_through_its_value_level_as_apply_matches_the_live_state(nnx_saved):
    path, state = nnx_saved
    on = mesh((4, 2))
    got = sr.load_orbax(path, NNX_RULES, on)  # no target: the checkpoint's metadata
    assert set(got["up"]["kernel"]) == {"value"}  # restored as Orbax saved it
    live = jax.tree_util.tree_leaves(sr.apply(state, NNX_RULES, on))  # up/kernel, not up/kernel/value
    restored = jax.tree_util.tree_flatten_with_path(got)[0]
    assert len(restored) == len(live) == 4
    for (where, array), placed in zip(restored, live, strict=True):
        assert array.sharding.spec == placed.sharding.spec, jax.tree_util.keystr(where)
        np.testing.assert_array_equal(np.asarray(array), np.asarray(placed))
    assert got["up"]["kernel"]["value"].sharding.spec == P(None, "model")  # not `default`'s auto(data)


def test_an_nnx_checkpoint_whose_rules_match_nothing_is_warned_about_as_apply_warns(nnx_saved):
    path, _ = nnx_saved
    rules = sr.loads(
        'mesh data, model\nrules params:\n  "up/kernal$" -> (_, model)\n  default -> replicated\n',
        name="typo.shard",
    )
    with pytest.warns(sr.ShardRulesWarning) as caught:
        sr.load_orbax(path, rules, mesh((4, 2)))
    codes = [w.message.code for w in caught if isinstance(w.message, sr.ShardRulesWarning)]
    assert "SR201" in codes, [str(w.message) for w in caught]
    assert any("up/kernal$" in str(w.message) for w in caught)


def test_a_leaf_named_value_in_another_tree_keeps_its_segment(tmp_path):
    tree = {"critic": {"value": np.ones((8, 4), np.float32)}, "w": np.ones((8, 4), np.float32)}
    rules = sr.loads(
        'mesh data, model\nrules params:\n  "critic/value$" -> (data, _)\n  "w$" -> (_, model)\n',
        name="v.shard",
    )
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "c", tree)
    checkpointer.wait_until_finished()
    got = sr.load_orbax(tmp_path / "c", rules, mesh((4, 2)))
    assert got["critic"]["value"].sharding.spec == P("data", None)
    assert got["w"].sharding.spec == P(None, "model")
