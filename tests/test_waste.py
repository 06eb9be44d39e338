"""Layouts that are correct but waste communication or memory, found in the
compiled step and named with their rule line (SR216-SR219, `StepCost.findings`)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules._cli._main import main

MICROBATCHES = """mesh data=8
rules params:
  "w\\d$" -> replicated
rules inputs:
  "x" -> (_, data, _)
"""

STEPS = """\
import jax
import jax.numpy as jnp
import numpy as np

import shardrules as sr


def loss(p, x):
    return (jnp.tanh(x @ p["w1"]) @ p["w2"]).sum()


def accumulating(params, x):
    def body(acc, xb):
        g = jax.grad(loss)(params, xb)
        return jax.tree.map(jnp.add, acc, g), None

    g, _ = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, params), x)
    return jax.tree.map(lambda a, b: a - 0.1 * b, params, g)


def layered(params, x):
    def stack(p, x):
        def body(h, w):
            return jnp.tanh(h @ w), None

        h, _ = jax.lax.scan(body, x[0], p["w1"])
        return h.sum()

    g = jax.grad(stack)(params, x)
    return jax.tree.map(lambda a, b: a - 0.1 * b, params, g)


def args(trips=4):
    params = {"w1": np.ones((64, 256), np.float32), "w2": np.ones((256, 64), np.float32)}
    return params, np.ones((trips, 32, 64), np.float32)


def accumulating_step(rules, mesh):
    return sr.jit(accumulating, rules, mesh, in_groups=("params", "inputs"), out_groups="params"), args()


def layered_step(rules, mesh):
    params = {"w1": np.ones((4, 64, 64), np.float32), "w2": np.ones((1,), np.float32)}
    step = sr.jit(layered, rules, mesh, in_groups=("params", "inputs"), out_groups="params")
    return step, (params, np.ones((1, 32, 64), np.float32))
"""

_names = itertools.count()


def _mesh(shape, names):
    """A mesh with Explicit axes (JAX's default since 0.9; 0.8 defaults to Auto)."""
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Explicit,) * len(names))


