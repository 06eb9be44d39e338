"""`shardrules convert` and the `convert_*` functions: each converted rule file,
loaded with `sr.loads`, gives leaf by leaf the layout its source gives.

- maxtext: MaxText's own golden dumps (extracts in tests/data/maxtext, see its
  NOTICE): for each dump, the named shardings MaxText computed for every leaf
  of its train state (step, parameters and AdamW state), reproduced from the
  dump's logical axis names and mesh by the `convert maxtext` output of the
  config the dump was made with (`base.yml` for `rule_default...`,
  `custom_mesh_and_rule/NAME.yml` for `rule_NAME...`), with no edits.
- flax: `flax.linen.logical_to_mesh_axes` itself, on random rule lists and
  name tuples, and on MaxText's rules with every name tuple of the dumps.
- regex: `easylm_specs` below, EasyLM's `match_partition_rules` semantics, on
  a Flax LLaMA train state with EasyLM's module names.
- hf: `hf_specs` below, transformers' plan lookup and styles, on Llama-like
  state dicts.

Then the command line: exit codes, `-o`, standard input and output, errors.
"""

from __future__ import annotations

import collections
import io
import itertools
import json
import math
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest
from flax.training import train_state
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules._cli._main import main

pytestmark = pytest.mark.filterwarnings("ignore::shardrules.ShardRulesWarning")

DATA = Path(__file__).resolve().parent / "data" / "maxtext"
DUMPS = sorted((DATA / "sharding").glob("*/*/*.json"))
CONFIGS = [DATA / "configs" / "base.yml", *sorted((DATA / "configs" / "custom_mesh_and_rule").glob("*.yml"))]


def S(shape: Any, dtype: Any = jnp.float32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


def entries(spec: Any, rank: int) -> list[tuple[str, ...]]:
    """A `PartitionSpec` (or a dump's JSON list) as one tuple of mesh axes per
    dimension, `rank` long: `'a'`, `('a',)` and `['a']` are the same entry, and
    `None` and `[]` are no axes (JAX pads a short spec with `None`)."""
    out = [() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in spec]
    assert len(out) <= rank, (spec, rank)
    return out + [()] * (rank - len(out))


def unbox(spec: Any) -> Any:
    return spec.value if isinstance(spec, nn.LogicallyPartitioned) else spec


# ---------------------------------------------------------------- maxtext


def config_of(dump: Path) -> Path:
    """The config a dump was made with: `rule_NAME[_overrides]` → NAME."""
    match = re.fullmatch(r"rule_([a-z0-9-]+)(_.*=.*)?", dump.stem)
    assert match, dump.name
    name = match[1]
    return DATA / "configs" / ("base.yml" if name == "default" else f"custom_mesh_and_rule/{name}.yml")


def dump_id(dump: Path) -> str:
    return f"{dump.parent.parent.name}/{dump.parent.name}/{dump.stem}"


# A dump names a leaf as MaxText's tests/utils/sharding_dump.py does,
# `"/".join(str(key) for key in keypath)`: `.name` for an attribute, `[0]` for a
# sequence index, `['name']` for a dict key. shardrules joins the bare names.
DUMP_KEY = re.compile(r"\.(?P<attr>\w+)|\[(?P<index>\d+)\]|\['(?P<key>[^'/]*)'\]")


def dump_keys(path: str) -> tuple[Any, ...]:
    """The key path a dump's path names."""
    keys: list[Any] = []
    for part in path.split("/"):
        match = DUMP_KEY.fullmatch(part)
        assert match, f"{path}: {part!r} is no key"
        if match["attr"] is not None:
            keys.append(jax.tree_util.GetAttrKey(match["attr"]))
        elif match["index"] is not None:
            keys.append(jax.tree_util.SequenceKey(int(match["index"])))
        else:
            keys.append(jax.tree_util.DictKey(match["key"]))
    return tuple(keys)


def dump_path(keypath: tuple[Any, ...]) -> str:
    """A key path as a dump names it (what sharding_dump.py does)."""
    return "/".join(str(key) for key in keypath)


def shardrules_path(path: str) -> str:
    """A dump's path as shardrules names the leaf:
    `.opt_state/[0]/.mu/['params']/['decoder']` → `opt_state/0/mu/params/decoder`."""
    out = []
    for key in dump_keys(path):
        if isinstance(key, jax.tree_util.GetAttrKey):
            out.append(key.name)
        elif isinstance(key, jax.tree_util.SequenceKey):
            out.append(str(key.idx))
        else:
            out.append(key.key)
    return "/".join(out)


def counterpart(path: str) -> str | None:
    """The parameter an optimizer-state leaf mirrors (as extract.py says): the
    state node's path, then the parameter's own, from its first dict key."""
    parts = path.split("/")
    for i, part in enumerate(parts):
        if part.startswith("['"):
            return "/".join([".params", *parts[i:]])
    return None


def dump_leaves(data: dict[str, Any]) -> dict[str, list[Any]]:
    """Every leaf of a dump, by path: `[names, shape, spec]`. A leaf of
    `mirrored` is laid out as its parameter (extract.py checked it)."""
    leaves = dict(data["leaves"])
    for path in data["mirrored"]:
        param = counterpart(path)
        assert path.startswith(".opt_state/") and param in data["leaves"] and path not in leaves, path
        leaves[path] = data["leaves"][param]
    return leaves


def maxtext_train_state(data: dict[str, Any]) -> Any:
    """The abstract train state MaxText dumps, built as MaxText builds it: a
    Flax `TrainState` of the boxed parameters (`nn.LogicallyPartitioned`, with
    the dump's names and shapes) and of `optax.adamw` (with a schedule, as
    MaxText's `learning_rate_schedule`: that adds the `[2]/.count`) initialised
    on them, under `jax.eval_shape`. Optax's init maps over the boxes and
    keeps them, so the moments carry their parameter's names."""
    params: dict[str, Any] = {}
    for path, (names, shape, _) in data["leaves"].items():
        keys = dump_keys(path)
        if keys[0] != jax.tree_util.GetAttrKey("params"):
            continue
        node = params
        for key in keys[1:-1]:
            node = node.setdefault(key.key, {})
        node[keys[-1].key] = nn.LogicallyPartitioned(S(shape), tuple(names))
    tx = optax.adamw(optax.constant_schedule(1e-3), b1=0.9, b2=0.95, weight_decay=0.1)
    return jax.eval_shape(lambda p: train_state.TrainState.create(apply_fn=None, params=p, tx=tx), params)


@pytest.mark.parametrize("dump", DUMPS, ids=dump_id)
def test_maxtext_golden_dump_is_reproduced(dump: Path) -> None:
    data = json.loads(dump.read_text(encoding="utf-8"))
    leaves = dump_leaves(data)
    state = maxtext_train_state(data)
    # The state has the dump's leaves, and the boxes give them the dump's logical names.
    keyed = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]
    assert sorted(dump_path(keypath) for keypath, _ in keyed) == sorted(leaves)
    names = jax.tree_util.tree_flatten_with_path(nn.get_partition_spec(state))[0]
    for (keypath, leaf), (_, logical) in zip(keyed, names, strict=True):
        assert [list(logical), list(unbox(leaf).shape)] == leaves[dump_path(keypath)][:2], dump_path(keypath)

    rules = sr.loads(sr.convert_maxtext(config_of(dump)).text, name=config_of(dump).name)
    plan = sr.plan(state, rules, data["mesh"])
    assert plan.ok, plan.errors
    # The translation of paths is a bijection from the dump's leaves onto the plan's.
    planned = [leaf.path for leaf in plan.leaves]
    assert [shardrules_path(dump_path(keypath)) for keypath, _ in keyed] == planned
    translated = {shardrules_path(path): path for path in leaves}
    assert len(translated) == len(leaves) == len(planned) == len(set(planned))
    assert set(translated) == set(planned)
    wrong = {}
    for path, (names, shape, expected) in leaves.items():
        leaf = plan[shardrules_path(path)]
        assert leaf.shape == tuple(shape), path
        got = entries(leaf.spec, len(shape))
        if got != entries(expected, len(shape)):
            wrong[path] = (names, got, expected)
    assert not wrong, f"{len(wrong)} of {len(leaves)} leaves differ from MaxText's: {wrong}"


