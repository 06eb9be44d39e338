"""penzai models: parameters planned under their labels, placed, and the model
still runs and gives what it gave before placement."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import shardrules as sr

pytest.importorskip("penzai")
from penzai import pz
from penzai.models.transformer.variants import llamalike_common

RULES = sr.loads(
    """
mesh fsdp, model

alias embed = fsdp
alias heads = model

rules params:
  "embedder\\.embeddings$"                 -> (_, embed)
  "attention/(query|key|value)\\.weights$" -> (embed, heads, ...)
  "attention/output\\.weights$"            -> (heads, ..., embed)
  "mlp/(gating|value)_linear\\.weights$"   -> (embed, model)
  "mlp/out_linear\\.weights$"              -> (model, embed)
  "lm_head\\.weights$"                     -> (embed, _)
  "scale\\.weights$"                       -> replicated
""",
    name="llamalike.shard",
)


@pytest.fixture(scope="module")
def model() -> object:
    config = llamalike_common.LlamalikeTransformerConfig(
        num_kv_heads=2,
        query_head_multiplier=2,
        embedding_dim=32,
        projection_dim=8,
        mlp_hidden_dim=64,
        num_decoder_blocks=2,
        vocab_size=64,
        mlp_variant="swiglu",
        tie_embedder_and_logits=False,
    )
    return llamalike_common.build_llamalike_transformer(config, init_base_rng=jax.random.key(0))


@pytest.fixture
def mesh() -> jax.sharding.Mesh:
    # Auto axes: penzai's layers run eagerly on the placed arrays, and JAX decides the results' layouts.
    return jax.make_mesh((4, 2), ("fsdp", "model"), axis_types=(AxisType.Auto,) * 2)


def _parameters(model: object) -> dict[str, object]:
    return {p.label: p for p in pz.unbind_params(model)[1]}


def test_every_weight_is_planned_under_its_label(model, mesh) -> None:
    plan = sr.plan(model, RULES, mesh)
    assert plan.ok, plan.errors
    labels = _parameters(model)
    by_path = {leaf.path: leaf for leaf in plan}
    assert set(labels) <= set(by_path)
    assert "transformer/block_0/attention/query.weights" in labels
    for label, parameter in labels.items():
        leaf = by_path[label]
        assert leaf.why == "rule", label
        assert leaf.shape == parameter.value.data_array.shape  # the positional data array
    assert by_path["transformer/block_1/attention/query.weights"].spec == P("fsdp", "model", None, None)
    assert by_path["transformer/embedder.embeddings"].spec == P(None, "fsdp")
    # the layers' constants keep their attribute paths (scalars: replicated without a rule)
    others = [leaf for leaf in plan if leaf.path not in labels]
    assert others and all(leaf.path.startswith("body/") and leaf.why == "scalar" for leaf in others)
    assert sum(leaf.why == "rule" for leaf in plan) == len(labels)


def test_apply_places_the_weights_and_the_model_gives_the_same_output(model, mesh) -> None:
    tokens = pz.nx.wrap(np.arange(8 * 16).reshape(8, 16) % 64).tag("batch", "seq")
    before = np.asarray(model(tokens).unwrap("batch", "seq", "vocabulary"))
    old = {label: p.value.data_array for label, p in _parameters(model).items()}

    placed = sr.apply(model, RULES, mesh)

    assert type(placed) is type(model)
    plan = {leaf.path: leaf for leaf in sr.plan(model, RULES, mesh)}
    new = _parameters(placed)
    assert set(new) == set(old)
    for label, parameter in new.items():
        array = parameter.value.data_array
        assert isinstance(parameter, pz.Parameter)
        assert isinstance(parameter.value, pz.nx.NamedArray)
        assert array.sharding.spec == plan[label].spec, label
        assert array.sharding.mesh == mesh
        np.testing.assert_array_equal(np.asarray(array), np.asarray(old[label]))
    # the input is unchanged: its parameters still hold their old arrays
    assert all(p.value.data_array is old[label] for label, p in _parameters(model).items())
    after = np.asarray(placed(tokens).unwrap("batch", "seq", "vocabulary"))
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


def test_specs_and_shardings_hold_each_parameters_layout_in_its_place(model, mesh) -> None:
    plan = {leaf.path: leaf.spec for leaf in sr.plan(model, RULES, mesh)}
    treedef = jax.tree_util.tree_structure(model)
    leaves = jax.tree_util.tree_leaves(model)
    specs = treedef.flatten_up_to(sr.specs(model, RULES, mesh))
    shardings = treedef.flatten_up_to(sr.shardings(model, RULES, mesh))
    checked = 0
    for leaf, spec, sharding in zip(leaves, specs, shardings, strict=True):
        if isinstance(leaf, pz.Parameter):
            assert spec == plan[leaf.label] == sharding.spec
            checked += 1
    assert checked == len(_parameters(model))


def test_frozen_values_are_keyed_by_label_too(model, mesh) -> None:
    unbound, frozen = pz.unbind_params(model, freeze=True)
    plan = sr.plan(frozen, RULES, mesh)
    assert plan.ok, plan.errors
    paths = [leaf.path for leaf in plan]
    assert paths == [f"{i}/{value.label}" for i, value in enumerate(frozen)]
    live = {leaf.path: leaf.spec for leaf in sr.plan(model, RULES, mesh)}
    assert [leaf.spec for leaf in plan] == [live[value.label] for value in frozen]
    # a jit step over the frozen values takes its shardings from the rules
    shardings = sr.shardings(frozen, RULES, mesh)
    placed = sr.apply(frozen, RULES, mesh)
    tokens = pz.nx.wrap(np.arange(4 * 8).reshape(4, 8) % 64).tag("batch", "seq")

    @jax.jit
    def logits(values):
        return pz.bind_variables(unbound, values)(tokens).unwrap("batch", "seq", "vocabulary")

    np.testing.assert_allclose(
        np.asarray(logits(placed)), np.asarray(model(tokens).unwrap("batch", "seq", "vocabulary")), atol=1e-5
    )
    assert jax.tree_util.tree_leaves(shardings)[2].spec == live["transformer/block_0/attention/query.weights"]


def test_the_model_under_a_key_keeps_the_key(model, mesh) -> None:
    paths = [leaf.path for leaf in sr.plan({"model": model, "step": 0}, RULES, mesh)]
    assert "model/transformer/lm_head.weights" in paths
    assert "step" in paths


@pytest.mark.parametrize("freeze", [False, True], ids=["live", "frozen"])
def test_a_dict_keyed_by_labels_names_each_parameter_once(model, mesh, freeze) -> None:
    by_label = {p.label: p for p in pz.unbind_params(model, freeze=freeze)[1]}
    plan = sr.plan(by_label, RULES, mesh)
    assert plan.ok, plan.errors
    assert [leaf.path for leaf in plan] == sorted(by_label)
    placed = sr.apply(by_label, RULES, mesh)
    query = placed["transformer/block_0/attention/query.weights"]
    assert isinstance(query, pz.ParameterValue if freeze else pz.Parameter)
    assert query.value.data_array.sharding.spec == P("fsdp", "model", None, None)


def test_a_shared_parameter_stays_one_parameter() -> None:
    layer = pz.nn.Affine.from_config(
        name="mlp/in",
        init_base_rng=jax.random.key(0),
        input_axes={"embedding": 8},
        output_axes={"embedding": 8},
    )
    tied = pz.nn.Sequential([layer, layer])
    rules = sr.loads('rules params:\n  "Linear\\.weights$" -> (data, _)\n  default -> replicated\n')
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    assert [leaf.path for leaf in sr.plan(tied, rules, mesh)] == [
        "mlp/in/Linear.weights",
        "mlp/in/AddBias.bias",
    ] * 2
    placed = sr.apply(tied, rules, mesh)
    first, second = placed.sublayers
    assert first.sublayers[0].weights is second.sublayers[0].weights
    assert first.sublayers[0].weights is not layer.sublayers[0].weights
    assert first.sublayers[0].weights.value.data_array.sharding.spec == P("data", None)


def test_labels_two_variables_share_fall_back_to_attribute_paths() -> None:
    def affine(seed: int) -> object:
        return pz.nn.Affine.from_config(
            name="mlp/in", init_base_rng=jax.random.key(seed), input_axes={"a": 8}, output_axes={"a": 8}
        )

    paths = [leaf.path for leaf in sr.plan(pz.nn.Sequential([affine(0), affine(1)]), RULES, {})]
    # penzai would refuse to unbind these (VariableConflictError): each is a box, as NNX's `Variable`
    assert len(paths) == 4 and len(set(paths)) == 4
    assert all(path.startswith(("sublayers/0/", "sublayers/1/")) for path in paths)
    assert [path.rsplit("/", 1)[1] for path in paths] == ["weights", "bias"] * 2


def test_named_arrays_and_unlabelled_state_add_no_segment() -> None:
    named = pz.nx.wrap(np.ones((8, 4), np.float32)).tag("batch", "embedding")
    tree = {
        "x": named,
        "view": named.untag("batch"),
        "counter": pz.StateVariable(value=np.zeros((8,), np.float32)),  # an automatic label
        "cache": pz.StateVariable(value=np.zeros((8,), np.float32), label="kv/cache"),
    }
    rules = sr.loads('rules params:\n  "^x$|^view$|cache|counter" -> (data, ...)\n')
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    plan = sr.plan(tree, rules, mesh)
    assert sorted(leaf.path for leaf in plan) == ["cache/kv/cache", "counter", "view", "x"]
    placed = sr.apply(tree, rules, mesh)
    assert isinstance(placed["x"], pz.nx.NamedArray)
    assert placed["x"].named_axes == named.named_axes
    assert placed["x"].data_array.sharding.spec == P("data", None)
    assert isinstance(placed["counter"], pz.StateVariable)
    assert placed["counter"].label == tree["counter"].label
    assert placed["cache"].value.sharding.spec == P("data")


def test_a_variable_holding_several_arrays_is_warned_about() -> None:
    tree = {"p": pz.Parameter(value={"a": np.ones(8), "b": np.ones(8)}, label="pair")}
    rules = sr.loads("rules params:\n  default -> replicated\n")
    found = [d for d in sr.plan(tree, rules, {"data": 8}).diagnostics if d.code == "SR213"]
    assert len(found) == 1 and found[0].path == "p/pair"
    assert "unbind_variables" in found[0].hint
    with pytest.warns(sr.ShardRulesWarning, match="SR213"):
        assert sr.specs(tree, rules, {"data": 8}) == {"p": None}


def test_a_penzai_steps_collectives_are_owned_by_its_rule_lines() -> None:
    """On penzai's own model code, every collective of the compiled train step
    has an owner, and each parameter is named by its label as rules match it
    (not its `data_array`), the same in the forward pass and as a gradient."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "_models.py"
    spec = importlib.util.spec_from_file_location("_penzai_models", path)
    assert spec is not None and spec.loader is not None
    models = importlib.util.module_from_spec(spec)
    sys.modules["_penzai_models"] = models
    spec.loader.exec_module(models)
    model = models.penzai_llamalike()
    rules = sr.load(model.rules)
    mesh = jax.make_mesh(model.shape, model.axes)
    step = sr.jit(
        model.step_on(mesh), rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None)
    )
    cost = step.cost(model.params, model.batch, ideal=False)
    total = sum(c.bytes_per_device for c in cost.collectives)
    assert (
        sum(r.bytes_per_device for r in cost.by_rule)
        == sum(a.bytes_per_device for a in cost.by_array)
        == total
        > 0
    )
    arrays = {a.array: a.rule for a in cost.by_array}
    assert not any("data_array" in name for name in arrays)
    down = "params/transformer/block_0/mlp/out_linear.weights"
    assert arrays[down] == arrays[f"{down} (gradient)"] == f"{model.rules}:14"
