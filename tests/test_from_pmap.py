"""The pmap program of examples/from_pmap and its jax.jit + rule file rewrite give the same numbers."""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "from_pmap"
STEPS = 8


@pytest.fixture(scope="module")
def versions():
    sys.path.insert(0, str(EXAMPLE))
    try:
        pmap_version = importlib.import_module("train_pmap")
        jit_version = importlib.import_module("train_jit")
    finally:
        sys.path.remove(str(EXAMPLE))
    yield pmap_version, jit_version
    for name in ("train_pmap", "train_jit", "pmap_model"):
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def pmap_run(versions):
    return versions[0].train(STEPS)


@pytest.mark.parametrize("rule_file", ["data_parallel.shard", "fsdp.shard"])
def test_jit_with_rules_matches_pmap(versions, pmap_run, rule_file):
    want_params, want_losses = pmap_run
    got_params, got_losses = versions[1].train(STEPS, rule_file)
    assert want_losses[-1] < want_losses[0]  # the comparison is of a run that learns
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(got_params), jax.tree.leaves(want_params), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-6)


def test_the_rule_files_give_the_layouts_the_docs_describe(versions):
    params, _ = versions[1].train(1, "data_parallel.shard")
    assert all(leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(params))
    params, _ = versions[1].train(1, "fsdp.shard")
    assert params["hidden"]["kernel"].sharding.spec == P(None, "batch")  # (16, 256): 256 divides by 8
    assert params["out"]["kernel"].sharding.spec == P("batch", None)  # (256, 4)
    assert {s.data.shape for s in params["hidden"]["kernel"].addressable_shards} == {(16, 32)}


def test_pmap_still_runs_without_a_warning():
    """docs/from-pmap.md says pmap works and warns nothing in this JAX; keep that true."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")(np.arange(8.0))
    np.testing.assert_array_equal(np.asarray(out), np.full(8, 28.0))
