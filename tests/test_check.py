"""Plan checks: each warning and error code, triggered from a bad rule file."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr

SIZES = {"data": 2, "fsdp": 4, "model": 8}


def sds(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def rules_of(body: str, mesh: str = "mesh data, fsdp, model") -> sr.RuleSet:
    return sr.loads(f'{mesh}\nrules params:\n{body}rules inputs:\n  "x" -> (data, _)\n', name="m.shard")


def codes(found):
    return [d.code for d in found]


def only(found, code):
    picked = [d for d in found if d.code == code]
    assert len(picked) == 1, found
    return picked[0]


TREE = {
    "layers": {"q": {"kernel": sds(64, 64)}, "o": {"kernel": sds(64, 64)}},
    "norm": {"scale": sds(64)},
}


def test_a_clean_plan_has_no_findings():
    rules = rules_of('  "kernel" -> (fsdp, model)\n  "scale" -> replicated\n')
    assert sr.check(TREE, rules, SIZES) == []
    assert sr.plan(TREE, rules, SIZES).diagnostics == ()


def test_sr201_dead_rule():
    rules = rules_of('  "kernel" -> (fsdp, model)\n  "attn/proj" -> (fsdp, _)\n  "scale" -> replicated\n')
    found = sr.check(TREE, rules, SIZES)
    d = only(found, "SR201")
    assert d.severity == "warning"
    assert (d.span.file, d.span.line, d.span.col) == ("m.shard", 4, 3)
    assert "attn/proj" in d.message
    assert "delete" in d.hint and "layers/o/kernel" in d.hint


def test_sr202_shadowed_rule_names_the_earlier_rule():
    rules = rules_of('  "kernel" -> (fsdp, model)\n  "q/kernel" -> (model, fsdp)\n  "scale" -> replicated\n')
    d = only(sr.check(TREE, rules, SIZES), "SR202")
    assert d.severity == "warning"
    assert d.span.line == 4
    assert "the one leaf it matches is taken first by m.shard:3:3" in d.message
    assert "move it above m.shard:3:3" in d.hint


def test_sr203_sharded_spec_on_a_scalar():
    rules = rules_of('  "step" -> (fsdp)\n  default -> replicated\n')
    d = only(sr.check({"step": sds(), "w": sds(4)}, rules, SIZES), "SR203")
    assert d.severity == "warning" and d.path == "step"
    assert (d.span.line, d.span.col) == (3, 13)
    assert "replicated" in d.hint


def test_sr204_large_replicated_array_with_configurable_threshold():
    rules = rules_of('  "embed" -> replicated\n  default -> (fsdp)\n')
    tree = {"embed": sds(32000, 4096), "b": sds(8)}
    d = only(sr.check(tree, rules, SIZES), "SR204")
    assert d.path == "embed" and d.span.line == 3
    assert "500.0 MiB" in d.message
    assert "auto(model)" in d.hint
    assert "SR204" not in codes(sr.check(tree, rules, SIZES, replicated_threshold="1GiB"))
    assert "SR204" in codes(sr.check({"embed": sds(512, 512)}, rules, SIZES, replicated_threshold=1 << 20))


def test_sr205_mesh_axis_no_rule_uses():
    rules = sr.loads(
        'mesh data, fsdp, model\nrules params:\n  "kernel" -> (fsdp, _)\n  default -> replicated\n'
    )
    found = sr.check(TREE, rules, SIZES)
    unused = sorted(d.message for d in found if d.code == "SR205")
    assert unused == ["mesh axis `data` is used by no rule", "mesh axis `model` is used by no rule"]
    d = only([d for d in found if "model" in d.message], "SR205")
    assert (d.span.line, d.span.col) == (1, 18)
    assert "drop it" in d.hint


def test_sr205_ignores_axes_of_size_one():
    rules = sr.loads('mesh data, fsdp\nrules params:\n  "kernel" -> (fsdp, _)\n  default -> replicated\n')
    assert "SR205" not in codes(sr.check(TREE, rules, {"data": 1, "fsdp": 4}))


def test_sr110_over_the_memory_budget_names_the_biggest_rule():
    rules = rules_of('  "kernel" -> (_, model)\n  "scale" -> replicated\n')
    tree = {"layers": {str(i): {"kernel": sds(8192, 8192)} for i in range(4)}, "norm": {"scale": sds(8)}}
    found = sr.check(tree, rules, SIZES, device_memory="100MiB")
    d = only(found, "SR110")
    assert d.severity == "error"
    assert found[0].code == "SR110"  # errors first
    assert "128.0 MiB" in d.message and "100.0 MiB" in d.message
    assert d.span.line == 3
    assert "4 leaves" in d.hint and "m.shard:3:3" in d.hint
    assert "SR110" not in codes(sr.check(tree, rules, SIZES, device_memory="1GiB"))
    plan = sr.plan(tree, rules, SIZES, device_memory=100 << 20)
    assert not plan.ok and codes(plan.errors) == ["SR110"]


def test_apply_enforces_an_explicit_memory_budget(mesh222):
    rules = sr.loads('mesh data, fsdp, model\nrules params:\n  "w" -> (fsdp, model)\n')
    tree = {"w": jnp.ones((64, 64))}
    with pytest.raises(sr.PlanError) as info:
        sr.apply(tree, rules, mesh222, device_memory="1KiB")
    assert info.value.code == "SR110"
    assert sr.apply(tree, rules, mesh222, device_memory="4KiB")["w"].sharding.spec == P("fsdp", "model")


def test_errors_from_compiling_are_findings_too():
    rules = sr.loads('rules params:\n  "kernel" -> (fsdp, model, data)\n  "scale" -> (modle)\n')
    found = sr.check(TREE, rules, SIZES)
    assert set(codes(found)) >= {"SR103", "SR101"}
    assert all(d.severity == "error" for d in found[:2])


def test_check_accepts_a_plan_and_reports_placement(mesh222):
    rules = sr.loads('mesh data, fsdp, model\nrules params:\n  "w" -> (fsdp, model)\n')
    tree = {"w": jnp.ones((8, 8))}
    tree["w"].delete()
    plan = sr.plan(tree, rules, mesh222)
    assert plan.ok
    d = only(sr.check(tree, plan), "SR107")
    assert d.path == "w"


def test_warnings_do_not_stop_apply(mesh222):
    rules = sr.loads(
        'mesh data, fsdp, model\nrules params:\n  "w" -> (fsdp, model)\n  "nothing" -> replicated\n'
    )
    plan = sr.plan({"w": jnp.ones((8, 8))}, rules, mesh222)
    assert plan.ok and "SR201" in codes(plan.diagnostics)
    with pytest.warns(sr.ShardRulesWarning, match="SR201"):
        assert sr.apply({"w": jnp.ones((8, 8))}, rules, mesh222)["w"].sharding.spec == P("fsdp", "model")


# --------------------------------------------------------------------------- check_devices
def test_check_devices_names_both_leaves(mesh42):
    rules = sr.loads(
        'mesh data, model\nrules params:\n  "w" -> (data, model)\nrules inputs:\n  "x" -> (data, _)\n'
    )
    params = sr.apply({"w": jnp.ones((8, 8))}, rules, mesh42)
    batch = {"x": jax.device_put(jnp.ones((8, 3)), jax.devices()[5])}
    with pytest.raises(sr.PlacementError) as info:
        sr.check_devices(params=params, batch=batch)
    err = info.value
    assert err.code == "SR111"
    assert "`params/w`" in str(err) and "`batch/x`" in str(err) and "{5}" in str(err)
    sr.check_devices(params=params, batch=sr.apply(batch, rules, mesh42, group="inputs"))


def test_check_devices_catches_another_device_order(mesh42):
    other = jax.sharding.Mesh(np.array(jax.devices())[::-1].reshape(4, 2), ("data", "model"))
    a = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh42, P("data")))
    b = jax.device_put(jnp.ones((8, 8)), NamedSharding(other, P("data")))
    with pytest.raises(sr.PlacementError) as info:
        sr.check_devices(params={"a": a}, batch={"b": b})
    assert "another mesh order" in str(info.value)


def test_check_devices_ignores_numpy_and_uncommitted_arrays(mesh42):
    placed = jax.device_put(jnp.ones((8,)), NamedSharding(mesh42, P("data")))
    sr.check_devices(params={"w": placed}, batch={"x": np.ones(3), "y": jnp.ones(3), "n": 3})


# --------------------------------------------------------------------------- SR115: dtypes JAX cannot hold
_EXTENDED = np.dtype(np.longdouble).itemsize > 8  # float128 on x86-64 Linux; float64 elsewhere
UNHOLDABLE = [
    pytest.param(np.longdouble, "`x.astype(np.float64)`", marks=pytest.mark.skipif(not _EXTENDED, reason="")),
    pytest.param(
        np.clongdouble, "`x.astype(np.complex128)`", marks=pytest.mark.skipif(not _EXTENDED, reason="")
    ),
    (np.dtype([("a", "f4"), ("b", "i4")]), "one array per field (`a`, `b`)"),
    (np.dtype("V8"), "`x.view(np.uint8)`"),
    (np.dtype(object), "`np.asarray(x, np.float32)`"),
    (np.dtype("U3"), "keep it out of the tree"),
    (np.dtype("S3"), "keep it out of the tree"),
    (np.dtype("datetime64[s]"), "`x.astype(np.int64)`"),
    (np.dtype(">f4"), "newbyteorder('=')"),
]


@pytest.mark.parametrize(("dtype", "fix"), UNHOLDABLE)
def test_dtypes_jax_cannot_hold_are_errors_of_the_plan(dtype, fix, mesh42):
    dtype = np.dtype(dtype)
    rules = sr.loads(
        'mesh data, model\nrules params:\n  "w" -> (data, _)\n  default -> replicated\n', name="m.shard"
    )
    tree = {"w": np.zeros((8, 2), dtype), "ok": np.ones((8, 2), np.float32)}
    for found in (sr.plan(tree, rules, {"data": 4, "model": 2}).diagnostics, sr.check(tree, rules, mesh42)):
        assert codes(found).count("SR115") == 1 and "SR107" not in codes(found), found
        d = only(found, "SR115")
        assert d.severity == "error" and d.path == "w"
        assert d.span is not None and (d.span.file, d.span.line, d.span.col) == ("m.shard", 3, 3)
        assert f"`w` (shape (8, 2), dtype {dtype}) has a dtype JAX cannot hold" in d.message
        assert fix in d.hint, d.hint
    for call in (sr.specs, sr.shardings):
        with pytest.raises(sr.PlanError) as info:
            call(tree, rules, mesh42)
        assert info.value.code == "SR115" and info.value.path == "w"
        assert str(info.value).startswith(f"m.shard:3:3: SR115 `w` (shape (8, 2), dtype {dtype})")


def test_dtypes_jax_cannot_hold_are_found_in_abstract_trees_and_scalars():
    rules = sr.loads("rules params:\n  default -> replicated\n", name="m.shard")
    tree = {"s": np.longdouble(1.0), "a": jax.ShapeDtypeStruct((4,), np.dtype("V8"))}
    found = sr.plan(tree, rules, SIZES).errors
    assert {(d.code, d.path) for d in found} == {("SR115", "a")} | ({("SR115", "s")} if _EXTENDED else set())


def test_leaves_of_one_dtype_and_rule_are_one_finding_with_their_paths():
    rules = sr.loads('rules params:\n  "w" -> (data, _)\n  default -> replicated\n', name="m.shard")
    record = np.dtype([("a", "f4"), ("b", "i4")])
    tree = {f"l{i}": {"w": np.zeros((8, i + 1), record)} for i in range(25)} | {"x": np.zeros(4, record)}
    found = sr.plan(tree, rules, SIZES).errors
    assert [(d.code, d.span.line if d.span else None) for d in found] == [("SR115", 2), ("SR115", 3)]
    many = found[0]
    assert many.message.startswith(f"`l0/w` (shape (8, 1), dtype {record}) has a dtype JAX cannot hold")
    assert many.count == 25 and many.paths[:2] == (("l0/w", (8, 1)), ("l1/w", (8, 2)))  # in tree order
    assert (
        "(and 24 more leaves like it: `l1/w` (8, 2), `l10/w` (8, 11), `l11/w` (8, 12), ...)" in many.render()
    )
    assert many.path == "l0/w"
    assert found[1].path == "x" and "`x` (shape (4,)" in found[1].message


def test_an_unmatched_leaf_of_such_a_dtype_is_reported_for_its_dtype():
    rules = sr.loads('rules params:\n  "w" -> (data, _)\n', name="m.shard")
    found = sr.plan({"w": np.ones((8, 2)), "v": np.zeros(4, "V8")}, rules, SIZES).errors
    assert [(d.code, d.path, d.span) for d in found] == [("SR115", "v", None)]


def test_a_logical_rule_does_not_lay_out_leaves_of_such_a_dtype():
    nn = pytest.importorskip("flax.linen")
    rules = sr.loads("alias embed = fsdp\nrules params:\n  default -> logical\n", name="m.shard")
    tree = {
        "raw": nn.LogicallyPartitioned(np.zeros((8, 8), "V8"), ("embed", None)),
        "w": nn.LogicallyPartitioned(np.zeros((8, 8), np.float32), ("embed", None)),
    }
    plan = sr.plan(tree, rules, SIZES)
    assert [(d.code, d.path) for d in plan.errors] == [("SR115", "raw")]
    assert (plan["raw"].spec, plan["raw"].why) == (None, "error")
    assert plan["w"].spec == P("fsdp", None)
