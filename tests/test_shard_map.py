"""`sr.specs` as the in_specs/out_specs of `jax.shard_map`, checked against unsharded runs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardrules as sr

RULES = sr.loads(
    "mesh data, model\n"
    "alias batch = (data, model)\n"
    "rules params:\n"
    '  "up/kernel$"   -> (_, model)\n'
    '  "up/bias$"     -> (model)\n'
    '  "down/kernel$" -> (model, _)\n'
    "  default        -> replicated\n"
    "rules inputs:\n"
    '  "^(x|y)$" -> (data, _)\n'
    "rules all_devices:\n"
    '  "^(x|y)$" -> (batch, _)\n'
    "  default   -> replicated\n",
    name="shard_map.shard",
)


@pytest.fixture
def params() -> dict:
    rng = np.random.default_rng(0)
    return {
        "up": {
            "kernel": rng.standard_normal((16, 64), np.float32),
            "bias": rng.standard_normal(64, np.float32),
        },
        "down": {
            "kernel": rng.standard_normal((64, 8), np.float32),
            "bias": rng.standard_normal(8, np.float32),
        },
    }


@pytest.fixture
def batch() -> dict:
    rng = np.random.default_rng(1)
    return {"x": rng.standard_normal((32, 16), np.float32), "y": rng.standard_normal((32, 8), np.float32)}


def mse(params: dict, batch: dict) -> jax.Array:
    h = jax.nn.relu(batch["x"] @ params["up"]["kernel"] + params["up"]["bias"])
    return jnp.mean((h @ params["down"]["kernel"] + params["down"]["bias"] - batch["y"]) ** 2)


def test_row_parallel_matmul_with_psum_matches_the_unsharded_product(mesh42, params, batch):
    specs = sr.specs(params, RULES, mesh42)
    x_spec = P(None, "model")  # the hidden activations, split like up/kernel's columns
    w_spec = specs["down"]["kernel"]
    assert w_spec == P("model", None)

    product = jax.jit(
        jax.shard_map(
            lambda h, w: jax.lax.psum(h @ w, "model"), mesh=mesh42, in_specs=(x_spec, w_spec), out_specs=P()
        )
    )
    h = np.random.default_rng(2).standard_normal((32, 64)).astype(np.float32)
    got = product(h, sr.apply(params, RULES, mesh42)["down"]["kernel"])
    np.testing.assert_allclose(np.asarray(got), h @ params["down"]["kernel"], rtol=1e-5, atol=1e-5)


def test_tensor_and_data_parallel_train_step_matches_the_unsharded_step(mesh42, params, batch):
    def local_loss(p: dict, b: dict) -> jax.Array:
        h = jax.nn.relu(b["x"] @ p["up"]["kernel"] + p["up"]["bias"])
        y = jax.lax.psum(h @ p["down"]["kernel"], "model") + p["down"]["bias"]
        return jax.lax.pmean(jnp.mean((y - b["y"]) ** 2), "data")

    def sgd(loss, p, b):
        value, grads = jax.value_and_grad(loss)(p, b)
        return jax.tree.map(lambda w, g: w - 0.1 * g, p, grads), value

    param_specs = sr.specs(params, RULES, mesh42)
    batch_specs = sr.specs(batch, RULES, mesh42, group="inputs")
    assert batch_specs == {"x": P("data", None), "y": P("data", None)}
    step = jax.jit(
        jax.shard_map(
            lambda p, b: sgd(local_loss, p, b),
            mesh=mesh42,
            in_specs=(param_specs, batch_specs),
            out_specs=(param_specs, P()),
        )
    )
    got_params, got_loss = step(
        sr.apply(params, RULES, mesh42), sr.apply(batch, RULES, mesh42, group="inputs")
    )
    want_params, want_loss = jax.jit(lambda p, b: sgd(mse, p, b))(params, batch)

    np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=1e-5)
    for got, want in zip(jax.tree.leaves(got_params), jax.tree.leaves(want_params), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
    # out_specs from the rules: the updated parameters come back in the planned layout.
    assert got_params["up"]["kernel"].sharding.spec == P(None, "model")
    assert {s.data.shape for s in got_params["down"]["kernel"].addressable_shards} == {(32, 8)}


def test_data_parallel_gradient_mean_over_every_device(mesh42, params, batch):
    """The batch split over both axes by an alias; gradients summed with psum and divided."""
    param_specs = sr.specs(params, RULES, mesh42, group="all_devices")
    batch_specs = sr.specs(batch, RULES, mesh42, group="all_devices")
    assert batch_specs["x"] == P(("data", "model"), None)
    assert all(spec == P(*[None] * len(spec)) for spec in jax.tree.leaves(param_specs))

    def local_grads(p: dict, b: dict) -> dict:
        grads = jax.grad(mse)(p, b)  # the gradient of this device's batch slice
        return jax.tree.map(lambda g: jax.lax.psum(g, ("data", "model")) / 8, grads)

    grads = jax.jit(
        jax.shard_map(
            local_grads,
            mesh=mesh42,
            in_specs=(param_specs, batch_specs),
            out_specs=param_specs,
            # With check_vma=True, JAX itself sums the gradients of replicated inputs over the
            # devices (the psum below would then count them 8 times): here the sum is written by hand.
            check_vma=False,
        )
    )(params, sr.apply(batch, RULES, mesh42, group="all_devices"))
    want = jax.grad(mse)(params, batch)
    for got, expected in zip(jax.tree.leaves(grads), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-4, atol=1e-5)


def test_specs_need_no_devices_for_shard_map(mesh42, params):
    """Specs from a dict of sizes and abstract shapes are the ones the real mesh gets."""
    abstract = jax.eval_shape(lambda: params)
    assert sr.specs(abstract, RULES, {"data": 4, "model": 2}) == sr.specs(params, RULES, mesh42)


# ---------------------------------------------------------------- sr.shard_map


def _local_loss(p: dict, b: dict) -> jax.Array:
    h = jax.nn.relu(b["x"] @ p["up"]["kernel"] + p["up"]["bias"])
    y = jax.lax.psum(h @ p["down"]["kernel"], "model") + p["down"]["bias"]
    return jax.lax.pmean(jnp.mean((y - b["y"]) ** 2), "data")


def _sgd(loss, p: dict, b: dict) -> tuple[dict, jax.Array]:
    value, grads = jax.value_and_grad(loss)(p, b)
    return jax.tree.map(lambda w, g: w - 0.1 * g, p, grads), value


def _meshes() -> list:
    explicit = jax.make_mesh((4, 2), ("data", "model"))
    auto = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    return [explicit, auto]


def test_plain_shard_map_refuses_inputs_not_yet_laid_out_on_explicit_axes(params, batch):
    mesh = _meshes()[0]
    step = jax.shard_map(
        lambda p, b: _sgd(_local_loss, p, b),
        mesh=mesh,
        in_specs=(sr.specs(params, RULES, mesh), sr.specs(batch, RULES, mesh, group="inputs")),
        out_specs=(sr.specs(params, RULES, mesh), P()),
    )
    with pytest.raises(ValueError, match="does not match the specs of the input"):
        step(jax.device_put(params), jax.device_put(batch))


@pytest.mark.parametrize("mesh_index", [0, 1], ids=["explicit", "auto"])
def test_sr_shard_map_takes_its_specs_from_the_rules_and_moves_the_inputs(mesh_index, params, batch):
    mesh = _meshes()[mesh_index]
    step = sr.shard_map(
        lambda p, b: _sgd(_local_loss, p, b),
        RULES,
        mesh,
        in_groups=("params", "inputs"),
        out_groups=("params", None),
    )
    in_specs, out_specs = step.specs(params, batch)
    assert in_specs == (sr.specs(params, RULES, mesh), sr.specs(batch, RULES, mesh, group="inputs"))
    assert out_specs == (sr.specs(params, RULES, mesh), P())
    want_params, want_loss = jax.jit(lambda p, b: _sgd(mse, p, b))(params, batch)
    # NumPy inputs, and arrays laid out otherwise (whole on one device), are moved first
    for p_in, b_in in ((params, batch), (jax.device_put(params), jax.device_put(batch))):
        got_params, got_loss = step(p_in, b_in)
        np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=1e-5)
        for got, want in zip(jax.tree.leaves(got_params), jax.tree.leaves(want_params), strict=True):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
    assert got_params["down"]["kernel"].sharding.spec == P("model", None)
    assert got_params["down"]["kernel"].sharding.mesh == mesh
    again, _ = jax.jit(step)(got_params, batch)  # inside jit, and fed its own outputs
    assert again["up"]["kernel"].sharding.spec == P(None, "model")


def test_sr_shard_map_names_a_lone_array_by_its_parameter_and_checks_the_groups(params):
    mesh = _meshes()[0]
    rules = sr.loads('rules params:\n  "^kernel$" -> (model, _)\n')
    kernel = params["down"]["kernel"]
    total = sr.shard_map(
        lambda kernel: jax.lax.psum(kernel.sum(0), "model"),
        rules,
        mesh,
        in_groups=("params",),
        out_groups=None,
    )
    assert total.specs(kernel) == ((P("model", None),), P())
    np.testing.assert_allclose(np.asarray(total(kernel)), kernel.sum(0), rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError, match="in_groups has 2 entries for 1 arguments"):
        sr.shard_map(lambda k: k, rules, mesh, in_groups=("params", None), out_groups=None)(kernel)


def test_an_output_that_varies_where_its_spec_replicates_is_sr118():
    """JAX's vma check, in our words: the loss is a per-device partial sum, and
    out_groups=None says it is the same on every device."""
    mesh = _meshes()[0]
    rules = sr.loads('rules inputs:\n  "x" -> (data, _)\n')

    def local_sum(x: jax.Array) -> jax.Array:
        return x.sum()

    with pytest.raises(sr.PlanError) as info:
        sr.shard_map(local_sum, rules, mesh, in_groups=("inputs",), out_groups=None)(jnp.ones((8, 4)))
    assert info.value.code == "SR118"
    assert "an output of `local_sum` varies over `data` across devices" in str(info.value)
    assert "jax.lax.psum" in info.value.hint
    fixed = sr.shard_map(
        lambda x: jax.lax.psum(x.sum(), "data"), rules, mesh, in_groups=("inputs",), out_groups=None
    )
    assert float(fixed(jnp.ones((8, 4)))) == 32.0
