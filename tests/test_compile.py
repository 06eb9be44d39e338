"""Compiling rules for a tree: the semantics of paths, patterns and specs, and plan errors."""

from __future__ import annotations

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardrules as sr

SIZES = {"data": 2, "fsdp": 4, "model": 8}
F32 = jnp.float32


def sds(*shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def rules_of(body: str, mesh: str = "mesh data, fsdp, model", extra: str = "") -> sr.RuleSet:
    return sr.loads(f"{mesh}\n{extra}rules params:\n{body}", name="r.shard")


LLAMA = rules_of(
    '  "embed/embedding"          -> (model, embed)\n'
    '  "attn/(q|k|v)_proj/kernel" -> (..., embed, heads)\n'
    '  "attn/o_proj/kernel"       -> (..., heads, embed)\n'
    '  "norm/scale$"              -> replicated\n'
    '  "lm_head/kernel"           -> (embed, model?)\n'
    "  default                    -> auto(fsdp, min_bytes=1MiB)\n",
    extra="alias embed = fsdp\nalias heads = model\n",
)


def test_ellipsis_right_aligns_for_scanned_layers():
    tree = {"layers": {"attn": {"q_proj": {"kernel": sds(80, 8192, 8192)}}}}
    specs = sr.specs(tree, LLAMA, SIZES)
    assert specs["layers"]["attn"]["q_proj"]["kernel"] == P(None, "fsdp", "model")


def test_ellipsis_matches_zero_leading_dims():
    tree = {"attn": {"o_proj": {"kernel": sds(8192, 8192)}}}
    assert sr.specs(tree, LLAMA, SIZES)["attn"]["o_proj"]["kernel"] == P("model", "fsdp")


def test_first_match_wins_in_file_order():
    rules = rules_of('  "kernel" -> (fsdp, _)\n  "q/kernel" -> (_, model)\n')
    assert sr.specs({"q": {"kernel": sds(8, 8)}}, rules, SIZES)["q"]["kernel"] == P("fsdp", None)


def test_patterns_are_searched_so_optimizer_state_matches_too():
    tree = {"opt_state": [{"mu": {"attn": {"q_proj": {"kernel": sds(64, 64)}}}}]}
    plan = sr.plan(tree, LLAMA, SIZES)
    (leaf,) = plan.leaves
    assert leaf.path == "opt_state/0/mu/attn/q_proj/kernel"
    assert leaf.spec == P("fsdp", "model")
    assert leaf.rule is not None and leaf.rule.span is not None and leaf.rule.span.line == 6


def test_replicated_and_underscore():
    rules = rules_of('  "norm" -> replicated\n  "b" -> (_, model)\n')
    specs = sr.specs({"norm": sds(4, 8), "b": sds(3, 16)}, rules, SIZES)
    assert specs == {"norm": P(None, None), "b": P(None, "model")}


def test_tuple_entry_shards_one_dim_over_several_axes():
    rules = rules_of('  "x" -> ((data, fsdp), model)\n')
    assert sr.specs({"x": sds(16, 16)}, rules, SIZES)["x"] == P(("data", "fsdp"), "model")


def test_alias_to_tuple_expands_in_place():
    rules = rules_of('  "x" -> (batch, _)\n', extra="alias batch = (data, fsdp)\n")
    assert sr.specs({"x": sds(16, 3)}, rules, SIZES)["x"] == P(("data", "fsdp"), None)


def test_optional_axis_dropped_where_it_does_not_divide():
    specs = sr.specs({"lm_head": {"kernel": sds(8192, 128256)}}, LLAMA, SIZES)
    assert specs["lm_head"]["kernel"] == P("fsdp", "model")  # 128256 = 8 * 16032
    specs = sr.specs({"lm_head": {"kernel": sds(8192, 32003)}}, LLAMA, SIZES)
    assert specs["lm_head"]["kernel"] == P("fsdp", None)


def test_optional_axis_inside_a_tuple_keeps_the_rest():
    rules = rules_of('  "x" -> ((data, model?))\n')
    assert sr.specs({"x": sds(6)}, rules, SIZES)["x"] == P("data")
    assert sr.specs({"x": sds(16)}, rules, SIZES)["x"] == P(("data", "model"))


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ((1024, 4096), P(None, "fsdp")),  # largest divisible dim
        ((4096, 1024), P("fsdp", None)),
        ((2048, 2048), P("fsdp", None)),  # ties: the first
        ((4096, 1022), P("fsdp", None)),
        ((4094, 1024), P(None, "fsdp")),  # the largest does not divide: next one
        ((4094, 1022), P(None, None)),  # nothing divides: replicated
        ((16, 16), P(None, None)),  # below min_bytes: replicated
    ],
)
def test_auto_shards_the_largest_divisible_dim(shape, expected):
    assert sr.specs({"w": sds(*shape)}, LLAMA, SIZES)["w"] == expected


