"""`lint --step`, `explain --step` and a step's `traced`, `decisions` and
`scopes` trace the step once: the output's shapes that `out_groups` are
planned for come from that trace, not from a `jax.eval_shape` of their own.
Each step here counts the runs of its Python body."""

from __future__ import annotations

import importlib
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType

import shardrules as sr
from shardrules._cli._main import main

RULES = """\
mesh data=4, model=2

rules params:
  "up$"   -> (_, model)
  "down$" -> (model, _)

rules activations:
  "up$" -> (data, model)

rules inputs:
  "x|y" -> (data, _)
"""

STEP = """\
import jax
import jax.numpy as jnp

import shardrules as sr

CALLS = 0


def sgd(params, batch):
    global CALLS
    CALLS += 1
    def loss_fn(p):
        with jax.named_scope("up"):
            h = jax.nn.gelu(batch["x"] @ p["up"])
        with jax.named_scope("down"):
            return jnp.mean((h @ p["down"] - batch["y"]) ** 2)
    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def shapes():
    S = jax.ShapeDtypeStruct
    params = {"up": S((16, 64), jnp.float32), "down": S((64, 16), jnp.float32)}
    batch = {"x": S((32, 16), jnp.float32), "y": S((32, 16), jnp.float32)}
    return params, batch


def plain(rules, mesh):
    return sr.jit(sgd, rules, mesh, in_groups=("params", "inputs")), shapes()


def with_out_groups(rules, mesh):
    return sr.jit(sgd, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None)), shapes()


def out_groups_swapped(rules, mesh):
    return sr.jit(sgd, rules, mesh, in_groups=("params", "inputs"), out_groups=("inputs", None)), shapes()
"""

_names = itertools.count()


@pytest.fixture
def steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Any]]:
    """tp.shard and a module of counting steps (a fresh name each time) in the
    current folder: the module's name and the module."""
    name = f"trace_once_{next(_names)}"
    (tmp_path / "tp.shard").write_text(RULES)
    (tmp_path / f"{name}.py").write_text(STEP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    yield name, module
    sys.modules.pop(name, None)


@pytest.mark.parametrize("command", ["lint", "explain"])
@pytest.mark.parametrize("factory", ["plain", "with_out_groups"])
def test_the_cli_traces_the_step_once(steps, capsys, command: str, factory: str) -> None:
    name, module = steps
    assert main([command, "tp.shard", "--step", f"{name}:{factory}"]) == 0
    assert module.CALLS == 1
    assert "down" in capsys.readouterr().out  # the step was traced: lint and explain name its scopes


def test_an_out_groups_error_names_the_output_after_one_trace(steps, capsys) -> None:
    name, module = steps
    assert main(["lint", "tp.shard", "--step", f"{name}:out_groups_swapped"]) == 1
    said = capsys.readouterr().out
    assert "SR105" in said and "out_groups[0] (output 0)" in said
    assert module.CALLS == 1


def _mesh(kind: AxisType) -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind,) * 2)


@pytest.mark.parametrize("kind", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])
@pytest.mark.parametrize("method", ["traced", "decisions", "scopes"])
def test_a_step_is_traced_once_with_out_groups(steps, kind: AxisType, method: str) -> None:
    _, module = steps
    rules = sr.loads(RULES, name="tp.shard")
    step, args = module.with_out_groups(rules, _mesh(kind))
    getattr(step, method)(*args)
    planned = step._entry(args)  # planned by that trace: a call traces no more for its output's shapes
    # (an Auto mesh has no decisions to make: `decisions` plans the step as a call would, one trace)
    assert module.CALLS == 1
    # what it planned is what a call plans from `jax.eval_shape`'s shapes
    again, _ = module.with_out_groups(rules, _mesh(kind))
    assert repr(planned.out_shardings) == repr(again._entry(args).out_shardings)
    assert planned.out_shardings[0] is not None


def test_out_groups_errors_come_first_as_before(steps) -> None:
    """Where the trace fails too (SR117 under `strict`), the output's error
    (SR105 naming it) is the one raised, as when the shapes came first."""
    _, module = steps
    rules = sr.loads(RULES, name="tp.shard")
    step = sr.jit(
        module.sgd, rules, _mesh(AxisType.Explicit), in_groups=("params", "inputs"),
        out_groups=("inputs", None), strict=True,
    )  # fmt: skip
    with pytest.raises(sr.PlanError) as info:
        step.traced(*module.shapes())
    assert info.value.code == "SR105" and "out_groups[0] (output 0)" in str(info.value)
    fine = sr.jit(
        module.sgd, rules, _mesh(AxisType.Explicit), in_groups=("params", "inputs"),
        out_groups=("params", None), strict=True,
    )  # fmt: skip
    with pytest.raises(sr.PlanError) as info:
        fine.traced(*module.shapes())
    assert info.value.code == "SR117"


def test_a_closed_over_layout_is_still_named_with_out_groups() -> None:
    mesh = _mesh(AxisType.Explicit)
    rules = sr.loads('rules params:\n  "." -> replicated\nrules inputs:\n  "." -> (data, _)\n')
    named = jax.sharding.NamedSharding
    a = jax.device_put(jnp.ones((64, 16)), named(mesh, jax.sharding.PartitionSpec("data", None)))
    b = jax.device_put(jnp.ones((16, 64)), named(mesh, jax.sharding.PartitionSpec(None, "data")))
    step = sr.jit(lambda x: {"y": x @ (a @ b)}, rules, mesh, in_groups=("inputs",), out_groups="inputs")
    with pytest.raises(sr.PlanError) as info:
        step.traced(jax.ShapeDtypeStruct((128, 64), jnp.float32))
    assert info.value.code == "SR117" and "closes over" in str(info.value)


