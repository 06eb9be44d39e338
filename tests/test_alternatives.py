"""Aliases with alternatives (`alias embed = (fsdp, expert) | fsdp | _`): the
file layer and the formatter, load-time resolution, the choice each spec makes
when a leaf is planned (SR119 when none applies), lint's SR209, and a
differential test against Flax's `logical_to_mesh_axes`."""

from __future__ import annotations

import re
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, note
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules._cli import _lint
from shardrules._language._parse import parse
from shardrules._language._syntax import Alias, AliasTarget, AxisRef


def S(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def spec_of(text, shape, sizes, path="w", group="params"):
    """The spec the rules give a leaf `path` of `shape`."""
    return sr.specs({path: S(*shape)}, sr.loads(text), sizes, group=group)[path]


def error_of(text, tree, sizes, name="m.shard"):
    rules = sr.loads(text, name=name)
    with pytest.raises(sr.ShardRulesError) as info:
        sr.specs(tree, rules, sizes)
    return info.value


SIZES = {"fsdp": 2, "tensor": 2, "expert": 2}
ALIASES = "alias embed = (fsdp, expert) | fsdp | _\nalias mlp = (tensor, expert) | tensor | _\nalias heads = tensor\n"


# ------------------------------------------------------------------ file layer and formatter


def test_alternatives_parse_into_the_alias_with_their_spans():
    (alias,) = parse("alias embed = (fsdp, x) | fsdp | _\n").statements
    assert isinstance(alias, Alias)
    assert alias.target == (AxisRef("fsdp"), AxisRef("x")) and alias.is_tuple
    assert alias.more == (AliasTarget((AxisRef("fsdp"),)), AliasTarget(()))
    assert [a.span.col for a in alias.alternatives if a.span] == [15, 27, 34]
    assert [a.span.end_col for a in alias.alternatives if a.span] == [24, 31, 35]


def test_one_alternative_is_an_alias_as_before():
    (alias,) = parse("alias embed = fsdp\n").statements
    assert isinstance(alias, Alias) and alias.more == () and len(alias.alternatives) == 1
    assert parse("alias embed = fsdp\n") != parse("alias embed = fsdp | _\n")


def test_format_writes_one_space_around_each_bar_and_aligns_the_equals():
    text = "alias embed=(fsdp ,x)|fsdp|  _  # note\nalias h = t\nalias mlp = ( a )|_\n"
    assert sr.format_text(text) == (
        "alias embed = (fsdp, x) | fsdp | _  # note\nalias h     = t\nalias mlp   = (a) | _\n"
    )


def test_a_bar_with_nothing_after_it_is_a_syntax_error():
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads("alias embed = fsdp |\n")
    assert info.value.code == "SR001" and info.value.span is not None and info.value.span.col == 21


# ------------------------------------------------------------------ load time


def test_aliases_with_alternatives_are_kept_apart_in_line_order_and_flatten_aliases_of_one():
    rules = sr.loads(
        "alias h = (tensor, x)\nalias mlp = h | tensor | _\nalias embed = fsdp | _\nalias b = fsdp\n"
    )
    assert dict(rules.aliases) == {"h": ("tensor", "x"), "b": ("fsdp",)}
    assert list(rules.alternatives.items()) == [
        ("mlp", (("tensor", "x"), ("tensor",), ())),
        ("embed", (("fsdp",), ())),
    ]


@pytest.mark.parametrize(
    ("text", "where", "words"),
    [
        ("alias a = fsdp | _\nalias b = a | model\n", (2, 11), "names alias `a`, which has alternatives too"),
        ("alias a = fsdp | _\nalias b = (a, model)\n", (2, 12), "alias `a` has alternatives"),
        ("alias a = (fsdp, a) | _\n", (1, 18), "names itself"),
        ("alias a = (fsdp, _) | model\n", (1, 18), "`_` (unsharded) cannot be one of several"),
    ],
)
def test_load_errors_in_alternatives_are_sr010(text, where, words):
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads(text, name="m.shard")
    err = info.value
    assert err.code == "SR010" and words in err.diagnostics[0].message, err.diagnostics[0].message
    assert err.span is not None and (err.span.line, err.span.col) == where


def test_with_a_mesh_line_an_unknown_name_in_an_alternative_is_no_error_but_in_a_plain_alias_it_is():
    rules = sr.loads("mesh fsdp, tensor\nalias embed = (fsdp, expert) | fsdp | _\n")
    assert rules.alternatives["embed"] == (("fsdp", "expert"), ("fsdp",), ())
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads("mesh fsdp, tensor\nalias embed = (fsdp, expert)\n")
    assert info.value.code == "SR010"


def test_an_alias_with_alternatives_defined_twice_is_sr012_and_one_named_like_an_axis_sr013():
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads("alias e = fsdp | _\nalias e = tensor | _\n")
    assert info.value.code == "SR012"
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads("mesh fsdp\nalias fsdp = fsdp | _\n")
    assert info.value.code == "SR013"
    plan = sr.plan({"w": S(8)}, sr.loads('alias x = y | _\nrules params:\n  "w" -> (x)\n'), {"x": 2, "y": 2})
    assert [d.code for d in plan.errors] == ["SR013"]


def test_an_alias_with_alternatives_in_a_spec_names_it_unknown_ones_are_still_sr010():
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads('mesh fsdp\nalias embed = fsdp | _\nrules params:\n  "w" -> (embd)\n')
    assert info.value.code == "SR010" and "did you mean `embed`?" in info.value.hint


def test_auto_cannot_name_an_alias_with_alternatives():
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads("alias embed = fsdp | _\nrules params:\n  default -> auto(embed)\n")
    assert info.value.code == "SR016" and "alternatives" in info.value.diagnostics[0].message


# ------------------------------------------------------------------ the choice, per spec


RULES = ALIASES + "rules params:\n  default -> (embed, mlp)\n"


def test_the_first_alternative_whose_axes_are_in_the_mesh_and_free_is_taken():
    assert spec_of(RULES, (8, 8), SIZES) == P(("fsdp", "expert"), "tensor")  # `expert` taken by embed


def test_an_alternative_naming_an_axis_the_mesh_lacks_does_not_apply():
    assert spec_of(RULES, (8, 8), {"fsdp": 2, "tensor": 2}) == P("fsdp", "tensor")


def test_an_axis_taken_by_a_fixed_entry_makes_the_alternative_fail():
    text = ALIASES + "rules params:\n  default -> (mlp, heads)\n"
    assert spec_of(text, (8, 8), SIZES) == P(None, "tensor")  # heads is placed first, whatever its place
    text = ALIASES + "rules params:\n  default -> (embed, fsdp)\n"
    assert spec_of(text, (8, 8), SIZES) == P(None, "fsdp")  # a mesh axis is fixed too


def test_aliases_are_settled_in_the_order_of_their_alias_lines_not_of_the_dimensions():
    text = ALIASES + "rules params:\n  default -> (mlp, embed)\n"
    assert spec_of(text, (8, 8), SIZES) == P("tensor", ("fsdp", "expert"))
    swapped = (
        "alias mlp = (tensor, expert) | tensor | _\nalias embed = (fsdp, expert) | fsdp | _\n"
        "rules params:\n  default -> (mlp, embed)\n"
    )
    assert spec_of(swapped, (8, 8), SIZES) == P(("tensor", "expert"), "fsdp")


def test_the_same_alias_twice_in_a_spec_settles_its_dimensions_in_order():
    text = "alias e = fsdp | tensor | _\nrules params:\n  default -> (e, e, e)\n"
    assert spec_of(text, (8, 8, 8), SIZES) == P("fsdp", "tensor", None)


def test_underscore_always_applies_and_an_alias_of_underscore_is_one():
    text = "alias vocab = _\nalias e = tensor | vocab | fsdp\nrules params:\n  default -> (tensor, e)\n"
    assert spec_of(text, (8, 8), SIZES) == P("tensor", None)


def test_the_choice_in_a_tuple_entry_and_beside_fixed_names_on_one_dimension():
    text = ALIASES + "rules params:\n  default -> ((heads, embed), mlp)\n"
    assert spec_of(text, (16, 8), SIZES) == P(("tensor", "fsdp", "expert"), None)


def test_optional_applies_to_the_chosen_alternative_after_the_choice():
    text = ALIASES + "rules params:\n  default -> (embed?, mlp)\n"
    # (fsdp, expert) is chosen (it applies: in the mesh, free), then dropped where 6 does not divide by 4
    assert spec_of(text, (6, 8), SIZES) == P(None, "tensor")
    assert spec_of(text, (4, 8), SIZES) == P(("fsdp", "expert"), "tensor")
    whole = ALIASES + "rules params:\n  default -> ((embed, heads)?)\n"
    assert spec_of(whole, (8,), SIZES) == P(("fsdp", "expert", "tensor"))
    assert spec_of(whole, (4,), SIZES) == P(None)


def test_a_dimension_that_does_not_divide_by_the_choice_is_sr104_not_a_fallback():
    err = error_of(ALIASES + "rules params:\n  default -> (embed, mlp)\n", {"w": S(6, 8)}, SIZES)
    assert err.code == "SR104"
    assert "`embed` → `fsdp`=2 × `expert`=2" in err.diagnostics[0].message, err.diagnostics[0].message


def test_sr119_lists_every_alternative_and_why_and_points_at_the_entry():
    text = 'alias heads = tensor\nalias mlp = (fsdp, tensor) | expert | tensor\nrules params:\n  "w" -> (heads, mlp)\n'
    err = error_of(text, {"w": S(8, 8)}, {"fsdp": 2, "tensor": 2})
    assert isinstance(err, sr.PlanError) and err.code == "SR119"
    assert err.diagnostics[0].message == (
        "no alternative of alias `mlp` (defined at m.shard:2:1) applies to dimension 1 of `w` (shape (8, 8)): "
        "`(fsdp, tensor)`: axis `tensor` is used by dimension 0; `expert`: axis `expert` is not in the mesh; "
        "`tensor`: axis `tensor` is used by dimension 0 (the mesh has fsdp=2, tensor=2)"
    )
    assert err.span is not None and (err.span.line, err.span.col, err.span.end_col) == (4, 18, 21)
    assert "`| _`" in err.hint
    assert '4 |   "w" -> (heads, mlp)\n    |                  ^^^' in str(err)


def test_sr119_when_an_earlier_settled_alias_took_the_axis():
    text = 'alias a = fsdp | _\nalias b = fsdp\nalias c = fsdp | tensor\nrules params:\n  "w" -> (c, a, b)\n'
    err = error_of(text, {"w": S(8, 8, 8)}, {"fsdp": 2})
    # b is fixed (fsdp, dimension 2): a takes `_`, c has neither fsdp nor tensor
    assert err.code == "SR119" and "alias `c`" in err.diagnostics[0].message
    assert (
        "axis `fsdp` is used by dimension 2; `tensor`: axis `tensor` is not in the mesh"
        in err.diagnostics[0].message
    )


def test_sr119_for_many_leaves_is_one_finding():
    text = "alias heads = tensor\nalias mlp = tensor | fsdp\nrules params:\n  default -> (heads, mlp)\n"
    rules = sr.loads(text)
    tree = {f"w{i}": S(8, 8) for i in range(3)}
    found = sr.check(tree, rules, {"tensor": 2})
    (d,) = [d for d in found if d.code == "SR119"]
    assert d.count == 3


def test_without_sizes_the_mesh_line_says_which_axes_exist():
    text = "mesh fsdp, tensor\n" + RULES
    assert sr.plan({"w": S(8, 8)}, sr.loads(text)).leaves[0].spec == P("fsdp", "tensor")


def test_without_any_mesh_every_name_exists():
    assert sr.plan({"w": S(8, 8)}, sr.loads(RULES)).leaves[0].spec == P(("fsdp", "expert"), "tensor")
    # `?` needs sizes, whatever the choice
    plan = sr.plan({"w": S(8, 8)}, sr.loads(ALIASES + "rules params:\n  default -> (embed?, _)\n"))
    assert [d.code for d in plan.errors] == ["SR108"]


def test_with_ellipsis_dimensions_are_counted_in_the_leaf():
    text = "alias heads = tensor\nalias mlp = tensor | _\nrules params:\n  default -> (..., mlp, heads)\n"
    assert spec_of(text, (4, 8, 8), SIZES) == P(None, None, "tensor")
    err = error_of(text.replace("| _", "| expert"), {"w": S(4, 8, 8)}, {"tensor": 2})
    assert (
        "dimension 1 of `w`" in err.diagnostics[0].message
        and "used by dimension 2" in err.diagnostics[0].message
    )


def test_entries_without_a_choice_are_left_as_they_are():
    text = "alias e = fsdp | _\nrules activations:\n  default -> (e, unconstrained, _)\n"
    assert spec_of(text, (8, 8, 8), SIZES, group="activations") == P("fsdp", P.UNCONSTRAINED, None)


def test_activation_constraints_take_the_choice_too(mesh222):
    text = (
        "mesh data, fsdp, model\nalias heads = model\nalias batch = (data, expert) | (data, model) | data\n"
        'rules activations:\n  "up$" -> (batch, heads)\n'
    )
    rules = sr.loads(text)

    def f(x):
        with jax.named_scope("up"):
            return x * 2

    lowered = jax.jit(sr.auto_constrain(f, rules, mesh222)).lower(jnp.ones((8, 8))).as_text()
    assert re.findall(r"sdy\.sharding_constraint %\S+ <@\w+, (\[.*?\])>", lowered) == [
        '[{"data"}, {"model"}]'
    ]


# ------------------------------------------------------------------ logical specs (Flax)


def test_logical_names_read_aliases_with_alternatives():
    text = ALIASES + "rules params:\n  default -> logical\n"
    tree = {
        "a": nn.LogicallyPartitioned(S(8, 8), ("embed", "mlp")),
        "b": nn.LogicallyPartitioned(S(8, 8), ("mlp", "heads")),
        "c": nn.LogicallyPartitioned(S(8, 8, 8), ("heads", "embed", "vocab")),
    }
    plan = sr.plan(tree, sr.loads(text), SIZES)
    assert [leaf.spec for leaf in plan.leaves] == [
        P(("fsdp", "expert"), "tensor"),
        P(None, "tensor"),
        P("tensor", ("fsdp", "expert"), None),
    ]
    assert [d.code for d in plan.diagnostics] == ["SR206"]  # vocab


def test_sr119_from_a_logical_spec_points_at_logical():
    text = "alias heads = tensor\nalias mlp = tensor | fsdp\nrules params:\n  default -> logical\n"
    tree = {"k": nn.LogicallyPartitioned(S(8, 8), ("heads", "mlp"))}
    plan = sr.plan(tree, sr.loads(text, name="m.shard"), {"tensor": 2})
    (d,) = plan.errors
    assert d.code == "SR119" and d.path == "k" and d.span is not None and (d.span.line, d.span.col) == (4, 14)


# ------------------------------------------------------------------ SR209 (lint)


def lint(tmp_path, text, sizes, tree=None):
    path = tmp_path / "m.shard"
    path.write_text(text)
    result = _lint.lint_file(str(path), tree, sizes)
    return [d for d in result.diagnostics if d.code == "SR209"], result


def test_sr209_an_axis_the_mesh_line_lacks_with_did_you_mean(tmp_path):
    found, result = lint(tmp_path, "mesh fsdp, tensor\nalias e = (fsdp, tensr) | fsdp | _\n", None)
    (d,) = found
    assert d.severity == "warning" and d.span is not None and (d.span.line, d.span.col) == (2, 18)
    assert (
        "`(fsdp, tensr)` of alias `e` never applies: axis `tensr` is not in the `mesh` line (fsdp, tensor)"
        in (d.message)
    )
    assert d.hint == "did you mean `tensor`?"
    assert result.errors == 0


def test_sr209_uses_the_mesh_given_and_follows_aliases(tmp_path):
    found, _ = lint(tmp_path, "alias x = expert\nalias e = (fsdp, x) | fsdp | _\n", {"fsdp": 4})
    (d,) = found
    assert "axis `expert` (through alias `x`) is not in the mesh (fsdp=4)" in d.message
    assert d.span is not None and (d.span.line, d.span.col) == (2, 18)
    found, _ = lint(tmp_path, "alias x = expert\nalias e = (fsdp, x) | fsdp | _\n", {"fsdp": 4, "expert": 2})
    assert found == []


def test_sr209_an_alternative_pre_empted_by_an_earlier_subset(tmp_path):
    text = "alias e = fsdp | (tensor, fsdp) | tensor | _ | expert\n"
    found, _ = lint(tmp_path, text, None)
    assert [(d.span.col, d.message.split(": ", 1)[1]) for d in found if d.span] == [
        (18, "wherever it could apply, the earlier alternative `fsdp` applies too and is taken"),
        (48, "`_` before it always applies"),
    ]
    assert found[0].hint == "delete it, or move it before `fsdp` if it should be tried first"


def test_no_sr209_for_alternatives_that_can_apply(tmp_path):
    found, result = lint(tmp_path, "mesh fsdp, tensor, expert\n" + RULES, None)
    assert found == [] and result.errors == 0


def test_lint_of_a_file_with_a_broken_alias_still_checks_the_others(tmp_path):
    text = 'mesh fsdp, model\nalias a = fsdp | _\nalias b = a | model\nrules params:\n  "w" -> (b)\n  "v" -> (a)\n'
    _, result = lint(tmp_path, text, {"fsdp": 2, "model": 1}, {"w": S(8), "v": S(8)})
    assert [d.code for d in result.diagnostics] == ["SR010", "SR302"]
    assert result.plan is not None and [leaf.spec for leaf in result.plan.leaves] == [P("fsdp"), None]


def test_plan_and_check_report_sr209_too():
    rules = sr.loads(
        "mesh fsdp, tensor\nalias e = (fsdp, expert) | fsdp | _\nrules params:\n  default -> (e)\n"
    )
    plan = sr.plan({"w": S(8)}, rules, {"fsdp": 2, "tensor": 2})
    assert plan.ok and [d.code for d in plan.diagnostics] == ["SR205", "SR209"]  # SR205: `tensor`
    assert "SR209" in [d.code for d in sr.check({"w": S(8)}, rules, {"fsdp": 2, "tensor": 2})]


def test_axes_used_only_in_alternatives_are_not_unused(tmp_path):
    path = tmp_path / "m.shard"
    path.write_text("mesh fsdp, tensor\nalias e = (fsdp, tensor) | _\nrules params:\n  default -> (e)\n")
    result = _lint.lint_file(str(path), None, {"fsdp": 2, "tensor": 2})
    assert [d.code for d in result.diagnostics] == []


# ------------------------------------------------------------------ against Flax

LOGICAL = ("batch", "length", "embed", "heads", "kv", "mlp", "vocab", "exp")
MESH_AXES = ("a", "b", "c", "d", "e")


@st.composite
def rule_lists(draw):
    """Flax `logical_axis_rules`, each name's rules consecutive: `[(name, axes), ...]`."""
    names = draw(st.lists(st.sampled_from(LOGICAL), unique=True, max_size=6))
    rules = []
    for name in names:
        for _ in range(draw(st.integers(1, 3))):
            axes = draw(
                st.one_of(
                    st.none(),
                    st.sampled_from(MESH_AXES),
                    st.lists(st.sampled_from(MESH_AXES), unique=True, min_size=1, max_size=3).map(tuple),
                )
            )
            rules.append((name, axes))
    return rules


def as_shard(rules, mesh_line):
    """The rules as aliases with alternatives, `| _` at the end of each."""
    alternatives: dict[str, list[str]] = {}
    for name, axes in rules:
        text = "_" if axes is None else axes if isinstance(axes, str) else "(" + ", ".join(axes) + ")"
        alternatives.setdefault(name, []).append(text)
    lines = [f"mesh {', '.join(MESH_AXES)}"] if mesh_line else []
    lines += [f"alias {name} = {' | '.join(alts)} | _" for name, alts in alternatives.items()]
    return "\n".join([*lines, "rules params:", "  default -> logical", ""])


def normal(entry):
    """A spec entry with one-axis tuples as the axis and empty ones as `None`."""
    if isinstance(entry, tuple):
        return None if not entry else entry[0] if len(entry) == 1 else entry
    return entry


@given(
    rules=rule_lists(),
    names=st.lists(st.sampled_from(LOGICAL), unique=True, min_size=1, max_size=4),
    sizes=st.lists(st.sampled_from([1, 2]), min_size=len(MESH_AXES), max_size=len(MESH_AXES)),
    mesh_line=st.booleans(),
)
def test_logical_specs_match_flax_logical_to_mesh_axes(rules, names, sizes, mesh_line):
    text = as_shard(rules, mesh_line)
    note(text)
    mesh = dict(zip(MESH_AXES, sizes, strict=True))
    dim = 1
    for size in sizes:
        dim *= size
    tree = {"w": nn.LogicallyPartitioned(S(*([dim * 2] * len(names))), tuple(names))}
    plan = sr.plan(tree, sr.loads(text), mesh)
    assert plan.ok, [d.render() for d in plan.errors]
    expected = nn.logical_to_mesh_axes(tuple(names), rules)
    assert tuple(normal(e) for e in plan.leaves[0].spec) == tuple(normal(e) for e in expected)


def test_apply_warns_about_a_misspelt_axis_in_an_alternative_but_not_an_absent_one() -> None:
    """`fsdpp` on a mesh with `fsdp` is a typo that would silently replicate:
    `apply` warns (SR209); `context`, absent from this mesh, is a file written
    for several meshes: no warning."""
    mesh = jax.make_mesh((4, 2), ("fsdp", "model"))
    typo = sr.loads('alias embed = (fsdp, model) | fsdpp | _\nrules params:\n  "w" -> (embed, _)\n')
    tree = {"w": jnp.ones((8, 4)), "v": jnp.ones((8, 4))}
    with pytest.warns(sr.ShardRulesWarning, match="did you mean `fsdp`") as caught:
        placed = sr.apply({"w": jnp.ones((8, 4))}, typo, mesh)
    assert placed["w"].sharding.spec == P(("fsdp", "model"), None)
    assert [w.message.code for w in caught if isinstance(w.message, sr.ShardRulesWarning)] == ["SR209"]
    absent = sr.loads(
        'alias embed = (context, fsdp) | fsdp | _\nrules params:\n  "w" -> (embed, _)\n  "v" -> (_, model)\n'
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", sr.ShardRulesWarning)
        placed = sr.apply(tree, absent, mesh)
    assert placed["w"].sharding.spec == P("fsdp", None)
