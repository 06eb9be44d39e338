"""`sr.specs` as the in_specs/out_specs of `jax.shard_map`, checked against unsharded runs."""

from __future__ import annotations

from typing import Any

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
    explicit = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
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
    refused = r"does not match the specs of the input|enter your `jit` into a mesh"  # JAX 0.8: sooner
    with pytest.raises(ValueError, match=refused):
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
    assert "the output of `local_sum` varies over `data` across devices" in str(info.value)
    assert "its out spec P() (out_groups entry None)" in str(info.value)
    assert "jax.lax.psum(..., 'data')" in info.value.hint and "check_vma=False" in info.value.hint
    fixed = sr.shard_map(
        lambda x: jax.lax.psum(x.sum(), "data"), rules, mesh, in_groups=("inputs",), out_groups=None
    )
    assert float(fixed(jnp.ones((8, 4)))) == 32.0


TP_RULES = sr.loads(
    "rules params:\n"
    '  "up/kernel$"   -> (_, model)\n'
    '  "down/kernel$" -> (model, _)\n'
    "rules inputs:\n"
    '  "^x$" -> (data, _)\n'
    "rules outs:\n"
    '  "^h$" -> (data, _)\n',
    name="tp.shard",
)


def _tp_params() -> dict:
    rng = np.random.default_rng(3)
    return {
        "up": {"kernel": rng.standard_normal((16, 8), np.float32)},
        "down": {"kernel": rng.standard_normal((8, 16), np.float32)},
    }


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_a_sharded_output_that_misses_a_psum_is_sr118(jitted):
    """The out spec from the rules is P('data', None); the row-parallel product
    still holds `model` partial sums. JAX's words for this case differ from the
    P() one ("replicated across mesh axis 'model', but could not infer
    replication over any axes"): both are SR118."""
    mesh = _meshes()[0]
    params, x = _tp_params(), np.ones((8, 16), np.float32)

    def forgot_psum(p: dict, x: jax.Array) -> dict:
        return {"h": (x @ p["up"]["kernel"]) @ p["down"]["kernel"]}

    step = sr.shard_map(forgot_psum, TP_RULES, mesh, in_groups=("params", "inputs"), out_groups="outs")
    assert step.specs(params, x)[1] == {"h": P("data", None)}  # the specs are still there to look at
    with pytest.raises(sr.PlanError) as info:
        (jax.jit(step) if jitted else step)(params, x)
    err = info.value
    assert err.code == "SR118" and len(err.diagnostics) == 1
    assert err.diagnostics[0].message == (
        "output `h` of `forgot_psum` varies over `model` across devices, but its out spec "
        "P('data', None) (group `outs`) does not shard it over `model`: it says every device along "
        "`model` holds the same block"
    )
    assert err.path == "h"
    assert "`jax.lax.psum(..., 'model')`" in err.hint and "pmean" in err.hint
    assert "rule shards it over `model`" in err.hint and "check_vma=False" in err.hint

    def with_psum(p: dict, x: jax.Array) -> dict:
        return {"h": jax.lax.psum((x @ p["up"]["kernel"]) @ p["down"]["kernel"], "model")}

    fixed = sr.shard_map(with_psum, TP_RULES, mesh, in_groups=("params", "inputs"), out_groups="outs")
    got = fixed(params, x)["h"]
    np.testing.assert_allclose(
        np.asarray(got), x @ params["up"]["kernel"] @ params["down"]["kernel"], rtol=1e-4, atol=1e-4
    )
    assert got.sharding.spec == P("data", None)
    unchecked = sr.shard_map(
        forgot_psum, TP_RULES, mesh, in_groups=("params", "inputs"), out_groups="outs", check_vma=False
    )
    assert unchecked(params, x)["h"].shape == (8, 16)  # check_vma=False: no SR118


def test_every_output_of_a_pytree_that_varies_is_named_in_one_sr118():
    mesh = _meshes()[1]
    rules = sr.loads(
        'rules inputs:\n  "^x$" -> (data, model)\nrules outs:\n  "^(a|b)$" -> (_, model)\n  "^c$" -> (data, _)\n'
    )

    def step(x: jax.Array) -> tuple:
        return {"a": x * 2, "b": x + 1, "c": jax.lax.psum(x, "model")}, x.sum()

    with pytest.raises(sr.PlanError) as info:
        sr.shard_map(step, rules, mesh, in_groups=("inputs",), out_groups=("outs", None))(jnp.ones((8, 16)))
    err = info.value
    assert [d.code for d in err.diagnostics] == ["SR118", "SR118"]
    second, first = err.diagnostics  # listed as errors are: those without a leaf path first
    # `a` and `b` vary over `data` for the same reason: one finding naming both
    assert first.message.startswith("output [0] `a` of `step` varies over `data` across devices")
    assert "out spec P(None, 'model') (group `outs`)" in first.message
    assert first.paths == (("a", (2, 16)), ("b", (2, 16)))
    assert "(and 1 more leaf like it: `b` (2, 16))" in str(err)
    assert second.message.startswith("output [1] of `step` varies over `data` and `model` across devices")
    assert "out spec P() (out_groups entry None)" in second.message
    assert "`jax.lax.psum(..., ('data', 'model'))`" in second.hint
    assert "`c`" not in str(err)  # reduced over `model`, sharded over `data`: nothing to say