def test_maxtext_dumps_hold_params_and_adamw_state() -> None:
    kinds: dict[str, int] = {}
    for dump in DUMPS:
        for path in dump_leaves(json.loads(dump.read_text(encoding="utf-8"))):
            kind = re.sub(r"/\['.*", "", path)
            kinds[kind] = kinds.get(kind, 0) + 1
    assert kinds == {
        ".step": 11,
        ".params": 311,
        ".opt_state/[0]/.count": 11,
        ".opt_state/[0]/.mu": 311,
        ".opt_state/[0]/.nu": 311,
        ".opt_state/[2]/.count": 11,
    }
    assert sum(kinds.values()) == 966


def test_every_config_has_dumps_and_the_dumps_cover_every_config() -> None:
    assert len(DUMPS) == 11
    assert {config_of(d) for d in DUMPS} == set(CONFIGS)
    assert all(config.exists() for config in CONFIGS)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_maxtext_configs_convert_exactly(config: Path) -> None:
    import yaml

    raw = yaml.safe_load(config.read_text(encoding="utf-8"))
    conversion = sr.convert_maxtext(config)
    assert conversion.exact, conversion.notes
    assert conversion.text.startswith(f"# Converted by shardrules convert maxtext from {config}\n")
    assert f"\nmesh {', '.join(raw['mesh_axes'])}\n" in conversion.text
    assert conversion.text.endswith(
        "\nrules params:\n  # RNG streams have no logical names; Flax replicates them (none in a linen model's "
        'state)\n  "(^|/)rngs/" -> replicated  # noqa: SR201\n  default      -> logical\n'
    )
    assert sr.format_text(conversion.text) == conversion.text
    # The same from the config already read, and from the Flax converter (no mesh line).
    assert sr.convert_maxtext(raw, source=str(config)).text == conversion.text
    flax_text = sr.convert_flax(raw["logical_axis_rules"]).text
    flax_aliases = flax_text.split("\n\n", 1)[1].split("rules params:")[0]  # MaxText adds the RNG rule
    assert flax_aliases in conversion.text.split("\n\n", 2)[2]


def test_maxtext_base_aliases_hold_the_rules_in_order() -> None:
    text = sr.convert_maxtext(CONFIGS[0]).text
    lines = {
        line.split("=")[0].split()[1]: line.split("=", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("alias ")
    }
    assert lines["embed"] == (
        "(fsdp, fsdp_transpose, context, context_usp_ulysses, expert) | (fsdp, context, context_usp_ulysses, expert) | _"
    )
    assert lines["activation_vocab"] == "(tensor, tensor_sequence) | tensor | tensor_sequence | _"
    assert lines["exp"] == "expert | _" and lines["qkv"] == "_"
    # `diloco` names a mesh axis and maps to it: no alias (it would clash with the axis, SR013).
    assert "diloco" not in lines and "# `diloco` is a mesh axis too" in text
    names = list(lines)
    assert names.index("vocab") < names.index("heads") < names.index("embed") < names.index("exp_with_fsdp")


def test_maxtext_notes_what_does_not_convert(tmp_path: Path) -> None:
    config = {
        "base_config": "base.yml",
        "mesh_axes": ["data", "fsdp", "tensor"],
        "logical_axis_rules": [
            ["batch", ["data", "fsdp"]],
            ["embed", "fsdp"],
            ["heads", "tensor"],
            ["embed", ["tensor"]],  # not next to the first `embed` rule, and `heads` uses `tensor`
            ["tensor", "fsdp"],  # a logical name that is a mesh axis, mapped elsewhere
            ["bad-name", "data"],
        ],
    }
    conversion = sr.convert_maxtext(config, source="model.yml")
    notes = "\n".join(conversion.notes)
    assert not conversion.exact and len(conversion.notes) == 4, conversion.notes
    assert "`embed`: its rule 4 (embed -> tensor) is not next to its rule 2" in notes
    assert "rules in between use the same axes (heads -> tensor)" in notes
    assert "`tensor` is a mesh axis too, so it cannot be an alias (SR013)" in notes
    assert "`bad-name` cannot be a name in a rule file" in notes
    assert "inherits from base.yml" in notes
    assert "\n# Not converted exactly (4):\n#   - " in conversion.text  # each note also a comment
    aliases = [line.split()[1] for line in conversion.text.splitlines() if line.startswith("alias ")]
    assert aliases == ["batch", "embed", "heads"]
    assert "alias embed = fsdp | tensor | _" in conversion.text
    assert "\n# `tensor`: not converted, see the notes above\n" in conversion.text
    assert isinstance(sr.loads(conversion.text), sr.RuleSet)


def test_rules_apart_with_no_shared_axes_in_between_convert_exactly() -> None:
    """Moving `a -> z` up past `b -> y` changes nothing: neither uses the other's axes."""
    rules = [("a", "x"), ("b", "y"), ("a", "z")]
    conversion = sr.convert_flax(rules)
    assert conversion.exact and "alias a = x | z | _" in conversion.text
    mesh = {"x": 2, "y": 2, "z": 2}
    for names in itertools.permutations(("a", "b", "c")):
        flax = entries(nn.logical_to_mesh_axes(names, rules), 3)
        assert entries(_logical_spec(conversion.text, names, mesh), 3) == flax, names
    shadowed = [("a", "x"), ("b", "y"), ("c", "x"), ("a", "z")]  # `c` takes x where `a` falls to z
    for names in itertools.permutations(("a", "b", "c")):
        flax = entries(nn.logical_to_mesh_axes(names, shadowed), 3)
        assert entries(_logical_spec(sr.convert_flax(shadowed).text, names, mesh), 3) == flax, names


def test_maxtext_merged_rules_differ_from_flax_only_where_reported() -> None:
    """The note's case: moving `a -> y` up past `b -> y` changes a leaf named (a, b, c)."""
    rules = [("c", "x"), ("a", "x"), ("b", "y"), ("a", "y")]
    conversion = sr.convert_flax(rules)
    assert any("rules in between use the same axes (b -> y)" in n for n in conversion.notes)
    names = ("a", "b", "c")
    flax = entries(nn.logical_to_mesh_axes(names, rules), 3)
    ours = entries(_logical_spec(conversion.text, names, {"x": 2, "y": 2}), 3)
    assert flax == [(), ("y",), ("x",)] and ours == [("y",), (), ("x",)]
    # Consecutive rules, same names: no note, and the same layout.
    reordered = [("c", "x"), ("a", "x"), ("a", "y"), ("b", "y")]
    assert sr.convert_flax(reordered).exact
    assert entries(_logical_spec(sr.convert_flax(reordered).text, names, {"x": 2, "y": 2}), 3) == entries(
        nn.logical_to_mesh_axes(names, reordered), 3
    )


def test_maxtext_needs_logical_axis_rules_and_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="has no `logical_axis_rules`"):
        sr.convert_maxtext({"mesh_axes": ["data"]})
    (tmp_path / "list.yml").write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="expected a MaxText config"):
        sr.convert_maxtext(tmp_path / "list.yml")
    (tmp_path / "bad.yml").write_text("logical_axis_rules: [\n")
    with pytest.raises(ValueError, match="not a YAML file"):
        sr.convert_maxtext(tmp_path / "bad.yml")
    with pytest.raises(ValueError, match=r"rule 1 is .*not a \(name, mesh axes\) pair"):
        sr.convert_maxtext({"logical_axis_rules": [["embed"]]})
    with pytest.raises(FileNotFoundError):
        sr.convert_maxtext(tmp_path / "missing.yml")
    without_mesh = sr.convert_maxtext({"logical_axis_rules": [["embed", "fsdp"]]})
    assert "no `mesh_axes`" in without_mesh.notes[0] and "\nmesh " not in without_mesh.text


# ---------------------------------------------------------------- flax


