"""The scope of an NNX or Equinox module call is its attribute path
(`blocks/0/attn`), the same whichever way the train step comes by the module:
passed as an argument, rebuilt with `nnx.merge` inside the step, rebuilt by
`nnx.value_and_grad`, `nnx.jit`, `eqx.filter_value_and_grad` or
`eqx.filter_jit`, or built as a stack with `nnx.vmap` and run with
`nnx.scan`. Flax linen names method calls itself (`Model/embedder.encode`).
Each pattern is traced for its scope outputs, and the activation rule for
`attn` lays each attention output out."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

import shardrules as sr

nnx = pytest.importorskip("flax.nnx", reason="flax is not installed")
eqx = pytest.importorskip("equinox", reason="equinox is not installed")
linen = pytest.importorskip("flax.linen", reason="flax is not installed")

RULES = sr.loads(
    "rules params:\n  default -> replicated\n"
    'rules inputs:\n  "." -> (data, _)\n'
    'rules activations:\n  "attn$" -> (data, _)\n',
    name="m.shard",
)
X = np.linspace(-1, 1, 8 * 16, dtype=np.float32).reshape(8, 16)
LAYERED = [
    "blocks/0/attn/q", "blocks/0/attn/o", "blocks/0/attn", "blocks/0/mlp", "blocks/0",
    "blocks/1/attn/q", "blocks/1/attn/o", "blocks/1/attn", "blocks/1/mlp", "blocks/1",
]  # fmt: skip


def _mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))


def _scopes(fn, groups, *args) -> list[str]:
    step = sr.jit(fn, RULES, _mesh(), in_groups=groups)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sr.ShardRulesWarning)  # the attn rule matches: no SR211
        found = step.scopes(*args)
        got = step(*args)
    attn = [s for s in found if s.name.endswith("/attn")]
    assert attn and all(s.rule is not None and s.rule.pattern == "attn$" for s in attn)
    np.testing.assert_allclose(float(got), float(jax.jit(fn)(*args)), rtol=1e-5)
    return [s.name for s in found if s.name != "blocks"]  # `blocks` holds both layers' scopes


class Attn(nnx.Module):
    def __init__(self, d, rngs):
        self.q, self.o = nnx.Linear(d, d, rngs=rngs), nnx.Linear(d, d, rngs=rngs)

    def __call__(self, x):
        return self.o(jnp.tanh(self.q(x)))


class Block(nnx.Module):
    def __init__(self, d, rngs):
        self.attn, self.mlp = Attn(d, rngs), nnx.Linear(d, d, rngs=rngs)

    def __call__(self, x):
        return x + self.mlp(self.attn(x))


class Model(nnx.Module):
    def __init__(self, d, rngs):
        self.blocks = nnx.List([Block(d, rngs) for _ in range(2)])

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class Scanned(nnx.Module):
    """Layers made by `nnx.vmap` (one module, stacked weights), run by `nnx.scan`."""

    def __init__(self, d, rngs):
        @nnx.split_rngs(splits=2)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return Block(d, rngs)

        self.blocks = make(rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def body(x, block):
            return block(x)

        return body(x, self.blocks)


def _loss(model, x):
    return jnp.mean(model(x) ** 2)


def test_nnx_module_as_argument():
    assert _scopes(_loss, (None, "inputs"), Model(16, nnx.Rngs(0)), X) == LAYERED


def test_nnx_merge_inside_the_step():
    graphdef, state = nnx.split(Model(16, nnx.Rngs(0)))

    def step(state, x):
        return _loss(nnx.merge(graphdef, state), x)

    assert _scopes(step, ("params", "inputs"), state, X) == LAYERED


def test_nnx_merge_inside_jax_value_and_grad():
    graphdef, state = nnx.split(Model(16, nnx.Rngs(0)))

    def step(state, x):
        return jax.value_and_grad(lambda s: _loss(nnx.merge(graphdef, s), x))(state)[0]

    assert _scopes(step, ("params", "inputs"), state, X) == LAYERED


def test_nnx_value_and_grad():
    def step(model, x):
        return nnx.value_and_grad(_loss)(model, x)[0]

    assert _scopes(step, (None, "inputs"), Model(16, nnx.Rngs(0)), X) == LAYERED


def test_nnx_jit_inside_the_step():
    inner = nnx.jit(_loss)

    def step(model, x):
        return inner(model, x)

    assert _scopes(step, (None, "inputs"), Model(16, nnx.Rngs(0)), X) == LAYERED


@pytest.mark.parametrize("how", ["argument", "merge"])
def test_nnx_scan_over_vmapped_layers(how):
    model = Scanned(16, nnx.Rngs(0))
    expected = ["blocks/attn/q", "blocks/attn/o", "blocks/attn", "blocks/mlp"]
    if how == "argument":
        assert _scopes(_loss, (None, "inputs"), model, X) == expected
    else:
        graphdef, state = nnx.split(model)
        step = lambda state, x: _loss(nnx.merge(graphdef, state), x)  # noqa: E731
        assert _scopes(step, ("params", "inputs"), state, X) == expected


class EqxAttn(eqx.Module):
    q: eqx.nn.Linear
    o: eqx.nn.Linear

    def __init__(self, d, key):
        k1, k2 = jax.random.split(key)
        self.q, self.o = eqx.nn.Linear(d, d, key=k1), eqx.nn.Linear(d, d, key=k2)

    def __call__(self, x):
        return self.o(jnp.tanh(self.q(x)))


class EqxBlock(eqx.Module):
    attn: EqxAttn
    mlp: eqx.nn.Linear

    def __init__(self, d, key):
        k1, k2 = jax.random.split(key)
        self.attn, self.mlp = EqxAttn(d, k1), eqx.nn.Linear(d, d, key=k2)

    def __call__(self, x):
        return x + self.mlp(self.attn(x))


class EqxModel(eqx.Module):
    blocks: list

    def __init__(self, d, key):
        self.blocks = [EqxBlock(d, k) for k in jax.random.split(key, 2)]

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _eqx_loss(model, x):
    return jnp.mean(jax.vmap(model)(x) ** 2)


def _eqx_names(names: list[str]) -> list[str]:
    return [n for n in names if not n.endswith("eqx.nn.Linear")]  # Equinox's own scope in Linear


@pytest.mark.parametrize("how", ["argument", "filter_value_and_grad", "filter_jit"])
def test_equinox_module_scopes(how):
    model = EqxModel(16, jax.random.key(0))
    if how == "argument":
        step = _eqx_loss
    elif how == "filter_value_and_grad":
        step = lambda m, x: eqx.filter_value_and_grad(_eqx_loss)(m, x)[0]  # noqa: E731
    else:
        step = lambda m, x: eqx.filter_jit(_eqx_loss)(m, x)  # noqa: E731
    assert _eqx_names(_scopes(step, (None, "inputs"), model, X)) == LAYERED


def test_flax_linen_names_method_calls_itself():
    class Embedder(linen.Module):
        def setup(self):
            self.table = self.param("table", linen.initializers.normal(), (32, 16))

        def encode(self, t):
            return self.table[t]

        def decode(self, h):
            return h @ self.table.T

    class Lm(linen.Module):
        def setup(self):
            self.embedder = Embedder()

        def __call__(self, t):
            return self.embedder.decode(jnp.tanh(self.embedder.encode(t)))

    lm, tokens = Lm(), np.arange(32, dtype=np.int32).reshape(8, 4)
    params = lm.init(jax.random.key(0), tokens)
    rules = sr.loads(
        'rules params:\n  default -> replicated\nrules inputs:\n  "." -> (data, _)\n'
        'rules activations:\n  "embedder\\.encode$" -> (data, _, _)\n',
        name="lm.shard",
    )
    step = sr.jit(lambda p, t: jnp.mean(lm.apply(p, t) ** 2), rules, _mesh(), in_groups=("params", "inputs"))
    scopes = {s.name: s for s in step.scopes(params, tokens)}
    assert list(scopes) == ["Lm/embedder.encode", "Lm/embedder.decode", "Lm"]
    assert scopes["Lm/embedder.encode"].rule is not None
    # the rule written for the module alone matches nothing, and says which name to use
    anchored = sr.loads(rules.sources["lm.shard"].replace("embedder\\.encode$", "embedder$"), name="lm.shard")
    step = sr.jit(
        lambda p, t: jnp.mean(lm.apply(p, t) ** 2), anchored, _mesh(), in_groups=("params", "inputs")
    )
    with pytest.warns(sr.ShardRulesWarning, match="SR211") as caught:
        step(params, tokens)
    (hint,) = [w.message.diagnostics[0].hint for w in caught if w.message.code == "SR211"]
    assert hint.startswith('did you mean "Lm/embedder.encode" or "Lm/embedder.decode"?')


def test_a_step_traced_inside_a_step_names_its_calls_and_does_not_wait_for_itself():
    import threading

    inner = sr.jit(_loss, RULES, _mesh(), in_groups=(None, "inputs"))
    outer = sr.jit(lambda m, x: inner(m, x) * 2, RULES, _mesh(), in_groups=(None, "inputs"))
    model, found = Model(16, nnx.Rngs(0)), []

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sr.ShardRulesWarning)
            found.append(float(outer(model, X)))
            found.append([s.name for s in inner.scopes(model, X)])

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive(), "the nested trace waited for the outer one"
    assert found[0] == pytest.approx(2 * float(jax.jit(_loss)(model, X)), rel=1e-5)
    assert [n for n in found[1] if n != "blocks"] == LAYERED


def _attention(q, k, v):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def test_einsum_subscripts_name_no_scope():
    """`jnp.einsum` names a scope with its subscripts (`bhqk,bkhd->bqhd`): a
    name that changes with the letters. Its result is named by the scope
    around it (the module's), and where the code names it with
    `jax.named_scope`, by that: rules and the list of scopes never see the
    subscripts, in the forward pass or the gradient's collectives."""
    rules = sr.loads(
        "rules params:\n  default -> replicated\n"
        'rules inputs:\n  "." -> (data, _, _, _)\n'
        'rules activations:\n  "attn/scores$" -> (data, _, _, _)\n  "attn$" -> (data, _, _, _)\n',
        name="a.shard",
    )

    def step(batch):
        with jax.named_scope("attn"):
            with jax.named_scope("scores"):
                scores = jnp.einsum("bqhd,bkhd->bhqk", batch["q"], batch["k"])
            out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), batch["v"])
        with jax.named_scope("head"):
            return (_attention(out, batch["k"], batch["v"]) ** 2).sum()

    batch = {name: jnp.linspace(-1, 1, 8 * 4 * 2 * 8).reshape(8, 4, 2, 8) for name in "qkv"}
    jitted = sr.jit(jax.value_and_grad(step), rules, _mesh(), in_groups=("inputs",))
    with warnings.catch_warnings():
        warnings.simplefilter("error", sr.ShardRulesWarning)  # both rules match: no SR211
        found = {s.name: s for s in jitted.scopes(batch)}
        got = jitted(batch)
    assert set(found) == {"attn/scores", "attn", "head"}, sorted(found)
    assert found["attn/scores"].shapes == ((8, 2, 4, 4),) and found["attn/scores"].rule is not None
    assert found["attn"].rule is not None and found["attn"].rule.pattern == "attn$"
    np.testing.assert_allclose(got[1]["q"], jax.jit(jax.grad(step))(batch)["q"], rtol=1e-5, atol=1e-6)
    decisions = jitted.decisions(batch)
    assert decisions and not [d for d in decisions if "->" in d.scope or "," in d.scope], decisions
    cost = jitted.cost(batch)
    scopes = [s for c in cost.collectives for s in c.scopes] + [r.scope for r in cost.repeated]
    assert not [s for s in scopes if "->" in s], cost
