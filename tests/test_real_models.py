"""Models from real libraries train one step under `sr.jit` on Explicit axes, with
the rule files of `benchmarks/rules/`: the loss and the new parameters are the
one-device ones, and each device does little more work than on Auto axes.

The libraries are optional (`pip install -e ".[models]"`); a test whose library
is missing is skipped with the reason. The models and their train steps are
`benchmarks/_models.py`'s, the exact FLOPs `benchmarks/explicit_flops.py`'s.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")  # before anything imports keras

import jax
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import shardrules as sr

_spec = importlib.util.spec_from_file_location(
    "_benchmark_models", Path(__file__).resolve().parent.parent / "benchmarks" / "_models.py"
)
assert _spec is not None and _spec.loader is not None
models = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = models  # dataclasses look their module up
_spec.loader.exec_module(models)

FLOPS_VS_AUTO = 1.10  # loose: the exact ratios are recorded by the benchmark


def _flops(compiled) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"])


def _placed(model, rules, kind: AxisType):
    mesh = jax.make_mesh(model.shape, model.axes, axis_types=(kind,) * len(model.axes))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)
        params = sr.apply(model.params, rules, mesh)
        batch = sr.apply(model.batch, rules, mesh, group="inputs")
    step = sr.jit(
        model.step_on(mesh), rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None)
    )
    return step, params, batch


def check_one_step(model, vs_auto: bool = True):
    """One step on an 8-device Explicit mesh against `jax.jit` on one device:
    the same loss and new parameters, laid out as the rules say, no axis dropped
    (SR210), and (with `vs_auto`) per-device FLOPs within `FLOPS_VS_AUTO` of the
    Auto mesh's. Returns the Explicit step and its placed arguments."""
    rules = sr.load(model.rules)
    ref_params, ref_loss = jax.jit(model.step_on(None))(model.params, model.batch)

    step, params, batch = _placed(model, rules, AxisType.Explicit)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", sr.ShardRulesWarning)
        compiled = step.lower(params, batch).compile()
    # (a rule for layers this small config lacks is SR201: not what is tested here)
    assert [str(w.message) for w in caught if getattr(w.message, "code", None) == "SR210"] == []
    new_params, loss = compiled(params, batch)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    got, want = jax.tree.leaves(new_params), jax.tree.leaves(ref_params)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    # the parameters come back laid out as they went in: the next step takes them as they are
    specs = [leaf.sharding.spec for leaf in jax.tree.leaves(params)]
    assert [leaf.sharding.spec for leaf in got] == specs
    assert any(entry is not None for spec in specs for entry in spec)  # really sharded
    if not vs_auto:
        return step, params, batch

    auto_step, auto_params, auto_batch = _placed(model, rules, AxisType.Auto)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)  # told once already, on Explicit axes
        auto = _flops(auto_step.lower(auto_params, auto_batch).compile())
    explicit = _flops(compiled)
    assert explicit <= FLOPS_VS_AUTO * auto, (explicit, auto)
    return step, params, batch


def test_keras_hub_gemma_trains_under_sr_jit() -> None:
    pytest.importorskip(
        "keras_hub",
        reason="keras-hub is not installed (pip install -e '.[models]' && pip install --no-deps keras-hub)",
    )
    check_one_step(models.keras_gemma())


def test_recurrentgemma_griffin_trains_under_sr_jit() -> None:
    pytest.importorskip(
        "recurrentgemma.jax", reason="recurrentgemma is not installed (pip install -e '.[models]')"
    )
    check_one_step(models.griffin(attention=False))  # the RG-LRU block: a scan inside remat


def test_penzai_llamalike_trains_under_sr_jit() -> None:
    pytest.importorskip("penzai", reason="penzai is not installed (pip install -e '.[models]')")
    check_one_step(models.penzai_llamalike())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # flax's, from inside MaxText and qwix
