"""Models from real libraries train one step under `sr.jit` on Explicit axes, with
the rule files of `benchmarks/rules/`: the loss and the new parameters are the
one-device ones, and each device does little more work than on Auto axes.

The libraries are optional (`pip install -e ".[models]"`); a test whose library
is missing is skipped with the reason. The models and their train steps are
`benchmarks/_models.py`'s, the exact FLOPs `benchmarks/explicit_flops.py`'s.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from typing import Any

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


def _bench_module(name: str):
    """A module of benchmarks/ (an agreement module: `_agree_haiku`, ...),
    loaded once."""
    if name not in sys.modules:
        here = Path(__file__).resolve().parent.parent / "benchmarks"
        if str(here) not in sys.path:
            sys.path.insert(0, str(here))  # the agreement modules import `_expert_layouts`
        spec = importlib.util.spec_from_file_location(name, here / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


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


def test_keras_hub_gemma_search_writes_a_file_that_trains_it(tmp_path: Path) -> None:
    """`suggest(search=True)` on keras-hub's Gemma (its own code, JAX's default
    Explicit mesh): the file it writes lays the model out on its mesh, and one
    step there computes what one device computes."""
    import dataclasses

    pytest.importorskip(
        "keras_hub",
        reason="keras-hub is not installed (pip install -e '.[models]' && pip install --no-deps keras-hub)",
    )
    model = models.keras_gemma()
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (model.params, model.batch))

    def make_step(rules, mesh):
        step = sr.jit(
            model.step_on(mesh), rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None)
        )
        return step, shapes

    text = sr.suggest(search=True, step=make_step, devices=8, target="h100", strategy="fsdp+tp")
    rules = sr.loads(text)
    sizes = {axis.name: int(axis.size) for axis in rules.mesh.axes}
    assert "\n#   " in text and "chosen" in text  # the table of candidates
    for tree, group in zip(shapes, ("params", "inputs"), strict=True):
        assert not sr.plan(tree, rules, sizes, group=group).diagnostics  # lint-clean on the model's own tree
    (tmp_path / "chosen.shard").write_text(text)
    chosen = dataclasses.replace(
        model, rules=tmp_path / "chosen.shard", shape=tuple(sizes.values()), axes=tuple(sizes)
    )
    check_one_step(chosen, vs_auto=False)


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


# haliax: a tiny transformer of named arrays (benchmarks/_agree_haliax.py), planned by its axis names.


def _haliax():
    """benchmarks/_agree_haliax.py, loaded once haliax is there."""
    pytest.importorskip("haliax", reason="haliax is not installed (`pip install marin-haliax`)")
    return _bench_module("_agree_haliax")


def test_haliax_arrays_are_planned_by_path_and_axis_names_as_haliax_lays_them_out() -> None:
    """Paths without the named array's own segment, and the mapping Levanter uses
    for FSDP+TP written as rules gives every leaf the sharding haliax's own
    `infer_resource_partitions` gives it: the same block on every device."""
    A = _haliax()
    import haliax as hax

    model = A.model()
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    rules = sr.loads(A.MAPPING_RULES)
    plan = sr.plan(model, rules, mesh)
    assert plan.ok, plan.errors
    paths = [leaf.path for leaf in plan]
    assert "layers/stacked/self_attn/q_proj/weight" in paths and "token_embeddings/weight" in paths
    assert not any(path.endswith("/0") for path in paths)
    by_path = {leaf.path: leaf.spec for leaf in plan}
    assert by_path["layers/stacked/self_attn/q_proj/weight"] == P(None, "model", None, "data")

    ours = sr.shardings(model, rules, mesh)
    theirs = hax.partitioning.infer_resource_partitions(model, A.MAPPING, mesh=mesh)
    is_named = lambda x: isinstance(x, hax.NamedArray)  # noqa: E731
    arrays = jax.tree_util.tree_leaves(model, is_leaf=is_named)
    mine = jax.tree_util.tree_leaves(ours, is_leaf=is_named)
    haliax_own = jax.tree_util.tree_leaves(theirs, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    assert len(arrays) == len(mine) == len(haliax_own) == len(paths) == 12
    for array, named, sharding in zip(arrays, mine, haliax_own, strict=True):
        assert isinstance(named, hax.NamedArray) and named.axis_names == array.axis_names
        shape = array.array.shape
        assert named.array.devices_indices_map(shape) == sharding.devices_indices_map(shape), array.axis_names

    # `jax.device_put` takes the shardings as they are, and `apply` places the model the same way
    put = jax.device_put(model, ours)
    placed = sr.apply(model, rules, mesh)
    for a, b, sharding in zip(
        jax.tree_util.tree_leaves(put), jax.tree_util.tree_leaves(placed), haliax_own, strict=True
    ):
        assert a.sharding == b.sharding
        assert a.sharding.devices_indices_map(a.shape) == sharding.devices_indices_map(a.shape)


def test_haliax_suggest_drafts_haliax_layout() -> None:
    """`sr.suggest(model, ..., "fsdp+tp")` on the named arrays lays every leaf out
    as haliax does under Levanter's FSDP+TP mapping (`measure()` of the benchmark)."""
    A = _haliax()
    found = A.measure()
    for what in ("suggest, named arrays", "its mapping as rules"):
        agreement = found[what][1]
        assert agreement.leaves == 12 and agreement.same_leaves == 12, (what, agreement.differ)
        assert agreement.same_bytes == agreement.bytes > 0, (what, agreement.differ)


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_haliax_model_trains_under_sr_jit(kind: str) -> None:
    """A haliax transformer trains under `sr.jit` with the rules' layouts: the
    loss falls, the new parameters are named arrays laid out as planned, and the
    first step gives what `jax.jit` on one device gives."""
    A = _haliax()
    import haliax as hax

    axis_type = AxisType.Explicit if kind == "explicit" else AxisType.Auto
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)
    rules = sr.loads(A.MAPPING_RULES + "\nrules inputs:\n  default -> (data, _)\n")
    model = A.model()
    tokens = np.random.default_rng(0).integers(0, A.Vocab.size, (8, A.Pos.size + 1))

    def step(model, tokens):
        loss, grads = jax.value_and_grad(A.loss)(model, tokens)
        return jax.tree_util.tree_map(lambda w, g: w - 0.5 * g, model, grads), loss

    expected_model, expected_loss = jax.jit(step)(model, tokens)
    params = sr.apply(model, rules, mesh)
    batch = sr.apply(tokens, rules, mesh, group="inputs")
    train = sr.jit(step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    with jax.set_mesh(mesh):
        new, first = train(params, batch)
        for ours, theirs in zip(
            jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(expected_model), strict=True
        ):
            np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-4, atol=1e-5)
        losses = [float(first)]
        for _ in range(3):
            new, loss = train(new, batch)
            losses.append(float(loss))
    np.testing.assert_allclose(float(first), float(expected_loss), rtol=1e-4)
    assert losses[-1] < losses[0], losses
    plan = {leaf.path: leaf.spec for leaf in sr.plan(model, rules, mesh)}
    q = new.layers.stacked.self_attn.q_proj.weight
    assert isinstance(q, hax.NamedArray) and q.axis_names == ("layers", "heads", "head_size", "embed")
    assert q.array.sharding.spec == plan["layers/stacked/self_attn/q_proj/weight"]
    assert new.token_embeddings.weight.array.sharding.spec == plan["token_embeddings/weight"]