def _logical_spec(text: str, names: tuple[Any, ...], mesh: dict[str, int]) -> Any:
    rules = sr.loads(text)
    tree = {"x": nn.LogicallyPartitioned(S((16,) * len(names)), names)}
    return unbox(sr.specs(tree, rules, mesh)["x"])


AXES = ["a", "b", "c", "d"]
NAMES = ["embed", "mlp", "heads", "vocab", "batch"]


@st.composite
def flax_rules(draw: Any) -> list[tuple[str, Any]]:
    """Random Flax rules, each name's rules consecutive: an axis, a tuple of
    axes, or `None` per rule."""
    rules: list[tuple[str, Any]] = []
    for name in draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=5)):
        for _ in range(draw(st.integers(1, 3))):
            axes = draw(st.lists(st.sampled_from(AXES), unique=True, max_size=3))
            kind = draw(st.integers(0, 2))
            value = (
                None if not axes and kind == 0 else axes[0] if len(axes) == 1 and kind == 1 else tuple(axes)
            )
            rules.append((name, value))
    return rules


@given(
    rules=flax_rules(),
    names=st.lists(st.sampled_from([*NAMES, "unruled", None]), min_size=1, max_size=4).filter(
        lambda n: len([x for x in n if x]) == len({x for x in n if x})
    ),
    sizes=st.lists(st.sampled_from([1, 2]), min_size=4, max_size=4),
)
@settings(deadline=None)
def test_flax_random_rules_give_flax_layouts(
    rules: list[tuple[str, Any]], names: list[Any], sizes: list[int]
) -> None:
    conversion = sr.convert_flax(rules)
    assert conversion.exact, conversion.notes
    flax = nn.logical_to_mesh_axes(tuple(names), rules)
    ours = _logical_spec(conversion.text, tuple(names), dict(zip(AXES, sizes, strict=True)))
    assert entries(ours, len(names)) == entries(flax, len(names))


def test_flax_layouts_of_every_maxtext_name_tuple() -> None:
    """MaxText's rules, through `convert_flax`, on every logical-name tuple of the dumps."""
    import yaml

    checked = 0
    for dump in DUMPS:
        data = json.loads(dump.read_text(encoding="utf-8"))
        raw = yaml.safe_load(config_of(dump).read_text(encoding="utf-8"))
        rules = [
            (name, tuple(axes) if isinstance(axes, list) else axes)
            for name, axes in raw["logical_axis_rules"]
        ]
        loaded = sr.loads(sr.convert_flax(rules).text)
        leaves = {path: (tuple(names), shape) for path, (names, shape, _) in data["leaves"].items() if names}
        tree = {path: nn.LogicallyPartitioned(S(shape), names) for path, (names, shape) in leaves.items()}
        ours = sr.specs(tree, loaded, data["mesh"])
        for path, (names, shape) in leaves.items():
            flax = nn.logical_to_mesh_axes(names, rules)
            assert entries(unbox(ours[path]), len(shape)) == entries(flax, len(shape)), (dump.name, names)
            checked += 1
    assert checked > 250


def test_flax_logical_name_that_is_a_mesh_axis() -> None:
    """A name mapped to the mesh axis of its own name needs no alias (it could
    not have one: SR013); a name that is an axis and maps elsewhere is a note."""
    rules = [("diloco", "diloco"), ("embed", "fsdp")]
    conversion = sr.convert_flax(rules)
    assert conversion.exact and "alias diloco" not in conversion.text
    assert (
        "\n# `diloco` is a mesh axis too: the name stands for the axis, as its rule says\n" in conversion.text
    )
    names = ("diloco", "embed")
    ours = _logical_spec(conversion.text, names, {"diloco": 2, "fsdp": 2})
    assert entries(ours, 2) == entries(nn.logical_to_mesh_axes(names, rules), 2) == [("diloco",), ("fsdp",)]
    shared = sr.convert_flax([("diloco", "diloco"), ("batch", ("diloco", "data"))])
    assert shared.notes == (
        "`diloco` is a mesh axis too, so it cannot be an alias (SR013): the name stands for the axis. Where "
        "another dimension takes `diloco` first (through batch), Flax leaves it unsharded; shardrules raises SR102",
    )


def test_flax_rules_from_module_attr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "convert_flax_src.py").write_text(
        "RULES = [('batch', ('data', 'fsdp')), ('embed', 'fsdp'), ('mlp', 'model'), ('vocab', None)]\n"
        "def rules():\n    return RULES[:2]\n"
    )
    conversion = sr.convert_flax("convert_flax_src:RULES")
    assert conversion.source == "convert_flax_src:RULES" and conversion.exact
    assert (
        "alias batch = (data, fsdp) | _\nalias embed = fsdp | _\nalias mlp   = model | _\nalias vocab = _\n"
        in conversion.text
    )
    assert "\nmesh " not in conversion.text
    assert "alias mlp" not in sr.convert_flax("convert_flax_src:rules").text
    with pytest.raises(ValueError, match="has no attribute"):
        sr.convert_flax("convert_flax_src:NOPE")
    with pytest.raises(ValueError, match="cannot import"):
        sr.convert_flax("no_such_module_here:RULES")
    with pytest.raises(ValueError, match="write `module:attr`"):
        sr.convert_flax("convert_flax_src")


# ---------------------------------------------------------------- regex (EasyLM, scalax)


def easylm_specs(rules: Any, tree: Any, strict: bool = True) -> Any:
    """EasyLM's `match_partition_rules(rules, tree)`: each leaf's key path
    rendered (dict key → `str(key)`, attribute → its name, sequence index → the
    index) and joined with `/`; scalars and size-1 arrays get `PS()`; every
    other leaf the spec of the first rule whose regex `re.search` finds in the
    path; no match is a `ValueError` (scalax's `strict=False`: `PS()`)."""

    def segment(key: Any) -> str:
        if isinstance(key, jax.tree_util.SequenceKey):
            return str(key.idx)
        if isinstance(key, jax.tree_util.DictKey):
            return str(key.key)
        if isinstance(key, jax.tree_util.GetAttrKey):
            return key.name
        return str(key.key)

    def spec(path: Any, leaf: Any) -> P:
        name = "/".join(segment(k) for k in path)
        if len(leaf.shape) == 0 or math.prod(leaf.shape) == 1:
            return P()
        for regex, ps in rules:
            if re.search(regex, name) is not None:
                return ps
        if strict:
            raise ValueError(f"Partition rule not found for param: {name}")
        return P()

    return jax.tree_util.tree_map_with_path(spec, tree)


LLAMA_RULES = (
    ("transformer/wte/embedding", P("mp", "fsdp")),
    ("attention/(wq|wk|wv)/kernel", P("fsdp", "mp")),
    ("attention/wo/kernel", P("mp", "fsdp")),
    ("feed_forward/w1/kernel", P("fsdp", "mp")),
    ("feed_forward/w2/kernel", P("mp", "fsdp")),
    ("feed_forward/w3/kernel", P("fsdp", "mp")),
    ("attention_norm/kernel", P(None)),
    ("ffn_norm/kernel", P(None)),
    ("transformer/ln_f/kernel", P(None)),
    ("lm_head/kernel", P("fsdp", "mp")),
    (".*", P(None)),
)
"""EasyLM's LLaMA rules (`LLaMAConfig.get_partition_rules`), mesh ("dp", "fsdp", "mp")."""


class RMSNorm(nn.Module):
    @nn.compact
    def __call__(self, x: Any) -> Any:
        return x * self.param("kernel", nn.initializers.ones, (x.shape[-1],))


class Attention(nn.Module):
    @nn.compact
    def __call__(self, h: Any) -> Any:
        q, k, v = (nn.Dense(32, use_bias=False, name=n)(h) for n in ("wq", "wk", "wv"))
        return nn.Dense(32, use_bias=False, name="wo")(q * k * v)


class FeedForward(nn.Module):
    @nn.compact
    def __call__(self, h: Any) -> Any:
        up = nn.Dense(64, use_bias=False, name="w1")(h) * nn.Dense(64, use_bias=False, name="w3")(h)
        return nn.Dense(32, use_bias=False, name="w2")(up)


