"""Positional specs checked against the logical names the tree carries
(SR214): a rule that splits a dimension over axes its name does not stand for
in the rule file is a warning naming both; one that agrees says nothing."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

import shardrules as sr
from shardrules._cli._main import main

nnx = pytest.importorskip("flax.nnx", reason="flax is not installed")
linen = pytest.importorskip("flax.linen", reason="flax is not installed")

HEADER = "mesh fsdp=4, tensor=2\nalias embed = fsdp\nalias heads = tensor\n"


def _param(shape, *names):
    return nnx.Param(jnp.zeros(shape), out_sharding=names, eager_sharding=False)


def maxtext_like():
    """MaxText's layer-stacked attention kernels: the layers on dimension 1."""
    return nnx.State(
        {
            "decoder": {
                "layers": {
                    "query": {"kernel": _param((64, 4, 8), "embed", "layers", "heads")},
                    "out": {"kernel": _param((8, 4, 64), "heads", "layers", "embed")},
                }
            }
        }
    )


def _sr214(rules_text: str, tree) -> list[sr.Diagnostic]:
    plan = sr.plan(tree, sr.loads(HEADER + rules_text, name="m.shard"), {"fsdp": 4, "tensor": 2})
    return [d for d in plan.diagnostics if d.code == "SR214"]


def test_a_spec_written_for_unstacked_kernels_splits_the_layer_dimension():
    found = _sr214(
        'rules params:\n  "query/kernel" -> (..., embed, heads)\n  default -> replicated\n', maxtext_like()
    )
    (d,) = found
    assert d.severity == "warning" and d.path == "decoder/layers/query/kernel"
    assert "splits dimension 1 of `decoder/layers/query/kernel` (shape (64, 4, 8)) over fsdp" in d.message
    assert "logical name `layers` for that dimension, which the rule file has no alias for" in d.message
    assert (
        "fsdp is what the tree's `embed` (dimension 0) stands for: the spec's positions are shifted"
        in d.message
    )
    assert "('embed', 'layers', 'heads')" in d.hint or "(embed, layers, heads)" in d.hint
    assert d.span is not None and d.span.line == 5


def test_a_name_the_file_has_no_alias_for_is_not_a_contradiction_by_itself():
    """`kv_heads` split over `tensor` by the `heads` alias: the file does not name
    every logical name the model uses, and `tensor` is no other dimension's."""
    tree = nnx.State({"key": {"kernel": _param((64, 4, 8), "embed", "layers", "kv_heads")}})
    assert _sr214('rules params:\n  "key/kernel" -> (embed, _, heads)\n', tree) == []


def test_a_spec_that_follows_the_names_says_nothing():
    assert (
        _sr214(
            'rules params:\n  "query/kernel" -> (embed, _, heads)\n  default -> replicated\n', maxtext_like()
        )
        == []
    )


def test_an_axis_named_directly_is_compared_too():
    found = _sr214(
        'rules params:\n  "out/kernel" -> (fsdp, _, tensor)\n  default -> replicated\n', maxtext_like()
    )
    first, second = found  # `heads` split over fsdp, `embed` over tensor
    assert "dimension 0" in first.message and "`heads`" in first.message and "over fsdp" in first.message
    assert "dimension 2" in second.message and "`embed`" in second.message and "over tensor" in second.message


def test_linen_logical_boxes_are_checked():
    tree = {"dense": {"kernel": linen.LogicallyPartitioned(jnp.zeros((16, 64)), ("mlp", "embed"))}}
    found = _sr214('rules params:\n  "kernel" -> (embed, _)\n', tree)
    assert [d.path for d in found] == ["dense/kernel"]


def test_lint_reports_it(tmp_path, monkeypatch, capsys):
    (tmp_path / "m.shard").write_text(
        HEADER + 'rules params:\n  "query/kernel" -> (..., embed, heads)\n  default -> replicated\n'
    )
    (tmp_path / "shapes_mod.py").write_text(
        "import jax.numpy as jnp\nfrom flax import nnx\n\n"
        "def shapes():\n"
        "    p = lambda s, *n: nnx.Param(jnp.zeros(s), out_sharding=n, eager_sharding=False)\n"
        "    return nnx.State({'layers': {'query': {'kernel': p((64, 4, 8), 'embed', 'layers', 'heads')}}})\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["lint", "m.shard", "--shapes", "shapes_mod:shapes"]) == 0  # a warning
    out = capsys.readouterr().out
    assert "m.shard:5:21: SR214 rule `query/kernel` splits dimension 1" in out