def test_maxtext_explicit_decoder_trains_under_sr_jit() -> None:
    """MaxText's llama2 decoder with `shard_mode: explicit` (its layers reshard
    their activations and give their contractions `out_sharding`s themselves)
    trains one step under `sr.jit` on an Explicit mesh with MaxText's axis
    names: the one-device loss and parameters, each parameter laid out as
    MaxText's own logical axis rules lay it out, and the layouts MaxText's code
    states kept and listed as the model's. (Its FLOPs against Auto axes, where
    the model is built with `shard_mode: auto`, are the benchmark's.)"""
    pytest.importorskip(
        "maxtext",
        reason="MaxText is not installed (how: `maxtext_llama` in benchmarks/_models.py)",
    )
    try:
        model = models.maxtext_llama()
    except models.Unavailable as why:
        pytest.skip(str(why))
    step, params, batch = check_one_step(model, vs_auto=False)
    # the rule file gives each parameter the layout MaxText's logical axis rules give it
    assert [leaf.sharding.spec for leaf in jax.tree.leaves(params)] == jax.tree.leaves(model.native_specs)

    stated = [d for d in step.decisions(params, batch) if d.by == "model"]
    assert stated, "no layout stated by MaxText's code was seen"
    # e.g. MaxText's MLP gives its row-parallel output projection (a contraction over
    # `tensor`, which JAX refuses on Explicit axes without one) its `out_sharding`
    wo = [d for d in stated if d.primitive == "dot_general" and d.scope.endswith("mlp/wo")]
    assert [d.spec for d in wo] == [P("fsdp", None, "tensor")], wo
    # MaxText holds its mesh: the step does not compile for one device, and its ideal is its
    # program before XLA partitions it (its scanned layers counted per trip)
    cost = step.cost(params, batch)
    assert any("before XLA partitions it" in note for note in cost.notes), cost.notes
    assert cost.ideal_flops_per_device is not None and 0.95 <= cost.ratio <= 1.5, cost.ratio


def test_keras_hub_scopes_are_the_layer_names_and_a_rule_that_misses_says_so() -> None:
    """Keras names each layer call itself (`decoder_block_0/attention`), the same
    names shardrules matches activation rules against; a rule written for
    another framework's names (`attn$`) matches none and says which it meant."""
    pytest.importorskip(
        "keras_hub",
        reason="keras-hub is not installed (pip install -e '.[models]' && pip install --no-deps keras-hub)",
    )
    model = models.keras_gemma()
    text = Path(model.rules).read_text()
    good = sr.loads(
        text + 'rules activations:\n  "decoder_block_\\d+/attention$" -> (batch, _, _)\n', name="g.shard"
    )
    step, params, batch = _placed(model, good, AxisType.Explicit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)
        scopes = step.scopes(params, batch)
    attention = [s for s in scopes if s.name.endswith("attention") and s.rule is not None]
    assert [s.name for s in attention] == ["decoder_block_0/attention", "decoder_block_1/attention"]
    wrong = sr.loads(text + 'rules activations:\n  "attn$" -> (batch, _, _)\n', name="w.shard")
    step, params, batch = _placed(model, wrong, AxisType.Explicit)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", sr.ShardRulesWarning)
        step.lower(params, batch)
    (found,) = [w.message for w in caught if getattr(w.message, "code", None) == "SR211"]
    assert found.diagnostics[0].hint.startswith('did you mean "decoder_block_0/attention" or')


def test_maxtext_logical_names_check_a_positional_spec_sr214() -> None:
    """MaxText stacks its layers on dimension 1 and names every dimension
    (`embed`, `layers`, `q_heads`, ...): its rule file agrees with the names;
    a spec written for unstacked kernels, `(..., embed, heads, _)`, splits the
    layer dimension, and SR214 says so."""
    model = _maxtext_or_skip(layers=4)  # a layer dimension `fsdp=4` divides: the plan is valid
    rules = sr.load(model.rules)
    mesh = dict(zip(model.axes, model.shape, strict=True))
    assert [d for d in sr.check(model.boxed, rules, mesh) if d.code == "SR214"] == []
    text = Path(model.rules).read_text()
    unstacked = text.replace(
        '"self_attention/(query|key|value)/kernel$" -> (embed, _, heads, _)',
        '"self_attention/(query|key|value)/kernel$" -> (..., embed, heads, _)',
    )
    assert unstacked != text
    found = [
        d
        for d in sr.check(model.boxed, sr.loads(unstacked, name="unstacked.shard"), mesh)
        if d.code == "SR214"
    ]
    assert found and all("self_attention" in d.path for d in found)
    assert any("`layers` for that dimension" in d.message and "shifted" in d.message for d in found), found


def _maxtext_or_skip(layers: int = 2):
    pytest.importorskip(
        "maxtext", reason="MaxText is not installed (how: `maxtext_llama` in benchmarks/_models.py)"
    )
    try:
        return models.maxtext_llama(layers=layers)
    except models.Unavailable as why:
        pytest.skip(str(why))


