"""A tiny haliax transformer, laid out by haliax and by shardrules.

Levanter (haliax's trainer) lays parameters out by their axis names through
one mapping from names to mesh axes: its FSDP+TP configuration maps
`embed` to `data` (`parameter_axis_resources`, ZeRO-3) and `mlp`, `heads`
and `vocab` to `model` (`axis_resources`). `haliax_specs` is what haliax's
own `hax.partitioning.pspec_for` makes of that mapping for each leaf;
`rows()` compares it, leaf by leaf (which block of each array every device
holds), with the rule file `sr.suggest(..., strategy="fsdp+tp")` drafts for
the model, and with that mapping written as rules (`MAPPING_RULES`).

The model follows Levanter's Llama: a token embedding `(vocab, embed)`,
layers stacked under `layers` (`hnn.Stacked`) of attention (`q_proj`,
`k_proj`, `v_proj` `(heads, head_size, embed)`, `o_proj` `(embed, heads,
head_size)`), RMS norms and a gated MLP (`gate_proj`, `up_proj` `(mlp,
embed)`, `down_proj` `(embed, mlp)`), and an output head `(vocab, embed)`.
Needs haliax (`marin-haliax`) and Equinox.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import jax
from jax.sharding import PartitionSpec

import shardrules as sr

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _expert_layouts as E

MESH = {"data": 4, "model": 2}
MAPPING = {"embed": "data", "mlp": "model", "heads": "model", "vocab": "model"}
"""Levanter's FSDP+TP mapping: `parameter_axis_resources` over `axis_resources`."""
MAPPING_RULES = """
alias embed = data
alias mlp   = model
alias heads = model
alias vocab = model
alias layers    = _  # names the mapping leaves out: unsharded, as haliax leaves them
alias head_size = _

rules params:
  default -> logical
"""
_ANY = sr.loads("rules params:\n  default -> replicated\n")

Vocab = hax.Axis("vocab", 256)
Embed = hax.Axis("embed", 64)
Heads = hax.Axis("heads", 4)
HeadSize = hax.Axis("head_size", 16)
Mlp = hax.Axis("mlp", 128)
Layers = hax.Axis("layers", 2)
Pos = hax.Axis("position", 16)
KeyPos = Pos.alias("key_position")


def _linear(In: Any, Out: Any, key: jax.Array) -> hnn.Linear:
    return hnn.Linear.init(In=In, Out=Out, key=key, use_bias=False, out_first=True)


def _norm() -> hnn.RmsNorm:
    return hnn.RmsNorm.init(Embed, use_bias=False)


class Attention(eqx.Module):
    q_proj: hnn.Linear
    k_proj: hnn.Linear
    v_proj: hnn.Linear
    o_proj: hnn.Linear

    @staticmethod
    def init(*, key: jax.Array) -> Attention:
        q, k, v, o = jax.random.split(key, 4)
        return Attention(
            _linear(Embed, (Heads, HeadSize), q),
            _linear(Embed, (Heads, HeadSize), k),
            _linear(Embed, (Heads, HeadSize), v),
            _linear((Heads, HeadSize), Embed, o),
        )

    def __call__(self, x: hax.NamedArray) -> hax.NamedArray:
        q = self.q_proj(x)
        k = self.k_proj(x).rename({"position": "key_position"})
        v = self.v_proj(x).rename({"position": "key_position"})
        mask = hnn.attention.causal_mask(Pos, KeyPos)
        return self.o_proj(hnn.attention.dot_product_attention("key_position", HeadSize, q, k, v, mask=mask))