class Block(nn.Module):
    @nn.compact
    def __call__(self, x: Any) -> Any:
        x = x + Attention(name="attention")(RMSNorm(name="attention_norm")(x))
        return x + FeedForward(name="feed_forward")(RMSNorm(name="ffn_norm")(x))


class Blocks(nn.Module):
    @nn.compact
    def __call__(self, x: Any) -> Any:
        for i in range(2):
            x = Block(name=str(i))(x)
        return x


class Transformer(nn.Module):
    @nn.compact
    def __call__(self, tokens: Any) -> Any:
        x = Blocks(name="h")(nn.Embed(128, 32, name="wte")(tokens))
        return RMSNorm(name="ln_f")(x)


class CausalLM(nn.Module):
    """A small LLaMA with EasyLM's module names (`transformer/h/0/attention/wq`, ...)."""

    @nn.compact
    def __call__(self, tokens: Any) -> Any:
        return nn.Dense(128, use_bias=False, name="lm_head")(Transformer(name="transformer")(tokens))


def llama_train_state() -> dict[str, Any]:
    """The shapes of a train state of `CausalLM`: step, params, AdamW state."""
    params = jax.eval_shape(lambda: CausalLM().init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))
    opt_state = jax.eval_shape(optax.adamw(1e-3).init, params)
    return {"step": S((), jnp.int32), "params": params, "opt_state": opt_state}


def test_regex_easylm_llama_rules_on_a_flax_train_state() -> None:
    tree = llama_train_state()
    paths = [leaf.path for leaf in sr.plan(tree, sr.loads("rules params:\n  default -> replicated\n"))]
    assert "params/params/transformer/h/1/attention/wq/kernel" in paths
    assert "opt_state/0/mu/params/lm_head/kernel" in paths
    conversion = sr.convert_regex(LLAMA_RULES)
    assert conversion.exact, conversion.notes
    assert '\n  "attention/(wq|wk|wv)/kernel" -> (fsdp, mp, ...)\n' in conversion.text
    assert "\nmesh mp, fsdp\n" in conversion.text
    mesh = {"dp": 2, "fsdp": 2, "mp": 2}
    ours = sr.specs(tree, sr.loads(conversion.text), mesh)
    theirs = easylm_specs(LLAMA_RULES, tree)
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    got = jax.tree_util.tree_leaves(ours, is_leaf=lambda x: isinstance(x, P))
    want = jax.tree_util.tree_leaves(theirs, is_leaf=lambda x: isinstance(x, P))
    assert len(got) == len(want) == len(leaves) > 40
    for (path, leaf), g, w in zip(leaves, got, want, strict=True):
        assert entries(g, leaf.ndim) == entries(w, leaf.ndim), jax.tree_util.keystr(path)
    assert any(entries(w, 2) == [("fsdp",), ("mp",)] for w in want)


class TreePathShardingRule:
    """scalax's rule object, as far as the converter reads it: `rules` and `strict`."""

    def __init__(self, *rules: Any, strict: bool = True):
        self.rules, self.strict = rules, strict


def test_regex_unmatched_leaves_strict_or_replicated() -> None:
    rules = (("kernel", P(None, "model")),)
    tree = {"dense": {"kernel": S((8, 8)), "bias": S((8,))}, "scale": S((1,))}
    strict = sr.loads(sr.convert_regex(TreePathShardingRule(*rules)).text)
    with pytest.raises(ValueError, match="Partition rule not found for param: dense/bias"):
        easylm_specs(rules, tree)
    with pytest.raises(sr.PlanError) as err:
        sr.specs(tree, strict, {"model": 2})
    assert err.value.code == "SR105" and err.value.path == "dense/bias"
    loose = sr.convert_regex(TreePathShardingRule(*rules, strict=False))
    assert loose.text.endswith("  default  -> replicated\n")
    ours = sr.specs(tree, sr.loads(loose.text), {"model": 2})
    theirs = easylm_specs(rules, tree, strict=False)
    for key in ("kernel", "bias"):
        assert entries(ours["dense"][key], 2) == entries(theirs["dense"][key], 2)
    assert entries(ours["scale"], 1) == entries(theirs["scale"], 1) == [()]


def test_regex_patterns_keep_their_meaning_in_the_rule_file() -> None:
    """Quotes, backslashes and line breaks in a regex become a literal that
    matches exactly the paths the regex does."""
    regexes = ['a"b', r"x\"y", "line\nbreak", r"\d+/w$", r"[\"]q", r"back\\slash"]
    conversion = sr.convert_regex([(r, P("m")) for r in regexes])
    assert conversion.exact, conversion.notes
    rules = sr.loads(conversion.text)
    paths = ['a"b', 'x"y', "line\nbreak", "l/12/w", '"q', "back\\slash", "ab", "xy", "line", "w"]
    for path in paths:
        tree = {path: S((4,))}
        expected = next((r for r in regexes if re.search(r, path)), None)
        if expected is None:
            with pytest.raises(sr.PlanError, match="SR105"):
                sr.specs(tree, rules, {"m": 2})
            continue
        assert entries(sr.specs(tree, rules, {"m": 2})[path], 1) == [("m",)], (path, expected)


def test_regex_what_does_not_convert_is_reported() -> None:
    rules = [
        ("(?<=attention/)wq", P("mp")),
        ("kernel", P(("dp", "fsdp"), P.UNCONSTRAINED)),
        (".*", P()),
    ]
    conversion = sr.convert_regex(rules, source="easylm:rules")
    assert len(conversion.notes) == 2, conversion.notes
    assert "SR017" in conversion.notes[0] and "written as a comment" in conversion.notes[0]
    assert "UNCONSTRAINED" in conversion.notes[1]
    assert '\n  # "(?<=attention/)wq" -> (mp, ...)  # not converted: SR017' in conversion.text
    assert '\n  "kernel" -> ((dp, fsdp), _, ...)\n' in conversion.text
    assert '\n  ".*"     -> replicated\n' in conversion.text
    with pytest.raises(ValueError, match="is not a regular expression"):
        sr.convert_regex([("(", P())])
    with pytest.raises(ValueError, match="is not a PartitionSpec"):
        sr.convert_regex([("x", 3)])


# ---------------------------------------------------------------- hf (transformers)


def hf_specs(plan: dict[str, str], tree: dict[str, Any], axis: str, prefix: str = "") -> dict[str, P]:
    """transformers' tensor-parallel plan on a state dict of `name -> shape`.

    A parameter is looked up by its generic name (each `.N.` layer number read
    as `.*.`): first `prefix + key` equal to the name itself, then to its
    module's name (the name without its last part, `weight`/`bias`); no key:
    replicated. The style splits one dimension over `axis` (an `nn.Linear`
    weight is `[out, in]`, an `nn.Embedding`'s `[vocab, hidden]`):

    - colwise, colwise_rep, colwise_gather_output, local_colwise: a weight's
      dimension -2, a bias's -1;
    - rowwise, rowwise_rep, rowwise_split_input, local_rowwise: a weight's -1;
      a bias is replicated;
    - embedding_rowwise: 0; grouped_gemm: 0 (experts);
    - replicate, sequence_parallel, ep_router, moe_tp_experts, ...: replicated.
    """
    weight_dim = {"colwise": -2, "colwise_rep": -2, "rowwise": -1, "rowwise_rep": -1,
                  "embedding_rowwise": 0, "grouped_gemm": 0}  # fmt: skip
    bias_dim = {"colwise": -1, "colwise_rep": -1, "rowwise": None, "rowwise_rep": None,
                "embedding_rowwise": 0, "grouped_gemm": 0}  # fmt: skip
    full = {prefix + key: style for key, style in plan.items()}
    out = {}
    for name, leaf in tree.items():
        generic = name
        while (new := re.sub(r"\.\d+(\.|$)", r".*\1", generic)) != generic:
            generic = new
        module = generic.rsplit(".", 1)[0]
        style = full.get(generic) or full.get(module)
        table = bias_dim if name.endswith(".bias") else weight_dim
        dim = table.get(style) if style else None
        spec: list[Any] = [None] * leaf.ndim
        if dim is not None:
            spec[dim] = axis
        out[name] = P(*spec)
    return out


