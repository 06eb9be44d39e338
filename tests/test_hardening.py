"""Rule files are data: pathological patterns, huge or deeply nested files and
bad bytes are refused quickly with a clear error."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import pytest

import shardrules as sr
from shardrules import _load

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
    depth = _load.MAX_INCLUDE_DEPTH + 2
    for i in range(depth):
        (tmp_path / f"f{i}.shard").write_text(f'include "f{i + 1}.shard"\n')
    (tmp_path / f"f{depth}.shard").write_text("")
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.load(tmp_path / "f0.shard")
    assert info.value.code == "SR008"
    assert f"deeper than {_load.MAX_INCLUDE_DEPTH}" in str(info.value)


def test_file_size_is_bounded(tmp_path):
    big = tmp_path / "big.shard"
    big.write_text("# padding\n" * (_load.MAX_FILE_BYTES // 10 + 1))
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.load(big)
    assert info.value.code == "SR009"
    (tmp_path / "top.shard").write_text('include "big.shard"\n')
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.load(tmp_path / "top.shard")
    assert info.value.code == "SR009" and info.value.span is not None and info.value.span.line == 1
    with pytest.raises(sr.ShardRulesError):
        sr.loads("#" * (_load.MAX_FILE_BYTES + 1))


def test_bytes_are_read_as_utf8():
    assert sr.loads(b'rules p:\n  "\xc3\xa9" -> replicated\n').group("p")[0].pattern == "é"
    with pytest.raises(sr.ShardRulesError) as info:
        sr.loads(b"rules p:\n\xff\n")
    assert "not UTF-8" in str(info.value)
    with pytest.raises(TypeError):
        sr.loads(42)  # type: ignore[arg-type]