# --- qwix: a decoder quantized by qwix, laid out by the float model's rule file -----------------------------


def _qwix_or_skip(**options):
    held = f'"jax=={jax.__version__}" "flax=={importlib.metadata.version("flax")}"'
    pytest.importorskip(
        "qwix", reason=f"qwix is not installed (pip install qwix {held}: holding jax and flax where they are)"
    )
    try:
        return models.nnx_qwix_decoder(**options)
    except models.Unavailable as why:
        pytest.skip(str(why))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # flax's, from inside qwix
@pytest.mark.parametrize("options", [{}, {"weight_qtype": "int4", "tile_size": 16}])
def test_qwix_quantized_decoder_takes_the_float_rules_and_trains_under_sr_jit(options) -> None:
    """qwix's post-training quantization turns each `.../kernel` into
    `kernel/array/qvalue` and `kernel/array/scale`; the float model's rule file
    (anchored `kernel$` patterns) lays both out with no finding, the values as
    the kernel and the scales along the dimensions they share, and one train
    step (the float leaves: embedding, norms, scales) under `sr.jit` on an
    Explicit and an Auto mesh gives the one-device loss and parameters."""
    model = _qwix_or_skip(**options)
    rules = sr.load(model.rules)
    mesh = jax.make_mesh(model.shape, model.axes, axis_types=(AxisType.Auto,) * 2)
    plan = sr.plan(model.params, rules, mesh)
    assert [d.code for d in plan.diagnostics] == [] and [
        d.code for d in sr.check(model.params, rules, mesh)
    ] == []
    leaves = {leaf.path: leaf for leaf in plan.leaves}
    up = "layers/0/mlp/up/kernel/array/"
    assert leaves[up + "qvalue"].spec == P("fsdp", "model")
    assert leaves[up + "qvalue"].rule is leaves[up + "scale"].rule is not None
    assert leaves[up + "qvalue"].rule.pattern == "mlp/(gate|up)/kernel$"
    # one scale per column: unsplit rows; 64 rows in 4 tiles of 16: a tile per fsdp device
    assert leaves[up + "scale"].spec == P("fsdp" if options else None, "model")
    assert leaves["layers/0/mlp/down/kernel/array/scale"].spec == P("model" if options else None, "fsdp")
    quantized = [
        leaf for leaf in plan.leaves if leaf.path.endswith(("/qvalue", "/scale")) and "kernel" in leaf.path
    ]
    assert len(quantized) == 2 * (2 * 7 + 1) and all(leaf.why == "rule" for leaf in quantized)

    ref_params, ref_loss = jax.jit(model.step_on(None))(model.params, model.batch)
    for kind in (AxisType.Explicit, AxisType.Auto):
        # (called, not `.lower().compile()`d: JAX's compiled programs refuse int4 arrays as placed)
        step, params, batch = _placed(model, rules, kind)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", sr.ShardRulesWarning)
            new_params, loss = step(params, batch)
        assert [str(w.message) for w in caught] == [], kind
        np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
        got, want = jax.tree.leaves(new_params), jax.tree.leaves(ref_params)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(
                np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-4, atol=1e-5
            )
        assert [leaf.sharding.spec for leaf in got] == [
            leaf.sharding.spec for leaf in jax.tree.leaves(params)
        ]
        # the scales trained: the step changed them
        assert not np.allclose(
            np.asarray(new_params["layers"][0]["mlp"]["up"]["kernel"]["array"]["scale"].value),
            np.asarray(model.params["layers"][0]["mlp"]["up"]["kernel"]["array"]["scale"].value),
        )


