"""torchax: a torch.nn.Module on the `jax` device, sharded through its state_dict."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr

torch = pytest.importorskip("torch")
try:
    import torchax
    import torchax.interop
except ImportError as err:  # pragma: no cover - depends on the environment
    pytest.skip(f"torchax is not installed: {err}", allow_module_level=True)
except AttributeError as err:  # pragma: no cover - torchax releases that predate this torch
    pytest.skip(
        f"this torchax release does not import with torch {torch.__version__}: {err}",
        allow_module_level=True,
    )

RULES = sr.loads(
    "mesh batch, model\n"
    "rules params:\n"
    '  "layers\\.1\\.(weight|bias)$" -> (model, ...)   # column parallel\n'
    '  "layers\\.2\\.weight$"        -> (_, model)     # row parallel\n'
    "  default                     -> replicated\n"
    "rules inputs:\n"
    '  "."                         -> (batch, _)\n',
    name="torchax.shard",
)


class MLP(torch.nn.Module):
    def __init__(self, sizes: list[int]):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in itertools.pairwise(sizes))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


@pytest.fixture
def env():
    environment = torchax.default_env()
    with environment:
        yield environment


@pytest.fixture
def model(env):
    torch.manual_seed(0)
    m = MLP([16, 32, 32, 8])
    m.to("jax")
    return m


@pytest.fixture
def mesh():
    return jax.make_mesh((4, 2), ("batch", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def numpy_state(state) -> dict[str, np.ndarray]:
    return {k: np.asarray(v.jax()) for k, v in state.items()}


def test_apply_returns_torchax_tensors_of_the_same_env_holding_sharded_arrays(model, mesh, env):
    state = model.state_dict()
    before = numpy_state(state)
    sharded = sr.apply(state, RULES, mesh)
    assert list(sharded) == list(state)  # same keys, same order
    for name, tensor in sharded.items():
        assert isinstance(tensor, torchax.tensor.Tensor), name
        assert tensor._env is state[name]._env
        assert isinstance(tensor.jax(), jax.Array)
        np.testing.assert_array_equal(np.asarray(tensor.jax()), before[name])
    assert sharded["layers.1.weight"].jax().sharding == NamedSharding(mesh, P("model", None))
    assert sharded["layers.1.bias"].jax().sharding == NamedSharding(mesh, P("model"))
    assert sharded["layers.2.weight"].jax().sharding == NamedSharding(mesh, P(None, "model"))
    assert sharded["layers.0.weight"].jax().sharding.is_fully_replicated
    shards = {s.data.shape for s in sharded["layers.1.weight"].jax().addressable_shards}
    assert shards == {(16, 32)}  # (32, 32) split in two along dim 0


def test_load_state_dict_assign_then_forward_matches_the_unsharded_model(model, mesh, env):
    x = torch.randn(8, 16, device="jax")
    want = np.asarray(model(x).jax())
    model.load_state_dict(sr.apply(model.state_dict(), RULES, mesh), assign=True)
    assert model.layers[1].weight.jax().sharding.spec == P("model", None)
    xs = sr.apply({"x": x}, RULES, mesh, group="inputs")["x"]
    assert xs.jax().sharding.spec == P("batch", None)
    got = model(xs)
    np.testing.assert_allclose(np.asarray(got.jax()), want, rtol=1e-5, atol=1e-6)


def test_specs_shardings_and_plan_accept_torchax_tensors(model, mesh):
    state = model.state_dict()
    specs = sr.specs(state, RULES, mesh)
    assert specs == {
        "layers.0.weight": P(None, None),
        "layers.0.bias": P(None),
        "layers.1.weight": P("model", None),
        "layers.1.bias": P("model"),
        "layers.2.weight": P(None, "model"),
        "layers.2.bias": P(None),
    }
    shardings = sr.shardings(state, RULES, mesh)
    assert shardings["layers.2.weight"] == NamedSharding(mesh, P(None, "model"))
    plan = sr.plan(state, RULES, mesh)
    assert plan.ok, plan.errors
    by_path = {leaf.path: leaf for leaf in plan.leaves}
    assert by_path["layers.1.weight"].shape == (32, 32)
    assert by_path["layers.1.weight"].dtype == np.float32
    assert by_path["layers.1.weight"].bytes_per_device == 16 * 32 * 4


def test_plain_torch_tensors_can_be_planned_but_not_applied(mesh):
    cpu = MLP([16, 32, 32, 8])  # still on the cpu device
    state = cpu.state_dict()
    assert sr.specs(state, RULES, mesh)["layers.1.weight"] == P("model", None)
    with pytest.raises(TypeError) as info:
        sr.apply(state, RULES, mesh)
    message = str(info.value)
    assert "layers.1.weight" in message and "model.to('jax')" in message and "shardrules[torchax]" in message


def test_plain_torch_bfloat16_plans_with_its_dtype(mesh):
    state = {"layers.1.weight": torch.zeros(32, 16, dtype=torch.bfloat16)}
    leaf = sr.plan(state, RULES, mesh).leaves[0]
    assert leaf.dtype == jax.numpy.bfloat16
    assert leaf.bytes_per_device == 16 * 16 * 2


def test_data_parallel_training_step_matches_the_unsharded_one(model, mesh, env):
    """The 4-way data × 2-way tensor parallel step gives the unsharded loss and gradients."""
    x = torch.randn(16, 16, device="jax")
    y = torch.randn(16, 8, device="jax")

    def loss_fn(params, batch):
        inputs, labels = batch
        out = torch.func.functional_call(model, params, (inputs,))
        return torch.nn.functional.mse_loss(out, labels)

    step = torchax.interop.jax_jit(torchax.interop.jax_value_and_grad(loss_fn))
    state = dict(model.state_dict())
    want_loss, want_grads = step(state, (x, y))

    params = sr.apply(state, RULES, mesh)
    batch = sr.apply((x, y), RULES, mesh, group="inputs")
    loss, grads = step(params, batch)
    np.testing.assert_allclose(float(loss.jax()), float(want_loss.jax()), rtol=1e-5)
    for name in state:
        np.testing.assert_allclose(
            np.asarray(grads[name].jax()), np.asarray(want_grads[name].jax()), rtol=1e-4, atol=1e-6
        )
    assert params["layers.1.weight"].jax().sharding.spec == P("model", None)
    assert batch[0].jax().sharding.spec == P("batch", None)


def test_apply_inside_a_torchax_jitted_function_pins_the_layout(model, mesh, env):
    transposed = sr.loads(
        'rules params:\n  "layers\\.2\\.weight$" -> (_, batch)\n  default -> replicated\n', name="t.shard"
    )
    state = sr.apply(model.state_dict(), RULES, mesh)  # committed to the whole mesh

    def relayout(params):
        return sr.apply(params, transposed, mesh)

    out = torchax.interop.jax_jit(relayout)(state)
    assert isinstance(out["layers.2.weight"], torchax.tensor.Tensor)
    assert out["layers.2.weight"].jax().sharding.spec == P(None, "batch")
    np.testing.assert_array_equal(
        np.asarray(out["layers.2.weight"].jax()), numpy_state(state)["layers.2.weight"]
    )


def test_trees_without_torch_tensors_pass_through_untouched():
    from shardrules._interop._torchax import to_jax

    tree = {"w": np.zeros((4, 4))}
    same, restore = to_jax(tree)
    assert same is tree and restore is None


def test_trees_jax_cannot_flatten_still_get_the_tree_error_with_torch_imported(mesh):
    with pytest.raises(sr.TreeError, match="SR109"):
        sr.specs({1: np.zeros(4), "a": np.zeros(4)}, RULES, mesh)


def test_check_reports_on_torchax_leaves(model, mesh):
    assert sr.check(model.state_dict(), RULES, mesh) == []
    odd = sr.loads('rules params:\n  "layers\\.2\\.weight$" -> (model, _)\n  default -> replicated\n')
    (found,) = [d for d in sr.check(model.state_dict(), odd, {"model": 3}) if d.severity == "error"]
    assert found.code == "SR104" and found.path == "layers.2.weight"  # (8, 32): 8 rows over 3
