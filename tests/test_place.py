"""Sharded initialisation and streaming checkpoint loading."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _safetensors import write_safetensors
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
    from shardrules._placement._sharded_init import _chunks

    assert _chunks([10, 10, 10], 20) == [[0, 1], [2]]
    assert _chunks([30, 5, 5], 20) == [[0], [1, 2]]
    assert _chunks([1, 1], None) == [[0, 1]]
    assert len(_chunks([2**30] * 8, None)) == 8


def test_chunks_make_the_largest_leaves_first():
    """A group's temporaries (3x its bytes for random init) come on top of the
    leaves already made: the big ones go first, when few are made."""
    from shardrules._placement._sharded_init import _chunks

    assert _chunks([10, 40, 20, 5], 30) == [[1], [2, 0], [3]]
    sizes = [2**20] * 28 + [2**28]  # many layer weights, then a large embedding
    groups = _chunks(sizes, None)
    assert groups[0] == [28]
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
    assert all(sum(sizes[i] for i in g) <= sum(sizes) // 16 for g in groups[1:])


def test_load_checkpoint_can_report_progress(tmp_path, mesh222, capsys):
    write_safetensors(tmp_path / "model.safetensors", tensors())
    sr.load_checkpoint(tmp_path / "model.safetensors", RULES, mesh222, progress=True)
    err = capsys.readouterr().err
    assert err.endswith("\rloading 5/5 tensors, 1.0 KiB of 1.0 KiB\n"), err
    assert err.count("\r") == 5
    sr.load_checkpoint(tmp_path / "model.safetensors", RULES, mesh222)
    assert capsys.readouterr().err == ""  # small, and not a terminal: quiet


def _decoder_init(key):
    k1, k2 = jax.random.split(key)
    return {
        "mlp": {
            "up_proj.weight": jax.random.normal(k1, (16, 8)),
            "down_proj.weight": jax.random.normal(k2, (8, 16)),
        },
        "norm": jnp.ones(8),
    }


def test_init_each_device_holds_only_its_shards(mesh222):
    params = sr.init(_decoder_init, RULES, mesh222)(jax.random.key(0))
    plan = sr.plan(jax.eval_shape(_decoder_init, jax.random.key(0)), RULES, mesh222)
    held: dict[int, int] = {}
    for array in jax.tree.leaves(params):
        for shard in array.addressable_shards:
            held[shard.device.id] = held.get(shard.device.id, 0) + shard.data.nbytes
    total = sum(a.nbytes for a in jax.tree.leaves(params))
    # up (16, 8) over model × fsdp: 8 × 4 floats; down (8, 16) over fsdp × model: 4 × 8; norm whole.
    assert set(held.values()) == {(8 * 4 + 4 * 8 + 8) * 4} == {plan.bytes_per_device}
    assert len(held) == 8 and plan.bytes_per_device < total


def test_init_checks_the_plan_before_running_the_initialiser(mesh222):
    traced = []

    def init_fn(key):
        traced.append(1)  # runs once per trace: eval_shape, then each compiled call
        return _decoder_init(key)

    sr.init(init_fn, RULES, mesh222)(jax.random.key(0))
    assert len(traced) >= 2  # learning the shapes, then the sharded call
    traced.clear()
    strict = sr.loads('rules params:\n  "up_proj" -> ((fsdp, model), _)\n  default -> replicated\n')

    def odd_init(key):
        traced.append(1)
        return {"up_proj": jax.random.normal(key, (6, 8))}  # 6 rows do not divide by fsdp × model = 4

    with pytest.raises(sr.PlanError, match="SR104"):
        sr.init(odd_init, strict, mesh222)(jax.random.key(0))
    assert len(traced) == 1  # shapes only: the failing plan stopped it before anything was computed


def test_init_without_a_mesh_uses_the_ambient_one_else_the_rule_files(mesh222):
    with jax.set_mesh(mesh222):
        params = sr.init(_decoder_init, RULES)(jax.random.key(0))
    assert params["mlp"]["up_proj.weight"].sharding == NamedSharding(mesh222, P("model", "fsdp"))

    sized = sr.loads(
        'mesh fsdp=4, model=2\nrules params:\n  "up_proj" -> (model, fsdp)\n  default -> replicated\n'
    )
    made = sr.init(_decoder_init, sized)(jax.random.key(0))["mlp"]["up_proj.weight"]
    assert dict(made.sharding.mesh.shape) == {"fsdp": 4, "model": 2}
    assert {s.data.shape for s in made.addressable_shards} == {(8, 2)}


def test_init_an_equinox_module_with_its_non_array_leaves(mesh42):
    """An initialiser may return leaves that are not arrays (an Equinox MLP holds
    its activation functions and sizes): they come back as it made them, and
    only the arrays are created sharded."""
    eqx = pytest.importorskip("equinox")
    rules = sr.loads('rules params:\n  "layers/\\d+/weight$" -> (model?, data)\n  default -> replicated\n')

    def build(key):
        return eqx.nn.MLP(16, 3, 32, depth=2, key=key)

    key = jax.random.key(0)
    mlp = sr.init(build, rules, mesh42)(key)
    want = build(key)
    assert type(mlp) is type(want)
    assert mlp.activation is want.activation and mlp.final_activation is want.final_activation
    assert (mlp.in_size, mlp.out_size, mlp.width_size, mlp.depth) == (16, 3, 32, 2)
    assert mlp.layers[1].weight.sharding == NamedSharding(mesh42, P("model", "data"))
    assert mlp.layers[0].weight.sharding.spec == P("model", "data")  # (32, 16)
    assert mlp.layers[2].weight.sharding.spec == P(None, "data")  # (3, 32): `model?` left out
    np.testing.assert_allclose(np.asarray(mlp(jnp.ones(16))), np.asarray(want(jnp.ones(16))), rtol=1e-5)


def test_init_keeps_python_values_as_made():
    """Python numbers and strings in an initialiser's output stay Python values."""
    rules = sr.loads('rules params:\n  "w$" -> (x)\n  default -> replicated\n')
    mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    out = sr.init(
        lambda k: {"w": jax.random.normal(k, (16,)), "n": 3, "name": "mlp", "f": jnp.tanh}, rules, mesh
    )(jax.random.key(0))
    assert (out["n"], out["name"], out["f"]) == (3, "mlp", jnp.tanh)
    assert out["w"].sharding.spec == P("x")