def test_scalars_size1_and_non_arrays_need_no_rule():
    rules = rules_of('  "w" -> (fsdp, _)\n')
    tree = {
        "w": sds(8, 8),
        "step": jnp.zeros((), jnp.int32),
        "one": np.ones((1, 1), np.float32),
        "act": jax.nn.relu,
        "name": "mlp",
        "n": 3,
        "nothing": None,
    }
    plan = sr.plan(tree, rules, SIZES)
    assert plan.ok, plan.diagnostics
    by_path = {leaf.path: leaf for leaf in plan}
    assert by_path["step"].spec == P() and by_path["step"].why == "scalar"
    assert by_path["one"].spec == P(None, None) and by_path["one"].why == "size-1"
    assert by_path["act"].spec is None and by_path["act"].why == "not an array"
    specs = plan.specs()
    assert specs["act"] is None and specs["name"] is None and specs["n"] is None
    assert specs["nothing"] is None
    assert jax.tree.structure(specs, is_leaf=lambda x: x is None) == jax.tree.structure(
        tree, is_leaf=lambda x: x is None
    )


class Pair(collections.namedtuple("Pair", "left right")):
    pass


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Block:
    kernel: jax.Array
    bias: jax.Array


def test_paths_for_every_container():
    rules = rules_of("  default -> replicated\n")
    tree = {
        "d": {1: sds(2, 2), 20: sds(2, 2)},
        "t": {("a", "b"): sds(2, 2)},
        "l": [sds(2, 2), (sds(2, 2),)],
        "nt": Pair(sds(2, 2), sds(2, 2)),
        "dc": Block(kernel=sds(2, 2), bias=sds(2)),
    }
    paths = [leaf.path for leaf in sr.plan(tree, rules, SIZES)]
    assert set(paths) == {
        "d/1",
        "d/20",
        "t/('a', 'b')",
        "l/0",
        "l/1/0",
        "nt/left",
        "nt/right",
        "dc/kernel",
        "dc/bias",
    }


def test_specs_and_shardings_have_the_input_structure(mesh222):
    rules = sr.loads(
        'mesh data, fsdp, model\nrules params:\n  "k" -> (fsdp, model)\n  default -> replicated\n'
    )
    tree = {"a": Block(kernel=jnp.zeros((4, 4)), bias=jnp.zeros(4)), "k": [jnp.zeros((4, 8))], "f": jnp.tanh}
    shardings = sr.shardings(tree, rules, mesh222)
    none_leaf = lambda x: x is None  # noqa: E731
    assert jax.tree.structure(shardings, is_leaf=none_leaf) == jax.tree.structure(tree, is_leaf=none_leaf)
    assert shardings["k"][0] == jax.sharding.NamedSharding(mesh222, P("fsdp", "model"))
    assert shardings["f"] is None


# --------------------------------------------------------------------------- plan errors
def plan_error(tree, rules, mesh=SIZES) -> sr.PlanError:
    with pytest.raises(sr.ShardRulesError) as info:
        sr.specs(tree, rules, mesh)
    return info.value  # type: ignore[return-value]


def test_rank_mismatch_names_path_shape_and_rule_line():
    rules = rules_of('  "w" -> (fsdp, _)\n  "x" -> (fsdp, model)\n')
    err = plan_error({"x": sds(4, 8, 16)}, rules)
    assert isinstance(err, sr.PlanError)
    assert err.code == "SR103"
    assert err.span is not None and (err.span.line, err.span.file) == (4, "r.shard")
    assert err.path == "x"
    assert "(4, 8, 16)" in str(err) and "2" in str(err) and "3" in str(err)
    assert "..." in err.hint


def test_divisibility_names_the_sizes_that_would_work():
    err = plan_error({"x": sds(12, 16)}, rules_of('  "x" -> (model, _)\n'))
    assert err.code == "SR104"
    assert err.path == "x"
    assert "12" in str(err) and "8" in str(err)
    assert "model?" in err.hint


def test_divisibility_message_names_every_axis_of_the_product():
    rules = rules_of('  "x" -> ((data, model?, fsdp))\n')
    err = plan_error({"x": sds(12)}, rules)
    assert err.code == "SR104"
    assert "does not divide by 8 (`data`=2 × `fsdp`=4)" in str(err)
    assert err.span is not None and err.span.col == 26


def test_alias_named_like_a_runtime_axis_points_at_the_alias():
    rules = sr.loads('alias data = model\nrules params:\n  "w" -> (data)\n', name="r.shard")
    err = plan_error({"w": sds(8)}, rules, {"data": 2, "model": 4})
    assert err.code == "SR013"
    assert err.span is not None and (err.span.file, err.span.line) == ("r.shard", 1)


