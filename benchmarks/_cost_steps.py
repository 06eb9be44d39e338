"""Train steps for `shardrules lint/explain --step` in the benchmarks, their
parameters as shapes (nothing initialised): `MODULE:FUNCTION` factories
taking the rules and the mesh, returning the `sr.jit` step and its arguments.
The batch grows with the mesh (`rows` per 8 devices) so that it divides."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _models


def _step(model: Any, rules: Any, mesh: Any) -> tuple[Any, tuple[Any, Any]]:
    import jax
    import numpy as np

    import shardrules as sr

    times = max(1, int(mesh.devices.size) // 8)
    batch = jax.tree.map(lambda a: np.concatenate([a] * times), model.batch)
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (model.params, batch))
    step = sr.jit(model.step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    return step, shapes


def transformer(rules: Any, mesh: Any) -> tuple[Any, tuple[Any, Any]]:
    """`examples/transformer`'s train step (2 blocks)."""
    return _step(_models.transformer(), rules, mesh)


def nnx_moe(rules: Any, mesh: Any) -> tuple[Any, tuple[Any, Any]]:
    """The NNX GQA+MoE decoder of `_models.nnx_moe`, 8 layers."""
    return _step(_models.nnx_moe(layers=8, abstract=True), rules, mesh)