# --- aqtp: AQT's QTensor in place of each kernel, laid out by the float rules ------------------------------


@pytest.mark.parametrize("kind", [AxisType.Explicit, AxisType.Auto])
def test_aqt_qtensors_take_the_float_rules_and_compute_as_on_one_device(kind) -> None:
    """AQT quantizes a kernel into a `QTensor` (`qvalue`, a list of scales):
    `kernel/qvalue` and `kernel/scale/0`. The float rules lay both out (the
    scale unsplit along its size-1 dimension) with no finding, and an MLP
    that dequantizes them runs under `sr.jit` as on one device."""
    pytest.importorskip("aqt.jax.v2.aqt_quantizer", reason="aqtp is not installed (pip install aqtp)")
    from aqt.jax.v2 import aqt_quantizer

    rng = np.random.default_rng(0)
    quantizer = aqt_quantizer.quantizer_make(8)

    def quantized(rows, cols):
        return quantizer.quant(rng.normal(size=(rows, cols)).astype(np.float32), calibration_axes=[0])[0]

    params = {"mlp": {"up": {"kernel": quantized(64, 128)}, "down": {"kernel": quantized(128, 64)}}}
    rules = sr.loads(
        'mesh fsdp, model\nrules params:\n  "mlp/up/kernel$" -> (fsdp, model)\n  "mlp/down/kernel$" -> (model, fsdp)\n'
        'rules inputs:\n  "x" -> (fsdp, _)\n'
    )
    mesh = jax.make_mesh((4, 2), ("fsdp", "model"), axis_types=(kind, kind))
    plan = sr.plan(params, rules, mesh)
    assert plan.diagnostics == () and [d.code for d in sr.check(params, rules, mesh)] == []
    assert [(leaf.path, leaf.spec) for leaf in plan.leaves] == [
        ("mlp/down/kernel/qvalue", P("model", "fsdp")),
        ("mlp/down/kernel/scale/0", P(None, "fsdp")),
        ("mlp/up/kernel/qvalue", P("fsdp", "model")),
        ("mlp/up/kernel/scale/0", P(None, "model")),
    ]

    def mlp(params, x):
        up, down = params["mlp"]["up"]["kernel"].dequant(), params["mlp"]["down"]["kernel"].dequant()
        return jax.nn.relu(x @ up) @ down

    x = rng.normal(size=(8, 64)).astype(np.float32)
    want = jax.jit(mlp)(params, x)
    step = sr.jit(mlp, rules, mesh, in_groups=("params", "inputs"), out_groups=None)
    got = step(sr.apply(params, rules, mesh), sr.apply({"x": x}, rules, mesh, group="inputs")["x"])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- dm-haiku: suggest's rules