class Mlp_(eqx.Module):
    gate_proj: hnn.Linear
    up_proj: hnn.Linear
    down_proj: hnn.Linear

    @staticmethod
    def init(*, key: jax.Array) -> Mlp_:
        g, u, d = jax.random.split(key, 3)
        return Mlp_(_linear(Embed, Mlp, g), _linear(Embed, Mlp, u), _linear(Mlp, Embed, d))

    def __call__(self, x: hax.NamedArray) -> hax.NamedArray:
        return self.down_proj(hnn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(eqx.Module):
    input_layernorm: hnn.RmsNorm
    self_attn: Attention
    post_attention_layernorm: hnn.RmsNorm
    mlp: Mlp_

    @staticmethod
    def init(*, key: jax.Array) -> Block:
        a, m = jax.random.split(key)
        return Block(_norm(), Attention.init(key=a), _norm(), Mlp_.init(key=m))

    def __call__(self, x: hax.NamedArray) -> hax.NamedArray:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(eqx.Module):
    token_embeddings: hnn.Embedding
    layers: hnn.Stacked
    norm: hnn.RmsNorm
    lm_head: hnn.Linear

    @staticmethod
    def init(*, key: jax.Array) -> Transformer:
        e, layers, h = jax.random.split(key, 3)
        return Transformer(
            hnn.Embedding.init(Vocab, Embed, key=e),
            hnn.Stacked.init(Layers, Block)(key=jax.random.split(layers, Layers.size)),
            _norm(),
            _linear(Embed, Vocab, h),
        )

    def __call__(self, tokens: hax.NamedArray) -> hax.NamedArray:
        x = self.layers.fold(self.token_embeddings.embed(tokens))
        return self.lm_head(self.norm(x))


def model(key: int = 0) -> Transformer:
    """The tiny transformer, initialised from `key`."""
    return Transformer.init(key=jax.random.key(key))


def loss(model: Transformer, tokens: jax.Array) -> jax.Array:
    """Next-token cross entropy of `tokens` `(batch, position + 1)`."""
    Batch = hax.Axis("batch", tokens.shape[0])
    inputs = hax.named(tokens[:, :-1], (Batch, Pos))
    targets = hax.nn.one_hot(hax.named(tokens[:, 1:], (Batch, Pos)), Vocab)
    logits = model(inputs)
    return hnn.cross_entropy_loss(logits, Vocab, targets, reduction=hax.mean).scalar()


def haliax_specs(tree: Any, mapping: dict[str, Any] = MAPPING) -> dict[str, PartitionSpec | None]:
    """haliax's own layout of each leaf (`hax.partitioning.pspec_for`), keyed by shardrules' paths."""
    specs = hax.partitioning.pspec_for(tree, resource_mapping=mapping)
    paths = [leaf.path for leaf in sr.plan(tree, _ANY)]
    flat = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    return dict(zip(paths, flat, strict=True))


def shapes(tree: Any) -> dict[str, jax.ShapeDtypeStruct]:
    """Every array leaf's shape and dtype, by path."""
    return {
        leaf.path: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for leaf in sr.plan(tree, _ANY) if leaf.shape
    }


def rule_specs(tree: Any, text: str) -> dict[str, PartitionSpec | None]:
    """What the rule file `text` lays each leaf of `tree` out as on `MESH`."""
    plan = sr.plan(tree, sr.loads(text), dict(MESH))
    assert plan.ok, plan.errors
    return {leaf.path: leaf.spec for leaf in plan}


def measure() -> dict[str, tuple[str, E.Agreement]]:
    """Each layout compared with haliax's own layout of the tiny transformer,
    by what it is: the drafted rules (`sr.suggest(..., "fsdp+tp")`, on the
    model's shapes and on the model itself, whose named arrays carry their axis
    names) and haliax's mapping written as rules; each with its strategy."""
    tree = jax.eval_shape(model)
    theirs = haliax_specs(tree)
    flat = shapes(tree)
    found = {}
    for what, strategy, source, text in (
        ("suggest, shapes by path", "fsdp+tp", flat, sr.suggest(flat, dict(MESH), strategy="fsdp+tp")),
        ("suggest, named arrays", "fsdp+tp", tree, sr.suggest(tree, dict(MESH), strategy="fsdp+tp")),
        ("its mapping as rules", "mapping", tree, MAPPING_RULES),
    ):
        found[what] = (strategy, E.agreement(flat, rule_specs(source, text), theirs, MESH))
    return found


def rows() -> list[list[str]]:
    """`measure` as table rows: library, model, strategy and mesh, leaves
    agreeing / total, bytes agreeing / total, and what differs."""
    mesh = ", ".join(f"{a}={n}" for a, n in dict(MESH).items())
    out = []
    for what, (strategy, found) in measure().items():
        out.append(
            ["haliax (its axis mapping)", f"tiny transformer ({what})", f"{strategy}, {mesh}", *found.cells()]
        )
    return out


if __name__ == "__main__":
    for row in rows():
        print("| " + " | ".join(row) + " |")
