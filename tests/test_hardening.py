"""Rule files are data: huge or deeply nested files and bad bytes are refused
quickly with a clear error (patterns: tests/test_patterns.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardrules as sr
from shardrules._language._files import MAX_FILE_BYTES
from shardrules._language._includes import MAX_INCLUDE_DEPTH


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
    # A form feed or U+2028 in a comment ends no line: it is refused where it stands,
    # the line shown is the line named, the caret under the character.
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads('# a\x0c comment\u2028 still the comment\nrules p:\n  "x" -> (\n')
    assert info.value.span is not None and (info.value.span.line, info.value.span.col) == (1, 4)
    assert "  1 | # a\ufffd comment\ufffd still the comment\n    |    ^\n" in str(info.value)
    # `\r\n` ends lines: the error on the third line is shown there
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads('# a comment\r\nrules p:\r\n  "x" -> (\r\n')
    assert info.value.span is not None and info.value.span.line == 3
    assert '  3 |   "x" -> (' in str(info.value)


@pytest.mark.parametrize(
    ("leaf", "error", "why"),
    [
        (np.array([["a", "b"]] * 4), sr.PlanError, "dtype <U1) has a dtype JAX cannot hold"),  # SR115
        (np.ones(4, object), sr.PlanError, "dtype object) has a dtype JAX cannot hold"),  # SR115
        (np.ma.masked_array(np.ones(4)), sr.PlacementError, "masked arrays"),  # SR107
    ],
)
def test_leaves_jax_cannot_hold_are_refused_before_anything_moves(mesh42, leaf, error, why):
    rules = sr.loads("rules params:\n  default -> replicated\n")
    good = jnp.ones((4, 4))
    with pytest.raises(error) as info:
        sr.apply({"bad": leaf, "good": good}, rules, mesh42)
    code = "SR115" if error is sr.PlanError else "SR107"
    assert info.value.code == code and why in str(info.value) and info.value.path == "bad"
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
