"""`step.cost`: per-device FLOPs, memory and collectives of a compiled step
against the one-device ideal; `step.compare`: the step on its mesh against
the same step on one device."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules._costs._cost import collectives
from shardrules._costs._opnames import scope_of

S = jax.ShapeDtypeStruct
PARAMS = {"up": S((64, 256), jnp.float32), "down": S((256, 64), jnp.float32)}
BATCH = {"x": S((64, 64), jnp.float32)}


def loss(params, batch):
    with jax.named_scope("up"):
        h = jax.nn.gelu(batch["x"] @ params["up"])
    with jax.named_scope("down"):
        return jnp.mean((h @ params["down"]) ** 2)


def sgd(params, batch):
    grads = jax.grad(loss)(params, batch)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def _step(text: str, kind=AxisType.Explicit, shape=(8,), names=("data",)):
    mesh = jax.make_mesh(shape, names, axis_types=(kind,) * len(names))
    return sr.jit(
        sgd, sr.loads(text, name="c.shard"), mesh, in_groups=("params", "inputs"), out_groups="params"
    )


DP = 'rules params:\n  default -> replicated\nrules inputs:\n  "x" -> (data, _)\n'
REPLICATED = "rules params:\n  default -> replicated\nrules inputs:\n  default -> replicated\n"


@pytest.mark.parametrize("kind", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])
def test_data_parallelism_does_its_share(kind):
    cost = _step(DP, kind).cost(PARAMS, BATCH)
    assert cost.devices == 8
    assert 0.95 <= cost.ratio <= 1.10, cost
    assert cost.ideal_flops_per_device * 8 == pytest.approx(
        _step(DP).cost(PARAMS, BATCH).ideal_flops_per_device * 8
    )
    (reduce,) = [c for c in cost.collectives if c.kind == "all-reduce"]
    # the gradients of both weights are summed over the batch's devices: 2 * 64 * 256 floats at least
    assert reduce.bytes_per_device >= 2 * 64 * 256 * 4
    assert any(s.endswith("(backward)") for s in reduce.scopes), reduce.scopes


def test_a_replicated_layout_costs_every_device_the_whole_step():
    cost = _step(REPLICATED).cost(PARAMS, BATCH)
    assert cost.ratio == pytest.approx(8.0, rel=0.05), cost
    assert cost.collectives == ()
    assert "collectives: none" in str(cost) and "8.00x the ideal" in str(cost)


def test_sharded_parameters_hold_their_share_of_memory():
    fsdp = 'rules params:\n  "up" -> (data, _)\n  "down" -> (_, data)\nrules inputs:\n  "x" -> (data, _)\n'
    whole = (64 * 256 * 2 + 64 * 64) * 4
    sharded, replicated = _step(fsdp).cost(PARAMS, BATCH), _step(REPLICATED).cost(PARAMS, BATCH)
    assert sharded.argument_bytes_per_device == whole // 8
    assert replicated.argument_bytes_per_device == whole
    assert sharded.peak_bytes_per_device < replicated.peak_bytes_per_device
    assert {c.kind for c in sharded.collectives} >= {"all-gather"}  # FSDP gathers its weights
    assert sharded.to_json()["ratio"] == sharded.ratio


def test_cost_allocates_nothing_and_takes_arrays_too():
    step = _step(DP)
    rng = np.random.default_rng(0)
    arrays = jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(np.float32), (PARAMS, BATCH))
    assert step.cost(*arrays).flops_per_device == step.cost(PARAMS, BATCH).flops_per_device


def test_compare_shows_the_layout_did_not_change_the_math():
    step = _step('rules params:\n  "up" -> (_, model)\n  "down" -> (model, _)\nrules inputs:\n  "x" -> (data, _)\n',
                 shape=(4, 2), names=("data", "model"))  # fmt: skip
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(np.float32), PARAMS)
    batch = jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(np.float32), BATCH)
    result = step.compare(params, batch, rtol=1e-4, atol=1e-5)
    assert result.ok, result
    assert {leaf.path for leaf in result.leaves} == {"up", "down"}
    assert result.worst is not None and result.worst.max_abs < 1e-4


def test_compare_catches_a_kernel_that_changes_the_math():
    rules = sr.loads('rules inputs:\n  "x" -> (data, _)\n', name="k.shard")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    # a per-device sum that forgets its psum: right on one device, wrong on eight
    partial = sr.shard_map(
        lambda b: {"s": jnp.sum(b["x"])}, rules, in_groups=("inputs",), out_groups=P(), check_vma=False
    )
    step = sr.jit(lambda b: partial(b)["s"], rules, mesh, in_groups=("inputs",))
    result = step.compare({"x": np.ones((16, 4), np.float32)})
    assert not result.ok and "DIFFERENT" in str(result)
    (leaf,) = result.leaves
    assert leaf.max_abs == pytest.approx(64 - 8)


def test_compare_counts_the_arrays_that_differ_among_those_compared():
    """`str(result)` says how many output arrays differ of how many were
    compared, and names them; `different` holds them."""
    rules = sr.loads('rules inputs:\n  "x" -> (data, _)\n', name="k.shard")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    sums = sr.shard_map(  # `forgot` misses its psum: right on one device, wrong on eight
        lambda b: {"forgot": jnp.sum(b["x"]), "summed": jax.lax.psum(jnp.sum(b["x"]), "data")},
        rules,
        in_groups=("inputs",),
        out_groups=P(),
        check_vma=False,
    )
    step = sr.jit(lambda b: {**sums(b), "x": b["x"] * 2, "y": b["x"] + 1}, rules, mesh, in_groups=("inputs",))
    result = step.compare({"x": np.ones((16, 4), np.float32)})
    assert [leaf.path for leaf in result.different] == ["forgot"], result
    assert "DIFFERENT on the mesh and on one device" in str(result)
    assert "1 of 4 output arrays compared differ (`forgot`)" in str(result), result
    assert "largest difference at `forgot`" in str(result)
    same = step.compare({"x": np.ones((16, 4), np.float32)}, rtol=1, atol=100)
    assert same.ok and same.different == () and ": 4 output arrays compared; largest" in str(same), same


def sgd_at(params, batch, extra):
    """`sgd` with an argument that no group lays out: a learning rate, and a mask on `up`'s gradient."""
    grads = jax.grad(loss)(params, batch)
    grads = {**grads, "up": grads["up"] * extra["mask"]}
    return jax.tree.map(lambda p, g: p - extra["lr"] * g, params, grads)


