"""What a layout costs, layout against layout: tensor parallelism's all-reduce
named by the row-parallel layer it comes from, every collective of a compiled
step counted with its size, a FLOPs budget in `lint` that a replicated layout
breaks and a data-parallel one keeps, and `examples/transformer`'s train step
computing on its mesh what it computes on one device."""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import sys
from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType

import shardrules as sr
from shardrules._cli._main import main

REPO = Path(__file__).resolve().parent.parent

STEP = """\
import jax
import jax.numpy as jnp
import jax.numpy as jnp

import shardrules as sr

S = jax.ShapeDtypeStruct


def forward(params, x):
    for i, p in enumerate(params):
        with jax.named_scope(f"layer_{i}"):
            with jax.named_scope("up"):
                h = jax.nn.gelu(x @ p["up"])
            with jax.named_scope("down"):
                x = x + h @ p["down"]
    return x


def sgd(params, batch):
    loss_fn = lambda p: jnp.mean((forward(p, batch["x"]) - batch["y"]) ** 2)
    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def shapes():
    params = [{"up": S((64, 256), jnp.float32), "down": S((256, 64), jnp.float32)} for _ in range(2)]
    batch = {"x": S((32, 64), jnp.float32), "y": S((32, 64), jnp.float32)}
    return params, batch


def check_step(rules, mesh):
    return sr.jit(sgd, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None)), shapes()
"""

# the same step, imported here as the CLI imports it from its folder
_namespace: dict = {}
exec(compile(STEP, "<step>", "exec"), _namespace)
SGD, SHAPES = _namespace["sgd"], _namespace["shapes"]

TENSOR_PARALLEL = """\
mesh data=4, model=2

rules params:
  "up$"   -> (_, model)  # column-parallel
  "down$" -> (model, _)  # row-parallel: each device holds a partial sum of the output

rules inputs:
  "x|y" -> (data, _)
"""

DATA_PARALLEL = """\
mesh data=8

rules params:
  default -> replicated

rules inputs:
  "x|y" -> (data, _)
"""

REPLICATED = """\
mesh data=8

rules params:
  default -> replicated

rules inputs:
  default -> replicated
"""