def test_jax_varying_output_errors_read_as_sr118():
    """Should JAX's own check refuse an output ours let through, its words
    (each wording, eager and under jit, where it lists every output) are SR118."""
    from shardrules._tracing import _shard_map_errors

    mesh = _meshes()[0]
    x = jax.device_put(jnp.ones((8, 4)), jax.NamedSharding(mesh, P("data", "model")))
    cases = [
        (lambda x: {"a": x.sum(), "b": {"c": x * 2}}, {"a": P(), "b": {"c": P(None, "model")}}),
        (lambda x: x.sum(1, keepdims=True), P("data")),
    ]
    found = {}
    for how in ("eager", "jit"):
        for i, (fn, out_specs) in enumerate(cases):
            mapped = jax.shard_map(fn, mesh=mesh, in_specs=P("data", "model"), out_specs=out_specs)
            with pytest.raises(ValueError, match="out_specs") as info:
                (jax.jit(mapped) if how == "jit" else mapped)(x)
            found[how, i] = [(d.code, d.message) for d in _shard_map_errors.from_jax(info.value, "f")]
    tail = "across devices, but its out spec {} (from out_groups) does not shard it over {}: it says every device along {} holds the same block"
    both = "`data` and `model`"
    assert found["jit", 0] == [
        ("SR118", f"output ['a'] of `f` varies over {both} " + tail.format("P()", both, both)),
        (
            "SR118",
            "output ['b']['c'] of `f` varies over `data` "
            + tail.format("P(None, 'model')", "`data`", "`data`"),
        ),
    ]
    # eager, JAX 0.10 to 0.12 name the first output it refuses; JAX 0.8 lists every one, as under jit
    assert found["eager", 0] in (
        [("SR118", f"an output of `f` varies over {both} " + tail.format("P()", both, both))],
        found["jit", 0],
    )
    for how in ("eager", "jit"):
        assert found[how, 1] == [
            (
                "SR118",
                "an output of `f` varies over `model` " + tail.format("P('data',)", "`model`", "`model`"),
            )
        ]
    assert _shard_map_errors.from_jax(ValueError("something else"), "f") == []


def test_a_lone_output_no_rule_matches_is_named_with_its_block_and_how_to_name_it():
    """A lone array output has no path: its group's rules are matched against
    "". The finding shows each device's block (the whole array's shape depends
    on the spec no rule gave), not the block scaled by the whole mesh."""
    mesh = _meshes()[0]
    rules = sr.loads(
        'rules params:\n  "^kernel$" -> (model, _)\nrules outs:\n  "^y$" -> (model, _)\n', name="m.shard"
    )
    kernel = np.ones((8, 6), np.float32)  # each device's block: (4, 6)

    def double(kernel: jax.Array) -> jax.Array:
        return kernel * 2

    with pytest.raises(sr.PlanError) as info:
        sr.shard_map(double, rules, mesh, in_groups=("params",), out_groups="outs")(kernel)
    err = info.value
    assert err.code == "SR105" and len(err.diagnostics) == 1
    assert err.diagnostics[0].message == (
        "the output of `double` (each device's block (4, 6), float32) matches no rule in group `outs` of "
        'm.shard: a lone array output has no path of its own, so the rules were matched against the empty path ""'
    )
    assert "(32, 48)" not in str(err)
    assert '`return {"y": y}`' in err.hint and '"^$"' in err.hint and "`default`" in err.hint
    assert err.span is not None and err.span.line == 3  # at `rules outs:`

    with pytest.raises(sr.PlanError) as info:  # in a tuple: named by its position
        sr.shard_map(
            lambda kernel: (kernel, kernel * 2), rules, mesh, in_groups=("params",), out_groups=(None, "outs")
        )(kernel)
    assert info.value.diagnostics[0].message.startswith(
        "output [1] of `<lambda>` (each device's block (4, 6), float32)"
    )

    with pytest.raises(sr.PlanError) as info:  # a leaf of a dict output: its path, and the block
        sr.shard_map(lambda kernel: {"z": kernel}, rules, mesh, in_groups=("params",), out_groups="outs")(
            kernel
        )
    assert info.value.diagnostics[0].message == (
        "array leaf `z` of the output of `<lambda>` (each device's block (4, 6), float32) matches no rule "
        "in group `outs` of m.shard"
    )

    # the two fixes the hint gives: a name, or a rule for the empty path
    named = sr.shard_map(
        lambda kernel: {"y": kernel * 2}, rules, mesh, in_groups=("params",), out_groups="outs"
    )
    assert named(kernel)["y"].sharding.spec == P("model", None)
    empty = sr.loads('rules params:\n  "^kernel$" -> (model, _)\nrules outs:\n  "^$" -> (model, _)\n')
    lone = sr.shard_map(double, empty, mesh, in_groups=("params",), out_groups="outs")
    assert lone.specs(kernel)[1] == P("model", None)
    np.testing.assert_allclose(np.asarray(lone(kernel)), kernel * 2)