@pytest.mark.parametrize("bad", [{"data": 2, "fsdp": 2, "model": 2}, "data=2,fsdp=2,model=2"])
def test_init_and_load_checkpoint_refuse_a_mesh_without_devices(tmp_path, bad):
    path = tmp_path / "model.safetensors"
    write_safetensors(path, tensors())
    # A clear TypeError naming the call and what it needs, as `apply` gives, not a bare assertion.
    expected = r"needs a jax\.sharding\.Mesh with devices, not (dict|str)"
    with pytest.raises(TypeError, match="init " + expected):
        sr.init(lambda: {"model.norm.weight": jnp.ones(8)}, RULES, bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="load_checkpoint " + expected):
        sr.load_checkpoint(path, RULES, bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="apply " + expected):
        sr.apply({"model.norm.weight": np.ones(8)}, RULES, bad)  # type: ignore[arg-type]


def test_load_checkpoint_refuses_a_tensor_whose_bytes_do_not_fit_its_shape(tmp_path, mesh222):
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"model.norm.weight": np.ones(8, np.float16)})
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b'"shape": [8]', b'"shape": [4]'))  # 16 bytes for a (4,) float16
    with pytest.raises(ValueError, match=r"'model.norm.weight' has 16 bytes for shape \(4,\) float16"):
        sr.load_checkpoint(path, RULES, mesh222)
