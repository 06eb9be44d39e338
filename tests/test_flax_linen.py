"""Flax linen: boxed parameters (`nn.Partitioned`, `nn.with_logical_partitioning`)
and the `logical` spec, which lays them out by their logical axis names."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules._interop import _paths
from shardrules._language._format import format_text
from shardrules._language._parse import parse


def logical(init, *names):
    return nn.with_logical_partitioning(init, names)


class Block(nn.Module):
    """Embedding, attention-like projections and an MLP, every parameter named."""

    @nn.compact
    def __call__(self, tokens):
        dense = nn.initializers.lecun_normal()
        zeros = nn.initializers.zeros
        x = nn.Embed(64, 16, embedding_init=logical(nn.initializers.normal(0.02), "vocab", "embed"))(tokens)
        q = nn.DenseGeneral((4, 4), kernel_init=logical(dense, "embed", "heads", "kv"), use_bias=False)(x)
        out = nn.DenseGeneral(
            16,
            axis=(-2, -1),
            kernel_init=logical(dense, "heads", "kv", "embed"),
            bias_init=logical(zeros, "embed"),
        )
        x = x + out(q)
        h = nn.Dense(32, kernel_init=logical(dense, "embed", "mlp"), bias_init=logical(zeros, "mlp"))(x)
        x = x + nn.Dense(16, kernel_init=logical(dense, "mlp", "embed"), bias_init=logical(zeros, "embed"))(
            nn.relu(h)
        )
        scale = self.param("norm_scale", logical(nn.initializers.ones, "norm"), (16,))
        return x * scale


TOKENS = jnp.zeros((4, 8), jnp.int32)

RULE_TEXT = """\
mesh data, fsdp, model

alias embed = fsdp
alias mlp   = model
alias heads = model
alias kv    = _

rules params:
  default -> logical