@pytest.fixture
def steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A module of steps, imported from a fresh name, with its folder current."""
    name = f"waste_steps_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(STEPS)
    (tmp_path / "micro.shard").write_text(MICROBATCHES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return __import__(name)


def _codes(cost) -> list[str]:
    return [f.code for f in cost.findings]


def test_a_gradient_reduced_on_every_microbatch_is_sr216_with_its_rule_line(steps) -> None:
    rules = sr.loads(MICROBATCHES)
    mesh = _mesh((8,), ("data",))
    step, args = steps.accumulating_step(rules, mesh)
    cost = step.cost(*args, ideal=False)
    found = [f for f in cost.findings if f.code == "SR216"]
    assert found, [(f.code, f.message) for f in cost.findings]
    first = found[0]
    assert first.span is not None and first.span.line == 3  # `"w\d$" -> replicated`
    assert "4 trips" in first.message and "(gradient)" in first.message
    owned = {a.array: a for a in cost.by_array}
    reduced = owned[first.message.split(" is reduced")[0]]
    assert "per device per step where one reduction" in first.message
    assert reduced.bytes_per_device % 4 == 0
    assert "psum" in first.hint and "unreduced" in first.hint


def test_a_scan_over_layers_writes_each_layer_s_gradient_once_no_sr216(steps) -> None:
    rules = sr.loads(
        'mesh data=4, model=2\nrules params:\n  "w1$" -> (_, data, model)\n  "w2$" -> replicated\n'
        'rules inputs:\n  "x" -> (_, data, _)\n'
    )
    mesh = _mesh((4, 2), ("data", "model"))
    step, args = steps.layered_step(rules, mesh)
    cost = step.cost(*args, ideal=False)
    assert any(c.kind in ("all-reduce", "reduce-scatter") and c.count > 1 for c in cost.collectives)
    assert "SR216" not in _codes(cost)


def test_lint_step_cost_reports_sr216_with_a_caret_and_noqa_acknowledges_it(steps, capsys) -> None:
    module = steps.__name__
    code = main(
        ["lint", "micro.shard", "--step", f"{module}:accumulating_step", "--cost", "--format", "json"]
    )
    found = json.loads(capsys.readouterr().out)
    assert code == 0
    sr216 = [d for d in found if d["code"] == "SR216"]
    assert sr216 and sr216[0]["line"] == 3, found
    assert main(["lint", "micro.shard", "--step", f"{module}:accumulating_step", "--cost"]) == 0
    text = capsys.readouterr().out
    assert "SR216" in text and '"w\\d$" -> replicated' in text
    Path("micro.shard").write_text(MICROBATCHES.replace("-> replicated", "-> replicated  # noqa: SR216"))
    assert main(["lint", "micro.shard", "--step", f"{module}:accumulating_step", "--cost"]) == 0
    assert "SR216" not in capsys.readouterr().out


def test_a_weight_gathered_whole_and_kept_for_the_backward_pass_is_sr217() -> None:
    rules = sr.loads(
        'mesh fsdp=8\nrules params:\n  "embed$" -> (fsdp, _)\n  "w\\d$" -> (fsdp, _)\n'
        'rules inputs:\n  "tokens" -> (fsdp, _)\n'
    )
    mesh = _mesh((8,), ("fsdp",))

    def step(params, tokens):
        def loss(p):  # `w1`'s input needs its gradient: the backward pass uses `w1` too
            return (jnp.tanh(p["embed"][tokens] @ p["w1"]) @ p["w2"]).sum()

        g = jax.grad(loss)(params)
        return jax.tree.map(lambda a, b: a - 0.1 * b, params, g)

    params = {
        "embed": np.ones((512, 256), np.float32),
        "w1": np.ones((256, 1024), np.float32),
        "w2": np.ones((1024, 256), np.float32),
    }
    cost = sr.jit(step, rules, mesh, in_groups=("params", "inputs"), out_groups="params").cost(
        params, np.zeros((8, 16), np.int32), ideal=False
    )
    found = [f for f in cost.findings if f.code == "SR217"]
    assert found and found[0].span is not None and found[0].span.line == 4, [f.message for f in cost.findings]
    assert "params/w1" in found[0].message and "gathered whole" in found[0].message
    assert "% of the step's peak" in found[0].message and "jax.checkpoint" in found[0].hint


def test_an_output_computed_whole_then_cut_to_its_layout_is_sr218() -> None:
    rules = sr.loads(
        'mesh fsdp=8\nrules params:\n  "table$" -> (fsdp, _)\nrules inputs:\n  "ids|rows" -> replicated\n'
    )
    mesh = _mesh((8,), ("fsdp",))

    def scatter(params, ids, rows):
        update = jnp.zeros(params["table"].shape).at[ids].add(rows)  # every device scatters every row
        return {"table": params["table"] + update}

    params = {"table": np.ones((4096, 128), np.float32)}
    step = sr.jit(scatter, rules, mesh, in_groups=("params", "inputs", "inputs"), out_groups="params")
    cost = step.cost(params, np.arange(64, dtype=np.int32), np.ones((64, 128), np.float32), ideal=False)
    found = [f for f in cost.findings if f.code == "SR218"]
    assert found and found[0].span is not None and found[0].span.line == 3, [f.message for f in cost.findings]
    assert "params/table" in found[0].message and "2.0 MiB" in found[0].message
    assert "256.0 KiB per device" in found[0].message


def test_a_partial_sum_of_the_batch_is_not_sr218() -> None:
    rules = sr.loads('mesh fsdp=8\nrules params:\n  "w$" -> (fsdp, _)\nrules inputs:\n  "x" -> (fsdp, _)\n')
    mesh = _mesh((8,), ("fsdp",))

    def step(params, x):
        g = jax.grad(lambda p: jnp.tanh(x @ p["w"]).sum())(params)
        return jax.tree.map(lambda a, b: a - 0.1 * b, params, g)

    cost = sr.jit(step, rules, mesh, in_groups=("params", "inputs"), out_groups="params").cost(
        {"w": np.ones((512, 1024), np.float32)}, np.ones((64, 512), np.float32), ideal=False
    )
    assert "SR218" not in _codes(cost)


def test_an_array_moved_there_and_straight_back_is_sr219() -> None:
    rules = sr.loads('mesh data=8\nrules params:\n  "w$" -> replicated\nrules inputs:\n  "x" -> (data, _)\n')
    mesh = _mesh((8,), ("data",))

    def step(params, x):
        h = x @ params["w"]
        with jax.named_scope("there"):
            h = jax.sharding.reshard(h, P(None, "data"))
        with jax.named_scope("back"):
            h = jax.sharding.reshard(h, P("data", None))
        return jnp.tanh(h)

    jitted = sr.jit(step, rules, mesh, in_groups=("params", "inputs"))
    cost = jitted.cost({"w": np.ones((256, 256), np.float32)}, np.ones((64, 256), np.float32), ideal=False)
    found = [f for f in cost.findings if f.code == "SR219"]
    assert len(found) == 1, [(f.code, f.message) for f in cost.findings]
    assert "the model's code" in found[0].message and "16.0 KiB" in found[0].message
    owners = {a.array: a.rule for a in cost.by_array}
    assert owners["activation there"] == owners["activation back"] == "the model's code"

    def once(params, x):
        with jax.named_scope("there"):
            return jnp.tanh(jax.sharding.reshard(x @ params["w"], P(None, "data")))

    single = sr.jit(once, rules, mesh, in_groups=("params", "inputs")).cost(
        {"w": np.ones((256, 256), np.float32)}, np.ones((64, 256), np.float32), ideal=False
    )
    assert "SR219" not in _codes(single)
