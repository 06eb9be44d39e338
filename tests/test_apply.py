"""`apply`: data lands where the plan says, values intact; failures move nothing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr

RULES = sr.loads(
    "mesh data, fsdp, model\n"
    "alias embed = fsdp\n"
    "rules params:\n"
    '  "attn/(q|k|v)_proj/kernel" -> (..., embed, model)\n'
    '  "mlp/up/kernel"            -> (embed, model)\n'
    '  "mlp/down/kernel"          -> (model, embed)\n'
    '  "norm/scale$"              -> replicated\n'
    "  default                    -> auto(fsdp, min_bytes=64B)\n"
    "rules inputs:\n"
    '  "tokens"                   -> ((data, fsdp), _)\n',
    name="model.shard",
)


def make_params():
    key = iter(jax.random.split(jax.random.key(0), 16))
    return {
        "layers": {
            "attn": {
                n: {"kernel": jax.random.normal(next(key), (3, 16, 8))}
                for n in ("q_proj", "k_proj", "v_proj")
            },
            "mlp": {
                "up": {"kernel": jax.random.normal(next(key), (16, 32))},
                "down": {"kernel": jax.random.normal(next(key), (32, 16))},
            },
            "norm": {"scale": jnp.ones(16)},
        },
        "embedding": np.arange(64 * 16, dtype=np.float32).reshape(64, 16),
        "step": jnp.array(3, jnp.int32),
        "activation": jax.nn.gelu,
    }


def test_apply_places_every_leaf_as_planned(mesh222):
    params = make_params()
    out = sr.apply(params, RULES, mesh222)
    assert jax.tree.structure(out) == jax.tree.structure(params)
    q = out["layers"]["attn"]["q_proj"]["kernel"]
    assert q.sharding == NamedSharding(mesh222, P(None, "fsdp", "model"))
    assert {s.data.shape for s in q.addressable_shards} == {(3, 8, 4)}
    assert out["layers"]["mlp"]["down"]["kernel"].sharding.spec == P("model", "fsdp")
    assert out["layers"]["norm"]["scale"].sharding.spec == P(None)
    assert out["embedding"].sharding.spec == P("fsdp", None)  # auto: largest divisible dim
    assert out["step"].sharding.spec == P()
    assert out["activation"] is jax.nn.gelu
    plan = sr.plan(params, RULES, mesh222)
    placed = dict(jax.tree_util.tree_leaves_with_path(out))
    assert len(placed) == len(plan)
    for (keypath, array), leaf in zip(placed.items(), plan, strict=True):
        assert jax.tree_util.keystr(keypath, simple=True, separator="/") == leaf.path
        if leaf.spec is not None:
            assert array.sharding == NamedSharding(mesh222, leaf.spec)


def test_values_dtypes_and_structure_survive(mesh222):
    params = make_params()
    params["half"] = jnp.arange(32, dtype=jnp.bfloat16).reshape(4, 8)
    out = sr.apply(params, RULES, mesh222)
    for before, after in zip(jax.tree.leaves(params), jax.tree.leaves(out), strict=True):
        if callable(before):
            assert after is before
            continue
        assert after.dtype == before.dtype
        np.testing.assert_array_equal(np.asarray(after), np.asarray(before))


def test_apply_uses_the_ambient_mesh(mesh222):
    with jax.set_mesh(mesh222):
        out = sr.apply({"tokens": jnp.zeros((8, 5), jnp.int32)}, RULES, group="inputs")
    assert out["tokens"].sharding == NamedSharding(mesh222, P(("data", "fsdp"), None))


def test_apply_builds_the_mesh_from_the_file_when_none_is_given():
    rules = sr.loads('mesh data=4, model=*\nrules params:\n  "w" -> (data, model)\n')
    out = sr.apply({"w": jnp.zeros((8, 8))}, rules)
    mesh = out["w"].sharding.mesh
    assert dict(mesh.shape) == {"data": 4, "model": 2}
    assert {s.data.shape for s in out["w"].addressable_shards} == {(2, 4)}


def test_apply_reads_a_rule_file_path(tmp_path, mesh42):
    path = tmp_path / "r.shard"
    path.write_text('mesh data, model\nrules params:\n  "w" -> (data, model)\n')
    out = sr.apply({"w": jnp.zeros((8, 8))}, str(path), mesh42)
    assert out["w"].sharding.spec == P("data", "model")


def test_without_any_mesh_the_error_says_how_to_give_one():
    rules = sr.loads('rules params:\n  "w" -> (data, _)\n')
    with pytest.raises(sr.MeshError) as info:
        sr.apply({"w": jnp.zeros((8, 8))}, rules)
    assert "mesh" in info.value.hint


def _snapshot(tree):
    return [
        np.asarray(x).copy() if isinstance(x, jax.Array | np.ndarray) else x for x in jax.tree.leaves(tree)
    ]


def _assert_intact(tree, snapshot):
    for leaf, before in zip(jax.tree.leaves(tree), snapshot, strict=True):
        if isinstance(leaf, jax.Array):
            assert not leaf.is_deleted()
            np.testing.assert_array_equal(np.asarray(leaf), before)
        elif isinstance(leaf, np.ndarray):
            np.testing.assert_array_equal(leaf, before)


def test_a_failing_apply_moves_nothing_and_keeps_inputs(mesh222):
    params = make_params()
    params["layers"]["mlp"]["up"]["kernel"] = jnp.ones((15, 32))  # 15 does not divide by fsdp=2
    shardings_before = [x.sharding for x in jax.tree.leaves(params) if isinstance(x, jax.Array)]
    snapshot = _snapshot(params)
    with pytest.raises(sr.PlanError) as info:
        sr.apply(params, RULES, mesh222)
    assert info.value.code == "SR104"
    assert info.value.path == "layers/mlp/up/kernel"
    _assert_intact(params, snapshot)
    assert [x.sharding for x in jax.tree.leaves(params) if isinstance(x, jax.Array)] == shardings_before


def test_deleted_inputs_are_named_before_anything_moves(mesh222):
    params = make_params()
    params["layers"]["mlp"]["up"]["kernel"].delete()
    with pytest.raises(sr.PlacementError) as info:
        sr.apply(params, RULES, mesh222)
    assert info.value.code == "SR107"
    assert "layers/mlp/up/kernel" in str(info.value)
    assert not params["layers"]["mlp"]["down"]["kernel"].is_deleted()


def test_abstract_leaves_cannot_be_applied(mesh222):
    with pytest.raises(sr.PlacementError) as info:
        sr.apply({"w": jax.ShapeDtypeStruct((4, 4), jnp.float32)}, RULES, mesh222)
    assert info.value.code == "SR107"
    assert "shardings()" in info.value.hint


def test_arrays_committed_outside_the_mesh_are_named():
    small = jax.make_mesh((2, 2), ("data", "model"), devices=jax.devices()[:4])
    rules = sr.loads('mesh data, model\nrules params:\n  "w" -> (data, model)\n  "v" -> (data, _)\n')
    far = jax.device_put(jnp.ones((4, 4)), jax.devices()[6])
    near = jax.device_put(jnp.ones((4, 4)), jax.devices()[0])
    with pytest.raises(sr.PlacementError) as info:
        sr.apply({"w": far, "v": near}, rules, small)
    assert info.value.code == "SR106"
    assert info.value.path == "w"
    assert "device 6" in str(info.value)
    assert len(info.value.diagnostics) == 1


def test_arrays_on_the_same_devices_in_another_order_are_named(mesh42):
    devices = np.array(jax.devices())
    other = jax.sharding.Mesh(devices[::-1].reshape(4, 2), ("data", "model"))
    rules = sr.loads('mesh data, model\nrules params:\n  "w" -> (data, model)\n')
    placed = jax.device_put(jnp.ones((8, 8)), NamedSharding(other, P("data", "model")))
    with pytest.raises(sr.PlacementError) as info:
        sr.apply({"w": placed}, rules, mesh42)
    assert info.value.code == "SR106"
    assert "another order" in str(info.value)


def test_reapplying_to_an_already_placed_tree_is_a_no_op_in_layout(mesh222):
    once = sr.apply(make_params(), RULES, mesh222)
    twice = sr.apply(once, RULES, mesh222)
    for a, b in zip(jax.tree.leaves(once), jax.tree.leaves(twice), strict=True):
        if isinstance(a, jax.Array):
            assert a.sharding == b.sharding
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_apply_inside_jit_lays_out_traced_values(mesh222):
    @jax.jit
    def f(x):
        return sr.apply({"w": x * 2}, RULES, mesh222)["w"]

    with pytest.warns(sr.ShardRulesWarning, match="SR201"):  # RULES' other rules match nothing in {"w"}
        out = f(jnp.ones((64, 16)))
    assert out.sharding.is_equivalent_to(NamedSharding(mesh222, P("fsdp", None)), 2)
    np.testing.assert_array_equal(np.asarray(out), np.full((64, 16), 2.0))


def test_a_dtype_jax_cannot_hold_fails_before_anything_moves(mesh222):
    params = make_params()
    params["layers"]["stats"] = np.zeros((4, 8), np.dtype([("mean", "f4"), ("count", "i4")]))
    placed_before = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh222, P("data")))
    params["placed"] = placed_before
    shardings_before = [x.sharding for x in jax.tree.leaves(params) if isinstance(x, jax.Array)]
    snapshot = _snapshot(params)
    with pytest.raises(sr.PlanError) as info:
        sr.apply(params, RULES, mesh222)
    err = info.value
    assert err.code == "SR115" and err.path == "layers/stats"
    assert "dtype [('mean', '<f4'), ('count', '<i4')]) has a dtype JAX cannot hold" in str(err)
    assert err.span is not None and (err.span.file, err.span.line) == ("model.shard", 8)  # the default rule
    assert "one array per field (`mean`, `count`)" in err.hint
    _assert_intact(params, snapshot)
    assert [x.sharding for x in jax.tree.leaves(params) if isinstance(x, jax.Array)] == shardings_before
    assert not any(
        x.committed for x in jax.tree.leaves(params) if isinstance(x, jax.Array) and x is not placed_before
    )
    assert isinstance(params["embedding"], np.ndarray)


def test_a_mesh_without_an_axis_the_file_writes_optional():
    """`mesh fsdp, model?` on a mesh of `fsdp` alone: `model` is size 1, so
    what it would shard stays unsharded; apply places, jit runs with the
    activation rule that names it, and nothing is warned."""
    import warnings

    from jax.sharding import AxisType

    rules = sr.loads(
        "mesh fsdp, model?\n"
        'rules params:\n  "up$" -> (fsdp, model)\n  "down$" -> (model, fsdp)\n'
        'rules activations:\n  "up$" -> (fsdp, model)\n'
        'rules inputs:\n  "x" -> (fsdp, _)\n',
        name="o.shard",
    )
    params = {"up": jnp.ones((16, 32)), "down": jnp.ones((32, 16))}
    batch = {"x": jnp.ones((8, 16))}

    def loss(p, b):
        with jax.named_scope("up"):
            h = b["x"] @ p["up"]
        return (h @ p["down"]).sum()

    for kind in (AxisType.Explicit, AxisType.Auto):
        mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(kind,))
        with warnings.catch_warnings():
            warnings.simplefilter("error", sr.ShardRulesWarning)
            placed = sr.apply(params, rules, mesh)
            assert {k: v.sharding.spec for k, v in placed.items()} == {
                "up": P("fsdp", None),
                "down": P(None, "fsdp"),
            }
            got = sr.jit(loss, rules, mesh, in_groups=("params", "inputs"))(placed, batch)
        assert float(got) == float(loss(params, batch))
    without = sr.loads("mesh fsdp, model\n" + 'rules params:\n  "up$" -> (fsdp, model)\n', name="n.shard")
    with pytest.raises(sr.MeshError, match="SR101") as raised:
        sr.apply({"up": jnp.ones((16, 32))}, without, jax.make_mesh((8,), ("fsdp",)))
    assert "`mesh fsdp, model?`" in str(raised.value)