class _Compiles:
    """Counts the programs JAX asks XLA for: its `backend_compile_duration`
    event, recorded for each program compiled or loaded from the compilation
    cache the test run keeps."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, event: str, duration: float, **kwargs: Any) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


@pytest.fixture
def compiles() -> Iterator[_Compiles]:
    counter = _Compiles()
    jax.monitoring.register_event_duration_secs_listener(counter)
    yield counter
    jax.monitoring.unregister_event_duration_listener(counter)


@pytest.mark.parametrize("kind", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])
def test_a_first_call_traces_the_step_once_with_out_groups(steps, kind: AxisType) -> None:
    """The output's shapes `out_groups` are planned for come from the trace the
    call evaluates with its layouts: one run of the step's body, and the
    step's `traced` afterwards reads what that trace found."""
    _, module = steps
    step, shapes = module.with_out_groups(sr.loads(RULES, name="tp.shard"), _mesh(kind))
    arrays = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), shapes)
    params, loss = step(*arrays)
    assert module.CALLS == 1
    assert loss.shape == () and params["up"].sharding.spec == jax.sharding.PartitionSpec(None, "model")
    assert {s.name for s in step.traced(*arrays).scopes} >= {"up", "down"}
    step(*arrays)
    assert module.CALLS == 1


@pytest.mark.parametrize("kind", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])
def test_cost_traces_once_per_mesh_and_compiles_once_per_signature(steps, compiles, kind: AxisType) -> None:
    """`step.cost` traces the step once for its mesh and once for one device,
    compiles it once for each, and a second call with the same signature
    reuses both; another signature is traced and compiled anew."""
    _, module = steps
    step, args = module.with_out_groups(sr.loads(RULES, name="tp.shard"), _mesh(kind))
    first = step.cost(*args)
    assert (module.CALLS, compiles.count) == (2, 2)
    again = step.cost(*args)
    assert (module.CALLS, compiles.count) == (2, 2)
    assert again is first  # read off the programs once, too
    assert step.cost(*args, ideal=False).ideal_flops_per_device is None
    assert (module.CALLS, compiles.count) == (2, 2)
    params, batch = args
    bigger = jax.tree.map(lambda s: jax.ShapeDtypeStruct((64, *s.shape[1:]), s.dtype), batch)
    step.cost(params, bigger)
    assert (module.CALLS, compiles.count) == (4, 4)


def test_a_first_call_without_activation_rules_on_auto_axes_traces_once(steps) -> None:
    """With nothing to evaluate (Auto axes, no activation rules) the step is
    `jax.jit` of the function itself, and the shapes `out_groups` are planned
    for come from the trace that `jax.jit` then finds in JAX's own cache."""
    _, module = steps
    text = RULES.replace('rules activations:\n  "up$" -> (data, model)\n\n', "")
    assert "activations" not in text
    step, shapes = module.with_out_groups(sr.loads(text, name="tp.shard"), _mesh(AxisType.Auto))
    arrays = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), shapes)
    params, _ = step(*arrays)
    assert module.CALLS == 1
    assert params["down"].sharding.spec == jax.sharding.PartitionSpec("model", None)
    # and its cost: the mesh's trace is the one JAX already has (the same function and
    # shapes), and the owners of its arrays need no other; one trace for one device
    costed, _ = module.with_out_groups(sr.loads(text, name="tp.shard"), _mesh(AxisType.Auto))
    cost = costed.cost(*shapes)
    assert module.CALLS == 2
    named = {a.array for a in cost.by_array}
    assert "params/down" in named and "output 1" in named, named  # attributed all the same


def test_the_ideal_of_a_step_plain_jax_jit_refuses_on_one_device(compiles) -> None:
    """On one device the ideal is plain `jax.jit` of the step's function;
    where JAX refuses that (a `with_sharding_constraint` on Explicit axes
    asserts a layout the unlaid-out values do not have), it is the step as
    `sr.jit` makes it on that device, still one compile, and no note."""
    rules = sr.loads(
        'mesh data=4, model=2\nrules params:\n  "w" -> (_, model)\nrules inputs:\n  "x" -> (data, _)\n'
    )

    def f(w, x):
        h = jax.lax.with_sharding_constraint(x @ w, jax.sharding.PartitionSpec("data", "model"))
        return jnp.sum(h * h)

    step = sr.jit(f, rules, _mesh(AxisType.Explicit), in_groups=("params", "inputs"))
    S = jax.ShapeDtypeStruct
    cost = step.cost(S((16, 32), jnp.float32), S((8, 16), jnp.float32))
    assert cost.notes == () and cost.ideal_flops_per_device is not None
    assert cost.ratio == pytest.approx(1.0, abs=0.05)
    assert compiles.count == 2


def test_the_ideal_is_compiled_for_its_figures_only(steps, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-device program is compiled once, without LLVM's optimisations
    (it never runs), and its FLOPs are those of the same program compiled
    with XLA's defaults."""
    from shardrules._costs import _cost, _step

    _, module = steps
    seen: list[Any] = []
    real = _step._for_its_figures

    def spy(lowered: Any) -> Any:
        seen.append(lowered)
        return real(lowered)

    monkeypatch.setattr(_step, "_for_its_figures", spy)
    step, args = module.with_out_groups(sr.loads(RULES, name="tp.shard"), _mesh(AxisType.Explicit))
    cost = step.cost(*args)
    assert len(seen) == 1
    by_default = _cost._number(seen[0].compile().cost_analysis(), "flops")
    assert cost.ideal_flops_per_device == pytest.approx(by_default / 8)