def _cost(text: str, shape: tuple[int, ...], names: tuple[str, ...]) -> sr.StepCost:
    mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Explicit,) * len(names))
    rules = sr.loads(text, name="layout.shard")
    step = sr.jit(SGD, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    return step.cost(*SHAPES())


def _sums(cost: sr.StepCost) -> set[str]:
    """The scopes of the all-reduces and reduce-scatters in `cost`."""
    return {s for c in cost.collectives if c.kind in ("all-reduce", "reduce-scatter") for s in c.scopes}


def test_tensor_parallelism_sums_the_row_parallel_layers_partial_outputs() -> None:
    tp = _cost(TENSOR_PARALLEL, (4, 2), ("data", "model"))
    # the forward pass of each row-parallel layer ends in a sum over `model`, named by its scope
    assert {"layer_0/down", "layer_1/down"} <= _sums(tp), tp
    assert tp.ratio is not None and tp.ratio < 1.2, tp  # both matmuls split 8 ways
    # data parallelism sums only gradients: no forward scope among its sums
    dp = _cost(DATA_PARALLEL, (8,), ("data",))
    assert _sums(dp) and all(s.endswith(" (backward)") for s in _sums(dp)), dp
    assert "layer_0/down (backward)" in _sums(dp)
    # the sums are counted with their sizes: at least each layer's (32, 64) output, over 4 data devices
    (reduce,) = [c for c in tp.collectives if c.kind == "all-reduce"]
    assert reduce.count >= 2 and reduce.bytes_per_device >= 2 * (32 // 4) * 64 * 4


def test_every_collective_of_the_compiled_step_is_counted_with_its_size() -> None:
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    rules = sr.loads(DATA_PARALLEL, name="dp.shard")
    step = sr.jit(SGD, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    params, batch = SHAPES()
    params = params + params[:1]  # three layers: six gradients, summed by one combined all-reduce
    cost = step.cost(params, batch)
    hlo = step.lower(params, batch).compile().as_text()
    kinds = "|".join(("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute"))
    in_hlo = Counter(re.findall(rf"\b({kinds})(?:-start)?\(", hlo))
    assert {c.kind: c.count for c in cost.collectives} == dict(in_hlo), cost
    (reduce,) = [c for c in cost.collectives if c.kind == "all-reduce"]
    assert reduce.bytes_per_device >= 3 * 2 * 64 * 256 * 4  # every gradient, whole on each device


_names = itertools.count()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A folder with the two rule files and a module of steps (a fresh module
    name each time, so that no test sees another's import), as the current folder."""
    module = f"layout_steps_{next(_names)}"
    (tmp_path / "replicated.shard").write_text(REPLICATED)
    (tmp_path / "dp.shard").write_text(DATA_PARALLEL)
    (tmp_path / f"{module}.py").write_text(STEP)
    monkeypatch.chdir(tmp_path)
    return tmp_path, module


def _lint(capsys: pytest.CaptureFixture[str], rules: str, module: str, ratio: str) -> tuple[int, list[dict]]:
    argv = ["lint", rules, "--step", f"{module}:check_step", "--max-flops-ratio", ratio]
    # every parameter is replicated on purpose in both files: not what is under test (SR116)
    code = main([*argv, "--replicated-tolerance", "100%", "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def test_a_flops_budget_fails_a_replicated_layout_and_passes_data_parallelism(project, capsys) -> None:
    _, module = project
    code, found = _lint(capsys, "replicated.shard", module, "1.2")
    assert code == 1, found
    (over,) = [f for f in found if f["code"] == "SR122"]
    assert over["severity"] == "error" and "x the ideal FLOPs per device (at most 1.2" in over["message"]
    assert [f for f in found if f["severity"] == "error"] == [over]  # the budget alone fails the run
    # the hint names the computations every device runs whole, not the collectives (they add no FLOPs)
    named = re.findall(r"`(layer_\d/(?:up|down))` \(with its gradient: dot_general[^)]*\): computed whole on each "
                       r"of the 8 devices", over["hint"])  # fmt: skip
    assert len(named) == 3, over  # the three costliest, each a layer
    assert "all-reduce" not in over["hint"] and "collective" not in over["hint"], over
    code, found = _lint(capsys, "dp.shard", module, "1.2")
    assert code == 0 and [f for f in found if f["code"] == "SR122"] == [], found


def test_the_computations_run_repeated_are_named_by_scope() -> None:
    """`StepCost.repeated`: the scopes whose devices compute more than their
    share, read off the compiled programs (layout against layout)."""
    layers = {f"layer_{i}/{m}" for i in range(2) for m in ("up", "down")}
    # every device computes every layer whole: each layer is repeated 8 times, forward and backward
    replicated = _cost(REPLICATED, (8,), ("data",))
    whole = {r.scope: r for r in replicated.repeated}
    assert layers <= set(whole), replicated.repeated
    for scope in layers:
        assert whole[scope].passes == ("forward", "backward") and 7.5 < whole[scope].times < 8.5, whole[scope]
        assert "dot_general" in whole[scope].operations
    # split over both axes, no layer is repeated (the loss and the update may be)
    tp = _cost(TENSOR_PARALLEL, (4, 2), ("data", "model"))
    assert not layers & {r.scope for r in tp.repeated}, tp.repeated
    # the batch replicated over `data`: each layer is computed 4 times (split over `model` alone)
    tp_whole_batch = TENSOR_PARALLEL.replace('"x|y" -> (data, _)', "default -> replicated")
    four = {r.scope: r for r in _cost(tp_whole_batch, (4, 2), ("data", "model")).repeated}
    assert layers <= set(four) and all(3.5 < four[s].times < 4.5 for s in layers), four
    # what the repeated scopes add up to is what XLA counts beyond the ideal
    excess = sum(r.flops_per_device - r.share for r in replicated.repeated)
    assert replicated.ideal_flops_per_device is not None
    over = replicated.flops_per_device - replicated.ideal_flops_per_device
    assert 0.9 * over < excess < 1.1 * over, (excess, over)
    # not a figure plan files keep
    assert "repeated" not in replicated.to_json()


def test_flops_by_scope_counts_a_dot_by_its_contracted_size() -> None:
    from shardrules._costs._flops import by_scope

    hlo = """\
ENTRY %main (a: f32[8,64], b: f32[64,32]) -> f32[8,32] {
  %a = f32[8,64]{1,0} parameter(0)
  %b = f32[64,32]{1,0} parameter(1)
  %dot.1 = f32[8,32]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(f)/mlp/dot_general"}
  %all-reduce = f32[8,32]{1,0} all-reduce(%dot.1), replica_groups={}, to_apply=%add, metadata={op_name="jit(f)/mlp/dot_general"}
  ROOT %t = f32[8,32]{1,0} tanh(%all-reduce), metadata={op_name="jit(f)/transpose(jvp(mlp))/tanh"}
}
"""
    assert by_scope(hlo) == {"mlp": {"dot_general": 2 * 8 * 32 * 64}, "mlp (backward)": {"tanh": 8 * 32}}
    # fused computations reuse their parameters' names with other shapes: each dot reads its own
    fused = """\
%fused_computation (param_0: f32[8,64], param_1: f32[64,32]) -> f32[8,32] {
  %param_0 = f32[8,64]{1,0} parameter(0)
  %param_1 = f32[64,32]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,32]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(f)/up/dot_general"}
}

%fused_computation.1 (param_0: f32[8,4], param_1: f32[4,32]) -> f32[8,32] {
  %param_0 = f32[8,4]{1,0} parameter(0)
  %param_1 = f32[4,32]{1,0} parameter(1)
  ROOT %dot.2 = f32[8,32]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(f)/down/dot_general"}
}

ENTRY %main (a: f32[8,64], b: f32[64,32]) -> f32[8,32] {
  %a = f32[8,64]{1,0} parameter(0)
  ROOT %f = f32[8,32]{1,0} fusion(%a, %b), kind=kOutput, calls=%fused_computation, metadata={op_name="jit(f)/up/dot_general"}
}
"""
    assert by_scope(fused) == {
        "up": {"dot_general": 2 * 8 * 32 * 64},
        "down": {"dot_general": 2 * 8 * 32 * 4},
    }


def test_flops_by_scope_counts_a_loop_body_once_per_trip() -> None:
    """A `scan` over layers runs its body once per layer: its FLOPs count
    that many times (XLA's own cost analysis counts the body once)."""
    from shardrules._costs._flops import by_scope

    def stack(w, x):
        def body(h, wi):
            with jax.named_scope("layer"):
                return jnp.tanh(h @ wi), None

        return jax.lax.scan(body, x, w)[0].sum()

    layers, hidden, rows = 6, 64, 16
    hlo = (
        jax.jit(stack).lower(jnp.ones((layers, hidden, hidden)), jnp.ones((rows, hidden))).compile().as_text()
    )
    found = by_scope(hlo)
    dots = sum(per.get("dot_general", 0.0) for scope, per in found.items() if "layer" in scope)
    assert dots == layers * 2 * rows * hidden * hidden, found
    # a fusion called from the body runs as often as the body; a while with no known count runs once
    written = """\
%fused (p: f32[8,4], q: f32[4,2]) -> f32[8,2] {
  %p = f32[8,4]{1,0} parameter(0)
  %q = f32[4,2]{1,0} parameter(1)
  ROOT %d = f32[8,2]{1,0} dot(%p, %q), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(f)/up/dot_general"}
}

%body (t: (f32[8,4], f32[4,2])) -> (f32[8,4], f32[4,2]) {
  %f = f32[8,2]{1,0} fusion(%a, %b), kind=kOutput, calls=%fused, metadata={op_name="jit(f)/up/dot_general"}
  ROOT %e = f32[8,2]{1,0} exponential(%f), metadata={op_name="jit(f)/act/exp"}
}

%cond (t: (f32[8,4], f32[4,2])) -> pred[] {
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: f32[8,4], b: f32[4,2]) -> f32[8,2] {
  %w = (f32[8,4], f32[4,2]) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  %v = (f32[8,4], f32[4,2]) while(%t), condition=%cond, body=%body
}
"""
    assert by_scope(written) == {"up": {"dot_general": 6 * 2 * 8 * 2 * 4}, "act": {"exp": 6 * 8 * 2}}


def _transformer():
    """`examples/transformer`'s model as `benchmarks/_models.py` builds it."""
    name = "_benchmark_models"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / "_models.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name].transformer()


def test_the_example_transformer_computes_on_its_mesh_what_it_computes_on_one_device() -> None:
    model = _transformer()
    mesh = jax.make_mesh(model.shape, model.axes, axis_types=(AxisType.Explicit,) * len(model.axes))
    step = sr.jit(model.step, model.rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    result = step.compare(model.params, model.batch, rtol=1e-4, atol=1e-5)
    assert result.ok, result
    leaves = {leaf.path: leaf for leaf in result.leaves}
    # every new parameter and the loss: (params, loss) flattened
    assert len(leaves) == len(jax.tree.leaves(model.params)) + 1
    assert "0/blocks/1/mlp/down/kernel" in leaves and leaves["0/blocks/1/mlp/down/kernel"].shape == (256, 64)
    assert result.worst is not None and result.worst.max_abs < 1e-4