TP = 'mesh data=4, model=2\nrules params:\n  "up" -> (_, model)\n  "down" -> (model, _)\nrules inputs:\n  "x" -> (data, _)\n'


@pytest.mark.parametrize("ambient", [False, True], ids=["", "inside-set_mesh"])
@pytest.mark.parametrize("given", ["numpy", "placed"])
@pytest.mark.parametrize("kind", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])
def test_compare_takes_arguments_with_and_without_a_group_however_they_are_given(kind, given, ambient):
    """The one-device run gets every argument leaf as a plain value on its
    device: arrays placed on the step's mesh (by `sr.apply`, or laid out
    there with no group) as well as NumPy arrays, inside `jax.set_mesh` too."""
    rules = sr.loads(TP, name="tp.shard")
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind,) * 2)
    step = sr.jit(sgd_at, rules, mesh, in_groups=("params", "inputs", None), out_groups="params")
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(np.float32), PARAMS)
    batch = jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(np.float32), BATCH)
    extra = {"lr": np.float32(0.1), "mask": (rng.random((64, 256)) > 0.5).astype(np.float32)}
    if given == "placed":
        params = sr.apply(params, rules, mesh, group="params")
        batch = sr.apply(batch, rules, mesh, group="inputs")
        extra = {
            "lr": jax.device_put(extra["lr"], NamedSharding(mesh, P())),
            "mask": jax.device_put(extra["mask"], NamedSharding(mesh, P(None, "model"))),
        }
    with jax.set_mesh(mesh) if ambient else contextlib.nullcontext():
        result = step.compare(params, batch, extra, rtol=1e-4, atol=1e-5)
    assert result.ok, result
    assert {leaf.path for leaf in result.leaves} == {"up", "down"}
    assert result.worst is not None and result.worst.max_abs < 1e-4
    assert isinstance(extra["mask"], np.ndarray) or extra["mask"].sharding.mesh == mesh  # moved, not changed


@pytest.mark.parametrize("kind", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])
def test_cost_inside_set_mesh_compiles_the_one_device_step_on_its_own_mesh(kind):
    step = _step(DP, kind)
    with jax.set_mesh(step.mesh):
        cost = step.cost(PARAMS, BATCH)
    assert cost.ratio is not None and 0.95 <= cost.ratio <= 1.10, cost
    assert cost.ideal_flops_per_device == pytest.approx(
        _step(DP, kind).cost(PARAMS, BATCH).ideal_flops_per_device
    )


