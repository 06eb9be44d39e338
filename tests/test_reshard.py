"""`reshard`: a placed tree moved to its layout on another mesh or group; the
values exact, the shardings as planned; every check before anything moves."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr

AUTO2 = (jax.sharding.AxisType.Auto,) * 2

TRAIN = sr.loads(
    "mesh data, model\n"
    "rules params:\n"
    '  "embed$"        -> (model, data)\n'
    '  "mlp/up$"       -> (data, model)\n'
    '  "mlp/down$"     -> (model, data)\n'
    '  "scale$"        -> replicated\n'
    "rules zero1:\n"  # optimizer state: the params' layout, also sharded over data
    '  "embed$"        -> ((model, data), _)\n'
    '  "mlp/up$"       -> ((data, model), _)\n'
    '  "mlp/down$"     -> (_, (data, model))\n'
    '  "scale$"        -> (data)\n',
    name="train.shard",
)
ROLLOUT = sr.loads(
    "mesh replica, tensor\n"
    "rules params:\n"
    '  "embed$"        -> (_, tensor)\n'
    '  "mlp/up$"       -> (replica, _)\n'
    '  "mlp/down$"     -> (replica, tensor)\n'
    '  "scale$"        -> (replica)\n',
    name="rollout.shard",
)


def host_params() -> dict:
    rng = np.random.default_rng(0)
    return {
        "embed": rng.standard_normal((64, 16), np.float32),
        "mlp": {
            "up": rng.standard_normal((16, 32), np.float32),
            "down": np.arange(32 * 16, dtype=np.int32).reshape(32, 16),
        },
        "scale": rng.standard_normal(16).astype(np.float32),
        "act": jax.nn.relu,
        "name": "mlp",
        "nothing": None,
    }


def arrays(tree) -> dict[str, np.ndarray]:
    return {
        jax.tree_util.keystr(k): np.asarray(v)
        for k, v in jax.tree_util.tree_leaves_with_path(tree)
        if isinstance(v, (jax.Array, np.ndarray))
    }


def assert_exact(got, want) -> None:
    got, want = arrays(got), arrays(want)
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def assert_as_planned(tree, rules, mesh, group="params") -> None:
    planned = sr.shardings(tree, rules, mesh, group=group)
    for (path, leaf), target in zip(
        jax.tree_util.tree_leaves_with_path(tree, is_leaf=lambda x: x is None),
        jax.tree.leaves(planned, is_leaf=lambda x: x is None),
        strict=True,
    ):
        if target is None:
            continue
        assert leaf.sharding == target, (jax.tree_util.keystr(path), leaf.sharding, target)


@pytest.fixture
def train_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=AUTO2)


def test_chain_of_meshes_keeps_values_and_plans_shardings(train_mesh):
    host = host_params()
    params = sr.apply(host, TRAIN, train_mesh)
    # 4×2 → 2×4 (the same axis names, another shape, Explicit axes)
    wide = jax.make_mesh((2, 4), ("data", "model"))
    moved = sr.reshard(params, TRAIN, wide)
    assert_exact(moved, host)
    assert_as_planned(moved, TRAIN, wide)
    assert moved["mlp"]["up"].sharding.spec == P("data", "model")
    assert moved["mlp"]["up"].addressable_shards[0].data.shape == (8, 8)
    # → 8×1 with other axis names (another rule file)
    rollout = jax.make_mesh((8, 1), ("replica", "tensor"), axis_types=AUTO2)
    again = sr.reshard(moved, ROLLOUT, rollout)
    assert_exact(again, host)
    assert_as_planned(again, ROLLOUT, rollout)
    assert again["mlp"]["down"].addressable_shards[0].data.shape == (4, 16)
    # Non-array leaves are the same objects; the inputs are untouched.
    assert again["act"] is host["act"] and again["name"] == "mlp" and again["nothing"] is None
    assert not any(x.is_deleted() for x in jax.tree.leaves(params) if isinstance(x, jax.Array))
    assert_exact(params, host)


def test_to_other_devices(train_mesh):
    host = host_params()
    params = sr.apply(host, TRAIN, train_mesh)
    devices = jax.devices()[4:]
    small = jax.make_mesh((2, 2), ("replica", "tensor"), axis_types=AUTO2, devices=devices)
    out = sr.reshard(params, ROLLOUT, small, donate=True)
    assert_exact(out, host)
    assert_as_planned(out, ROLLOUT, small)
    assert all(
        x.sharding.device_set == set(devices) for x in jax.tree.leaves(out) if isinstance(x, jax.Array)
    )


def test_params_to_another_group_of_the_file(train_mesh):
    host = host_params()
    params = sr.apply(host, TRAIN, train_mesh)
    opt = sr.reshard(params, TRAIN, train_mesh, group="zero1")
    assert_exact(opt, host)
    assert_as_planned(opt, TRAIN, train_mesh, group="zero1")
    assert opt["mlp"]["down"].sharding.spec == P(None, ("data", "model"))
    assert opt["scale"].addressable_shards[0].data.shape == (4,)
    back = sr.reshard(opt, TRAIN, train_mesh, group="params")
    assert_exact(back, host)
    assert_as_planned(back, TRAIN, train_mesh)


def test_ambient_mesh_is_the_target(train_mesh):
    params = sr.apply(host_params(), TRAIN, train_mesh)
    wide = jax.make_mesh((2, 4), ("data", "model"), axis_types=AUTO2)
    with jax.set_mesh(wide):
        out = sr.reshard(params, TRAIN)
    assert out["embed"].sharding.mesh == wide


def test_donate_deletes_every_moved_source(train_mesh):
    host = host_params()
    params = sr.apply(host, TRAIN, train_mesh)
    sources = [x for x in jax.tree.leaves(params) if isinstance(x, jax.Array)]
    rollout = jax.make_mesh((2, 4), ("replica", "tensor"), axis_types=AUTO2)
    out = sr.reshard(params, ROLLOUT, rollout, donate=True)
    assert all(x.is_deleted() for x in sources)
    assert_exact(out, host)
    assert_as_planned(out, ROLLOUT, rollout)


@pytest.mark.filterwarnings("ignore::shardrules.ShardRulesWarning")  # parts of a tree: rules match nothing
def test_donate_keeps_leaves_already_in_place_and_shared_leaves(train_mesh):
    params = sr.apply(host_params(), TRAIN, train_mesh)
    tree = {"embed": params["embed"], "scale": params["scale"], "mlp": params["mlp"]}
    # The same array twice, under two paths that plan the same layout.
    tree["mlp"] = {"up": params["mlp"]["up"], "down": params["mlp"]["down"]}
    twice = {"a": {"mlp": {"up": params["mlp"]["up"]}}, "b": {"mlp": {"up": params["mlp"]["up"]}}}
    want = np.asarray(params["mlp"]["up"])
    out = sr.reshard(twice, TRAIN, train_mesh, group="zero1", donate=True)
    np.testing.assert_array_equal(np.asarray(out["a"]["mlp"]["up"]), want)
    np.testing.assert_array_equal(np.asarray(out["b"]["mlp"]["up"]), want)
    assert params["mlp"]["up"].is_deleted()
    # Already in its planned sharding: returned as it is, not deleted.
    same = sr.reshard({"embed": params["embed"]}, TRAIN, train_mesh, donate=True)
    assert same["embed"] is params["embed"] and not params["embed"].is_deleted()


def test_failed_check_moves_and_deletes_nothing(train_mesh):
    params = sr.apply(host_params(), TRAIN, train_mesh)
    gone = jax.device_put(jnp.ones(16), NamedSharding(train_mesh, P()))
    gone.delete()
    bad = {**params, "scale": gone}
    sources = [x for x in jax.tree.leaves(params) if isinstance(x, jax.Array)]
    before = [x.sharding for x in sources]
    rollout = jax.make_mesh((2, 4), ("replica", "tensor"), axis_types=AUTO2)
    with pytest.raises(sr.PlacementError) as info:
        sr.reshard(bad, ROLLOUT, rollout, donate=True)
    assert info.value.code == "SR107" and info.value.path == "scale"
    assert "deleted" in str(info.value) and "hint:" in str(info.value)
    assert [x.sharding for x in sources] == before
    assert not any(x.is_deleted() for x in sources)


def test_target_that_does_not_divide(train_mesh):
    params = sr.apply(host_params(), TRAIN, train_mesh)
    # 20 rows divide by the train mesh's 4 `data` devices, not by the 8 of `replica` below.
    odd = {**params, "mlp": {"up": jax.device_put(jnp.ones((20, 32)), NamedSharding(train_mesh, P("data")))}}
    rollout = jax.make_mesh((8, 1), ("replica", "tensor"), axis_types=AUTO2)
    with pytest.raises(sr.PlanError) as info:
        sr.reshard(odd, ROLLOUT, rollout, donate=True)
    assert info.value.code == "SR104" and info.value.path == "mlp/up"
    assert "20" in str(info.value) and info.value.hint
    assert not any(x.is_deleted() for x in jax.tree.leaves(odd) if isinstance(x, jax.Array))


def test_unknown_axis_on_target_mesh(train_mesh):
    params = sr.apply(host_params(), TRAIN, train_mesh)
    other = jax.make_mesh((2, 4), ("replica", "tensor"), axis_types=AUTO2)
    with pytest.raises(sr.MeshError) as info:
        sr.reshard(params, TRAIN, other, donate=True)
    assert info.value.code == "SR101" and "lacks `data`" in str(info.value)
    assert not any(x.is_deleted() for x in jax.tree.leaves(params) if isinstance(x, jax.Array))


@pytest.mark.filterwarnings("ignore::shardrules.ShardRulesWarning")
def test_tracer_is_a_clear_error(train_mesh):
    params = sr.apply(host_params(), TRAIN, train_mesh)
    arrays_only = {"embed": params["embed"], "mlp": params["mlp"]}
    with pytest.raises(sr.PlacementError) as info:
        jax.jit(lambda t: sr.reshard(t, TRAIN, train_mesh, group="zero1"))(arrays_only)
    assert info.value.code == "SR107" and "traced" in str(info.value)
    assert "outside jit" in info.value.hint


def test_host_and_abstract_leaves_are_refused(train_mesh):
    with pytest.raises(sr.PlacementError) as info:
        sr.reshard({"embed": np.ones((64, 16), np.float32)}, TRAIN, train_mesh)
    assert info.value.code == "SR107" and "shardrules.apply" in info.value.hint
    with pytest.raises(sr.PlacementError) as info:
        sr.reshard({"embed": jax.ShapeDtypeStruct((64, 16), jnp.float32)}, TRAIN, train_mesh)
    assert info.value.code == "SR107"


def test_bad_arguments(train_mesh):
    params = sr.apply(host_params(), TRAIN, train_mesh)
    with pytest.raises(TypeError, match="donate"):
        sr.reshard(params, TRAIN, train_mesh, donate="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Mesh with devices"):
        sr.reshard(params, TRAIN, jax.sharding.AbstractMesh((4, 2), ("data", "model")))  # type: ignore[arg-type]
    with pytest.raises(sr.GroupNotFoundError):
        sr.reshard(params, TRAIN, train_mesh, group="nope", donate=True)
    assert not any(x.is_deleted() for x in jax.tree.leaves(params) if isinstance(x, jax.Array))