"""
# The same mapping written as Flax's logical_axis_rules (`vocab` and `norm` are in
# neither: both leave those dimensions unsharded).
FLAX_RULES = (("embed", "fsdp"), ("mlp", "model"), ("heads", "model"), ("kv", None))


@pytest.fixture
def variables():
    return Block().init(jax.random.key(0), TOKENS)


def test_boxed_leaves_add_no_path_segment(variables):
    kernel = variables["params"]["Dense_0"]["kernel"]
    assert isinstance(kernel, nn.LogicallyPartitioned)
    walked = _paths.leaf_paths(variables)
    keyed, _ = _paths.flatten(variables)
    flat = _paths.path_strs([keypath for keypath, _ in keyed])
    assert walked == flat
    assert "params/Dense_0/kernel" in walked and "params/norm_scale" in walked
    assert not any(p.endswith("/value") or "/value/" in p for p in walked), walked
    # A path rule sees the same paths.
    rules = sr.loads('mesh fsdp\nrules params:\n  "Dense_0/kernel$" -> (fsdp, _)\n  default -> replicated\n')
    plan = sr.plan(variables, rules, {"fsdp": 2})
    assert plan["params/Dense_0/kernel"].spec == P("fsdp", None)


def test_unusual_boxes_lose_only_their_own_segment():
    x = jnp.ones((4, 4))
    tree = {
        "nested": nn.Partitioned(nn.Partitioned(x, ("a", "b")), ("a", "b")),
        "of_dict": nn.Partitioned({"k": x, "v": x}, ("a", "b")),
        "pair": [nn.Partitioned(x, ("a", "b")), x],
        "value": {"value": x},  # keys named `value` that are not boxes stay
    }
    want = ["nested", "of_dict/k", "of_dict/v", "pair/0", "pair/1", "value/value"]
    assert _paths.leaf_paths(tree) == want
    keyed, _ = _paths.flatten(tree)
    assert _paths.path_strs([keypath for keypath, _ in keyed]) == want
    assert [leaf for _, leaf in keyed] == jax.tree.leaves(tree)


def test_plain_partitioned_boxes_too():
    boxed = {"w": nn.Partitioned(jnp.ones((8, 4)), ("model", None))}
    assert _paths.leaf_paths(boxed) == ["w"]
    rules = sr.loads("mesh data, model\nrules params:\n  default -> logical\n")
    # `nn.with_partitioning` names mesh axes; `logical` reads them as such.
    assert sr.specs(boxed, rules, {"data": 4, "model": 2})["w"].value == P("model", None)


def test_apply_keeps_the_boxes_and_shards_their_values(variables, mesh222):
    rules = sr.loads(RULE_TEXT)
    placed = sr.apply(variables, rules, mesh222)
    kernel = placed["params"]["Dense_0"]["kernel"]
    assert type(kernel) is nn.LogicallyPartitioned and kernel.names == ("embed", "mlp")
    assert kernel.value.sharding.spec == P("fsdp", "model")
    np.testing.assert_array_equal(kernel.value, variables["params"]["Dense_0"]["kernel"].value)
    # The model runs on the placed variables as on the original ones.
    np.testing.assert_allclose(
        Block().apply(placed, TOKENS), Block().apply(variables, TOKENS), rtol=1e-5, atol=1e-6
    )


def test_specs_and_shardings_fit_the_boxed_tree(variables, mesh222):
    rules = sr.loads(RULE_TEXT)
    specs = sr.specs(variables, rules, mesh222)
    shardings = sr.shardings(variables, rules, mesh222)
    # Same structure as the variables: each box holds its spec or sharding.
    assert jax.tree.structure(specs) == jax.tree.structure(variables)
    assert jax.tree.structure(shardings) == jax.tree.structure(variables)
    assert specs["params"]["Dense_0"]["kernel"].value == P("fsdp", "model")
    # Usable as jit shardings for the boxed variables as they are.
    out = jax.jit(lambda v: v, out_shardings=shardings)(variables)
    assert out["params"]["Dense_1"]["kernel"].value.sharding.spec == P("model", "fsdp")


def test_logical_matches_flax_logical_to_mesh_sharding(variables, mesh222):
    ours = sr.shardings(variables, sr.loads(RULE_TEXT), mesh222)
    theirs = nn.logical_to_mesh_sharding(nn.get_partition_spec(variables), mesh222, FLAX_RULES)
    ours_flat = jax.tree_util.tree_leaves_with_path(nn.unbox(ours))
    theirs_flat = dict(jax.tree_util.tree_leaves_with_path(theirs))
    assert len(ours_flat) == len(theirs_flat) == 9
    shapes = dict(jax.tree_util.tree_leaves_with_path(nn.unbox(variables)))
    for path, sharding in ours_flat:
        ndim = shapes[path].ndim
        assert sharding.is_equivalent_to(theirs_flat[path], ndim), (
            path,
            sharding.spec,
            theirs_flat[path].spec,
        )
    # Spot checks written out by hand: a tuple alias-free layout, `_`, and names in no rule.
    by_path = {jax.tree_util.keystr(p, simple=True, separator="/"): s.spec for p, s in ours_flat}
    assert by_path["params/Embed_0/embedding"] == P(None, "fsdp")  # vocab: no alias
    assert by_path["params/DenseGeneral_0/kernel"] == P("fsdp", "model", None)
    assert by_path["params/norm_scale"] == P(None)


def test_a_name_with_no_alias_stays_unsharded_with_a_warning(variables, mesh222):
    plan = sr.plan(variables, sr.loads(RULE_TEXT, name="block.shard"), mesh222)
    assert plan.ok, plan.errors
    warnings = {d.message.split("`")[1]: d for d in plan.diagnostics if d.code == "SR206"}
    assert set(warnings) == {"vocab", "norm"}
    d = warnings["vocab"]
    assert d.severity == "warning" and d.path == "params/Embed_0/embedding"
    assert d.span is not None and (d.span.file, d.span.line) == ("block.shard", 9)
    assert "alias vocab = " in d.hint
    # `alias NAME = _` says so explicitly and silences it.
    quiet = sr.loads(RULE_TEXT.replace("alias kv    = _", "alias kv    = _\nalias vocab = _\nalias norm = _"))
    assert not [d for d in sr.plan(variables, quiet, mesh222).diagnostics if d.code == "SR206"]


def test_leaves_without_names_are_an_error_naming_them(mesh222):
    class Plain(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Dense(8, kernel_init=logical(nn.initializers.lecun_normal(), "embed", "mlp"))(x)
            return nn.LayerNorm()(x)  # unnamed bias and scale

    variables = Plain().init(jax.random.key(0), jnp.ones((2, 16)))
    rules = sr.loads(RULE_TEXT, name="block.shard")
    with pytest.raises(sr.PlanError) as info:
        sr.apply(variables, rules, mesh222)
    err = info.value
    assert err.code == "SR113"
    message = str(err)
    for path in ("params/Dense_0/bias", "params/LayerNorm_0/bias", "params/LayerNorm_0/scale"):
        assert path in message
    assert "params/Dense_0/kernel " not in message
    assert "with_logical_partitioning" in err.hint
    # A rule above `logical` for those paths fixes it.
    fixed = sr.loads(RULE_TEXT.replace("  default", '  "bias|scale" -> replicated\n  default'))
    placed = sr.apply(variables, fixed, mesh222)
    assert placed["params"]["Dense_0"]["kernel"].value.sharding.spec == P("fsdp", "model")


def test_logical_errors_name_the_leaf_and_the_alias(mesh222):
    boxed = {"w": nn.LogicallyPartitioned(jnp.ones((6, 8)), ("embed", "mlp"))}
    # 6 does not divide by fsdp=2 × ... (here: embed -> (fsdp, model) = 4)
    wide = sr.loads("alias embed = (fsdp, model)\nalias mlp = data\nrules params:\n  default -> logical\n")
    with pytest.raises(sr.PlanError) as info:
        sr.specs(boxed, wide, mesh222)
    assert info.value.code == "SR104" and info.value.path == "w"
    assert "`embed`" in str(info.value) and "point the alias" in info.value.hint
    # Two names on one mesh axis.
    twice = sr.loads("alias embed = fsdp\nalias mlp = fsdp\nrules params:\n  default -> logical\n")
    with pytest.raises(sr.PlanError) as info:
        sr.specs(boxed, twice, mesh222)
    assert info.value.code == "SR102" and "`embed` and `mlp`" in str(info.value)
    # An alias naming an axis the mesh lacks.
    missing = sr.loads("alias embed = expert\nrules params:\n  default -> logical\n")
    with pytest.raises(sr.MeshError) as info:
        sr.specs(boxed, missing, mesh222)
    assert info.value.code == "SR101" and "alias `embed`" in str(info.value)
    # Names that do not fit the rank.
    short = {"w": nn.LogicallyPartitioned(jnp.ones((4, 4, 4)), ("embed", "mlp"))}
    ok = sr.loads("alias embed = fsdp\nalias mlp = model\nrules params:\n  default -> logical\n")
    with pytest.raises(sr.PlanError) as info:
        sr.specs(short, ok, mesh222)
    assert info.value.code == "SR103" and "(embed, mlp)" in str(info.value)


def test_logical_in_the_language():
    text = 'alias embed = fsdp\n\nrules params:\n  "norm"  ->   replicated\n  default ->logical\n'
    formatted = format_text(text)
    assert formatted.endswith('  "norm"  -> replicated\n  default -> logical\n')
    assert parse(formatted) == parse(text)
    assert format_text(formatted) == formatted
    rules = sr.loads(text)
    assert rules.defaults["params"].spec.kind == "logical"
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads('rules params:\n  "w" -> logicl\n')
    assert "did you mean `logical`?" in info.value.hint
    # `logical` is a keyword only where a spec starts: it can still name an axis.
    axis = sr.loads('mesh logical\nrules params:\n  "w" -> (logical)\n')
    assert axis.groups["params"][0].spec.axes == ("logical",)


def test_optimizer_state_of_boxed_params_follows_the_names(variables, mesh222):
    rules = sr.loads(RULE_TEXT)
    params = sr.apply(variables["params"], rules, mesh222)
    tx = optax.adam(1e-3)
    state = sr.apply(tx.init(params), rules, mesh222)
    mu = state[0].mu["Dense_0"]["kernel"]
    assert isinstance(mu, nn.LogicallyPartitioned) and mu.value.sharding.spec == P("fsdp", "model")


def test_train_step_keeps_the_layout(variables, mesh222):
    rules = sr.loads(RULE_TEXT)
    params = sr.apply(variables, rules, mesh222)["params"]
    shardings = sr.shardings(variables, rules, mesh222)["params"]
    tx = optax.sgd(0.1)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state):
        def loss_fn(p):
            out = Block().apply({"params": p}, TOKENS)
            return jnp.mean((out - 1.0) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state)
        params = sr.constrain(optax.apply_updates(params, updates), rules, mesh222)
        return params, opt_state, loss

    losses = []
    for _ in range(3):
        params, opt_state, loss = step(params, opt_state)
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    for new, want in zip(jax.tree.leaves(params), jax.tree.leaves(shardings), strict=True):
        assert new.sharding.is_equivalent_to(want, new.ndim)


def test_a_logical_error_is_reported_once_for_leaves_alike(mesh222):
    layers = {f"layer_{i}": nn.LogicallyPartitioned(jnp.ones((6, 8)), ("embed", "mlp")) for i in range(5)}
    rules = sr.loads("alias embed = (fsdp, model)\nalias mlp = data\nrules params:\n  default -> logical\n")
    plan = sr.plan(layers, rules, mesh222)
    assert [d.code for d in plan.errors] == ["SR104"]
    assert plan.errors[0].path == "layer_0"
    assert [leaf.why for leaf in plan] == ["error"] * 5


def test_without_a_mesh_only_aliases_and_partitioned_names_shard():
    rules = sr.loads("alias embed = fsdp\nrules params:\n  default -> logical\n")  # no mesh line
    tree = {
        "logical": nn.LogicallyPartitioned(jnp.ones((8, 4)), ("embed", "vocab")),
        "mesh_axes": nn.Partitioned(jnp.ones((8, 4)), ("model", None)),
    }
    plan = sr.plan(tree, rules)
    assert plan["logical"].spec == P("fsdp", None)  # `vocab`: no alias, no mesh to look in
    assert plan["mesh_axes"].spec == P("model", None)  # with_partitioning names mesh axes
    assert [d.message.split("`")[1] for d in plan.diagnostics if d.code == "SR206"] == ["vocab"]
    # On a mesh without `model`, a Partitioned name that is not a mesh axis is an error.
    with pytest.raises(sr.MeshError) as info:
        sr.specs(tree, rules, {"fsdp": 2, "data": 4})
    assert info.value.code == "SR101" and "`model`" in str(info.value)