def test_axis_used_twice_in_one_spec():
    err = plan_error({"x": sds(8, 8)}, rules_of('  "x" -> (fsdp, (data, fsdp))\n'))
    assert err.code == "SR102"
    assert "fsdp" in str(err)


def test_unknown_axis_for_the_runtime_mesh_with_did_you_mean():
    rules = sr.loads('rules params:\n  "x" -> (modle, _)\n', name="r.shard")
    err = plan_error({"x": sds(8, 8)}, rules)
    assert isinstance(err, sr.MeshError)
    assert err.code == "SR101"
    assert "did you mean `model`?" in str(err)
    assert err.span is not None and err.span.line == 2


def test_every_unmatched_leaf_is_listed_once():
    rules = rules_of('  "w" -> (fsdp)\n')
    tree = {"w": sds(8), "u": {"a": sds(4, 4), "b": sds(4, 4)}, "v": [sds(2, 2)]}
    err = plan_error(tree, rules)
    assert err.code == "SR105"
    assert len(err.diagnostics) == 1
    for path in ("u/a", "u/b", "v/0"):
        assert path in str(err)
    assert "default" in err.hint


def test_all_problems_are_reported_together():
    rules = rules_of('  "a" -> (model, _)\n  "b" -> (fsdp)\n')
    plan = sr.plan({"a": sds(3, 3), "b": sds(4, 4), "c": sds(4, 4)}, rules, SIZES)
    assert not plan.ok
    assert sorted(d.code for d in plan.errors) == ["SR103", "SR104", "SR105"]
    with pytest.raises(sr.PlanError) as info:
        plan.raise_for_errors()
    assert len(info.value.diagnostics) == 3


def test_missing_group_is_a_key_error():
    with pytest.raises(KeyError) as info:
        sr.specs({"x": sds(2)}, LLAMA, SIZES, group="parms")
    assert isinstance(info.value, sr.GroupNotFoundError)
    assert "did you mean `params`?" in str(info.value)


def test_sizes_needed_for_optional_and_auto():
    rules = sr.loads('mesh fsdp, model\nrules params:\n  "x" -> (fsdp, model?)\n')
    plan = sr.plan({"x": sds(8, 8)}, rules, None)
    assert [d.code for d in plan.errors] == ["SR108"]


def test_plain_specs_need_no_sizes():
    rules = sr.loads('mesh fsdp, model\nrules params:\n  "x" -> (fsdp, model)\n')
    assert sr.specs({"x": sds(8, 8)}, rules, None)["x"] == P("fsdp", "model")


def test_sized_mesh_line_is_used_without_devices():
    rules = sr.loads("mesh data=2, fsdp=64, model=8\nrules params:\n  default -> auto(fsdp)\n")
    plan = sr.plan({"w": sds(8192, 28672)}, rules)
    assert plan.ok, plan.diagnostics
    assert plan["w"].spec == P(None, "fsdp")
    assert plan["w"].bytes_per_device == 8192 * 28672 * 4 // 64


def test_bytes_per_device_and_table():
    plan = sr.plan({"attn": {"o_proj": {"kernel": sds(64, 64)}}}, LLAMA, SIZES)
    assert plan.bytes_per_device == 64 * 64 * 4 // (8 * 4)
    table = plan.table()
    assert "attn/o_proj/kernel" in table and "r.shard:7" in table and "(64, 64)" in table


def test_the_plan_is_deterministic_and_hashable_inputs_are_untouched():
    tree = {"w": np.arange(64, dtype=np.float32).reshape(8, 8)}
    before = tree["w"].copy()
    first = sr.specs(tree, LLAMA, SIZES)
    second = sr.specs(tree, LLAMA, SIZES)
    assert first == second
    np.testing.assert_array_equal(tree["w"], before)


def test_table_shows_rule_files_relative_to_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "sharding").mkdir()
    path = tmp_path / "sharding" / "m.shard"
    path.write_text('rules params:\n  "w" -> (fsdp, _)\n')
    monkeypatch.chdir(tmp_path)
    table = sr.plan({"w": sds(8, 8)}, sr.load(path), SIZES).table()
    assert " sharding/m.shard:2:3 " in table
    assert str(tmp_path) not in table


def test_cached_plans_tell_apart_keys_that_compare_equal():
    rules = sr.loads('rules params:\n  "False" -> (fsdp)\n  default -> replicated\n')
    first = sr.plan({0: sds(8)}, rules, SIZES)
    second = sr.plan({False: sds(8)}, rules, SIZES)
    assert [leaf.path for leaf in first] == ["0"] and first.leaves[0].spec == P(None)
    assert [leaf.path for leaf in second] == ["False"] and second.leaves[0].spec == P("fsdp")