def _auto_step_is_the_one_device_step(model) -> None:
    """One step on an 8-device Auto mesh gives the one-device loss and parameters."""
    rules = sr.load(model.rules)
    ref_params, ref_loss = jax.jit(model.step_on(None))(model.params, model.batch)
    step, params, batch = _placed(model, rules, AxisType.Auto)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)
        new_params, loss = step(params, batch)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(ref_params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    assert any(entry is not None for leaf in jax.tree.leaves(params) for entry in leaf.sharding.spec)


def test_haiku_transformer_trains_under_sr_jit_with_suggests_rules(tmp_path: Path) -> None:
    hk = pytest.importorskip("haiku", reason="dm-haiku is not installed (pip install dm-haiku)")
    agree = _bench_module("_agree_haiku")
    net = agree.forward(agree.TINY)
    seq = models.tokens(0, 8, 8, agree.TINY["vocab"])
    batch = {"tokens": seq[:, :-1], "targets": seq[:, 1:]}
    params = net.init(jax.random.key(0), batch["tokens"])
    assert isinstance(hk.data_structures.to_haiku_dict(params), dict)
    sizes = {"fsdp": 2, "model": 4}
    rules = tmp_path / "haiku.shard"
    rules.write_text(sr.suggest(params, sizes, strategy="fsdp+tp"), encoding="utf-8")

    def loss_fn(p, b):
        return models.cross_entropy(net.apply(p, None, b["tokens"]), b["targets"])

    model = models.Model(
        "haiku", models.sgd(loss_fn), params, batch, rules, tuple(sizes.values()), tuple(sizes), "dm-haiku"
    )
    _, placed, _ = check_one_step(model)
    _auto_step_is_the_one_device_step(model)
    assert placed["block_0/mlp/~/linear_1"]["w"].sharding.spec == P("model", "fsdp")  # row-parallel
    assert placed["block_0/multi_head_attention/linear"]["w"].sharding.spec == P("model", "fsdp")


@pytest.mark.parametrize("strategy", ["fsdp", "tp", "fsdp+tp"])
def test_haiku_suggest_agrees_with_the_megatron_hand_layout(strategy: str) -> None:
    pytest.importorskip("haiku", reason="dm-haiku is not installed (pip install dm-haiku)")
    agree = _bench_module("_agree_haiku")
    for config in (agree.TINY, agree.SMALL):
        found = agree.measure(config, strategy)
        assert found.leaf_share >= 0.95 and found.byte_share >= 0.95, found.differ


# ---------------------------------------------------------------- gemma: Gemma 3's own tree

# Google's gemma does not install by `pip install gemma` (kauldron's requirements do not resolve; gemma 4
# needs Python 3.12+). These tests ran with gemma 3.3.0 and kauldron 1.4.1 installed with --no-deps, plus
# the packages they import (tensorflow, clu, chex, ml_collections, typeguard).
GEMMA_MISSING = "gemma is not installed (`pip install gemma` does not resolve; see GEMMA_MISSING's comment)"


def test_gemma3_tree_is_the_one_built_from_its_names_and_suggest_agrees_with_megatron() -> None:
    pytest.importorskip("gemma.gm.nn._transformer", reason=GEMMA_MISSING)
    agree = _bench_module("_agree_gemma")
    own = agree.gemma_shapes(agree.TINY)
    built = agree.shapes(agree.TINY)
    assert {k: (v.shape, v.dtype) for k, v in own.items()} == {
        k: (v.shape, v.dtype) for k, v in built.items()
    }
    found = agree.measure(own, "fsdp+tp")
    assert found.leaf_share >= 0.95 and found.byte_share >= 0.95, found.differ
    # kauldron's FSDPSharding, on gemma's own Gemma3_1B tree (shapes only): fsdp_dim="largest"
    big = agree.gemma_shapes(agree.CONFIGS["Gemma3_1B"])
    found = agree.measure(big, "fsdp", **agree.LARGEST)
    assert found.leaf_share >= 0.95 and found.byte_share >= 0.95, found.differ
    assert agree.measure(big, "fsdp").byte_share < 0.5  # the default splits the hidden size instead


def test_gemma3_trains_under_sr_jit_with_suggests_rules(tmp_path: Path) -> None:
    pytest.importorskip("gemma.gm.nn._transformer", reason=GEMMA_MISSING)
    agree = _bench_module("_agree_gemma")
    net = agree.model(agree.TINY)
    seq = models.tokens(0, 8, 8, agree.TINY["vocab"])
    batch = {"tokens": seq[:, :-1], "targets": seq[:, 1:]}
    params = jax.tree.map(lambda x: x.astype(np.float32), net.init(jax.random.key(0), batch["tokens"]))
    sizes = {"fsdp": 2, "model": 4}
    rules = tmp_path / "gemma.shard"
    rules.write_text(sr.suggest(params, sizes, strategy="fsdp+tp"), encoding="utf-8")

    def loss_fn(p, b):
        return models.cross_entropy(net.apply(p, b["tokens"]).logits, b["targets"])

    model = models.Model(
        "gemma", models.sgd(loss_fn), params, batch, rules, tuple(sizes.values()), tuple(sizes), "gemma"
    )
    _, placed, _ = check_one_step(model)
    _auto_step_is_the_one_device_step(model)
    assert placed["params"]["layer_0"]["mlp"]["linear"].sharding.spec == P("model", "fsdp")


# ---------------------------------------------------------------- gemma (Gemma 3, Flax linen)


def _gemma_transformer():
    """gemma's linen `Transformer` and its config module, or a skip: the
    library drags kauldron (and with it clu and TensorFlow) into its import."""
    pytest.importorskip("gemma", reason=GEMMA_MISSING)
    try:
        from gemma.gm.nn import _config, _modules, _transformer
    except (ImportError, AttributeError) as err:  # a kauldron or JAX this gemma does not know
        pytest.skip(f"gemma's model does not import here: {type(err).__name__}: {err}")
    return _transformer.Transformer, _config.TransformerConfig, _modules.AttentionType


def test_gemma_mlp_reached_by_its_weights_name_and_the_loss_listed() -> None:
    """Gemma's feed-forward block calls its gating `Einsum` as `mlp/Einsum_0`
    and keeps the weight as `mlp/gating_einsum`: a rule with the weight's
    name reaches it; the loss's label gather and mask select, outside the
    model, are listed with their lines."""
    transformer, config, attention = _gemma_transformer()
    import jax.numpy as jnp

    model = transformer(
        config=config(
            num_embed=64, embed_dim=32, hidden_dim=64, num_heads=2, head_dim=16, num_kv_heads=1,
            final_logit_softcap=None, use_post_attn_norm=True, use_post_ffw_norm=True,
            attention_types=(attention.GLOBAL,), use_qk_norm=True,
        )
    )  # fmt: skip
    S = jax.ShapeDtypeStruct
    batch = {"tokens": S((8, 16), jnp.int32), "labels": S((8, 16), jnp.int32), "mask": S((8, 16), jnp.bool_)}
    params = jax.eval_shape(model.init, jax.random.key(0), batch["tokens"])

    def loss(params, batch):
        logp = jax.nn.log_softmax(model.apply(params, batch["tokens"]).logits)
        nll = -jnp.take_along_axis(logp, batch["labels"][..., None], axis=-1)[..., 0]  # LABELS
        return jnp.sum(jnp.where(batch["mask"], nll, 0.0)) / jnp.sum(batch["mask"])  # MASK

    rules = sr.loads(
        "rules params:\n  default -> replicated\nrules inputs:\n  default -> (data, _)\n"
        'rules activations:\n  "layer_\\d+/mlp/gating_einsum$" -> (data, _, _, _)\n',
        name="gemma.shard",
    )
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    step = sr.jit(loss, rules, mesh, in_groups=("params", "inputs"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", sr.ShardRulesWarning)  # the rule matches: no SR211
        traced = step.traced(params, batch)
    (gating,) = [s for s in traced.scopes if s.name.endswith("layer_0/mlp/Einsum_0")]
    assert gating.alias == "params/layer_0/mlp/gating_einsum"
    assert gating.rule is not None and gating.rule.pattern == "layer_\\d+/mlp/gating_einsum$"
    lines = Path(__file__).read_text(encoding="utf-8").splitlines()
    labels = next(i for i, line in enumerate(lines, 1) if line.rstrip().endswith("# LABELS"))
    mask = next(i for i, line in enumerate(lines, 1) if line.rstrip().endswith("# MASK"))
    kinds = {u.kind: u for u in traced.reach.unreached}
    assert kinds["gather"].sources == (f"{__file__}:{labels}",)
    assert f"{__file__}:{mask}" in kinds["select"].sources


# ---------------------------------------------------------------- EasyDeL


def _easydel_tiny_llama(monkeypatch: pytest.MonkeyPatch, **fields: Any) -> tuple[Any, Any]:
    """A tiny EasyDeL Llama's config (2 layers of width 64, 4 query heads
    sharing 2 key/value heads; `fields`: more of its fields) and its
    `LlamaForCausalLM`; EasyDeL imported without the GPU flags it would add."""
    monkeypatch.setenv("EASYDEL_AUTO", "0")  # else importing it adds GPU flags to XLA_FLAGS
    pytest.importorskip(
        "easydel", reason="EasyDeL is not installed (see docs/convert.md#easydel-easydel-model-configs)"
    )
    from easydel.modules.llama import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **fields,
    )  # fmt: skip
    return config, LlamaForCausalLM


def test_easydel_llama_rules_converted_lay_out_every_leaf_as_easydel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A tiny EasyDeL Llama: its config's `get_partition_rules()`, converted
    (by the function and by `shardrules convert easydel llama`), give every
    parameter the layout EasyDeL's own `_match_partition_rules` gives it: the
    same device -> block map on a mesh of all five EasyDeL axes."""
    config, LlamaForCausalLM = _easydel_tiny_llama(monkeypatch)
    from flax import nnx

    from shardrules._cli._main import main

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


# ---------------------------------------------------------------- kauldron: FSDPSharding, as gemma is trained


def test_suggest_fsdp_dim_largest_is_kauldrons_own_fsdp_sharding() -> None:
    pytest.importorskip("gemma.gm.nn._transformer", reason=GEMMA_MISSING)
    from kauldron.utils.sharding_utils import FSDPSharding

    agree = _bench_module("_agree_gemma")
    tree = dict(agree.gemma_shapes(agree.CONFIGS["Gemma3_1B"]))
    bf16 = lambda *s: jax.ShapeDtypeStruct(s, jax.numpy.bfloat16)  # noqa: E731
    # beside gemma's own: arrays of equal largest dimensions, and one of exactly 4 MiB (kept whole)
    tree |= {
        "extra/square": bf16(2048, 2048),
        "extra/cube": bf16(256, 256, 256),
        "extra/four": bf16(2048, 1024),
    }
    theirs = FSDPSharding()(tree)  # over every device (kauldron's `devices` mesh)
    sizes = {"devices": jax.device_count()}
    text = sr.suggest(tree, sizes, strategy="fsdp", **agree.LARGEST)
    ours = sr.specs(tree, sr.loads(text), sizes)
    for path, leaf in tree.items():
        rank = len(leaf.shape)
        want = tuple(theirs[path].spec) + (None,) * (rank - len(theirs[path].spec))
        assert tuple(ours[path]) + (None,) * (rank - len(ours[path])) == want, (path, leaf.shape, text)
    assert ours["extra/square"] == P(None, "devices")  # kauldron's `argsort` order: the last of equal
    assert ours["params/layer_0/mlp/linear"] == P("devices", None)  # its MLP units, the largest


def _easydel_llama(monkeypatch: pytest.MonkeyPatch):
    """A tiny EasyDeL Llama (float32 throughout, attention too) with weights
    from a fixed seed, its config, and its parameters (an `nnx.State`, on the
    host) split from the rest of its state."""
    import jax.numpy as jnp
    from flax import nnx

    config, LlamaForCausalLM = _easydel_tiny_llama(monkeypatch, attn_dtype=jnp.float32, kvdtype=jnp.float32)
    model = LlamaForCausalLM(config=config, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss_fn(params, batch):  # EasyDeL's forward pass, the next-token cross-entropy of its logits
        logits = nnx.merge(graphdef, params, rest)(input_ids=batch["tokens"]).logits
        return models.cross_entropy(logits, batch["targets"])

    return config, jax.device_get(params), models.sgd(loss_fn)


@pytest.mark.parametrize(
    "kind",
    [
        AxisType.Auto,
        pytest.param(
            AxisType.Explicit,
            marks=pytest.mark.xfail(
                raises=AssertionError,
                strict=True,
                reason="EasyDeL's layers state their activations' layouts with "
                "`with_sharding_constraint`, which JAX makes an assert on Explicit axes, and the "
                "layouts they state are not those their values have (the hidden states stated "
                "`((fsdp, dp), sp, tp)` are laid out `((dp, fsdp), _, tp)`); the layouts they state "
                "(query and key sequences both over `sp`) are ones JAX refuses to contract there",
            ),
        ),
    ],
)
def test_easydel_llama_trains_under_sr_jit_with_its_converted_rules(
    monkeypatch: pytest.MonkeyPatch, kind: AxisType
) -> None:
    """The tiny EasyDeL Llama trains two SGD steps under `sr.jit` with the rule
    file converted from its config (and a batch rule) on a mesh of EasyDeL's
    five axes (fsdp=2, tp=2, sp=2): the losses and the new parameters are those
    of the same steps on one device, laid out as the rules say."""
    config, params, step = _easydel_llama(monkeypatch)
    rules = sr.loads(sr.convert_easydel(config).text + "\nrules inputs:\n  default -> ((dp, fsdp), _)\n")
    axes = tuple(config.sharding_axis_names)
    seq = models.tokens(0, 8, 16, config.vocab_size)
    batch = {"tokens": seq[:, :-1], "targets": seq[:, 1:]}

    def train(step, mesh, params, batch):  # EasyDeL's layers read the mesh from the config and the context
        config.set_model_mesh(mesh)
        losses = []
        with mesh:
            for _ in range(2):
                params, loss = step(params, batch)
                losses.append(float(loss))
        return params, losses

    one = jax.make_mesh((1,) * 5, axes, axis_types=(AxisType.Auto,) * 5, devices=jax.devices()[:1])
    want, want_losses = train(jax.jit(step), one, params, batch)

    mesh = jax.make_mesh((1, 2, 1, 2, 2), axes, axis_types=(kind,) * 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sr.ShardRulesWarning)  # rules for biases this Llama lacks: SR201
        placed = sr.apply(params, rules, mesh)
        placed_batch = sr.apply(batch, rules, mesh, group="inputs")
    jitted = sr.jit(step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", sr.ShardRulesWarning)
        got, losses = train(jitted, mesh, placed, placed_batch)
    assert [str(w.message) for w in caught if getattr(w.message, "code", None) != "SR201"] == []
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    assert losses[1] < losses[0], losses
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    specs = [leaf.sharding.spec for leaf in jax.tree.leaves(placed)]
    assert [leaf.sharding.spec for leaf in jax.tree.leaves(got)] == specs
    embedding = placed["model"]["embed_tokens"]["embedding"]
    assert embedding.sharding.spec == P(("fsdp", "sp"), "tp")
    assert sum(any(e is not None for e in spec) for spec in specs) == 16
