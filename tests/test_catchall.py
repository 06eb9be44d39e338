"""SR125: a catch-all (`default`, or a pattern that matches any path) takes
leaves an earlier rule of its file was evidently written for. An error in
`plan`, `check`, `specs`, `apply` and `shardrules lint`; a rule that matches
nothing with no such leaf stays the SR201 warning."""

from __future__ import annotations

import json
import re
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import shardrules as sr
from shardrules._cli._main import main
from shardrules._planning import _catchall, _meant
from shardrules._planning._segments import catch_all

SIZES = {"fsdp": 4, "model": 2}


def S(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def layers(prefix: str = "", n: int = 2, name: str = "layers/{i}") -> dict[str, jax.ShapeDtypeStruct]:
    out = {}
    for i in range(n):
        at = f"{prefix}{name.format(i=i)}"
        out[f"{at}/attn/q_proj/kernel"] = S(64, 64)
        out[f"{at}/mlp/up/kernel"] = S(64, 128)
    return out


def adam_tree(**kw) -> dict[str, jax.ShapeDtypeStruct]:
    """Parameters with their optimizer copies, as a flat dict of paths."""
    return {**layers(**kw), **layers("opt_state/0/mu/", **kw), **layers("opt_state/0/nu/", **kw)}


ANCHORED = (
    "mesh fsdp, model\n"
    "rules params:\n"
    '  "^layers/\\d+/attn/q_proj/kernel$" -> (fsdp, model)\n'
    '  "^layers/\\d+/mlp/up/kernel$"      -> (fsdp, model)\n'
    "  default -> auto(fsdp)\n"
)


def findings(text: str, tree, name: str = "m.shard") -> list[sr.Diagnostic]:
    return sr.check(tree, sr.loads(text, name=name), SIZES)


def coded(found, code):
    return [d for d in found if d.code == code]


# ------------------------------------------------------------------ the anchor


def test_an_anchored_rule_that_misses_the_optimizer_copies_is_an_error_pointing_at_its_caret():
    found = findings(ANCHORED, adam_tree())
    errors = coded(found, "SR125")
    assert [(d.span.line, d.span.col, d.span.end_col) for d in errors] == [(3, 4, 5), (4, 4, 5)]
    q = errors[0]
    assert q.severity == "error"
    assert q.path == "opt_state/0/mu/layers/0/attn/q_proj/kernel"
    assert "`default` (m.shard:5:3)" in q.message and "(shape (64, 64), float32)" in q.message
    assert "`^layers/\\d+/attn/q_proj/kernel$`" in q.message and "`^`" in q.message
    # one finding for every copy the default takes: mu and nu of both layers
    assert sorted(p for p, _ in q.paths) == sorted(
        f"opt_state/0/{m}/layers/{i}/attn/q_proj/kernel" for m in ("mu", "nu") for i in range(2)
    )
    assert "drop the anchor: `layers/\\d+/attn/q_proj/kernel$`" in q.hint
    assert '`"^opt_state/" -> auto(fsdp)`' in q.hint
    # the rules take the parameters themselves: no SR201, nothing else
    assert [d.code for d in found] == ["SR125", "SR125"]


def test_the_rendered_finding_shows_the_caret_under_the_anchor():
    rules = sr.loads(ANCHORED, name="m.shard")
    with pytest.raises(sr.PlanError) as info:
        sr.specs(adam_tree(), rules, SIZES)
    assert info.value.code == "SR125"
    text = str(info.value)
    assert '  3 |   "^layers/\\d+/attn/q_proj/kernel$" -> (fsdp, model)\n    |    ^\n' in text
    assert "(and 3 more leaves like it:" in text


def test_plan_reports_it_as_an_error():
    p = sr.plan(adam_tree(), sr.loads(ANCHORED), SIZES)
    assert not p.ok
    assert {d.code for d in p.errors} == {"SR125"}


def test_dropping_the_anchor_as_the_hint_says_clears_it():
    fixed = ANCHORED.replace('"^layers', '"layers')
    tree = adam_tree()
    assert findings(fixed, tree) == []
    specs = sr.specs(tree, sr.loads(fixed), SIZES)
    assert specs["opt_state/0/mu/layers/1/attn/q_proj/kernel"] == jax.sharding.PartitionSpec("fsdp", "model")


def test_a_rule_of_their_own_above_the_default_says_the_default_is_meant():
    text = ANCHORED.replace("  default", '  "^opt_state/" -> auto(fsdp)\n  default')
    assert findings(text, adam_tree()) == []


def test_apply_raises_it_and_moves_nothing():
    mesh = jax.make_mesh((4, 2), ("fsdp", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    tree = {path: np.ones(s.shape, np.float32) for path, s in adam_tree().items()}
    with pytest.raises(sr.PlanError) as info:
        sr.apply(tree, sr.loads(ANCHORED), mesh)
    assert info.value.code == "SR125"
    assert all(type(leaf) is np.ndarray for leaf in tree.values())  # nothing placed, nothing replaced
    placed = {path: jnp.ones(s.shape) for path, s in adam_tree().items()}
    before = {path: leaf.sharding for path, leaf in placed.items()}
    with pytest.raises(sr.PlanError):
        sr.apply(placed, sr.loads(ANCHORED), mesh)
    assert {path: leaf.sharding for path, leaf in placed.items()} == before
    assert all(not leaf.is_deleted() for leaf in placed.values())


def test_lint_exits_1_and_json_carries_the_code(tmp_path: Path, capsys):
    (tmp_path / "m.shard").write_text(ANCHORED)
    (tmp_path / "shapes.json").write_text(
        json.dumps({p: [list(s.shape), "float32"] for p, s in adam_tree().items()})
    )
    argv = [str(tmp_path / "m.shard"), "--shapes", str(tmp_path / "shapes.json"), "--mesh", "fsdp=4,model=2"]
    assert main(["lint", *argv]) == 1
    out = capsys.readouterr().out
    assert "m.shard:3:4: SR125" in out and "Found 2 errors and 0 warnings." in out
    assert main(["lint", *argv, "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    text = json.dumps(report)
    assert '"SR125"' in text and '"error"' in text


def train_state(wrap=lambda p: p):
    """A train state as Flax's `TrainState` holds one: the parameters without
    their `params` collection, the optimizer's moments of them (no `params`)."""
    params = {f"Dense_{i}": {"kernel": S(64, 64), "bias": S(64)} for i in range(2)}
    moments = {m: wrap(params) for m in ("mu", "nu")}
    return {
        "step": S(dtype=jnp.int32),
        "params": params,
        "opt_state": {"0": {"count": S(dtype=jnp.int32), **moments}},
    }


TRAIN = 'rules params:\n  "^params/Dense_\\d+/kernel$" -> (fsdp, model)\n  default -> replicated\n'


def test_copies_in_a_copy_of_the_rules_container_are_an_error():
    (d,) = coded(found := findings(TRAIN, train_state()), "SR125")
    assert codes_of(found) == ["SR125"]
    assert d.path == "opt_state/0/mu/Dense_0/kernel" and d.count == 4
    assert "a copy of `params/Dense_0/kernel`, which the rule takes, under `opt_state/0/mu`" in d.message
    assert (d.span.line, d.span.col, d.span.end_col) == (2, 4, 12)  # under `^params/`
    assert "did you mean `Dense_\\d+/kernel$` (without `^params/`)?" in d.hint
    # the fix the hint offers takes the copies; a rule of their own says the default is meant
    assert findings(TRAIN.replace("^params/", ""), train_state()) == []
    assert (
        findings(TRAIN.replace("  default", '  "^opt_state/" -> replicated\n  default'), train_state()) == []
    )
    # moments of some parameters only (`optax.masked`) are copies too
    part = train_state(lambda p: {"Dense_0": p["Dense_0"]})
    assert [d.paths for d in coded(findings(TRAIN, part), "SR125")] == [
        (("opt_state/0/mu/Dense_0/kernel", (64, 64)), ("opt_state/0/nu/Dense_0/kernel", (64, 64)))
    ]


def test_a_container_that_is_no_copy_of_the_rules_is_not_an_error():
    # another shape, another set of arrays, a sibling (an anchor to one tower means that one)
    assert findings(TRAIN, train_state(lambda p: {k: {**v, "scale": S(64)} for k, v in p.items()})) == []
    assert findings(TRAIN, train_state(lambda p: {k: {"kernel": S(8, 8)} for k in p})) == []
    towers = {t: {f"Dense_{i}": {"kernel": S(64, 64)} for i in range(2)} for t in ("tower_a", "tower_b")}
    text = 'rules params:\n  "^tower_a/Dense_\\d+/kernel$" -> (fsdp, model)\n  default -> replicated\n'
    assert findings(text, towers) == []


# ------------------------------------------------------------------ names


LINEN = (
    "mesh fsdp, model\n"
    "rules params:\n"
    '  "layers/\\d+/attn/q_proj/kernel$" -> (fsdp, model)\n'
    '  "mlp/up/kernel$"                  -> (fsdp, model)\n'
    "  default -> replicated\n"
)


def test_a_rule_that_matches_nothing_whose_last_names_the_default_takes_is_an_error():
    tree = layers(name="layers_{i}")  # Linen's names: `layers_0`, not `layers/0`
    (d,) = coded(found := findings(LINEN, tree), "SR125")
    assert not coded(found, "SR201")  # one finding for the cause: the error
    assert d.path == "layers_0/attn/q_proj/kernel" and d.count == 2
    assert "matches no leaf of this tree" in d.message
    assert (
        "`attn/q_proj/kernel`" in d.message
        and "`layers/\\d+` does not match the path's `layers_0`" in d.message
    )
    assert (d.span.line, d.span.col, d.span.end_col) == (3, 4, 14)  # under `layers/\d+`
    assert "did you mean `layers_\\d+/attn/q_proj/kernel$`?" in d.hint
    fixed = LINEN.replace("layers/\\d+/", "layers_\\d+/")
    assert findings(fixed, tree) == []


def test_a_pattern_with_a_prefix_the_tree_lacks():
    text = 'rules params:\n  "^model/layers/\\d+/mlp/up/kernel$" -> (fsdp, model)\n  default -> replicated\n'
    (d,) = coded(findings(text, layers()), "SR125")
    assert "the path has nothing before them for its `model`" in d.message
    assert "did you mean `layers/\\d+/mlp/up/kernel$` (without the anchor `^`)?" in d.hint


def test_a_catch_all_pattern_is_a_catch_all_too():
    for catch in ('""', '"."', '".*"', '"^"', '"$"', '".+"'):
        text = f'rules params:\n  "^layers/\\d+/mlp/up/kernel$" -> (fsdp, model)\n  {catch} -> replicated\n'
        (d,) = coded(findings(text, adam_tree()), "SR125")
        assert f"the catch-all rule `{catch[1:-1]}` (m.shard:3:3)" in d.message
        assert "just above it" in d.hint


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (None, True),
        ("", True),
        (".", True),
        (".*", True),
        ("^", True),
        ("[^/]", True),
        ("kernel", False),
        ("\\w", False),
        ("^$", False),
        ("x|y", False),
        ("layers/\\d+", False),
    ],
)
def test_which_patterns_are_catch_alls(pattern, expected):
    assert catch_all(pattern) is expected


# ------------------------------------------------------------------ what stays a warning


def test_a_rule_for_another_model_stays_a_warning():
    # `encoder/...` matches nothing of a decoder-only tree; the decoder's attention
    # falls to default with the same last names, but the rule names `encoder`.
    text = (
        "rules params:\n"
        '  "encoder/layers/\\d+/attn/q_proj/kernel$" -> (fsdp, model)\n'
        "  default -> replicated\n"
    )
    tree = layers("decoder/")
    assert codes_of(findings(text, tree)) == ["SR201"]


def test_a_rule_naming_other_models_in_a_group_stays_a_warning():
    # `(encoder|vision)` names what the path lacks as plainly as `encoder` does
    tree = layers("decoder/")
    for written in ("(encoder|vision)", "(?:encoder|vision)", "(enc|vision_)oder"):
        text = f'rules params:\n  "{written}/layers/\\d+/mlp/up/kernel$" -> (fsdp, model)\n  default -> replicated\n'
        assert codes_of(findings(text, tree)) == ["SR201"], written
    # a group one of whose texts the path has, or that writes no name, asks for nothing more
    for written, prefix in (("(encoder|decoder)", "decoder_0/"), ("(a|b)", "c/")):
        text = f'rules params:\n  "{written}/layers/\\d+/mlp/up/kernel$" -> (fsdp, model)\n  default -> replicated\n'
        assert codes_of(findings(text, layers(prefix))) == ["SR125"], written


def test_an_anchor_meant_for_the_top_level_leaf_is_not_an_error():
    # `^w$` takes the top-level `w`; `block/w`, of another shape, is no copy of it
    text = 'rules params:\n  "^w$" -> (fsdp, model)\n  default -> replicated\n'
    assert findings(text, {"w": S(64, 8), "block/w": S(8, 8)}) == []
    # a copy of `w` (same path below, same shape) is what the anchor misses
    (d,) = coded(findings(text, {"w": S(64, 8), "opt/mu/w": S(64, 8)}), "SR125")
    assert d.path == "opt/mu/w" and "drop the anchor: `w$`" in d.hint
    # and where the rule takes nothing, its anchor is what keeps it from the leaf
    (d,) = coded(findings(text, {"block/w": S(8, 8)}), "SR125")
    assert d.path == "block/w"


def test_a_pattern_that_tells_digits_apart_is_looked_at_path_by_path():
    # `[0-1]` matches layers 0 and 1: the copies of those, not of 2, are what `^` misses
    text = 'rules params:\n  "^layers/[0-1]/mlp/up/kernel$" -> (fsdp, model)\n  default -> replicated\n'
    (d,) = coded(findings(text, adam_tree(n=3)), "SR125")
    assert sorted(p for p, _ in d.paths) == sorted(
        f"opt_state/0/{m}/layers/{i}/mlp/up/kernel" for m in ("mu", "nu") for i in range(2)
    )
    # a rule for another model's numbered layers matches no leaf; the path has its names
    dead = 'rules params:\n  "enc/[0-3]/attn/kernel$" -> (fsdp, model)\n  default -> replicated\n'
    (d,) = coded(findings(dead, {"enc/5/attn/kernel": S(64, 64)}), "SR125")
    assert "`enc/[0-3]` does not match the path's `enc/5`" in d.message
    assert "did you mean `enc/\\d+/attn/kernel$`?" in d.hint


def test_a_rule_meant_for_some_layers_only_is_not_an_error():
    text = 'rules params:\n  "^layers/[0-1]/mlp/up/kernel$" -> (fsdp, model)\n  default -> replicated\n'
    tree = layers(n=4)  # layers 2 and 3 go to the default, as written
    assert findings(text, tree) == []


def test_one_last_name_alone_is_not_evidence():
    text = 'rules params:\n  "blocks/\\d+/kernel$" -> (fsdp, model)\n  default -> replicated\n'
    tree = {"dense/kernel": S(64, 64)}
    assert codes_of(findings(text, tree)) == ["SR201"]


def test_rules_of_another_file_and_after_the_catch_all_are_not_considered(tmp_path: Path):
    (tmp_path / "common.shard").write_text(
        'rules params:\n  "^layers/\\d+/mlp/up/kernel$" -> (fsdp, model)\n'
    )
    (tmp_path / "m.shard").write_text(
        'mesh fsdp, model\ninclude "common.shard"\nrules params:\n  default -> replicated\n'
    )
    rules = sr.load(tmp_path / "m.shard")
    assert not coded(sr.check(adam_tree(), rules, SIZES), "SR125")
    after = 'rules params:\n  "." -> replicated\n  "^layers/\\d+/mlp/up/kernel$" -> (fsdp, model)\n'
    assert codes_of(findings(after, adam_tree())) == ["SR202"]


def test_a_guard_that_refuses_the_leaf_says_it_was_not_meant():
    text = (
        'rules params:\n  "^layers/\\d+/mlp/up/kernel$" -> (fsdp, model) if dtype == bfloat16\n'
        "  default -> replicated\n"
    )
    tree = {
        "layers/0/mlp/up/kernel": S(64, 128, dtype=jnp.bfloat16),
        "opt/layers/0/mlp/up/kernel": S(64, 128),
    }
    assert findings(text, tree) == []
    tree["opt/layers/0/mlp/up/kernel"] = S(64, 128, dtype=jnp.bfloat16)
    assert codes_of(findings(text, tree)) == ["SR125"]


def codes_of(found) -> list[str]:
    return [d.code for d in found]


# ------------------------------------------------------------------ campaign

NAMES = ["layers", "blocks", "attn", "mlp", "q_proj", "up", "kernel", "bias", "scale", "norm"]
segment = st.sampled_from(NAMES) | st.integers(0, 3).map(str)


@st.composite
def cases(draw):
    """A tree of parameter paths with optimizer copies, rules written for some
    parameter paths (numbers as `\\d+`, some anchored at `^`), and a default."""
    params = draw(st.lists(st.lists(segment, min_size=1, max_size=4).map("/".join), min_size=1, max_size=6))
    params = sorted(set(params))
    paths = [*params, *(f"opt_state/{m}/{p}" for p in params for m in ("mu", "nu") if draw(st.booleans()))]
    if any(a != b and b.startswith(a + "/") for a in paths for b in paths):
        paths = [p for p in paths if not any(q.startswith(p + "/") for q in paths)]
    written = draw(st.lists(st.sampled_from(params), min_size=1, max_size=3, unique=True))
    patterns = []
    number = st.sampled_from(["\\d+", "\\d+", "[0-1]", "NUMBER"])  # some tell digits apart
    for p in written:
        body = "/".join(
            (lambda n: s if n == "NUMBER" else n)(draw(number)) if s.isdigit() else s for s in p.split("/")
        )
        patterns.append(("^" if draw(st.booleans()) else "") + body + ("$" if draw(st.booleans()) else ""))
    if draw(st.booleans()):  # the tree names its layers as Linen does (`layers_0`), the rules do not
        paths = sorted({re.sub(r"([a-z_]+)/(\d+)(?=/|$)", r"\1_\2", p) for p in paths})
    return paths, list(dict.fromkeys(patterns))


def _fixes(d: sr.Diagnostic) -> str | None:
    found = re.match(r"(?:drop the anchor: |did you mean )`([^`]*)`", d.hint)
    return None if found is None else found.group(1)


@given(cases())
def test_every_anchor_miss_is_reported_and_every_fix_offered_works(case):
    paths, patterns = case
    tree = {p: S(8, 8) for p in paths}
    text = (
        "rules params:\n" + "".join(f'  "{p}" -> (fsdp, _)\n' for p in patterns) + "  default -> replicated\n"
    )
    rules = sr.loads(text, name="m.shard")
    p = sr.plan(tree, rules, SIZES)
    by_default = {leaf.path for leaf in p.leaves if leaf.why == "default"}
    errors = coded(p.diagnostics, "SR125")
    reported = {path for d in errors for path, _ in d.paths}
    assert reported <= by_default  # only the catch-all's leaves
    taken = {leaf.rule.pattern for leaf in p.leaves if leaf.rule is not None}
    for d in errors:  # by names only for a rule that matches no leaf
        copy = "the leaf is a copy of" in d.message and "(without `^" in d.hint
        assert "drop the anchor" in d.hint or copy or patterns[d.span.line - 2] not in taken, d.render()
    # The oracle: a default leaf one of whose segment-aligned suffixes an anchored
    # pattern matches whole is a leaf that pattern was written for, where the
    # pattern matches no leaf, or takes that suffix as a leaf of its own (a copy).
    rule_of = {leaf.path: leaf.rule.pattern for leaf in p.leaves if leaf.rule is not None}
    for path in by_default:
        segments = path.split("/")
        missed = any(
            pat.startswith("^")
            and any(
                re.search(pat, suffix, re.ASCII)
                and (pat not in rule_of.values() or rule_of.get(suffix) == pat)
                for suffix in ("/".join(segments[i:]) for i in range(1, len(segments)))
            )
            for pat in patterns
        )
        assert (path in reported) or not missed, (path, patterns, [d.render() for d in errors])
    # Looking at leaves once per path key gives what looking at each path gives.
    with mock.patch.object(_catchall, "path_keys", lambda paths: [path.encode() for path in paths]):
        each = coded(sr.plan(tree, sr.loads(text, name="m.shard"), SIZES).diagnostics, "SR125")
    assert [(d.span, d.paths, d.hint) for d in each] == [(d.span, d.paths, d.hint) for d in errors]
    # Each fix offered, put in place of its rule's pattern, takes the leaf from the default.
    for d in errors:
        fix = _fixes(d)
        assert fix is not None, d.hint
        line = d.span.line - 2
        edited = list(patterns)
        edited[line] = fix
        new = (
            "rules params:\n"
            + "".join(f'  "{q}" -> (fsdp, _)\n' for q in edited)
            + "  default -> replicated\n"
        )
        again = sr.plan(tree, sr.loads(new), SIZES)
        assert again[d.path].why == "rule", (d.render(), new)


# ------------------------------------------------------------------ cost


def test_leaves_are_looked_at_one_by_one_only_for_the_patterns_that_tell_digits_apart():
    # Many default leaves with one key; a pattern written with a digit (`wi_0`) may hit
    # some of them, so each is looked at, but only against that pattern: the forty
    # others treat digits alike (looked at once for the key), or name what the tree
    # lacks (not looked at).
    tree = {f"dec/layers/{i}/mlp/wi_1/kernel": S(8, 8) for i in range(300)}
    text = (
        "rules params:\n"
        + "".join(f'  "^enc{j}/layers/\\d+/mlp/wi_1/kernel$" -> (fsdp, _)\n' for j in range(20))
        + "".join(f'  "^tower/layers/[a-z]+/mlp{j}x/kernel$" -> (fsdp, _)\n' for j in range(20))
        + '  "^mlp/wi_0/kernel" -> (fsdp, _)\n'
        + "  default -> replicated\n"
    )
    calls = []
    real = _meant.Leaves._line_ups
    counted = lambda self, alt, segments: calls.append(1) or real(self, alt, segments)  # noqa: E731
    with mock.patch.object(_meant.Leaves, "_line_ups", counted):
        found = findings(text, tree)
    assert codes_of(found).count("SR201") == 41 and not coded(found, "SR125")
    assert calls  # the pattern with a digit is looked at
    assert len(calls) < 3 * len(tree)


@st.composite
def train_states(draw):
    """Parameters under `params/`, rules anchored at `^params/` for some of
    them, the optimizer's moments of all or some parameters without `params/`
    (as a train state holds them), and maybe a tower side by side with the
    parameters' own arrays."""
    names = st.lists(segment, min_size=1, max_size=3).map("/".join)
    params = sorted(set(draw(st.lists(names, min_size=2, max_size=6))))
    params = [p for p in params if not any(q.startswith(p + "/") for q in params)]
    shapes = {p: draw(st.sampled_from([(8, 8), (8,), (4, 8)])) for p in params}
    ruled = draw(st.lists(st.sampled_from(params), min_size=1, max_size=3, unique=True))
    kept = [p for p in params if draw(st.booleans())] if draw(st.booleans()) else params
    paths = {f"params/{p}": shapes[p] for p in params}
    paths |= {f"opt_state/0/{m}/{p}": shapes[p] for p in kept for m in ("mu", "nu")}
    if draw(st.booleans()):
        paths |= {f"tower/{p}": shapes[p] for p in params}
    general = lambda p: "/".join("\\d+" if s.isdigit() else s for s in p.split("/"))  # noqa: E731
    return paths, ruled, kept, list(dict.fromkeys(f"^params/{general(p)}$" for p in ruled))


@given(train_states())
def test_the_moments_a_params_anchor_misses_are_reported_and_nothing_else(case):
    paths, _, kept, patterns = case
    tree = {p: S(*s) for p, s in paths.items()}
    text = (
        "rules params:\n"
        + "".join(f'  "{p}" -> (fsdp, ...)\n' for p in patterns)
        + "  default -> replicated\n"
    )
    p = sr.plan(tree, sr.loads(text, name="m.shard"), SIZES)
    reported = {path for d in coded(p.diagnostics, "SR125") for path, _ in d.paths}
    taken = {leaf.path[len("params/") :] for leaf in p.leaves if leaf.why == "rule"}
    # the moments of a parameter a rule takes, where the moments hold two arrays or more
    expected = (
        {f"opt_state/0/{m}/{q}" for q in kept if q in taken for m in ("mu", "nu")} if len(kept) > 1 else set()
    )
    assert reported == expected, (sorted(paths), patterns, [d.render() for d in p.diagnostics])


# ------------------------------------------------------------------ SR201


def test_a_misspelled_name_stays_a_warning_whose_hint_spells_it():
    # `q_porj` names nothing the tree has: not SR125, but SR201 offers the spelling that matches
    text = 'rules params:\n  "q_porj/kernel$" -> (fsdp, model)\n  default -> replicated\n'
    tree = {"embed": S(64, 8), **adam_tree()}
    (d,) = findings(text, tree)
    assert d.code == "SR201"
    assert "did you mean `q_proj/kernel$`? It matches `layers/0/attn/q_proj/kernel`" in d.hint
    assert findings(text.replace("porj", "proj"), tree) == []
    # an escape's letter is no name to respell, and a name far from every other is left alone
    far = 'rules params:\n  "\\dxyzzy/kernel$" -> (fsdp, model)\n  default -> replicated\n'
    (d,) = findings(far, tree)
    assert "did you mean" not in d.hint and "paths look like `embed`" in d.hint


def test_a_pattern_whose_names_a_path_lacks_is_not_lined_up_with_it():
    # leaves with many keys (names without digits); rules without `$` whose last name
    # lines up with the path's last segment only, and whose other names the paths lack
    words = ["".join(w) for w in zip("abcdefghij" * 3, "klmnopqrst" * 3, "uvwxyzabcd" * 3, strict=True)]
    tree = {f"m/{a}{b}/wa/kernel": S(8, 8) for a in words[:10] for b in words[:20]}
    text = (
        "rules params:\n"
        + "".join(f'  "enc{j}/mlp/[a-z]+/kernel" -> (fsdp, _)\n' for j in range(20))
        + "  default -> replicated\n"
    )
    calls = []
    real = _meant.Leaves._line_ups
    counted = lambda self, alt, segments: calls.append(1) or real(self, alt, segments)  # noqa: E731
    with mock.patch.object(_meant.Leaves, "_line_ups", counted):
        found = findings(text, tree)
    assert codes_of(found).count("SR201") == 20 and not coded(found, "SR125")
    assert len(calls) < len(tree)