LLAMA_PLAN = {
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.gate_proj": "colwise",
    "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.down_proj": "rowwise",
}
"""LlamaConfig's `base_model_tp_plan`."""


def llama_state_dict(layers: int = 2, biases: bool = True) -> dict[str, jax.ShapeDtypeStruct]:
    """A Llama-like state dict (Qwen2's q/k/v biases with `biases`), by checkpoint name."""
    h, i, v, kv = 64, 128, 256, 32
    sd = {"model.embed_tokens.weight": S((v, h)), "model.norm.weight": S((h,)), "lm_head.weight": S((v, h))}
    for n in range(layers):
        p = f"model.layers.{n}."
        sd |= {
            p + "self_attn.q_proj.weight": S((h, h)),
            p + "self_attn.k_proj.weight": S((kv, h)),
            p + "self_attn.v_proj.weight": S((kv, h)),
            p + "self_attn.o_proj.weight": S((h, h)),
            p + "mlp.gate_proj.weight": S((i, h)),
            p + "mlp.up_proj.weight": S((i, h)),
            p + "mlp.down_proj.weight": S((h, i)),
            p + "input_layernorm.weight": S((h,)),
            p + "post_attention_layernorm.weight": S((h,)),
        }
        if biases:
            sd |= {p + "self_attn.q_proj.bias": S((h,)), p + "self_attn.k_proj.bias": S((kv,)),
                   p + "self_attn.v_proj.bias": S((kv,)), p + "self_attn.o_proj.bias": S((h,))}  # fmt: skip
    return sd


def _compare_hf(conversion: sr.Conversion, tree: dict[str, Any], reference: dict[str, P], axis: str) -> None:
    ours = sr.specs(tree, sr.loads(conversion.text), {"data": 2, axis: 4})
    for name, leaf in tree.items():
        assert entries(ours[name], leaf.ndim) == entries(reference[name], leaf.ndim), name


def test_hf_llama_config_json(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                                  "base_model_tp_plan": LLAMA_PLAN}))  # fmt: skip
    conversion = sr.convert_hf(config, axis="tp")
    assert conversion.exact, conversion.notes
    assert "\nmesh tp\n" in conversion.text and re.search(r"\n  default +-> replicated\n\Z", conversion.text)
    tree = llama_state_dict()
    _compare_hf(conversion, tree, hf_specs(LLAMA_PLAN, tree, "tp", prefix="model."), "tp")
    # The same rules match nested trees, whose paths are joined with `/`.
    nested: dict[str, Any] = {}
    for name, leaf in tree.items():
        node = nested
        *parents, last = name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = leaf
    specs = sr.specs(nested, sr.loads(conversion.text), {"tp": 4})
    assert specs["model"]["layers"]["1"]["self_attn"]["q_proj"]["weight"] == P("tp", None)
    assert specs["model"]["layers"]["1"]["self_attn"]["q_proj"]["bias"] == P("tp")
    assert specs["model"]["layers"]["0"]["mlp"]["down_proj"]["weight"] == P(None, "tp")


def test_hf_full_plan_with_embeddings_experts_and_replicated_styles() -> None:
    plan = {
        "model.embed_tokens": "embedding_rowwise",
        "model.layers.*.self_attn.q_proj": "colwise_rep",
        "model.layers.*.self_attn.k_proj": "colwise",
        "model.layers.*.self_attn.v_proj": "colwise",
        "model.layers.*.self_attn.o_proj": "rowwise_rep",
        "model.layers.*.mlp.experts.gate_up_proj": "grouped_gemm",
        "model.layers.*.mlp.experts.down_proj": "grouped_gemm",
        "model.layers.*.mlp.experts": "moe_tp_experts",
        "model.layers.*.mlp.gate": "ep_router",
        "model.norm": "replicate",
        "lm_head": "colwise_rep",
    }
    tree = llama_state_dict(biases=True)
    for n in range(2):
        tree |= {f"model.layers.{n}.mlp.experts.gate_up_proj": S((8, 64, 256)),
                 f"model.layers.{n}.mlp.experts.down_proj": S((8, 128, 64)),
                 f"model.layers.{n}.mlp.gate.weight": S((8, 64))}  # fmt: skip
    conversion = sr.convert_hf({"tp_plan": plan})
    assert conversion.exact, conversion.notes
    reference = hf_specs(plan, tree, "model")
    assert reference["model.layers.0.mlp.experts.gate_up_proj"] == P("model", None, None)
    assert reference["model.embed_tokens.weight"] == P("model", None)
    _compare_hf(conversion, tree, reference, "model")


def test_hf_styles_without_a_layout_are_reported() -> None:
    plan = {
        "layers.*.mlp.experts.gate_up_proj": "packed_colwise",
        "layers.*.mlp.experts": "moe_tp_experts",
        "layers.*.mlp": "local",
        "norm": "sequence_parallel",
        "layers.0.attn": "colwise",
        "layers.*.fc*": "rowwise",
        "head": "my_custom_style",
    }
    conversion = sr.convert_hf(plan, source="plan.json")
    notes = "\n".join(conversion.notes)
    assert len(conversion.notes) == 6, conversion.notes
    assert "`layers.*.mlp.experts.gate_up_proj`: packed_colwise" in notes
    assert "`layers.*.mlp`: local divides each weight by the mesh size" in notes
    assert "`norm`: sequence_parallel: its parameters are replicated (converted)" in notes
    assert "`layers.0.attn`: it names a layer by its number" in notes
    assert "`layers.*.fc*`: it has `*` inside a name" in notes
    assert "unknown style 'my_custom_style'" in notes
    assert (
        '# "(^|[./])layers[./]\\d+[./]mlp[./]experts[./]gate_up_proj([./][^./]+)?$" -> ?' in conversion.text
    )
    # The packed weight falls to its module's rule: replicated, as the note says.
    tree = {"layers.0.mlp.experts.gate_up_proj": S((8, 64, 256))}
    assert sr.specs(tree, sr.loads(conversion.text), {"model": 2})["layers.0.mlp.experts.gate_up_proj"] == P(
        None, None, None
    )


def test_hf_needs_a_plan(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "vocab_size": 10}))
    with pytest.raises(ValueError, match="no tensor-parallel plan"):
        sr.convert_hf(tmp_path / "config.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        sr.convert_hf(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="entries that are not name -> style"):
        sr.convert_hf({"base_model_tp_plan": {"q": 3}})
    with pytest.raises(ValueError, match="not a mesh axis name"):
        sr.convert_hf(LLAMA_PLAN, axis="tensor parallel")


# ---------------------------------------------------------------- the command line


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str], stdin: str | None = None,
            monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[int, str, str]:  # fmt: skip
    if stdin is not None:
        assert monkeypatch is not None
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    try:
        status = main(args)
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 2
    out, err = capsys.readouterr()
    return status, out, err


MAXTEXT_YAML = textwrap.dedent("""\
    mesh_axes: ['data', 'fsdp', 'tensor']
    logical_axis_rules: [
      ['batch', ['data', 'fsdp']],
      ['embed', ['fsdp', 'tensor']],
      ['embed', 'fsdp'],
      ['mlp', ['tensor']],
      ['vocab', []],
    ]
""")


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.yml").write_text(MAXTEXT_YAML)
    return tmp_path


