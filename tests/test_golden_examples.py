"""Every example's plan, checked against its golden dump in tests/data/golden/
(`sr.assert_plan_matches`). After a deliberate change to an example's rules or
model, refresh them with `SHARDRULES_UPDATE_GOLDEN=1 pytest tests/test_golden_examples.py`
and review the diff of the JSON files.

Each example's parameters are built by the example's own code, as shapes only
(`jax.eval_shape`, or the NumPy arrays' shapes): nothing trains. The mesh is
the rule file's sizes, or `fsdp=4, model=2`-style sizes of 8 devices where the
file names axes without sizes, as a dict (no devices needed).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import numpy as np
import pytest

import shardrules as sr

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
GOLDEN = Path(__file__).resolve().parent / "data" / "golden"


def _module(relative: str) -> ModuleType:
    path = EXAMPLES / relative
    name = "_golden_example_" + relative.replace("/", "_").removesuffix(".py")
    if name in sys.modules:
        return sys.modules[name]
    sys.path.insert(0, str(path.parent))  # for the example's own imports (from_pmap's pmap_model)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def _shapes(tree: Any) -> Any:
    """Arrays (NumPy or JAX) as `ShapeDtypeStruct`s; anything else as it is."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if hasattr(x, "shape") else x, tree)


def _mlp() -> Any:
    return _shapes(_module("mlp/train.py").init_params(np.random.default_rng(0)))


def _transformer() -> Any:
    return _shapes(_module("transformer/train.py").init_params(np.random.default_rng(0)))


def _sharded_init() -> Any:
    return jax.eval_shape(_module("sharded_init/init.py").init_fn, jax.random.key(0))


def _orbax() -> Any:
    return _shapes(_module("orbax/restore.py").make_weights(np.random.default_rng(0)))


def _shard_map() -> Any:
    return _shapes(_module("shard_map/train.py").init_params(np.random.default_rng(0)))


def _optax() -> Any:
    import optax

    params = jax.eval_shape(_module("optax/train.py").init_params, jax.random.key(0))
    return {"params": params, "opt_state": jax.eval_shape(optax.adam(1e-3).init, params)}


def _from_pmap() -> Any:
    return _shapes(_module("from_pmap/pmap_model.py").init_params())


def _multihost() -> Any:
    launch = _module("multihost/launch.py")
    f32 = np.float32
    return {  # the tree `worker` builds, as shapes
        "up": {
            "kernel": jax.ShapeDtypeStruct((launch.D_IN, launch.D_HIDDEN), f32),
            "bias": jax.ShapeDtypeStruct((launch.D_HIDDEN,), f32),
        },
        "down": {"kernel": jax.ShapeDtypeStruct((launch.D_HIDDEN, launch.D_OUT), f32)},
    }


# rule file (under examples/) -> (what it plans, the mesh's sizes when the file gives none)
CASES: dict[str, tuple[Callable[[], Any], dict[str, int] | None]] = {
    "from_pmap/data_parallel.shard": (_from_pmap, {"batch": 8}),
    "from_pmap/fsdp.shard": (_from_pmap, {"batch": 8}),
    "mlp/mlp.shard": (_mlp, None),
    "multihost/multihost.shard": (_multihost, None),
    "optax/mlp.shard": (_optax, None),
    "orbax/model.shard": (_orbax, {"fsdp": 4, "model": 2}),
    "shard_map/mlp.shard": (_shard_map, {"data": 4, "model": 2}),
    "sharded_init/model.shard": (_sharded_init, None),
    "transformer/transformer.shard": (_transformer, None),
}


def _golden(rule_file: str) -> Path:
    return GOLDEN / (rule_file.removesuffix(".shard").replace("/", "--") + ".json")


@pytest.mark.parametrize("rule_file", sorted(CASES))
def test_example_plan_matches_golden(rule_file: str) -> None:
    build, sizes = CASES[rule_file]
    rules = sr.load(EXAMPLES / rule_file)
    if sizes is None:
        assert rules.mesh is not None
        sizes = {axis.name: axis.size for axis in rules.mesh.axes if isinstance(axis.size, int)}
    sr.assert_plan_matches(sr.plan(build(), rules, sizes), _golden(rule_file))
