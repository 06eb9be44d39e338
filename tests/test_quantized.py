"""Quantized parameters laid out by their float parameter's rule, with no
quantization library: trees shaped as qwix's (`kernel/array/qvalue`, `scale`,
`zero_point`) and AQT's (`kernel/qvalue`, `scale/0`, `scale_t/0`) containers,
as nested dicts and as registered dataclasses."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec

import shardrules as sr
from shardrules._interop._quantized import containers

RULES = sr.loads(
    """
mesh fsdp, model
rules params:
  "layers/\\d+/mlp/up/kernel"   -> (fsdp, model)
  "layers/\\d+/mlp/down/kernel" -> (model, fsdp)
  "norm/scale"                  -> replicated
  default                       -> replicated
""",
    name="float.shard",
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class QArray:
    """Shaped as qwix's `QArray` (its fields, not its code)."""

    qvalue: Any
    scale: Any
    zero_point: Any = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class WithAux:
    """Shaped as qwix's NNX `WithAux`: the `QArray` in its `array` field."""

    array: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class QTensor:
    """Shaped as AQT's `QTensor`: lists of scales."""

    qvalue: Any
    scale: Any
    scale_t: Any = None


def _mesh(fsdp: int = 4, model: int = 2) -> jax.sharding.Mesh:
    return jax.make_mesh((fsdp, model), ("fsdp", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _q(shape: tuple[int, int], scale: tuple[int, int], zero: bool = False) -> dict[str, Any]:
    out = {"qvalue": np.zeros(shape, np.int8), "scale": np.ones(scale, np.float32)}
    if zero:
        out["zero_point"] = np.zeros(scale, np.int8)
    return out


def _plan(tree: Any, mesh: Any = None) -> dict[str, Any]:
    plan = sr.plan(tree, RULES, mesh or _mesh())
    return {leaf.path: leaf for leaf in plan.leaves}, plan


def test_qwix_state_takes_the_float_rules() -> None:
    tree = {
        "layers": {
            "0": {
                "mlp": {
                    "up": {"kernel": {"array": _q((16, 64), (1, 64), zero=True)}},
                    "down": {"kernel": {"array": _q((64, 16), (64, 1))}},
                }
            }
        },
        "norm": {"scale": np.ones((16,), np.float32)},
    }
    leaves, plan = _plan(tree)
    up, down = "layers/0/mlp/up/kernel/array/", "layers/0/mlp/down/kernel/array/"
    assert leaves[up + "qvalue"].spec == PartitionSpec("fsdp", "model")
    assert leaves[up + "scale"].spec == PartitionSpec(None, "model")  # size 1: unsplit
    assert leaves[up + "zero_point"].spec == PartitionSpec(None, "model")
    assert leaves[down + "qvalue"].spec == PartitionSpec("model", "fsdp")
    assert leaves[down + "scale"].spec == PartitionSpec("model", None)
    for path in (up + "qvalue", up + "scale", down + "qvalue", down + "scale"):
        assert leaves[path].why == "rule" and leaves[path].rule is not None
    assert leaves[up + "scale"].rule.location == "float.shard:4:3"
    assert leaves[up + "scale"].bytes_per_device == 64 // 2 * 4
    codes = {d.code for d in plan.diagnostics} | {d.code for d in sr.check(tree, RULES, _mesh())}
    assert not codes & {"SR104", "SR201", "SR303"}, codes


def test_registered_containers_as_the_libraries_nest_them() -> None:
    tree = {
        "layers": [
            {
                "mlp": {
                    "up": {
                        "kernel": WithAux(QArray(np.zeros((16, 64), np.int8), np.ones((1, 64), np.float32)))
                    },
                    "down": {
                        "kernel": QTensor(
                            np.zeros((64, 16), np.int8),
                            [np.ones((64, 1), np.float32)],
                            [np.ones((1, 16), np.float32)],
                        )
                    },
                }
            }
        ],
        "norm": {"scale": np.ones((16,), np.float32)},
    }
    leaves, plan = _plan(tree)
    assert leaves["layers/0/mlp/up/kernel/array/scale"].spec == PartitionSpec(None, "model")
    assert leaves["layers/0/mlp/down/kernel/qvalue"].spec == PartitionSpec("model", "fsdp")
    assert leaves["layers/0/mlp/down/kernel/scale/0"].spec == PartitionSpec("model", None)
    assert leaves["layers/0/mlp/down/kernel/scale_t/0"].spec == PartitionSpec(None, "fsdp")
    assert not [d for d in plan.diagnostics if d.severity != "note"]
    placed = sr.apply(tree, RULES, mesh=_mesh())
    scale = placed["layers"][0]["mlp"]["down"]["kernel"].scale[0]
    assert scale.sharding.spec == PartitionSpec("model", None)


def test_the_same_tree_without_quantization_paths_falls_to_default() -> None:
    """The float rules reach the values only through their container: the same
    arrays under other names take `default`."""
    tree = {"layers": {"0": {"mlp": {"up": {"kernel": {"box": {"values": np.zeros((16, 64), np.int8)}}}}}}}
    leaves, _ = _plan(tree)
    assert leaves["layers/0/mlp/up/kernel/box/values"].why == "rule"  # the pattern is searched
    tree = {"layers": {"0": {"mlp": {"up": {"weights": {"array": _q((16, 64), (1, 64))}}}}}}
    leaves, _ = _plan(tree)
    assert leaves["layers/0/mlp/up/weights/array/qvalue"].why == "default"


def test_blocked_scales_split_only_where_blocks_stay_whole() -> None:
    # 64 input rows in 8 blocks of 8: fsdp=4 divides 8 blocks (2 a device); fsdp=8 too;
    # 6 blocks (ragged) and 2 blocks over fsdp=4 do not.
    def tree(blocks: int) -> dict[str, Any]:
        return {"layers": {"0": {"mlp": {"up": {"kernel": {"array": _q((64, 16), (blocks, 16))}}}}}}

    leaves, plan = _plan(tree(8))
    assert leaves["layers/0/mlp/up/kernel/array/scale"].spec == PartitionSpec("fsdp", "model")
    assert not [d for d in plan.diagnostics if d.code == "SR303"]
    for blocks in (2, 6):
        leaves, plan = _plan(tree(blocks))
        assert leaves["layers/0/mlp/up/kernel/array/scale"].spec == PartitionSpec(None, "model")
        (note,) = [d for d in plan.diagnostics if d.code == "SR303"]
        assert note.severity == "note" and note.path == "layers/0/mlp/up/kernel/array/scale"
        assert "dimension 0" in note.message and note.span is not None and note.span.line == 4


def test_a_rule_for_the_scale_itself_comes_first_when_earlier() -> None:
    rules = sr.loads(
        """
rules params:
  "kernel/array/scale" -> replicated
  "mlp/up/kernel"      -> (fsdp, model)
""",
    )
    tree = {"mlp": {"up": {"kernel": {"array": _q((16, 64), (16, 64))}}}}
    plan = sr.plan(tree, rules, _mesh())
    by = {leaf.path: leaf for leaf in plan.leaves}
    assert by["mlp/up/kernel/array/scale"].spec == PartitionSpec(None, None)
    assert by["mlp/up/kernel/array/qvalue"].spec == PartitionSpec("fsdp", "model")


def test_explain_lists_the_quantized_forms_under_the_float_rule(tmp_path: Any) -> None:
    from shardrules._cli._render import explain_rows

    tree = {"layers": {"0": {"mlp": {"up": {"kernel": {"array": _q((16, 64), (2, 64))}}}}}}
    plan = sr.plan(tree, RULES, _mesh())
    rows = {row[0]: row for row in explain_rows(plan)}
    for name in ("qvalue", "scale"):
        assert rows[f"layers/0/mlp/up/kernel/array/{name}"][3] == "float.shard:4:3"
    # the report's table of rules counts both under the float rule
    html = plan._repr_html_()
    row = html[html.index("float.shard:4:3") :]
    assert row.index("2 leaves") < row.index("float.shard:5:3")


def test_paths_and_containers() -> None:
    sig = ((4, 4), np.dtype(np.int8))
    paths = ["k/array/qvalue", "k/array/scale", "norm/scale", "q/qvalue", "q/scale_t/1"]
    found = containers(paths, [sig] * len(paths))
    assert {i: (q.parameter, q.values, q.companion) for i, q in found.items()} == {
        0: ("k", 0, False),
        1: ("k", 0, True),
        3: ("q", 3, False),
        4: ("q", 3, True),
    }
    assert containers(["norm/scale", "kernel"], [sig, sig]) == {}


@given(
    rows_log=st.integers(0, 4),
    cols_log=st.integers(0, 4),
    rows_mult=st.sampled_from([1, 3]),
    fsdp_log=st.integers(0, 3),
    blocks=st.integers(1, 48),
    on_rows=st.booleans(),
)
def test_each_device_holds_the_scales_of_its_values(
    rows_log: int, cols_log: int, rows_mult: int, fsdp_log: int, blocks: int, on_rows: bool
) -> None:
    """For any kernel shape, mesh and blocking: a scale split by the plan gives
    each device exactly the scales of the values it holds; else it is
    replicated along that dimension."""
    fsdp = 2**fsdp_log
    model = 8 // fsdp
    rows, cols = 8 * rows_mult * 2**rows_log, 8 * 2**cols_log  # both divide by any axis size here
    n = rows if on_rows else cols
    k = blocks if n % blocks == 0 else 1
    scale_shape = (k, cols) if on_rows else (1, k)
    tree = {"layers": {"0": {"mlp": {"up": {"kernel": {"array": _q((rows, cols), scale_shape)}}}}}}
    mesh = _mesh(fsdp, model)
    plan = sr.plan(tree, RULES, mesh)
    by = {leaf.path: leaf for leaf in plan.leaves}
    values = by["layers/0/mlp/up/kernel/array/qvalue"]
    scale = by["layers/0/mlp/up/kernel/array/scale"]
    assert values.spec == PartitionSpec("fsdp", "model")
    value_blocks = NamedSharding(mesh, values.spec).devices_indices_map((rows, cols))
    scale_blocks = NamedSharding(mesh, scale.spec).devices_indices_map(scale_shape)
    dim = 0 if on_rows else 1
    size = math.prod(scale_shape)
    split = scale.spec[dim] is not None
    if not split:
        assert all(
            idx[dim] == slice(None) or idx[dim] == slice(0, scale_shape[dim]) for idx in scale_blocks.values()
        )
        if size > 1 and k not in (1, n) and values.spec[dim] is not None:
            assert any(d.code == "SR303" for d in plan.diagnostics)
        return
    block = n // scale_shape[dim]
    for device, idx in value_blocks.items():
        held = idx[dim].indices(n)
        wanted = range(held[0] // block, (held[1] - 1) // block + 1)
        got = range(*scale_blocks[device][dim].indices(scale_shape[dim]))
        assert list(got) == list(wanted), (device, idx, scale_blocks[device])
        assert held[0] % block == 0 and held[1] % block == 0  # no block shared with another device


def test_quantized_tree_under_jit_matches_one_device() -> None:
    """A dequantizing matmul on the planned layouts gives the one-device result."""
    rng = np.random.default_rng(0)
    tree = {
        "mlp": {
            "up": {
                "kernel": {
                    "array": {
                        "qvalue": rng.integers(-127, 128, (16, 64)).astype(np.int8),
                        "scale": rng.uniform(0.01, 0.02, (4, 64)).astype(np.float32),
                    }
                }
            }
        }
    }
    rules = sr.loads('rules params:\n  "mlp/up/kernel" -> (fsdp, model)\n')
    x = rng.normal(size=(8, 16)).astype(np.float32)

    def forward(params: Any, x: Any) -> Any:
        q = params["mlp"]["up"]["kernel"]["array"]
        w = q["qvalue"].astype(jnp.float32).reshape(4, 4, 64) * q["scale"][:, None, :]
        return x @ w.reshape(16, 64)

    mesh = _mesh()
    placed = sr.apply(tree, rules, mesh=mesh)
    scale = placed["mlp"]["up"]["kernel"]["array"]["scale"]
    assert scale.sharding.spec == PartitionSpec("fsdp", "model")
    got = jax.jit(forward)(placed, x)
    want = forward(jax.tree.map(jnp.asarray, tree), x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("no_mesh", [True])
def test_without_axis_sizes_blocked_scales_stay_whole(no_mesh: bool) -> None:
    tree = {"mlp": {"up": {"kernel": {"array": _q((16, 64), (4, 64))}}}}
    rules = sr.loads('rules params:\n  "mlp/up/kernel" -> (fsdp, model)\n')
    plan = sr.plan(tree, rules, {"fsdp": 4, "model": 2} if not no_mesh else None)
    by = {leaf.path: leaf for leaf in plan.leaves}
    assert by["mlp/up/kernel/array/scale"].spec == PartitionSpec(None, "model")


def _decoder(quantized: bool, tile: int | None = None) -> dict[str, Any]:
    """A two-layer decoder's shapes; `quantized`: each kernel as qwix's NNX state holds it."""
    d, f, v = 64, 256, 512

    def kernel(rows: int, cols: int) -> Any:
        if not quantized:
            return jax.ShapeDtypeStruct((rows, cols), jnp.float32)
        scale = (rows // tile if tile else 1, cols)
        return {
            "array": {
                "qvalue": jax.ShapeDtypeStruct((rows, cols), jnp.int8),
                "scale": jax.ShapeDtypeStruct(scale, jnp.float32),
            }
        }

    layer = {
        "attn": {name: {"kernel": kernel(d, d)} for name in ("q", "k", "v", "o")},
        "mlp": {
            "gate": {"kernel": kernel(d, f)},
            "up": {"kernel": kernel(d, f)},
            "down": {"kernel": kernel(f, d)},
        },
        "norm1": {"scale": jax.ShapeDtypeStruct((d,), jnp.float32)},
        "norm2": {"scale": jax.ShapeDtypeStruct((d,), jnp.float32)},
    }
    return {
        "embed": {"embedding": jax.ShapeDtypeStruct((v, d), jnp.float32)},
        "layers": {str(i): layer for i in range(2)},
        "norm": {"scale": jax.ShapeDtypeStruct((d,), jnp.float32)},
        "head": {"kernel": kernel(d, v)},
    }


@pytest.mark.parametrize("tile", [None, 16])
def test_suggest_lays_quantized_values_out_as_their_float_parameters(tile: int | None) -> None:
    """`suggest` on the quantized tree plans every leaf as the float tree's
    suggestion, carried to the quantized forms, plans it; the scales are no
    rule's own."""
    sizes = {"fsdp": 4, "model": 2}
    tree = _decoder(True, tile)
    text = sr.suggest(tree, sizes, strategy="fsdp+tp")
    carried = sr.plan(tree, sr.loads(sr.suggest(_decoder(False), sizes, strategy="fsdp+tp")), sizes)
    ours = sr.plan(tree, sr.loads(text), sizes)
    assert ours.ok and carried.ok
    assert [(leaf.path, leaf.spec) for leaf in ours.leaves] == [
        (leaf.path, leaf.spec) for leaf in carried.leaves
    ]
    by = {leaf.path: leaf for leaf in ours.leaves}
    up = by["layers/0/mlp/up/kernel/array/qvalue"]
    assert any(entry is not None for entry in up.spec)  # really split
    assert by["layers/0/mlp/up/kernel/array/scale"].rule is up.rule
    assert "qvalue" not in text and "array/" not in text  # written for the float paths