def test_cli_writes_stdout_and_exits_0(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(["convert", "maxtext", "model.yml"], capsys)
    assert (status, err) == (0, "")
    assert out == sr.convert_maxtext("model.yml").text
    assert "alias embed = (fsdp, tensor) | fsdp | _\n" in out


def test_cli_output_file_passes_fmt_and_lint(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(["convert", "maxtext", "model.yml", "-o", "model.shard"], capsys)
    assert (status, out, err) == (0, "", "")
    assert (workdir / "model.shard").read_text() == sr.convert_maxtext("model.yml").text
    assert run_cli(["fmt", "--check", "model.shard"], capsys)[0] == 0
    status, out, _ = run_cli(["lint", "model.shard", "--mesh", "data=2,fsdp=2,tensor=2"], capsys)
    assert status == 0, out


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_cli_maxtext_configs_pass_fmt_and_lint(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.shard"
    assert run_cli(["convert", "maxtext", str(config), "-o", str(out)], capsys)[0] == 0
    assert run_cli(["fmt", "--check", str(out)], capsys)[0] == 0
    status, text, _ = run_cli(["lint", str(out)], capsys)
    assert status == 0, text


def test_cli_reads_stdin(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    status, out, _ = run_cli(["convert", "maxtext", "-"], capsys, stdin=MAXTEXT_YAML, monkeypatch=monkeypatch)
    assert status == 0 and out.startswith("# Converted by shardrules convert maxtext from <stdin>\n")
    plan = json.dumps({"base_model_tp_plan": LLAMA_PLAN})
    status, out, _ = run_cli(
        ["convert", "hf", "-", "--axis", "tp", "-o", "-"], capsys, stdin=plan, monkeypatch=monkeypatch
    )
    assert status == 0 and "\nmesh tp\n" in out


def test_cli_notes_exit_1_and_go_to_stderr_and_the_file(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workdir / "plan.json").write_text(
        json.dumps({"layers.*.mlp.gate_up_proj": "packed_colwise", "lm_head": "colwise"})
    )
    status, out, err = run_cli(["convert", "hf", "plan.json", "-o", "plan.shard"], capsys)
    assert (status, out) == (1, "")
    assert err.startswith("plan.json: not converted exactly: `layers.*.mlp.gate_up_proj`: packed_colwise")
    text = (workdir / "plan.shard").read_text()
    assert "# Not converted exactly (1):\n#   - `layers.*.mlp.gate_up_proj`: packed_colwise" in text
    assert run_cli(["fmt", "--check", "plan.shard"], capsys)[0] == 0
    assert run_cli(["lint", "plan.shard"], capsys)[0] == 0


def test_cli_module_attr_sources(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (workdir / "cli_convert_src.py").write_text(
        "from jax.sharding import PartitionSpec as PS\n"
        "AXIS_RULES = [('embed', 'fsdp'), ('mlp', ('fsdp', 'model'))]\n"
        "PARTITION_RULES = [('kernel', PS('fsdp', 'model')), ('.*', PS())]\n"
    )
    status, out, _ = run_cli(["convert", "flax", "cli_convert_src:AXIS_RULES"], capsys)
    assert status == 0 and "alias mlp   = (fsdp, model) | _\n" in out
    status, out, _ = run_cli(["convert", "regex", "cli_convert_src:PARTITION_RULES"], capsys)
    assert status == 0 and '  "kernel" -> (fsdp, model, ...)\n' in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["convert", "maxtext", "missing.yml"], "shardrules convert: missing.yml: no such file"),
        (["convert", "maxtext", "."], "shardrules convert: .: cannot read"),
        (["convert", "maxtext", "broken.yml"], "shardrules convert: broken.yml: not a YAML file"),
        (
            ["convert", "maxtext", "norules.yml"],
            "shardrules convert: norules.yml: has no `logical_axis_rules`",
        ),
        (["convert", "hf", "model.yml"], "shardrules convert: model.yml: not JSON"),
        (["convert", "flax", "model.yml"], "shardrules convert: flax: SOURCE is module:attr"),
        (["convert", "regex", "no_such_module_x:RULES"], "cannot import 'no_such_module_x'"),
        (["convert", "maxtext", "model.yml", "--axis", "tp"], "--axis is for the hf format, not maxtext"),
        (
            ["convert", "maxtext", "model.yml", "-o", "no/such/folder/out.shard"],
            "-o no/such/folder/out.shard: cannot write",
        ),
        (["convert", "yaml", "model.yml"], "invalid choice: 'yaml'"),
    ],
)
def test_cli_errors_exit_2(
    args: list[str], message: str, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workdir / "broken.yml").write_text("logical_axis_rules: [\n")
    (workdir / "norules.yml").write_text("mesh_axes: [data]\n")
    status, out, err = run_cli(args, capsys)
    assert status == 2
    assert out == ""
    assert message in err, err


def test_cli_binary_source_is_an_error(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (workdir / "binary.yml").write_bytes(b"\xff\xfe\x00bad")
    status, _, err = run_cli(["convert", "maxtext", "binary.yml"], capsys)
    assert status == 2 and "not UTF-8 text" in err


def test_converted_text_is_canonical_and_loads() -> None:
    for conversion in (sr.convert_flax([("embed", "fsdp")]), sr.convert_regex([("x", P("a"))]),
                       sr.convert_hf(LLAMA_PLAN), sr.convert_maxtext({"logical_axis_rules": [["e", "a"]]})):  # fmt: skip
        assert sr.format_text(conversion.text) == conversion.text
        assert isinstance(sr.loads(conversion.text), sr.RuleSet)
        assert conversion.text.startswith(f"# Converted by shardrules convert {conversion.format} from ")
    assert sr.Conversion("x", (), "flax", "s").exact and not sr.Conversion("x", ("n",), "flax", "s").exact


# ---------------------------------------------------------------- maxtext: several configs, RNG streams

BASE_RULES = {
    "mesh_axes": ["data", "fsdp", "tensor"],
    "logical_axis_rules": [
        ["batch", ["data", "fsdp"]],
        ["embed", "fsdp"],
        ["embed", "data"],
        ["mlp", "tensor"],
    ],
    "base_config": "base.yml",
}


def _aliases(text: str) -> dict[str, str]:
    return {
        line.split("=")[0].split()[1]: line.split("=", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("alias ")
    }


def test_maxtext_configs_given_together_merge_as_maxtext_merges_them() -> None:
    """A later config's rules replace the earlier rules for the same names
    (all of them), going last; its other keys replace the earlier ones."""
    model = {
        "logical_axis_rules": [["embed", ["fsdp", "tensor"]], ["exp", "data"]],
        "mesh_axes": ["data", "fsdp", "tensor", "expert"],
    }
    conversion = sr.convert_maxtext([BASE_RULES, model], source="base.yml + models/moe.yml")
    aliases = _aliases(conversion.text)
    assert aliases == {
        "batch": "(data, fsdp) | _",
        "mlp": "tensor | _",
        "embed": "(fsdp, tensor) | _",
        "exp": "data | _",
    }
    assert list(aliases) == ["batch", "mlp", "embed", "exp"]  # the replaced names go last, in the new order
    assert "\nmesh data, fsdp, tensor, expert\n" in conversion.text
    assert (
        "# <mapping 2> sets mesh_axes.\n# <mapping 2> replaces the rules for 2 names (embed, exp), now last."
        in (conversion.text)
    )
    assert "inherits" not in conversion.text  # the configs it inherits from are the ones given
    replaced = sr.convert_maxtext([BASE_RULES, {**model, "override_logical_axis_rules": True}])
    assert _aliases(replaced.text) == {"embed": "(fsdp, tensor) | _", "exp": "data | _"}
    assert "replaces all the rules (override_logical_axis_rules)" in replaced.text
    # a config with no rules changes none
    assert _aliases(sr.convert_maxtext([BASE_RULES, {"vocab_size": 10}]).text) == _aliases(
        sr.convert_maxtext({k: v for k, v in BASE_RULES.items() if k != "base_config"}).text
    )


def test_maxtext_several_config_files_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("yaml")
    (tmp_path / "base.yml").write_text(
        "mesh_axes: [data, fsdp]\nlogical_axis_rules:\n  - [embed, fsdp]\n  - [mlp, data]\n"
    )
    (tmp_path / "model.yml").write_text("logical_axis_rules:\n  - [embed, [fsdp, data]]\n")
    base, model = str(tmp_path / "base.yml"), str(tmp_path / "model.yml")
    code, out, _ = run_cli(["convert", "maxtext", base, model], capsys)
    assert code == 0 and out.startswith(f"# Converted by shardrules convert maxtext from {base} + {model}\n")
    assert _aliases(out) == {"mlp": "data | _", "embed": "(fsdp, data) | _"}
    assert sr.convert_maxtext([base, model]).text == out
    code, _, err = run_cli(["convert", "maxtext", base, str(tmp_path / "nope.yml")], capsys)
    assert code == 2 and f"{tmp_path / 'nope.yml'}: no such file" in err
    code, _, err = run_cli(["convert", "hf", base, model], capsys)
    assert code == 2 and "the hf format takes one SOURCE, not 2" in err


def test_maxtext_rng_streams_are_replicated_without_a_hand_rule() -> None:
    """An NNX model's RNG streams carry no logical names: without the
    converted rule for them, `logical` stops there (SR113); with it, they are
    replicated, and a state without them gets no warning."""
    rules = sr.loads(sr.convert_maxtext({k: v for k, v in BASE_RULES.items() if k != "base_config"}).text)
    S = jax.ShapeDtypeStruct
    params = {"w": nn.LogicallyPartitioned(S((8, 4), jnp.float32), ("embed", "mlp"))}
    state = {"params": params, "rngs": {"dropout": {"key": S((2,), jnp.uint32), "count": S((), jnp.uint32)}}}
    plan = sr.plan(state, rules, {"data": 2, "fsdp": 4, "tensor": 2})
    assert not plan.diagnostics
    assert {lp.path: lp.spec for lp in plan.leaves}["rngs/dropout/key"] == P(None)
    assert not sr.plan({"params": params}, rules, {"data": 2, "fsdp": 4, "tensor": 2}).diagnostics
    bare = sr.loads("alias embed = fsdp\nalias mlp = tensor\nrules params:\n  default -> logical\n")
    assert "SR113" in [d.code for d in sr.plan(state, bare, {"data": 2, "fsdp": 4, "tensor": 2}).diagnostics]


# ---------------------------------------------------------------- easydel


def eformer_specs(rules: Any, tree: Any, min_size: int = 0) -> Any:
    """eformer's `match_partition_rules(rules, tree, min_size)` as its source
    reads: `/`-joined key paths, scalars and leaves without a shape
    replicated, the first rule `re.search` finds wins, a matched leaf under
    `min_size` elements replicated, a spec longer than the rank cut to it."""

    def spec(path: Any, leaf: Any) -> P:
        name = "/".join(
            str(
                k.idx
                if isinstance(k, jax.tree_util.SequenceKey)
                else getattr(k, "key", getattr(k, "name", k))
            )
            for k in path
        )
        if not hasattr(leaf, "shape") or len(leaf.shape) == 0:
            return P()
        for regex, ps in rules:
            if re.search(regex, name) is not None:
                if math.prod(leaf.shape) < min_size:
                    return P()
                return P(*tuple(ps)[: len(leaf.shape)]) if len(ps) > len(leaf.shape) else ps
        raise ValueError(f"Partition rule not found for param: {name}")

    return jax.tree_util.tree_map_with_path(spec, tree)


EASYDEL_MESH = {"dp": 1, "fsdp": 2, "ep": 1, "tp": 2, "sp": 1}
EASYDEL_LLAMA_RULES = (
    ("model/embed_tokens/embedding", P("tp", ("fsdp", "sp"))),
    ("self_attn/(q_proj|k_proj|v_proj)/kernel", P(("fsdp", "sp"), "tp")),
    ("self_attn/o_proj/kernel", P("tp", ("sp", "fsdp"))),
    ("mlp/(gate_proj|up_proj)/kernel", P(("fsdp", "sp"), "tp")),
    ("mlp/down_proj/kernel", P("tp", ("fsdp", "sp"))),
    (r".*(input_layernorm|post_attention_layernorm|norm)/kernel", P(None)),
    ("lm_head/kernel", P(("fsdp", "sp"), "tp")),
    (".*", P(None)),
)


def easydel_llama_tree() -> dict[str, Any]:
    """The parameter paths and shapes of a two-layer EasyDeL Llama (layers a list)."""
    layer = {
        "self_attn": {k: {"kernel": S((64, 64))} for k in ("q_proj", "k_proj", "v_proj", "o_proj")},
        "mlp": {
            k: {"kernel": S((64, 128) if k != "down_proj" else (128, 64))}
            for k in ("gate_proj", "up_proj", "down_proj")
        },
        "input_layernorm": {"kernel": S((64,))},
        "post_attention_layernorm": {"kernel": S((64,))},
    }
    return {
        "model": {
            "embed_tokens": {"embedding": S((256, 64))},
            "layers": [layer, layer],
            "norm": {"kernel": S((64,))},
        },
        "lm_head": {"kernel": S((64, 256))},
        "step": S((), jnp.int32),
    }


def assert_same_specs(ours: Any, theirs: Any, tree: Any) -> int:
    """Each array leaf of `tree` gets the same spec from both; the count compared."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    got = jax.tree_util.tree_leaves(ours, is_leaf=lambda x: isinstance(x, P))
    want = jax.tree_util.tree_leaves(theirs, is_leaf=lambda x: isinstance(x, P))
    assert len(got) == len(want) == len(leaves)
    for (path, leaf), g, w in zip(leaves, got, want, strict=True):
        assert entries(g, leaf.ndim) == entries(w, leaf.ndim), jax.tree_util.keystr(path)
    return len(leaves)


@pytest.mark.parametrize("min_size", [0, 8192])
def test_easydel_llama_rules_give_eformers_specs(min_size: int) -> None:
    tree = easydel_llama_tree()
    conversion = sr.convert_easydel(EASYDEL_LLAMA_RULES, min_size=min_size)
    assert conversion.exact and conversion.format == "easydel", conversion.notes
    assert "\nmesh dp, fsdp, ep, tp, sp\n" in conversion.text
    assert '\n  "self_attn/o_proj/kernel"' in conversion.text
    assert ("if elements < 8192" in conversion.text) == bool(min_size)
    ours = sr.specs(tree, sr.loads(conversion.text), EASYDEL_MESH)
    theirs = eformer_specs(EASYDEL_LLAMA_RULES, tree, min_size)
    assert assert_same_specs(ours, theirs, tree) == 22
    q = theirs["model"]["layers"][1]["self_attn"]["q_proj"]["kernel"]
    assert entries(q, 2) == ([(), ()] if min_size else [("fsdp", "sp"), ("tp",)])
    embedding = ours["model"]["embed_tokens"]["embedding"]
    assert entries(embedding, 2) == [("tp",), ("fsdp", "sp")]  # 16,384 elements: not under 8,192


class EasyDeLConfig:
    """An EasyDeL config, as far as the converter reads it."""

    sharding_axis_names = ("dp", "fsdp", "tp", "sp", "ep")

    def get_partition_rules(self, *args: Any, **kwargs: Any) -> Any:
        return EASYDEL_LLAMA_RULES


class NoRulesConfig:
    def get_partition_rules(self) -> None:
        return None


def test_an_unsupported_regex_is_said_without_nested_parentheses() -> None:
    """SR017 from both converters: the construct, what happens to the rule
    (regex: a comment, its leaves to the rules below; easydel: refused, since
    that would change the layout), and the fix, in one run of text."""
    rules = (("x", P("tp")), (r"(a)\1", P("tp")))
    with pytest.raises(ValueError) as refused:
        sr.convert_easydel(rules)
    said = str(refused.value)
    assert "SR017 unsupported regular expression: a backreference" in said and "))" not in said, said
    assert "leaving the rule out would hand its leaves to the rules below it and change the layout" in said
    assert said.endswith("; see docs/language.md#patterns"), said
    (note,) = sr.convert_regex(rules).notes
    assert "SR017" in note and "written as a comment" in note and "))" not in note, note
    assert note.endswith("; see docs/language.md#patterns"), note


def test_easydel_that_does_not_import_says_how_to_install_it(tmp_path: Path, monkeypatch) -> None:
    """A model type without EasyDeL points to its pinned install; a model
    type EasyDeL does not have, or one whose imports fail, says which."""
    import importlib.util

    if importlib.util.find_spec("easydel") is None:
        with pytest.raises(ValueError) as missing:
            sr.convert_easydel("llama")
        assert "EasyDeL is not installed here" in str(missing.value)
        assert "docs/convert.md#easydel-easydel-model-configs" in str(missing.value)
        assert (
            "## easydel: EasyDeL model configs"
            in (Path(__file__).resolve().parents[1] / "docs" / "convert.md").read_text()
        )
    fake = tmp_path / "easydel" / "modules"
    fake.mkdir(parents=True)
    (tmp_path / "easydel" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "llama.py").write_text("import no_such_dependency_of_easydel\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "easydel" or m.startswith("easydel.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(
        ValueError, match=r"no_such_dependency_of_easydel.*pinned stack.*#easydel-easydel-model"
    ):
        sr.convert_easydel("llama")
    with pytest.raises(ValueError, match="EasyDeL has no model type 'mistral'"):
        sr.convert_easydel("mistral")
    for name in [m for m in sys.modules if m == "easydel" or m.startswith("easydel.")]:
        del sys.modules[name]


def test_easydel_config_object_class_and_errors() -> None:
    from_object = sr.convert_easydel(EasyDeLConfig())
    assert from_object.source == "EasyDeLConfig"
    assert "\nmesh dp, fsdp, tp, sp, ep\n" in from_object.text
    assert sr.convert_easydel(EasyDeLConfig).text == from_object.text
    assert "\nmesh a, b, tp, fsdp, sp\n" in sr.convert_easydel(EASYDEL_LLAMA_RULES, axes=("a", "b")).text
    with pytest.raises(ValueError, match=r"get_partition_rules\(\) returned None"):
        sr.convert_easydel(NoRulesConfig())
    with pytest.raises(ValueError, match=r"rule 2 .*SR017.*backreference"):
        sr.convert_easydel((("x", P("tp")), (r"(a)\1", P("tp"))))
    with pytest.raises(ValueError, match="min_size must be"):
        sr.convert_easydel(EASYDEL_LLAMA_RULES, min_size=-1)
    with pytest.raises(ValueError, match="not a regular expression"):
        sr.convert_easydel((("(", P()),))
    with pytest.raises(ValueError, match="does not import"):
        sr.convert_easydel("no_such_easydel_model_type")


def test_easydel_a_spec_longer_than_the_rank_is_an_error_not_a_cut() -> None:
    """eformer cuts `P("fsdp", "tp")` to `P("fsdp")` on a vector; the rule
    file says so instead (SR103, naming the leaf), never differs silently."""
    rules = (("bias", P("fsdp", "tp")),)
    tree = {"dense": {"bias": S((64,))}}
    assert entries(eformer_specs(rules, tree)["dense"]["bias"], 1) == [("fsdp",)]
    with pytest.raises(sr.PlanError) as err:
        sr.specs(tree, sr.loads(sr.convert_easydel(rules).text), EASYDEL_MESH)
    assert err.value.code == "SR103" and err.value.path == "dense/bias"


_EASYDEL_PATTERNS = [
    "kernel",
    "q_proj",
    "(q|k|v)_proj/kernel",
    r"layers/\d+/",
    r"^model/",
    "norm/kernel$",
    ".*",
    "embed.*ding",
    "[a-c]_",
    r"\d$",
    "mlp/(gate|up)_proj",
    "(?i)KERNEL",
    "o_proj|down_proj",
    "x{2,3}",
]
_EASYDEL_SEGMENTS = [
    "model",
    "layers",
    "0",
    "1",
    "12",
    "self_attn",
    "q_proj",
    "o_proj",
    "mlp",
    "gate_proj",
    "down_proj",
    "kernel",
    "bias",
    "norm",
    "embed_tokens",
    "embedding",
    "a_b",
    "xxx",
    "KERNEL",
]
_EASYDEL_SPECS = [
    P(),
    P(None),
    P("tp"),
    P("fsdp", "tp"),
    P(("fsdp", "sp"), "tp"),
    P(None, "tp"),
    P("tp", ("fsdp", "sp")),
]


@settings(max_examples=60, deadline=None)
@given(
    rules=st.lists(
        st.tuples(st.sampled_from(_EASYDEL_PATTERNS), st.sampled_from(_EASYDEL_SPECS)), min_size=1, max_size=6
    ),
    paths=st.lists(
        st.lists(st.sampled_from(_EASYDEL_SEGMENTS), min_size=1, max_size=5).map("/".join),
        min_size=1,
        max_size=8,
        unique=True,
    ),
    shapes=st.lists(st.sampled_from([(), (1,), (4,), (8, 4), (4, 8, 4), (64, 64)]), min_size=8, max_size=8),
    min_size=st.sampled_from([0, 16, 1024]),
    catch_all=st.booleans(),
)
def test_easydel_converted_rules_choose_as_pythons_first_search_match(
    rules: list[Any], paths: list[str], shapes: list[Any], min_size: int, catch_all: bool
) -> None:
    """For random rules and paths, the converted file gives each leaf the
    spec of the first rule whose regex `re.search` finds (eformer's choice);
    where eformer has no rule it errors, and so does the file (SR105); where
    it cuts a spec to the rank, the file says SR103; a file may refuse with
    SR125 (a catch-all taking what a rule was evidently written for)."""
    rules = rules + [(".*", P(None))] * catch_all  # as EasyDeL's rules end
    tree = {path: S(shape) for path, shape in zip(paths, shapes, strict=False)}
    rules_file = sr.loads(sr.convert_easydel(tuple(rules), min_size=min_size).text)
    try:
        ours: Any = sr.specs(tree, rules_file, EASYDEL_MESH)
    except sr.PlanError as err:
        ours = err.code
    if ours == "SR125":  # a catch-all takes a leaf an earlier rule evidently meant: refused, not silent
        EASYDEL_OUTCOMES["SR125"] += 1
        return
    ones = {p for p, leaf in tree.items() if leaf.ndim and math.prod(leaf.shape) == 1}
    if not isinstance(ours, str):  # size-1 arrays: replicated by the file, matched or not (eformer: an error
        for path in ones:  # unmatched, else a spec that cannot divide their dimensions)
            assert entries(ours.pop(path), 1) == [()], path
    tree = {p: leaf for p, leaf in tree.items() if p not in ones}
    try:
        theirs = eformer_specs(rules, tree, min_size)
    except ValueError:
        assert ours == "SR105"
        EASYDEL_OUTCOMES["SR105"] += 1
        return
    cut = [
        p
        for p, leaf in tree.items()
        if leaf.ndim
        and math.prod(leaf.shape) >= max(min_size, 2)
        and len(next(ps for r, ps in rules if re.search(r, p))) > leaf.ndim
    ]
    if cut:
        assert ours == "SR103"
        EASYDEL_OUTCOMES["SR103"] += 1
        return
    assert_same_specs(ours, theirs, tree)
    EASYDEL_OUTCOMES["same"] += 1


EASYDEL_OUTCOMES: collections.Counter[str] = collections.Counter()
"""How often the property above compared specs, and how often each error was the outcome."""


def test_cli_convert_easydel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "edrules.py").write_text(
        "from jax.sharding import PartitionSpec as PS\n"
        "RULES = (('mlp/down_proj/kernel', PS('tp', ('fsdp', 'sp'))), ('.*', PS(None)))\n"
        "BAD = (('(?<=mlp/)x', PS('tp')),)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "easydel.shard"
    assert main(["convert", "easydel", "edrules:RULES", "--min-size", "16384", "-o", str(out)]) == 0
    text = out.read_text()
    assert text == sr.convert_easydel("edrules:RULES", min_size=16384).text
    assert '\n  "mlp/down_proj/kernel" -> replicated if elements < 16384\n' in text
    capsys.readouterr()
    assert main(["convert", "easydel", "edrules:BAD"]) == 2
    assert "SR017" in capsys.readouterr().err
    assert main(["convert", "regex", "edrules:RULES", "--min-size", "3"]) == 2
    assert "--min-size is for the easydel format" in capsys.readouterr().err