def test_ordinary_mistakes_with_groups_and_meshes_are_clear_type_errors():
    mesh = _meshes()[0]
    rules = sr.loads('rules inputs:\n  "^x$" -> (data, _)\n', name="m.shard")
    x = np.ones((8, 4), np.float32)
    # one group name alone is that group for every argument, as out_groups's is for the whole output
    alone = sr.shard_map(lambda x: x, rules, mesh, in_groups="inputs", out_groups=P("data"))
    assert alone.specs(x)[0] == (P("data", None),)
    with pytest.raises(TypeError, match="one entry per positional argument"):
        sr.shard_map(lambda x: x, rules, mesh, in_groups=P("data"), out_groups=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="in_groups: 3 is not a group: give a group name"):
        sr.shard_map(lambda x: x, rules, mesh, in_groups=(3,), out_groups=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"out_groups: 1\.5 is not a group"):
        sr.shard_map(lambda x: x, rules, mesh, in_groups=(None,), out_groups=(None, 1.5))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"needs a jax\.sharding\.Mesh with devices, got AbstractMesh"):
        sr.shard_map(lambda x: x, rules, mesh.abstract_mesh, in_groups=(None,), out_groups=None)  # type: ignore[arg-type]
    step = sr.shard_map(lambda x: x, rules, mesh, in_groups=("inputs",), out_groups=P("data"))
    with pytest.raises(
        TypeError, match=r"in_groups has 2 entries for 1 arguments: give one entry per positional"
    ):
        sr.shard_map(lambda x: x, rules, mesh, in_groups=("inputs", None), out_groups=None)(x)
    with pytest.raises(TypeError, match=r"pass the arguments of `<lambda>` by position .* not as x="):
        step(x=x)
    with pytest.raises(sr.GroupNotFoundError) as info:
        sr.shard_map(lambda x: x, rules, mesh, in_groups=("input",), out_groups=None)(x)
    assert info.value.code == "SR018" and "inputs" in info.value.hint
    with pytest.raises(sr.PlanError) as info:  # a rule's axis that does not divide
        sr.shard_map(lambda x: x, rules, mesh, in_groups=("inputs",), out_groups=None)(
            np.ones((6, 4), np.float32)
        )
    assert info.value.code == "SR104" and "`x` (shape (6, 4))" in str(info.value)
    # a Python scalar argument is replicated, as jax.shard_map takes it
    scaled = sr.shard_map(lambda x, n: x * n, rules, mesh, in_groups=("inputs", None), out_groups=P("data"))
    np.testing.assert_allclose(np.asarray(scaled(x, 3)), x * 3)


def test_partition_specs_given_in_groups_are_checked_against_the_mesh_and_the_arrays():
    mesh = _meshes()[0]
    rules = sr.loads('rules inputs:\n  "^x$" -> (data, _)\n')
    x = np.ones((6, 4), np.float32)

    def fails(in_groups: tuple, out_groups, arg: Any = x) -> sr.ShardRulesError:
        with pytest.raises(sr.ShardRulesError) as info:
            sr.shard_map(lambda x: x.sum(), rules, mesh, in_groups=in_groups, out_groups=out_groups)(arg)
        return info.value

    err = fails((P("data"),), None)
    assert err.code == "SR104" and isinstance(err, sr.PlanError)
    assert str(err).startswith(
        "SR104 dimension 0 of argument 0 (`x`) of `<lambda>` (shape (6, 4)) has size 6, which does not divide "
        "by 4 (`data`=4) as P('data',) asks"
    )
    with pytest.raises(TypeError, match="is not a group"):  # jax.shard_map's in_specs are not groups
        fails(({"x": P("data")},), None, {"x": np.ones((8, 4), np.float32)})
    err = fails((P("fsdp"),), None)
    assert err.code == "SR101" and isinstance(err, sr.MeshError)
    assert "mesh axis `fsdp` of P('fsdp',) (the in_groups entry for argument 0 (`x`) of `<lambda>`)" in str(
        err
    )
    err = fails((P("data", None, None),), None, np.ones((8, 4), np.float32))
    assert err.code == "SR103" and "has 3 entries but the array has 2 dimensions (shape (8, 4))" in str(err)
    err = fails((P("data", "data"),), None, np.ones((8, 4), np.float32))
    assert err.code == "SR102" and "mesh axis `data` is used twice in P('data', 'data')" in str(err)
    err = fails((None,), P("data"))  # the output is a scalar
    assert err.code == "SR103" and "the out_groups entry for the output of `<lambda>`" in str(err)
    assert err.hint == "a scalar takes P()"
    err = fails((None,), P(None, "fsdp"))
    assert err.code == "SR101" and "(the out_groups entry for the output of `<lambda>`)" in str(err)