def test_scopes_of_hlo_op_names():
    assert scope_of("jit(sgd)/jvp(block_0/down)/dot_general") == ["block_0/down"]
    assert scope_of("jit(sgd)/transpose(jvp(down))/dot_general") == ["down (backward)"]
    assert scope_of("jit(f)/(transpose(jvp(a))/dot_general:jvp(b/c)/mul)") == ["a (backward)", "b/c"]
    assert scope_of("jit(f)/add") == [""]
    # what JAX's loops and calls add is not a scope of the model's
    body = "jit(step)/transpose(jvp(layers))/while/body/closed_call/attn/ctx/dot_general"
    assert scope_of(body) == ["layers/attn/ctx (backward)"]
    assert scope_of("jit(f)/cond/branch_1_fun/mlp/add") == ["mlp"]
    assert scope_of("jit(f)/while/cond/lt") == [""]
    assert scope_of("jit(f)/while/mlp/add") == ["while/mlp"]  # a scope named `while`, not a loop's


def test_collectives_from_hlo_text():
    hlo = "\n".join(
        [
            '%ag = bf16[64,16]{1,0} all-gather(%p), dimensions={0}, metadata={op_name="jit(f)/jvp(up)/dot_general"}',
            '%ar = (f32[16,32]{1,0}, f32[32]{0}) all-reduce(%a, %b), to_apply=%add, metadata={op_name="jit(f)/x"}',
            "%rs = f32[8]{0} reduce-scatter(%c), dimensions={0}",
            "%ags = (f32[4]{0}, f32[32]{0}) all-gather-start(%d), dimensions={0}",
            "%agd = f32[32]{0} all-gather-done(%ags)",
        ]
    )
    found = {c.kind: c for c in collectives(hlo)}
    assert found["all-gather"].count == 2 and found["all-gather"].bytes_per_device == 64 * 16 * 2 + 32 * 4
    assert found["all-gather"].scopes == ("up",)
    assert found["all-reduce"].bytes_per_device == (16 * 32 + 32) * 4
    assert found["reduce-scatter"].count == 1 and "all-to-all" not in found


def test_collectives_of_long_tuples_are_counted_whole():
    """XLA numbers the elements of long tuple types in comments (`/*index=5*/`)."""
    six = ", ".join(["f32[4]{0}"] * 5) + ", /*index=5*/f32[4]{0}"
    (found,) = collectives(f"%ar = ({six}) all-reduce(%a, %b, %c, %d, %e, %f), to_apply=%add")
    assert (found.kind, found.count, found.bytes_per_device) == ("all-reduce", 1, 6 * 16)


def _held_mesh_step(kind: AxisType, scanned: bool, held: bool):
    """A step whose model states a layout on the mesh it holds (as MaxText's
    does): a constraint on the 8-device mesh itself, which the one-device
    compile of the ideal cannot take. `scanned`: its layers in a `scan`."""
    mesh = jax.make_mesh((8,), ("data",), axis_types=(kind,))
    state = NamedSharding(mesh, P("data", None))

    def model_loss(params, batch):
        def layer(h, w):
            h = jnp.tanh(h @ w)
            if held:  # the model's own layout, on the mesh it holds
                h = jax.lax.with_sharding_constraint(h, state)
            return h, None

        ws = jnp.stack([params["up"][:, :64], params["up"][:, 64:128], params["up"][:, 128:192]])
        h = batch["x"]
        if scanned:
            h, _ = jax.lax.scan(layer, h, ws)
        else:
            for w in ws:
                h, _ = layer(h, w)
        return jnp.mean((h @ params["down"][:64]) ** 2)

    def step(params, batch):
        grads = jax.grad(model_loss)(params, batch)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    return sr.jit(
        step, sr.loads(DP, name="c.shard"), mesh, in_groups=("params", "inputs"), out_groups="params"
    )


@pytest.mark.parametrize("scanned", [False, True], ids=["layers", "scan"])
def test_a_model_holding_its_own_mesh_gets_the_ideal_before_partitioning(scanned):
    """Where the step does not compile for one device, the ideal is its
    program's FLOPs before XLA partitions it (each loop counted per trip):
    within 2% of the one-device ideal of the same step without the held
    layout, and said in the notes."""
    kind = AxisType.Auto
    cost = _held_mesh_step(kind, scanned, held=True).cost(PARAMS, BATCH)
    assert any("before XLA partitions it" in note for note in cost.notes), cost.notes
    reference = _held_mesh_step(kind, scanned, held=False).cost(PARAMS, BATCH)
    assert not reference.notes
    assert cost.ideal_flops_per_device == pytest.approx(reference.ideal_flops_per_device, rel=0.02)
    assert cost.ratio == pytest.approx(cost.flops_per_device / cost.ideal_flops_per_device)