@pytest.mark.skipif(
    importlib.util.find_spec("maxtext") is None,
    reason="MaxText is not installed (how: `maxtext_llama` in benchmarks/_models.py)",
)
def test_maxtext_base_and_model_configs_convert_as_maxtext_merges_them() -> None:
    """`convert maxtext base.yml models/NAME.yml` against MaxText's own
    merge of the two (its `pyconfig` merges the rules apart from the other
    keys): for every model config MaxText ships that sets rules, the same
    aliases, in the same order, as converting the config MaxText merged."""
    yaml = pytest.importorskip("yaml")
    pyconfig = importlib.import_module("maxtext.configs.pyconfig")
    apply_rules = getattr(pyconfig, "_apply_rules", None)
    if apply_rules is None:
        pytest.skip("this MaxText merges its rules elsewhere (no pyconfig._apply_rules)")
    configs = Path(pyconfig.__file__).parent
    base = configs / "base.yml"
    base_data = yaml.safe_load(base.read_text(encoding="utf-8"))
    checked = 0
    for model in sorted((configs / "models").glob("*.yml")):
        data = yaml.safe_load(model.read_text(encoding="utf-8")) or {}
        if not data.get("logical_axis_rules"):
            continue
        merged = {**base_data, **{k: v for k, v in data.items() if k != "logical_axis_rules"}}
        merged["logical_axis_rules"] = apply_rules(
            base_data["logical_axis_rules"], data["logical_axis_rules"], data
        )
        merged.pop("base_config", None)
        ours = sr.convert_maxtext([base, model]).text
        theirs = sr.convert_maxtext(merged).text
        assert ours.split("\n\n", 1)[1] == theirs.split("\n\n", 1)[1], model.name
        checked += 1
    assert checked >= 3, f"only {checked} of MaxText's model configs set logical_axis_rules"


# ---------------------------------------------------------------- EasyDeL


def test_easydel_llama_rules_converted_lay_out_every_leaf_as_easydel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A tiny EasyDeL Llama: its config's `get_partition_rules()`, converted
    (by the function and by `shardrules convert easydel llama`), give every
    parameter the layout EasyDeL's own `_match_partition_rules` gives it: the
    same device -> block map on a mesh of all five EasyDeL axes."""
    monkeypatch.setenv("EASYDEL_AUTO", "0")  # else importing it adds GPU flags to XLA_FLAGS
    pytest.importorskip("easydel", reason="EasyDeL is not installed (see docs/convert.md#easydel)")
    from easydel.modules.llama import LlamaConfig, LlamaForCausalLM
    from flax import nnx

    from shardrules._cli._main import main

    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    model = nnx.eval_shape(lambda: LlamaForCausalLM(config=config, rngs=nnx.Rngs(0)))
    tree = model.graphtree_params_shape
    theirs = model._match_partition_rules()  # eformer's match_partition_rules on the config's rules
    conversion = sr.convert_easydel(config)
    assert conversion.exact, conversion.notes
    out = tmp_path / "llama.shard"
    assert main(["convert", "easydel", "llama", "-o", str(out)]) == 0
    assert out.read_text().split("\n\n", 1)[1] == conversion.text.split("\n\n", 1)[1]
    axes = tuple(config.sharding_axis_names)
    mesh = jax.make_mesh((1, 2, 1, 2, 2), axes, axis_types=(AxisType.Auto,) * len(axes))
    ours = sr.specs(tree, sr.loads(conversion.text), mesh)
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    got = jax.tree_util.tree_leaves(ours, is_leaf=lambda x: isinstance(x, P))
    want = jax.tree_util.tree_leaves(theirs, is_leaf=lambda x: isinstance(x, P))
    assert len(got) == len(want) == len(leaves) == 21
    sharded = 0
    for (path, leaf), g, w in zip(leaves, got, want, strict=True):
        blocks = [jax.NamedSharding(mesh, s).devices_indices_map(leaf.shape) for s in (g, w)]
        assert blocks[0] == blocks[1], (jax.tree_util.keystr(path), g, w)
        sharded += w != P() and any(e is not None for e in w)
    assert sharded == 16  # embedding, head, 2 x (4 attention + 3 MLP kernels): the rest whole
