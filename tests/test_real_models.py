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


# --- Levanter (marin-levanter, on haliax) ----------------------------------------------------

# Levanter's parameters are haliax arrays, whose leaves' paths end in the array's
# field (`/0` where haliax flattens it so): the patterns are not anchored at the end.
LEVANTER_RULES = r"""mesh data=4, model=2

rules params:
  "mlp/(gate|up)_proj/weight"   -> (_, model, _)        # (layers, mlp, embed)
  "mlp/down_proj/weight"        -> (_, _, model)        # (layers, embed, mlp)
  "self_attn/q_proj/weight"     -> (_, model, _, _, _)  # (layers, kv_heads, q_per_group, head_size, embed)
  "self_attn/(k|v)_proj/weight" -> (_, model, _, _)     # (layers, kv_heads, head_size, embed)
  "self_attn/o_proj/weight"     -> (_, _, model, _)     # (layers, embed, heads, head_size)
  "token_embeddings/weight"     -> (model, _)           # (vocab, embed)
  default -> replicated

rules inputs:
  "tokens" -> (data, _)                                 # (batch, position)
"""


def _levanter_llama():
    """A tiny Levanter llama (two stacked layers, rotary embeddings, grouped
    attention), a batch of tokens and an SGD step on its next-token loss.

    Levanter (tested on Python 3.11) is installed without its training stack,
    then the packages its import needs, held to the JAX stack already there
    (`stack.txt`: the installed jax, jaxlib, flax, numpy and optax pins):
    `pip install --no-deps marin-{levanter,haliax,rigging,fray,iris}==0.2.20.dev202606180959
    marin-finelog==0.2.10`, then `pip install -c stack.txt draccus GitPython
    google-cloud-storage wandb tqdm-loggable chex cloudpickle connect-python zstandard
    humanfriendly pyarrow braceexpand tblib datasets pytimeparse transformers aqtp jmp
    safetensors botocore uvicorn`."""
    try:
        import equinox as eqx
        import haliax as hax
        import jax.numpy as jnp
        from levanter.layers.attention import AttentionBackend, AttentionMask
        from levanter.models.llama import LlamaConfig, LlamaLMHeadModel
        from levanter.models.lm_model import LmExample
    except ImportError as why:  # levanter, or one of the packages its import needs
        pytest.skip(f"Levanter's model code does not import ({why}): install it as `_levanter_llama` says")
    config = LlamaConfig(
        max_seq_len=16, hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=4, num_kv_heads=2,
        attn_backend=AttentionBackend.VANILLA, gradient_checkpointing=False,
    )  # fmt: skip
    vocab = hax.Axis("vocab", 64)
    model = LlamaLMHeadModel.init(vocab, config, key=jax.random.PRNGKey(0))
    tokens = hax.random.randint(jax.random.PRNGKey(1), (hax.Axis("batch", 8), config.max_Pos), 0, vocab.size)
    weight = LmExample.causal_loss_mask(config.max_Pos).astype(jnp.float32)

    def step(model, batch):
        def loss(m):
            example = LmExample(
                tokens=batch["tokens"],
                loss_weight=hax.broadcast_to(weight, batch["tokens"].axes),
                attn_mask=AttentionMask.causal(),
            )
            return m.compute_next_token_loss(example).scalar()

        value, grads = eqx.filter_value_and_grad(loss)(model)
        return jax.tree.map(lambda p, g: p - 0.5 * g, model, grads), value

    return model, {"tokens": tokens}, step


@pytest.mark.parametrize("kind", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])
def test_levanter_llama_trains_under_sr_jit(kind: AxisType) -> None:
    """Two steps of a Levanter llama on an 8-device mesh give one device's
    losses and parameters. Its rotary embedding computes its frequencies
    while the step is traced (`jax.ensure_compile_time_eval`)."""
    model, batch, step = _levanter_llama()
    rules = sr.loads(LEVANTER_RULES, name="levanter_llama.shard")
    one, want = model, []
    for _ in range(2):
        one, loss = jax.jit(step)(one, batch)
        want.append(float(loss))
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind,) * 2)
    params, placed = sr.apply(model, rules, mesh), sr.apply(batch, rules, mesh, group="inputs")
    sharded = sr.jit(step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    got = []
    for _ in range(2):  # each step's outputs feed the next as they come back
        params, loss = sharded(params, placed)
        got.append(float(loss))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(one), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    specs = {
        jax.tree_util.keystr(k): x.sharding.spec for k, x in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    assert [s for p, s in specs.items() if "up_proj" in p] == [P(None, "model", None)]
    assert [s for p, s in specs.items() if "token_embeddings" in p] == [P("model", None)]
