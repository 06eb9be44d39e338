"""Rule files are data: pathological patterns, huge or deeply nested files and
bad bytes are refused quickly with a clear error."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardrules as sr
from shardrules._language._files import MAX_FILE_BYTES
from shardrules._language._includes import MAX_INCLUDE_DEPTH

SAFE = [
    r"attn/(q|k|v)_proj/kernel$",
    r"layers_\d+/attn$",
    r"experts/\d+/(gate|up)_proj/kernel$",
    r"\d+/\d+/\d+/",
    r"[^/]+/[^/]+/[^/]+/kernel",
    r"^(x|y)$",
    r"tokens|targets",
    r"(norm|_norm)/scale$",
    r"model\.layers\.\d+\.mlp\.(gate|up)_proj\.weight",
    r".*attn.*",
    r"(?<=mlp/)up",
    r"(?:block_\d+/)?attn",
    r"(q|k|v)+",
    r"\w+\w+x",
]

UNSAFE = {
    r"(x+)+y": "a repeat inside a repeat",
    r"(\w+/)*kernel": "a repeat inside a repeat",
    r"(a|a)*b": "alternatives can start alike",
    r"(\d|x\d)+": "alternatives can start alike",
    r"(ab{2,3})+": "a repeat inside a repeat",
    r"(a)\1": "backreferences",
    r"(?P<n>a)(?P=n)": "backreferences",
    r".*a.*a.*b": "3 unbounded repeats",
    r"\S+\S+\S+": "3 unbounded repeats",
}


@pytest.mark.parametrize("pattern", SAFE)
def test_realistic_patterns_are_accepted(pattern):
    rules = sr.loads(f'rules params:\n  "{pattern}" -> replicated\n')
    assert rules.group("params")[0].pattern == pattern


@pytest.mark.parametrize(("pattern", "reason"), sorted(UNSAFE.items()))
def test_pathological_patterns_are_refused_with_a_located_error(pattern, reason):
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads(f'mesh x\nrules params:\n  "{pattern}" -> replicated\n', name="hostile.shard")
    err = info.value
    assert err.code == "SR017"
    assert reason in str(err)
    assert err.span is not None and (err.span.file, err.span.line, err.span.col) == ("hostile.shard", 3, 3)
    assert "docs/language.md#safe-patterns" in err.hint


def test_the_classic_redos_pattern_returns_within_a_second():
    path = "x" * 40
    start = time.perf_counter()
    with pytest.raises(sr.RuleSyntaxError):
        rules = sr.loads('rules params:\n  "(x+)+y" -> replicated\n')
        sr.plan({path: jax.ShapeDtypeStruct((4,), jnp.float32)}, rules, {})
    assert time.perf_counter() - start < 1.0


def test_accepted_patterns_stay_fast_on_long_adversarial_paths():
    """The worst accepted shapes, on a 300-character path built to make them backtrack."""
    body = "\n".join(f'  "{p}" -> replicated' for p in [r".*a.*b", r"\w+\w+x", r"[^/]+/[^/]+/z"])
    rules = sr.loads(f"rules params:\n{body}\n  default -> replicated\n")
    tree = {"a" * 300: jax.ShapeDtypeStruct((4,), jnp.float32)}
    start = time.perf_counter()
    plan = sr.plan(tree, rules, {})
    assert plan.ok
    assert time.perf_counter() - start < 1.0


def test_include_depth_is_bounded(tmp_path):
    depth = MAX_INCLUDE_DEPTH + 2
    for i in range(depth):
        (tmp_path / f"f{i}.shard").write_text(f'include "f{i + 1}.shard"\n')
    (tmp_path / f"f{depth}.shard").write_text("")
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.load(tmp_path / "f0.shard")
    assert info.value.code == "SR008"
    assert f"deeper than {MAX_INCLUDE_DEPTH}" in str(info.value)


def test_file_size_is_bounded(tmp_path):
    big = tmp_path / "big.shard"
    big.write_text("# padding\n" * (MAX_FILE_BYTES // 10 + 1))
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.load(big)
    assert info.value.code == "SR009"
    (tmp_path / "top.shard").write_text('include "big.shard"\n')
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.load(tmp_path / "top.shard")
    assert info.value.code == "SR009" and info.value.span is not None and info.value.span.line == 1
    with pytest.raises(sr.ShardRulesError):
        sr.loads("#" * (MAX_FILE_BYTES + 1))


def test_bytes_are_read_as_utf8():
    assert sr.loads(b'rules p:\n  "\xc3\xa9" -> replicated\n').group("p")[0].pattern == "é"
    with pytest.raises(sr.ShardRulesError) as info:
        sr.loads(b"rules p:\n\xff\n")
    assert "not UTF-8" in str(info.value)
    with pytest.raises(TypeError):
        sr.loads(42)  # type: ignore[arg-type]


HOSTILE_TEXTS = {
    "deeply nested groups": 'rules p:\n  "' + "(" * 1000 + "a" + ")" * 1000 + '" -> replicated\n',
    "huge repeat count": 'rules p:\n  "a{4294967295}" -> replicated\n',
    "huge mesh size": "mesh data=" + "9" * 5000 + "\n",
    "huge byte size": "rules p:\n  default -> auto(x, min_bytes=" + "9" * 5000 + ")\n",
    "NUL in include": 'include "a\x00b"\n',
    "empty include": 'include ""\n',
    "long alias chain": "".join(f"alias a{i} = a{i + 1}\n" for i in range(1200)) + "alias a1200 = x\n",
    "form feed then error": '# a\x0c comment\nrules p:\n  "x" -> (\n',
}


@pytest.mark.parametrize("name", sorted(HOSTILE_TEXTS))
def test_hostile_text_raises_only_our_errors(name):
    with pytest.raises(sr.ShardRulesError) as info:
        sr.loads(HOSTILE_TEXTS[name])
    rendered = str(info.value)
    assert len(rendered) < 2000  # long inputs are shortened in messages
    if info.value.span is not None:
        assert f"  {info.value.span.line} | " in rendered


def test_error_excerpts_count_lines_as_the_parser_does():
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads('# a\x0c comment\u2028 still the comment\nrules p:\n  "x" -> (\n')
    assert info.value.span is not None and info.value.span.line == 3
    assert '  3 |   "x" -> (' in str(info.value)


@pytest.mark.parametrize(
    ("leaf", "why"),
    [
        (np.array([["a", "b"]] * 4), "not a JAX dtype"),
        (np.ones(4, object), "not a JAX dtype"),
        (np.ma.masked_array(np.ones(4)), "masked arrays"),
    ],
)
def test_leaves_jax_cannot_hold_are_refused_before_anything_moves(mesh42, leaf, why):
    rules = sr.loads("rules params:\n  default -> replicated\n")
    good = jnp.ones((4, 4))
    with pytest.raises(sr.PlacementError) as info:
        sr.apply({"bad": leaf, "good": good}, rules, mesh42)
    assert info.value.code == "SR107" and why in str(info.value) and info.value.path == "bad"
    assert not good.is_deleted() and not good.committed


def test_group_must_be_a_name():
    rules = sr.loads("rules params:\n  default -> replicated\n")
    with pytest.raises(TypeError, match="group must be the name"):
        sr.specs({"w": np.ones(2)}, rules, {}, group=None)  # type: ignore[arg-type]


def test_mesh_sizes_may_be_numpy_integers():
    rules = sr.loads('rules params:\n  "w" -> (data)\n')
    assert sr.specs({"w": np.ones(8)}, rules, {"data": np.int64(4)})["w"] == jax.sharding.PartitionSpec(
        "data"
    )


def test_a_utf8_byte_order_mark_is_ignored(tmp_path):
    path = tmp_path / "bom.shard"
    path.write_bytes('\ufeffmesh x\nrules params:\n  "w" -> (x)\n'.encode())
    rules = sr.load(path)
    assert rules.mesh is not None and rules.mesh.names == ("x",)
    assert rules.group("params")[0].span.line == 3
