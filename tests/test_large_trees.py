"""The shortcuts large trees take give what the long way gives: shapes files
read with one `ShapeDtypeStruct` per distinct entry, plans cached by what the
leaves look like, flat dicts' paths read from their treedef, rules matched a
list of paths at a time, lint of a shapes file."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules._cli import _lint
from shardrules._cli._main import main
from shardrules._interop._paths import flat_paths, leaf_paths
from shardrules._language._load import iter_rules
from shardrules._planning._match import Matcher, by_key, path_key
from shardrules._planning._shapes import ShapeSourceError

SIZES = {"data": 2, "fsdp": 4, "model": 8}
RULES = (
    "mesh data, fsdp, model\n"
    "rules params:\n"
    '  "experts/\\d+/w[13]$" -> (fsdp, model)\n'
    '  "experts/\\d+/w2$"    -> (model, fsdp)\n'
    '  "layers_1/"            -> (_, model)\n'
    '  "norm$"                -> replicated\n'
    "  default                -> replicated\n"
)


def sds(*shape: int, dtype=jnp.float32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def shapes_file(tmp_path: Path, data: dict, name: str = "shapes.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def moe_entries(layers: int = 3, experts: int = 5) -> dict[str, Any]:
    out: dict[str, Any] = {"step": [[], "int32"], "final/norm": [[64], "float32"]}
    for i in range(layers):
        out[f"layers_{i}/norm"] = {"shape": [64], "dtype": "float32"}
        for e in range(experts):
            for w, shape in (("w1", [64, 32]), ("w2", [32, 64]), ("w3", [64, 32])):
                out[f"layers_{i}/experts/{e}/{w}"] = [shape, "bfloat16"]
    return out


# ------------------------------------------------------------------ load_shapes


def test_load_shapes_gives_a_shape_dtype_struct_per_entry_shared_by_equal_entries(tmp_path: Path) -> None:
    entries = moe_entries()
    tree = sr.load_shapes(shapes_file(tmp_path, entries))
    assert list(tree) == list(entries)
    for name, entry in entries.items():
        shape, dtype = (entry["shape"], entry["dtype"]) if isinstance(entry, dict) else entry
        leaf = tree[name]
        assert type(leaf) is jax.ShapeDtypeStruct
        assert leaf.shape == tuple(shape) and leaf.dtype == np.dtype(jnp.dtype(dtype))
    assert tree["layers_0/experts/0/w1"] is tree["layers_2/experts/4/w3"]
    assert tree["layers_0/experts/0/w1"] is not tree["layers_0/experts/0/w2"]
    assert tree["final/norm"] is tree["layers_1/norm"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": [[1, 4], "float32"], "b": [[true, 4], "float32"]}', "a shape is a list of whole numbers"),
        ('{"a": [[4], "float32"], "b": [[4.0], "float32"]}', "a shape is a list of whole numbers"),
        ('{"a": [[4], "float32"], "b": {"shape": [4.0], "dtype": "float32"}}', "whole numbers"),
        ('{"a": [[4], "float32"], "b": [[4], "float33"]}', "unknown dtype"),
        ('{"a": [[4], "float32"], "b": [[4]]}', "should be [shape, dtype]"),
        ('{"a": [[4], "float32"], "b": ["4", "float32"]}', "should be [shape, dtype]"),
        ('{"a": [[4], "float32"], "b": [[[4]], "float32"]}', "a shape is a list of whole numbers"),
        ('{"a": [[4], "float32"], "b": [[-4], "float32"]}', "is negative"),
    ],
)
def test_an_entry_equal_to_one_already_read_is_checked_all_the_same(
    tmp_path: Path, text: str, message: str
) -> None:
    """`[true, 4]` equals `[1, 4]` and `[4.0]` equals `[4]` in Python: the entry
    that follows a good one is refused as it would be on its own."""
    path = tmp_path / "shapes.json"
    path.write_text(text)
    with pytest.raises(ShapeSourceError, match="entry 'b'") as info:
        sr.load_shapes(path)
    assert message in str(info.value)


def test_a_file_that_mentions_true_or_false_still_loads(tmp_path: Path) -> None:
    tree = sr.load_shapes(shapes_file(tmp_path, {"is_true/w": [[4], "float32"], "false": [[4], "float32"]}))
    assert tree["is_true/w"] is tree["false"] and tree["false"].shape == (4,)


# ------------------------------------------------------------------ paths and matching


def test_flat_dicts_paths_come_from_the_treedef_and_are_jaxs() -> None:
    for tree in ({"b": sds(2), "a": 1, "c/d": "x"}, {"only": sds(3)}):
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        assert flat_paths(treedef, leaves) == leaf_paths(tree)
    for tree in ({"a": sds(2), "b": None}, {"a": {"b": sds(2)}}, {0: sds(2)}, {}, [sds(2)], sds(2)):
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        assert flat_paths(treedef, leaves) is None, tree


def test_firsts_is_first_of_every_path() -> None:
    rules = sr.loads(RULES)
    matcher = Matcher(list(iter_rules(rules, "params")))
    paths = [
        "layers_0/experts/3/w1",
        "layers_0/experts/3/w2",
        "layers_1/experts/12/w3",
        "layers_1/experts/12/w4",
        "layers_12/norm",
        "",
        "line\nbreak/experts/1/w1",
        "lone\udc80surrogate/norm",
        "caf\u00e9/experts/9/w2",
    ]
    want = [matcher.first(path) for path in paths]
    assert Matcher(list(iter_rules(rules, "params"))).firsts(paths) == want
    assert matcher.firsts(paths) == want
    kept = [i for i, p in enumerate(paths) if "\n" not in p]
    assert matcher.firsts([paths[i] for i in kept]) == [want[i] for i in kept]
    assert matcher.firsts([]) == []


def test_by_key_groups_paths_by_their_keys() -> None:
    paths = ["a/1", "a/2", "b\n3", "a/10", "b\n4", "\udc80/5"]
    want: dict[bytes, list[int]] = {}
    for i, path in enumerate(paths):
        want.setdefault(path_key(path), []).append(i)
    assert by_key(paths) == want
    assert by_key(iter(paths[:2])) == {b"a/0": [0, 1]}


# ------------------------------------------------------------------ the plan cache


class Fake:
    """An object with a shape and a dtype."""

    def __init__(self, shape: tuple[int, ...], dtype: object) -> None:
        self.shape, self.dtype = shape, dtype


class Holder:
    """An object that hides an array (SR213)."""

    def __init__(self) -> None:
        self.array = np.zeros(4)


def test_a_cached_plan_is_used_only_for_leaves_that_look_the_same() -> None:
    rules = sr.loads('mesh fsdp\nrules params:\n  "w" -> (fsdp, _)\n  default -> replicated\n')
    sizes = {"fsdp": 4}
    assert sr.specs({"w": Fake((8, 8), np.dtype("float64"))}, rules, sizes) == {"w": P("fsdp", None)}
    # NumPy finds float64 equal to None; a leaf with no dtype is not an array
    assert sr.specs({"w": Fake((8, 8), None)}, rules, sizes) == {"w": None}
    assert sr.specs({"w": Fake}, rules, sizes) == {"w": None}  # a class is not an array
    assert sr.specs({"w": np.zeros((8, 8))}, rules, sizes) == {"w": P("fsdp", None)}
    assert sr.specs({"w": sds(4, 8)}, rules, sizes) == {"w": P("fsdp", None)}
    with pytest.raises(sr.PlanError):  # 2 rows do not divide by 4
        sr.specs({"w": sds(2, 8)}, rules, sizes)
    assert sr.plan({"w": sds(8, 8), "n": 3}, rules, sizes).ok
    hidden = sr.plan({"w": sds(8, 8), "n": Holder()}, rules, sizes)
    assert [d.code for d in hidden.diagnostics] == ["SR213"]
    again = sr.plan({"w": sds(8, 8), "n": Holder()}, rules, sizes)  # cached: signatures compared
    assert [d.code for d in again.diagnostics] == ["SR213"]


def test_one_structure_keeps_a_plan_per_kind_of_leaves() -> None:
    rules = sr.loads('rules params:\n  "w" -> (fsdp, _)\n  default -> replicated\n')
    bf16, f32 = {"w": sds(8, 8, dtype=jnp.bfloat16)}, {"w": sds(8, 8)}
    first = sr.plan(bf16, rules, SIZES)
    second = sr.plan(f32, rules, SIZES)
    assert len(rules._plan_cache) == 2
    assert sr.plan(bf16, rules, SIZES).leaves is first.leaves
    assert sr.plan(f32, rules, SIZES).leaves is second.leaves
    assert sr.plan(f32, rules, SIZES).leaves[0].dtype == np.dtype("float32")


def test_cached_plans_tell_apart_str_keys_and_str_enum_keys() -> None:
    class Key(str, enum.Enum):  # noqa: UP042 - its `str` is `Key.A`, a StrEnum's is `a`
        A = "a"

    rules = sr.loads('rules params:\n  "^a$" -> (fsdp)\n  default -> replicated\n')
    first = sr.plan({"a": sds(8)}, rules, SIZES)
    second = sr.plan({Key.A: sds(8)}, rules, SIZES)
    assert [leaf.path for leaf in first] == ["a"] and first.leaves[0].spec == P("fsdp")
    assert [leaf.path for leaf in second] == [str(Key.A)] and second.leaves[0].spec == P(None)


def test_leaf_plans_are_made_as_the_constructor_makes_them() -> None:
    rules = sr.loads(RULES)
    tree = {"layers_0": {"experts": [{"w1": sds(8, 8), "w2": sds(8, 8)}]}, "x": "not an array"}
    plan = sr.plan(tree, rules, SIZES)
    names = ["path", "shape", "dtype", "rule", "spec", "bytes_per_device", "why"]
    for leaf in plan.leaves:
        assert list(vars(leaf)) == names
        assert leaf == sr.LeafPlan(**vars(leaf)) and leaf.where is None
    assert [leaf.path for leaf in plan.leaves] == ["layers_0/experts/0/w1", "layers_0/experts/0/w2", "x"]
    assert plan.leaves.specs() is plan.leaves.specs()  # type: ignore[attr-defined]


# ------------------------------------------------------------------ lint of a shapes file


def test_lint_of_a_shapes_file_is_lint_of_the_tree_it_describes(tmp_path: Path) -> None:
    """The same findings and plan from the file's tree (shared leaves, paths
    read from the treedef) as from the same tree built leaf by leaf, and
    nested (paths walked)."""
    entries = moe_entries()
    rules = tmp_path / "m.shard"
    rules.write_text(RULES + '  "never/\\d+$" -> (fsdp)\n')
    path = shapes_file(tmp_path, entries)
    by_hand = {
        name: sds(*shape, dtype=jnp.dtype(dtype))
        for name, (shape, dtype) in (
            (n, (e["shape"], e["dtype"]) if isinstance(e, dict) else e) for n, e in entries.items()
        )
    }
    from_file = _lint.lint_file(str(rules), sr.load_shapes(path), SIZES)
    built = _lint.lint_file(str(rules), by_hand, SIZES)
    assert from_file.diagnostics == built.diagnostics
    assert from_file.plan is not None and built.plan is not None
    assert tuple(from_file.plan.leaves) == tuple(built.plan.leaves)
    assert {d.code for d in from_file.diagnostics} >= {"SR201"}
    nested: dict = {}
    for name, leaf in by_hand.items():
        *parents, last = name.split("/")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = leaf
    walked = _lint.lint_file(str(rules), nested, SIZES)
    assert walked.plan is not None
    assert [(p.path, p.spec, p.why) for p in walked.plan.leaves] == [
        (p.path, p.spec, p.why) for p in from_file.plan.leaves
    ]


def test_lint_command_says_the_same_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("m.shard").write_text(RULES)
    shapes_file(tmp_path, moe_entries())
    args = ["lint", "m.shard", "--shapes", "shapes.json", "--mesh", "data=2,fsdp=4,model=8"]
    outputs = []
    for _ in range(2):  # an SR103 for the norm `layers_1/` takes: an error per leaf kind
        assert main(args) == 1
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and "Found 1 error and 1 warning." in outputs[0]
