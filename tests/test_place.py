"""Sharded initialisation and streaming checkpoint loading."""

from __future__ import annotations

import json
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr

RULES = sr.loads(
    "mesh data, fsdp, model\n"
    "rules params:\n"
    '  "up_proj\\.weight$"   -> (model, fsdp)\n'
    '  "down_proj\\.weight$" -> (fsdp, model)\n'
    '  "embed"               -> (_, fsdp)\n'
    "  default               -> replicated\n",
    name="ckpt.shard",
)
CODES = {
    np.dtype(np.float32): "F32",
    np.dtype(jnp.bfloat16): "BF16",
    np.dtype(np.int8): "I8",
    np.dtype(np.float16): "F16",
}


def write_safetensors(path, tensors: dict[str, np.ndarray]) -> None:
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {
            "dtype": CODES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "model.layers.0.mlp.up_proj.weight": rng.standard_normal((16, 8)).astype(jnp.bfloat16),
        "model.layers.0.mlp.down_proj.weight": rng.standard_normal((8, 16)).astype(np.float32),
        "model.embed_tokens.weight": rng.integers(-100, 100, (32, 8)).astype(np.int8),
        "model.norm.weight": np.ones(8, np.float16),
        "model.scale": np.array(2.5, np.float32),
    }


def test_load_checkpoint_builds_each_array_in_its_planned_layout(tmp_path, mesh222):
    want = tensors()
    write_safetensors(tmp_path / "model.safetensors", want)
    got = sr.load_checkpoint(tmp_path / "model.safetensors", RULES, mesh222)
    assert set(got) == set(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        np.testing.assert_array_equal(np.asarray(got[name]), array)
    up = got["model.layers.0.mlp.up_proj.weight"]
    assert up.sharding == NamedSharding(mesh222, P("model", "fsdp"))
    assert {s.data.shape for s in up.addressable_shards} == {(8, 4)}
    assert got["model.embed_tokens.weight"].sharding.spec == P(None, "fsdp")
    assert got["model.scale"].sharding.spec == P()


def test_load_checkpoint_follows_an_index_and_renames(tmp_path, mesh222):
    want = tensors()
    names = sorted(want)
    write_safetensors(tmp_path / "a.safetensors", {n: want[n] for n in names[:2]})
    write_safetensors(tmp_path / "b.safetensors", {n: want[n] for n in names[2:]})
    weight_map = {n: "a.safetensors" for n in names[:2]} | {n: "b.safetensors" for n in names[2:]}
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": weight_map}))

    def rename(name: str) -> str | None:
        return None if name == "model.scale" else name.removeprefix("model.")

    got = sr.load_checkpoint(index, RULES, mesh222, rename=rename)
    assert set(got) == {n.removeprefix("model.") for n in want} - {"scale"}
    np.testing.assert_array_equal(
        np.asarray(got["layers.0.mlp.down_proj.weight"]), want["model.layers.0.mlp.down_proj.weight"]
    )
    assert got["layers.0.mlp.down_proj.weight"].sharding.spec == P("fsdp", "model")


def test_load_checkpoint_plans_everything_before_reading(tmp_path, mesh222):
    write_safetensors(tmp_path / "m.safetensors", {"x.up_proj.weight": np.ones((3, 8), np.float32)})
    with pytest.raises(sr.PlanError) as info:
        sr.load_checkpoint(tmp_path / "m.safetensors", RULES, mesh222)
    assert info.value.code == "SR104" and info.value.path == "x.up_proj.weight"


def test_init_creates_parameters_sharded(mesh222):
    def init_fn(key):
        k1, k2 = jax.random.split(key)
        return {
            "mlp": {
                "up_proj.weight": jax.random.normal(k1, (16, 8)),
                "down_proj.weight": jax.random.normal(k2, (8, 16)),
            },
            "norm": jnp.ones(8),
        }

    params = sr.init(init_fn, RULES, mesh222)(jax.random.key(0))
    plain = jax.jit(init_fn)(jax.random.key(0))
    assert params["mlp"]["up_proj.weight"].sharding == NamedSharding(mesh222, P("model", "fsdp"))
    assert params["norm"].sharding.spec == P(None)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(plain), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_init_with_static_arguments(mesh222):
    make = sr.init(
        lambda key, n: {"mlp": {"up_proj.weight": jnp.zeros((n, 8))}}, RULES, mesh222, static_argnums=1
    )
    out = make(jax.random.key(0), 16)
    assert out["mlp"]["up_proj.weight"].shape == (16, 8)
    assert out["mlp"]["up_proj.weight"].sharding.spec == P("model", "fsdp")


def test_init_in_chunks_gives_the_same_arrays(mesh222):
    def init_fn(key):
        keys = jax.random.split(key, 4)
        return {f"layer{i}": {"up_proj.weight": jax.random.normal(k, (16, 8))} for i, k in enumerate(keys)}

    whole = sr.init(init_fn, RULES, mesh222)(jax.random.key(1))
    chunked = sr.init(init_fn, RULES, mesh222, chunk_bytes=16 * 8 * 4)(jax.random.key(1))  # one leaf per call
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(chunked), strict=True):
        assert a.sharding == b.sharding == NamedSharding(mesh222, P("model", "fsdp"))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_chunks_group_leaves_by_bytes():
    from shardrules._place import _chunks

    assert _chunks([10, 10, 10], 20) == [[0, 1], [2]]
    assert _chunks([30, 5, 5], 20) == [[0], [1, 2]]
    assert _chunks([1, 1], None) == [[0, 1]]
    assert len(_chunks([2**30] * 8, None)) == 8


def test_load_checkpoint_can_report_progress(tmp_path, mesh222, capsys):
    write_safetensors(tmp_path / "model.safetensors", tensors())
    sr.load_checkpoint(tmp_path / "model.safetensors", RULES, mesh222, progress=True)
    err = capsys.readouterr().err
    assert err.endswith("\rloading 5/5 tensors, 1.0 KiB of 1.0 KiB\n"), err
    assert err.count("\r") == 5
    sr.load_checkpoint(tmp_path / "model.safetensors", RULES, mesh222)
    assert capsys.readouterr().err == ""  # small, and not a terminal: quiet
