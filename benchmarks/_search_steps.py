"""Train steps for `benchmarks/search.py` and `shardrules suggest --search`:
`MODULE:FUNCTION` factories taking the rules and the mesh, returning the
`sr.jit` step and its arguments as shapes (nothing initialised). A search
compares one step's layouts, so the global batch depends on the number of
devices only, never on the mesh's shape: `ROWS_PER_DEVICE` sequences per device.

- `transformer`: `examples/transformer`'s train step (2 blocks, SGD, float32),
  2 sequences of 32 tokens per device;
- `nnx_moe`: the Flax NNX GQA+MoE decoder of `_models.nnx_moe` (4 layers, 8
  experts top-2, 4 query heads sharing 2 key/value heads), 2 sequences per device;
- `llama7b`: the 7B-like decoder of `_llama7b.py` (Llama-2-7B's sizes, the
  layers scanned and rematerialised, Adam), 1 sequence of 2,048 tokens per
  device (MaxText's published Llama-2-7B recipes on v5p run 4 of 4,096).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _llama7b
import _models

ROWS_PER_DEVICE = {"transformer": 2, "nnx_moe": 2, "llama7b": 1}


def _rows(name: str, mesh: Any) -> int:
    return ROWS_PER_DEVICE[name] * int(mesh.devices.size)


def _small(model: Any, rows: int, rules: Any, mesh: Any) -> tuple[Any, tuple[Any, Any]]:
    import jax
    import numpy as np

    import shardrules as sr

    have = next(iter(model.batch.values())).shape[0]
    batch = jax.tree.map(lambda a: np.concatenate([a] * (rows // have)), model.batch)
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (model.params, batch))
    step = sr.jit(model.step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    return step, shapes


@functools.cache
def _model(name: str) -> Any:
    """The model, built once: it is the same for every mesh (a factory may keep it)."""
    return _models.transformer() if name == "transformer" else _models.nnx_moe(layers=4, abstract=True)


def transformer(rules: Any, mesh: Any) -> tuple[Any, tuple[Any, Any]]:
    """`examples/transformer`'s train step."""
    return _small(_model("transformer"), _rows("transformer", mesh), rules, mesh)


def nnx_moe(rules: Any, mesh: Any) -> tuple[Any, tuple[Any, Any]]:
    """The NNX GQA+MoE decoder, 4 layers."""
    return _small(_model("nnx_moe"), _rows("nnx_moe", mesh), rules, mesh)


def llama7b(rules: Any, mesh: Any) -> tuple[Any, tuple[dict, dict]]:
    """The 7B-like decoder with Adam, one sequence of 2,048 tokens per device."""
    return _llama7b.make_step(rules, mesh), _llama7b.shapes(_rows("llama7b", mesh))
