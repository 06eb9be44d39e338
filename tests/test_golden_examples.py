"""Every example's plan, checked against its golden dump in tests/data/golden/
(`sr.assert_plan_matches`). After a deliberate change to an example's rules or
model, refresh them with `SHARDRULES_UPDATE_GOLDEN=1 pytest tests/test_golden_examples.py`
and review the diff of the JSON files.

Each example's parameters are built by the example's own code, as shapes only
(`jax.eval_shape`, or the NumPy arrays' shapes): nothing trains. The mesh is
the rule file's sizes, or `fsdp=4, model=2`-style sizes of 8 devices where the
file names axes without sizes, as a dict (no devices needed). A case named
`file.shard#group` plans that group of the file instead of `params`.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
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


def _equinox() -> Any:
    import equinox as eqx

    _module("equinox/train.py")  # the example imports (equinox, optax) as it runs
    return eqx.filter_eval_shape(  # the MLP `main` builds; activations stay functions
        eqx.nn.MLP, 8, 1, width_size=128, depth=2, activation=jax.nn.gelu, key=jax.random.key(0)
    )


def _flax_linen() -> Any:
    import optax

    example = _module("flax_linen/train.py")
    model, tx = example.Stack(), optax.adam(1e-2)

    def init_state(key: jax.Array, x: jax.Array) -> dict[str, Any]:  # `main`'s init_state
        params = model.init(key, x)["params"]  # boxed: nn.LogicallyPartitioned
        return {"params": params, "opt_state": tx.init(params)}

    x = jax.ShapeDtypeStruct((example.BATCH, example.EMBED), np.float32)
    return jax.eval_shape(init_state, jax.random.key(0), x)


def _flax_nnx() -> Any:
    import optax
    from flax import nnx

    example = _module("flax_nnx/train.py")
    model = nnx.eval_shape(lambda: example.DotReluDot(example.DEPTH, rngs=nnx.Rngs(0)))
    optimizer = nnx.eval_shape(
        lambda: nnx.Optimizer(
            example.DotReluDot(example.DEPTH, rngs=nnx.Rngs(0)), optax.adam(1e-3), wrt=nnx.Param
        )
    )
    _, model_state = nnx.split(model)
    return {"model": model_state, "optimizer": nnx.state(optimizer)}


def _torchax() -> Any:
    torch = pytest.importorskip("torch")
    try:
        with warnings.catch_warnings():  # notices that torchax itself raises on import, as the example does
            warnings.simplefilter("ignore")
            import torchax
            import torchax.interop  # the example's import; where the deprecation notices come from
    except ImportError as err:  # pragma: no cover - depends on the environment
        pytest.skip(f"torchax is not installed: {err}")
    except AttributeError as err:  # pragma: no cover - torchax releases that predate this torch
        pytest.skip(f"this torchax release does not import with torch {torch.__version__}: {err}")
    example = _module("torchax/train.py")
    with torchax.default_env():  # as `main` builds it: a torch MLP moved to the `jax` device
        torch.manual_seed(0)
        state = example.MLP(example.LAYER_SIZES).to("jax").state_dict()
        return {k: jax.ShapeDtypeStruct(tuple(v.shape), v.jax().dtype) for k, v in state.items()}


def _reshard() -> Any:
    return _shapes(_module("reshard/reshard.py").host_params())


# rule file (under examples/) -> (what it plans, the mesh's sizes when the file gives none)
CASES: dict[str, tuple[Callable[[], Any], dict[str, int] | None]] = {
    "equinox/mlp.shard": (_equinox, None),
    "flax_linen/dot_relu_dot.shard": (_flax_linen, None),
    "flax_nnx/dot_relu_dot.shard": (_flax_nnx, None),
    "from_pmap/data_parallel.shard": (_from_pmap, {"batch": 8}),
    "from_pmap/fsdp.shard": (_from_pmap, {"batch": 8}),
    "mlp/mlp.shard": (_mlp, None),
    "multihost/multihost.shard": (_multihost, None),
    "optax/mlp.shard": (_optax, None),
    "orbax/model.shard": (_orbax, {"fsdp": 4, "model": 2}),
    "reshard/rollout.shard": (_reshard, None),
    "reshard/train.shard": (_reshard, None),
    "reshard/train.shard#zero1": (_reshard, None),
    "shard_map/mlp.shard": (_shard_map, {"data": 4, "model": 2}),
    "sharded_init/model.shard": (_sharded_init, None),
    "torchax/mlp.shard": (_torchax, {"batch": 4, "model": 2}),
    "transformer/transformer.shard": (_transformer, None),
}


def _golden(case: str) -> Path:
    rule_file, _, group = case.partition("#")
    name = rule_file.removesuffix(".shard").replace("/", "--") + (f"--{group}" if group else "")
    return GOLDEN / (name + ".json")


@pytest.mark.parametrize("case", sorted(CASES))
def test_example_plan_matches_golden(case: str) -> None:
    build, sizes = CASES[case]
    rule_file, _, group = case.partition("#")
    rules = sr.load(EXAMPLES / rule_file)
    if sizes is None:
        assert rules.mesh is not None
        sizes = {axis.name: axis.size for axis in rules.mesh.axes if isinstance(axis.size, int)}
    plan = sr.plan(build(), rules, sizes, group=group or "params")
    sr.assert_plan_matches(plan, _golden(case))
