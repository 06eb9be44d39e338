"""Every collective of a compiled step traced to the array it is for and the
rule line that laid that array out (`StepCost.by_rule`, `.by_array`)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardrules as sr
from shardrules._costs._attribute import INFERRED, MODEL
from shardrules._costs._cost import cost_from_json

ROOT = Path(__file__).resolve().parents[1]


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _total(cost) -> int:
    return sum(c.bytes_per_device for c in cost.collectives)


def _owned_by_rule_lines(cost, path: Path) -> None:
    """Each owner is a line of `path` (whose text is the rule's), `inferred`
    or the model's code; the bytes per rule and per array add up to the step's."""
    lines = path.read_text().splitlines()
    assert cost.by_rule, "no collective attributed"
    for r in cost.by_rule:
        if r.rule in (INFERRED, MODEL):
            assert r.text == ""
            continue
        file, line = r.rule.rsplit(":", 1)
        assert Path(file).resolve() == path.resolve()
        pattern = re.match(r'"(.*)" ->', r.text)
        assert pattern is not None and f'"{pattern[1]}"' in lines[int(line) - 1], (r.rule, r.text)
    assert sum(r.bytes_per_device for r in cost.by_rule) == _total(cost) > 0
    assert sum(a.bytes_per_device for a in cost.by_array) == _total(cost)
    for kind in cost.collectives:
        runs = sum(s.count for r in cost.by_rule for s in r.collectives if s.kind == kind.kind)
        assert runs >= kind.count  # a combined collective counts under each rule it carries arrays of


@pytest.fixture(scope="module")
def transformer():
    train = _module(ROOT / "examples/transformer/train.py", "_attribution_transformer")
    rules = sr.load(train.RULES)
    mesh = jax.make_mesh((4, 2), ("fsdp", "model"))
    rng = np.random.default_rng(0)
    params = sr.apply(train.init_params(rng), rules, mesh)
    seq = (rng.integers(0, train.VOCAB, (train.BATCH, 1)) + np.arange(train.SEQ + 1)) % train.VOCAB
    batch = sr.apply({"tokens": seq[:, :-1], "targets": seq[:, 1:]}, rules, mesh, group="inputs")

    def cost(activations):
        step = sr.jit(
            train.train_step,
            rules,
            mesh,
            in_groups=("params", "inputs"),
            out_groups=("params", None),
            activations=activations,
        )
        return step.cost(params, batch, ideal=False)

    return train.RULES, cost("activations"), cost(None)


def _line(path: Path, pattern: str) -> str:
    """`FILE:LINE` of the rule whose pattern is `pattern` in `path`."""
    for n, text in enumerate(path.read_text().splitlines(), 1):
        if text.strip().startswith(f'"{pattern}"'):
            return f"{path}:{n}"
    raise AssertionError(pattern)


def _array(cost, name: str):
    found = [a for a in cost.by_array if a.array == name]
    assert len(found) == 1, [a.array for a in cost.by_array]
    return found[0]


def test_every_collective_of_the_transformer_has_an_owner(transformer):
    path, with_rules, without = transformer
    _owned_by_rule_lines(with_rules, path)
    _owned_by_rule_lines(without, path)


def test_a_row_parallel_weight_owns_the_sum_its_split_contraction_needs(transformer):
    path, cost, _ = transformer
    o = _array(cost, "params/blocks/0/attn/o/kernel")
    assert o.rule.endswith(_line(path, "attn/o/kernel$").rsplit("/", 1)[-1])
    assert any(s.kind == "all-reduce" for s in o.collectives)
    assert any(s.kind == "all-gather" for s in o.collectives)  # gathered over fsdp before use


def test_gradients_are_owned_by_their_parameter_rules(transformer):
    path, cost, _ = transformer
    for name, pattern in (
        ("params/blocks/1/mlp/up/kernel", "mlp/up/kernel$"),
        ("params/head/kernel", "head/kernel$"),
        ("params/norm/scale", r"norm\d*/scale$"),
    ):
        g = _array(cost, f"{name} (gradient)")
        assert g.rule == _line(path, pattern)
        assert {s.kind for s in g.collectives} <= {"all-reduce", "reduce-scatter"}
    # the CPU compiler sums most gradients in one combined all-reduce: split by its elements
    gradients = [a for a in cost.by_array if a.array.endswith("(gradient)")]
    combined = [c for c in cost.calls if c.kind == "all-reduce"]
    assert len(gradients) > len(combined)


def test_an_activation_rule_owns_what_its_layout_moves_and_without_it_the_layout_is_inferred(transformer):
    path, with_rules, without = transformer
    gathered = _array(with_rules, "activation block_0/attn")
    assert gathered.rule == _line(path, r"block_\d+/(attn|mlp)$")
    assert all(a.rule != _line(path, r"block_\d+/(attn|mlp)$") for a in without.by_array)
    assert any(r.rule == INFERRED for r in without.by_rule)


def test_the_attribution_is_written_and_read_back(transformer):
    _, cost, _ = transformer
    again = cost_from_json(cost.to_json())
    assert again.by_rule == cost.by_rule
    assert again.by_array == cost.by_array
    data = cost.to_json()
    assert data["by_rule"][0]["bytes_per_device"] == cost.by_rule[0].bytes_per_device


RULES = """mesh fsdp=4, model=2
rules params:
  "layers/w$" -> (_, fsdp, model)
  "out$" -> (fsdp, _)
rules inputs:
  "x" -> (fsdp, _)
"""


def _scanned(layers: int):
    def loss(p, x):
        def body(h, w):
            return jnp.tanh(h @ w), None

        h, _ = jax.lax.scan(body, x, p["layers"]["w"])
        return (h @ p["out"]).sum()

    def step(params, x):
        g = jax.grad(loss)(params, x)
        return jax.tree.map(lambda a, b: a - 0.1 * b, params, g)

    params = {"layers": {"w": np.ones((layers, 32, 32), np.float32)}, "out": np.ones((32, 8), np.float32)}
    mesh = jax.make_mesh((4, 2), ("fsdp", "model"))
    rules = sr.loads(RULES)
    jitted = sr.jit(step, rules, mesh, in_groups=("params", "inputs"), out_groups="params")
    return jitted.cost(params, np.ones((16, 32), np.float32), ideal=False)


def test_a_scan_over_layers_counts_each_trip():
    two, four = _scanned(2), _scanned(4)
    for cost in (two, four):
        assert sum(r.bytes_per_device for r in cost.by_rule) == _total(cost)
    w2, w4 = _array(two, "params/layers/w"), _array(four, "params/layers/w")
    assert w2.rule == w4.rule == "<string>:3"
    gathers = {c: next(s for s in a.collectives if s.kind == "all-gather") for c, a in ((2, w2), (4, w4))}
    assert gathers[4].count == 2 * gathers[2].count  # gathered in the loop's body: once per layer
    assert gathers[4].bytes_per_device == 2 * gathers[2].bytes_per_device


AXES = st.sampled_from(["_", "fsdp", "model"])


@settings(max_examples=6, deadline=None)
@given(
    shape=st.sampled_from([(4, 2), (2, 4), (8, 1)]),
    first=st.tuples(AXES, AXES),
    second=st.tuples(AXES, AXES),
    batch=AXES,
)
def test_the_bytes_of_any_layout_add_up_and_each_has_an_owner(shape, first, second, batch):
    def spec(entries):
        used = [e for e in entries if e != "_"]
        if len(set(used)) < len(used):
            entries = (entries[0], "_")
        return "(" + ", ".join(entries) + ")"

    text = (
        f"mesh fsdp={shape[0]}, model={shape[1]}\nrules params:\n"
        f'  "w1$" -> {spec(first)}\n  "w2$" -> {spec(second)}\nrules inputs:\n  "x" -> ({batch}, _)\n'
    )
    rules = sr.loads(text)
    mesh = jax.make_mesh(shape, ("fsdp", "model"))

    def step(params, x):
        def loss(p):
            return (jnp.tanh(x @ p["w1"]) @ p["w2"]).sum()

        g = jax.grad(loss)(params)
        return jax.tree.map(lambda a, b: a - 0.1 * b, params, g)

    params = {"w1": np.ones((16, 32), np.float32), "w2": np.ones((32, 16), np.float32)}
    cost = sr.jit(step, rules, mesh, in_groups=("params", "inputs"), out_groups="params").cost(
        params, np.ones((8, 16), np.float32), ideal=False
    )
    assert sum(r.bytes_per_device for r in cost.by_rule) == _total(cost)
    assert sum(a.bytes_per_device for a in cost.by_array) == _total(cost)
    assert all(r.rule in ("<string>:3", "<string>:4", "<string>:6", INFERRED, MODEL) for r in cost.by_rule)


def test_every_collective_of_an_nnx_gqa_moe_step_has_an_owner():
    pytest.importorskip("flax.nnx", reason="flax is an optional extra: pip install 'shardrules[flax]'")
    models = _module(ROOT / "benchmarks/_models.py", "_attribution_models")
    model = models.nnx_moe()
    rules = sr.load(model.rules)
    mesh = jax.make_mesh(model.shape, model.axes)
    step = sr.jit(model.step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    cost = step.cost(model.params, model.batch, ideal=False)
    _owned_by_rule_lines(cost, Path(model.rules))
    experts = _line(Path(model.rules), "moe/w_(in|out)$")
    assert {a.array for a in cost.by_array if a.rule == experts} >= {
        "state/blocks/0/moe/w_in (gradient)",
        "state/blocks/1/moe/w_out (gradient)",
    }


def test_every_matrix_product_s_flops_are_owned(transformer):
    from shardrules._costs._hlo import matmul_flops_by_dtype

    path, cost, _ = transformer
    owned = sum(r.matmul_flops_per_device for r in cost.by_rule)
    train = sys.modules["_attribution_transformer"]
    rules = sr.load(path)
    mesh = jax.make_mesh((4, 2), ("fsdp", "model"))
    params = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), train.init_params(np.random.default_rng(0))
    )
    tokens = jax.ShapeDtypeStruct((train.BATCH, train.SEQ), np.int32)
    step = sr.jit(
        train.train_step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None),
        activations="activations",
    )  # fmt: skip
    hlo = step.lower(params, {"tokens": tokens, "targets": tokens}).compile().as_text()
    assert owned == pytest.approx(sum(matmul_flops_by_dtype(hlo).values()))
    assert 0 < owned < cost.flops_per_device
    up = next(r for r in cost.by_rule if r.rule == _line(path, "mlp/up/kernel$"))
    assert up.matmul_flops_per_device > 0  # the products with `mlp/up/kernel`, forward and backward
