"""SR215: a rule whose mesh axes all have size 1 on the mesh it is planned
for shards nothing; `plan`, `check` and `lint` say so, with the leaves and
bytes it keeps replicated, and say nothing where the rule does shard, names
no axis, or the whole mesh is one device."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardrules as sr
from shardrules._cli import _lint
from shardrules._cli._main import main

S = jax.ShapeDtypeStruct

TEXT = """\
mesh data, model

rules params:
  "kernel" -> (_, model)
  "bias"   -> replicated
  default  -> (data)

rules inputs:
  "tokens" -> (_, model)
"""
TREE = {
    "up": {"kernel": S((64, 32), jnp.float32), "bias": S((32,), jnp.float32)},
    "down": {"kernel": S((32, 64), jnp.bfloat16)},
    "embed": S((16, 8), jnp.float32),
    "step": S((), jnp.int32),
}


def _sr215(diagnostics) -> list:
    return [d for d in diagnostics if d.code == "SR215"]


def test_a_rule_over_axes_of_size_one_is_named_with_what_it_keeps_whole() -> None:
    rules = sr.loads(TEXT, name="model.shard")
    (d,) = _sr215(sr.plan(TREE, rules, {"data": 8, "model": 1}).diagnostics)
    assert d.severity == "warning"
    assert (d.span.file, d.span.line, d.span.col) == ("model.shard", 4, 15)
    assert d.message == (
        "rule `kernel` shards nothing on this mesh: mesh axis `model` has size 1 (data=8, model=1), "
        "so the 2 leaves it lays out stay replicated: 12.0 KiB on every device"
    )  # (64 * 32 * 4 + 32 * 64 * 2) bytes, each held whole by every device
    assert "give `model` a size above 1" in d.hint and "`data` (8 devices)" in d.hint
    assert "`-> replicated`" in d.hint and "# noqa: SR215" in d.hint
    assert _sr215(sr.check(TREE, rules, {"data": 8, "model": 1})) == [d]
    rendered = d.render(rules.sources)
    assert '  4 |   "kernel" -> (_, model)\n    |               ^^^^^^^^^^' in rendered


@pytest.mark.parametrize(
    "sizes",
    [{"data": 8, "model": 2}, {"data": 1, "model": 1}, {"data": 4, "model": 2}],
    ids=["model-shards", "one-device", "both-shard"],
)
def test_no_warning_where_the_rule_shards_or_the_mesh_is_one_device(sizes) -> None:
    assert _sr215(sr.plan(TREE, sr.loads(TEXT), sizes).diagnostics) == []


def test_an_axis_of_size_one_beside_one_that_shards_is_no_warning() -> None:
    """`(data, model)` on model=1 still splits over data; `replicated` names no axis."""
    rules = sr.loads('mesh data, model\nrules params:\n  "w" -> (data, model)\n  "b" -> replicated\n')
    tree = {"w": S((8, 8), jnp.float32), "b": S((8,), jnp.float32)}
    assert _sr215(sr.plan(tree, rules, {"data": 8, "model": 1}).diagnostics) == []


def test_an_alias_alternative_that_shards_is_no_warning() -> None:
    text = 'mesh data, model\nalias mlp = model | data\nrules params:\n  "w" -> (_, mlp)\n'
    tree = {"w": S((8, 8), jnp.float32)}
    assert _sr215(sr.plan(tree, sr.loads(text), {"data": 8, "model": 1}).diagnostics) == []
    only_small = 'mesh data, model, tensor\nalias mlp = model | tensor\nrules params:\n  "w" -> (_, mlp)\n'
    (d,) = _sr215(sr.plan(tree, sr.loads(only_small), {"data": 8, "model": 1, "tensor": 1}).diagnostics)
    assert "mesh axes `model` and `tensor` each have size 1" in d.message


def test_auto_over_an_axis_of_size_one_is_warned_about() -> None:
    rules = sr.loads("mesh data, model\nrules params:\n  default -> auto(model)\n")
    (d,) = _sr215(sr.plan({"w": S((64, 64), jnp.float32)}, rules, {"data": 2, "model": 1}).diagnostics)
    assert (
        d.message.startswith("rule `default` shards nothing")
        and "the one leaf it lays out stays" in d.message
    )


def test_a_rule_that_takes_no_leaf_is_left_to_sr201() -> None:
    rules = sr.loads('mesh data, model\nrules params:\n  "nothing" -> (model)\n  default -> (data)\n')
    codes = {d.code for d in sr.plan({"w": S((8,), jnp.float32)}, rules, {"data": 8, "model": 1}).diagnostics}
    assert "SR201" in codes and "SR215" not in codes


def test_noqa_acknowledges_it() -> None:
    text = TEXT.replace(
        '"kernel" -> (_, model)', '"kernel" -> (_, model)  # kept for the TP mesh; noqa: SR215'
    )
    rules = sr.loads(text, name="model.shard")
    assert _sr215(sr.check(TREE, rules, {"data": 8, "model": 1})) == []
    assert rules.acknowledged == {("model.shard", 4): frozenset({"SR215"})}


def test_lint_reports_every_group_and_counts_the_planned_one(tmp_path) -> None:
    path = tmp_path / "model.shard"
    path.write_text(TEXT)
    kernel, tokens = _sr215(_lint.lint_file(str(path), TREE, {"data": 8, "model": 1}).diagnostics)
    assert kernel.span.line == 4 and "the 2 leaves it lays out stay replicated" in kernel.message
    # the inputs group is not planned for this tree: its rule is named, its leaves not counted
    assert tokens.span.line == 9 and tokens.message.endswith("so every leaf it lays out stays replicated")
    no_tree = _sr215(_lint.lint_file(str(path), None, {"data": 8, "model": 1}).diagnostics)
    assert [d.span.line for d in no_tree] == [4, 9]
    assert all(d.message.endswith("so every leaf it lays out stays replicated") for d in no_tree)
    assert _sr215(_lint.lint_file(str(path), TREE, {"data": 8, "model": 2}).diagnostics) == []


@pytest.mark.parametrize("form", ["text", "json", "github"])
def test_lint_shows_it_in_every_format(tmp_path, monkeypatch, capsys, form) -> None:
    (tmp_path / "model.shard").write_text(TEXT)
    monkeypatch.chdir(tmp_path)
    assert main(["lint", "model.shard", "--mesh", "data=8,model=1", "--format", form]) == 0  # a warning
    out = capsys.readouterr().out
    if form == "json":
        (found,) = [f for f in json.loads(out) if f["code"] == "SR215" and f["line"] == 4]
        assert (found["line"], found["severity"]) == (4, "warning") and "`model` has size 1" in found[
            "message"
        ]
    elif form == "github":
        assert "::warning file=model.shard,line=4," in out and "SR215" in out
    else:
        assert "model.shard:4:15: SR215 rule `kernel` shards nothing on this mesh" in out


AXES = ("a", "b", "c")


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.tuples(*[st.sampled_from([1, 2]) for _ in AXES]),
    named=st.lists(st.sampled_from(AXES), unique=True, max_size=3),
    auto=st.booleans(),
)
def test_warns_iff_every_named_axis_has_size_one_on_a_mesh_with_more_devices(sizes, named, auto) -> None:
    mesh = dict(zip(AXES, sizes, strict=True))
    if auto and named:
        spec = f"auto({named[0]})" if len(named) == 1 else f"auto(({', '.join(named)}))"
    else:
        spec = "(" + ", ".join(named) + ")" if named else "replicated"
    rules = sr.loads(f'mesh a, b, c\nrules params:\n  "w" -> {spec}\n')
    tree = {"w": S((8, 8, 8), jnp.float32)} if not named or auto else {"w": S((8,) * len(named), jnp.float32)}
    found = _sr215(sr.plan(tree, rules, mesh).diagnostics)
    expected = bool(named) and all(mesh[a] == 1 for a in named) and max(mesh.values()) > 1
    assert bool(found) == expected, (spec, mesh, found)