def test_a_second_plan_for_the_same_structure_comes_from_the_cache():
    rules = sr.loads('rules params:\n  "w" -> (fsdp, _)\n')
    tree = {"w": sds(8, 8)}
    sr.specs(tree, rules, SIZES)
    assert len(rules._plan_cache) == 1
    assert sr.specs({"w": sds(8, 8)}, rules, SIZES) == {"w": P("fsdp", None)}
    assert len(rules._plan_cache) == 1
    sr.specs({"w": sds(16, 8)}, rules, SIZES)
    assert len(rules._plan_cache) == 2


def test_plans_are_safe_to_compile_from_many_threads():
    from concurrent.futures import ThreadPoolExecutor

    rules = sr.loads('rules params:\n  "w" -> (fsdp, _)\n  default -> replicated\n')
    trees = [{"w": sds(8 * (i % 4 + 1), 8), "b": sds(i % 3 + 2)} for i in range(64)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda t: sr.specs(t, rules, SIZES), trees))
    for tree, specs in zip(trees, got, strict=True):
        assert specs == {"w": P("fsdp", None), "b": P(None)}, (tree, specs)


def test_fast_paths_are_jaxs_paths():
    from shardrules._interop._paths import leaf_paths, path_str

    od = collections.OrderedDict([("y", 1), ("x", 2)])
    trees = [
        {"b": [1, (2, None, Pair(3, {"z": 4}))], "a": Block(kernel=5, bias={"k": [6]}), "o": od},
        {"": {"attn": 1}, "x": {"": [2, {"": 3}]}},
        {1: 2, 0: 3},
        7,
        None,
        [],
        {"m": {}},
    ]
    for tree in trees:
        want = [path_str(kp) for kp, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
        assert leaf_paths(tree) == want, tree


def test_plan_leaves_read_like_a_tuple_and_specs_make_no_leaf_plans() -> None:
    """`Plan.leaves` is a sequence of `LeafPlan`s that compares, hashes, indexes
    and slices like the tuple of them; `specs()` reads the shared per-kind parts
    and makes no `LeafPlan` at all."""
    text = 'rules params:\n  "w$" -> (x, _)\n  default -> replicated\n'
    s = jax.ShapeDtypeStruct
    tree = {
        "a": {"w": s((8, 4), jnp.float32)},
        "b": [s((8, 4), jnp.float32), "not an array"],
        "c": s((), jnp.int32),
    }
    from shardrules._planning._compile import compile_plan  # what `sr.specs` uses: no warnings pass

    fresh = compile_plan(tree, sr.loads(text), {"x": 2}, "params")
    assert fresh.specs() == {"a": {"w": P("x", None)}, "b": [P(None, None), None], "c": P()}
    assert fresh.leaves._made is None  # type: ignore[attr-defined]
    leaves = fresh.leaves
    as_tuple = tuple(leaves)
    assert [lp.path for lp in as_tuple] == ["a/w", "b/0", "b/1", "c"]
    assert [lp.why for lp in as_tuple] == ["rule", "default", "not an array", "scalar"]
    assert len(leaves) == 4 and leaves[0] == as_tuple[0] and leaves[-1] == as_tuple[-1]
    assert leaves[1:3] == as_tuple[1:3] and leaves == as_tuple and hash(leaves) == hash(as_tuple)
    assert leaves + () == as_tuple == () + leaves and leaves.index(as_tuple[2]) == 2  # noqa: RUF005
    assert (
        as_tuple[0].shape == (8, 4)
        and as_tuple[0].spec == P("x", None)
        and as_tuple[0].bytes_per_device == 64
    )
    again = sr.plan(tree, sr.loads(text), {"x": 2})
    assert again.leaves == fresh.leaves and again.leaves == as_tuple


def test_table_says_how_many_errors_and_how_to_see_them():
    """Leaves that could not be planned count 0 B; the table's last line says so."""
    rules = sr.loads('mesh data=4\nrules params:\n  "w" -> (data, _)\n')
    tree = {"w": jax.ShapeDtypeStruct((6, 4), jnp.float32), "v": jax.ShapeDtypeStruct((8, 4), jnp.float32)}
    last = str(sr.plan(tree, rules)).splitlines()[-1]
    assert last.startswith("2 errors (SR104, SR105); the leaves they concern count 0 B")
    assert "plan.raise_for_errors()" in last
    fine = sr.plan({"w": jax.ShapeDtypeStruct((8, 4), jnp.float32)}, rules)
    assert str(fine).splitlines()[-1].endswith("per device")
