"""`reshard(donate=True)` never loses a value: it deletes an input only once
its copy exists and no returned array or input still to move uses its
buffers, and a move that fails part-way hands back the whole tree."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules._placement import _moves

pytestmark = pytest.mark.filterwarnings("ignore::shardrules.ShardRulesWarning")  # trees with some rules only
AUTO2 = (jax.sharding.AxisType.Auto,) * 2

# The target mesh has the train mesh's devices in the same order, under other
# names: `jax.device_put` onto it with an equivalent spec makes no copy, the
# result shares the source's buffers.
RULES = sr.loads(
    "mesh x, y\n"
    "rules params:\n"
    '  "^moved$"   -> (y, x)\n'  # moves: another layout
    '  "^kept$"    -> (x, y)\n'  # already there: returned as it is
    '  "^also$"    -> (y, _)\n'  # moves
    '  "^other$"   -> (y, x)\n'  # moves, shares nothing
    '  "^small$"   -> (x)\n'  # moves
    '  "^alias$"   -> (_, y)\n',  # moves
    name="target.shard",
)


@pytest.fixture
def meshes() -> tuple[jax.sharding.Mesh, jax.sharding.Mesh]:
    train = jax.make_mesh((4, 2), ("data", "model"), axis_types=AUTO2)
    target = jax.make_mesh((4, 2), ("x", "y"), axis_types=AUTO2)
    assert list(train.devices.flat) == list(target.devices.flat)
    return train, target


def _values(seed: int, shape: tuple[int, ...] = (8, 8)) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _buffers(x: jax.Array) -> set[int]:
    return {s.data.unsafe_buffer_pointer() for s in x.addressable_shards}


def test_an_array_returned_as_it_is_keeps_the_buffers_it_shares_with_a_moved_input(meshes):
    train, target = meshes
    x = jax.device_put(_values(0), NamedSharding(train, P("data", "model")))
    kept = jax.device_put(x, NamedSharding(target, P("x", "y")))  # equivalent: no copy
    assert _buffers(kept) == _buffers(x)
    out = sr.reshard({"moved": x, "kept": kept}, RULES, target, donate=True)
    assert out["kept"] is kept and not kept.is_deleted()
    np.testing.assert_array_equal(np.asarray(out["kept"]), _values(0))
    np.testing.assert_array_equal(np.asarray(out["moved"]), _values(0))
    assert out["moved"].sharding == NamedSharding(target, P("y", "x"))
    assert not _buffers(out["moved"]) & _buffers(kept)


def test_inputs_sharing_buffers_are_deleted_only_once_all_of_them_have_moved(meshes):
    train, target = meshes
    x = jax.device_put(_values(1), NamedSharding(train, P("data", "model")))
    alias = jax.device_put(x, NamedSharding(target, P("x", "y")))  # shares x's buffers, moves too
    other = jax.device_put(_values(2), NamedSharding(train, P("data", "model")))
    out = sr.reshard({"moved": x, "also": alias, "other": other}, RULES, target, donate=True)
    for key, seed in (("moved", 1), ("also", 1), ("other", 2)):
        np.testing.assert_array_equal(np.asarray(out[key]), _values(seed), err_msg=key)
    assert x.is_deleted() and alias.is_deleted() and other.is_deleted()  # freed once all had moved
    assert out["also"].sharding == NamedSharding(target, P("y", None))


def test_without_buffer_addresses_nothing_is_deleted(meshes, monkeypatch):
    train, target = meshes
    x = jax.device_put(_values(3), NamedSharding(train, P("data", "model")))
    monkeypatch.setattr(_moves, "_pointers", lambda array: None)
    out = sr.reshard({"moved": x}, RULES, target, donate=True)
    assert not x.is_deleted()
    np.testing.assert_array_equal(np.asarray(out["moved"]), _values(3))


def _tree(train: jax.sharding.Mesh, target: jax.sharding.Mesh) -> tuple[dict, dict[str, np.ndarray]]:
    """Leaves of every kind: moved alone, sharing buffers with an input that
    moves and with one returned as it is, and not an array at all."""
    on = NamedSharding(train, P("data", "model"))
    shared = jax.device_put(_values(4), on)
    tree = {
        "moved": shared,
        "alias": jax.device_put(shared, NamedSharding(target, P("x", "y"))),  # moves after `moved`
        "other": jax.device_put(_values(5), on),
        "small": jax.device_put(_values(6, (8,)), NamedSharding(train, P("model"))),
        "kept": jax.device_put(jax.device_put(_values(7), on), NamedSharding(target, P("x", "y"))),
        "also": jax.device_put(_values(8), on),
        "name": "not an array",
    }
    want = {"moved": 4, "alias": 4, "other": 5, "small": 6, "kept": 7, "also": 8}
    return tree, {k: _values(seed, (8,) if k == "small" else (8, 8)) for k, seed in want.items()}


GONE_BEFORE = [set(), set(), {"also"}, {"also", "alias", "moved"}, {"also", "alias", "moved", "other"}]


def test_a_move_that_fails_at_any_leaf_loses_nothing(meshes, monkeypatch):
    train, target = meshes
    real = _moves._move_one
    moving = 5  # every array leaf but `kept`
    for k in range(moving):
        tree, want = _tree(train, target)
        inputs = dict(tree)
        calls: list[int] = []

        def failing(source, sharding, mine, k=k, calls=calls):
            calls.append(1)
            if len(calls) == k + 1:
                raise MemoryError(f"RESOURCE_EXHAUSTED: out of memory moving leaf {k}")
            return real(source, sharding, mine)

        monkeypatch.setattr(_moves, "_move_one", failing)
        with pytest.raises(MemoryError, match="RESOURCE_EXHAUSTED") as caught:
            sr.reshard(tree, RULES, target, donate=True)
        error = caught.value
        assert "reshard(donate=True) stopped after" in "\n".join(error.__notes__)
        got = error.tree
        assert got["name"] == "not an array"
        for key, values in want.items():
            leaf = got[key]
            assert not leaf.is_deleted(), (k, key)
            np.testing.assert_array_equal(np.asarray(leaf), values, err_msg=f"leaf {k} failed: {key}")
            if inputs[key].is_deleted():  # its input is gone: the moved copy stands for it
                assert leaf is not inputs[key] and leaf.sharding.mesh == target, (k, key)
            else:  # else the input itself, untouched
                assert leaf is inputs[key], (k, key)
        # Leaves move in the tree's order (alias, also, moved, other, small); an input
        # is deleted once its copy exists, `alias` and `moved` (one buffer) once both have moved.
        gone = {key for key in want if inputs[key].is_deleted()}
        assert gone == GONE_BEFORE[k], (k, gone)
        # The partial tree is usable: resharding it again finishes the job.
        monkeypatch.setattr(_moves, "_move_one", real)
        done = sr.reshard(got, RULES, target, donate=True)
        for key, values in want.items():
            np.testing.assert_array_equal(np.asarray(done[key]), values, err_msg=key)
            assert done[key].sharding == sr.shardings({key: values}, RULES, target)[key]


def test_an_interrupt_part_way_hands_back_the_tree_too(meshes, monkeypatch):
    train, target = meshes
    tree = {
        k: jax.device_put(_values(i), NamedSharding(train, P("data", "model")))
        for i, k in enumerate(["moved", "other"])
    }
    real = _moves._move_one
    calls: list[int] = []

    def interrupted(source, sharding, mine):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(source, sharding, mine)

    monkeypatch.setattr(_moves, "_move_one", interrupted)
    with pytest.raises(KeyboardInterrupt) as caught:
        sr.reshard(tree, RULES, target, donate=True)
    got = caught.value.tree  # type: ignore[attr-defined]
    assert tree["moved"].is_deleted() and got["moved"].sharding.mesh == target
    assert got["other"] is tree["other"] and not tree["other"].is_deleted()
    for i, key in enumerate(["moved", "other"]):
        np.testing.assert_array_equal(np.asarray(got[key]), _values(i))
