"""Small train steps for `explicit_flops.py` and `tests/test_real_models.py`.

Each builder returns a `Model`: a train step `step(params, batch) -> (params,
loss)` (`jax.value_and_grad` of a next-token cross-entropy, then an SGD
update), its parameters and a batch as NumPy arrays (not yet placed), the rule
file that lays them out and the mesh it is written for. The steps are plain
JAX: no sharding in them. A builder whose library is not installed raises
`Unavailable` with the reason.

- `transformer`: `examples/transformer` (its model and rule file).
- `nnx_moe`: a Flax NNX decoder with grouped-query attention and an 8-expert
  top-2 MoE layer (GShard-style dispatch with a capacity); the step does
  `nnx.merge(graphdef, state)` inside.
- `keras_gemma`: keras-hub's `GemmaBackbone` built from a config (no weights
  downloaded), trained through `stateless_call` on the JAX backend.
- `griffin`: recurrentgemma's Griffin (Flax linen), one recurrent and one
  local-attention block.
- `penzai_llamalike`: penzai's llamalike transformer, its parameters keyed by
  their penzai labels.
- `maxtext_llama`: MaxText's llama2 decoder built from MaxText's own `base.yml`;
  on Explicit axes with `shard_mode: explicit`, where MaxText's layers reshard
  their activations and give their contractions `out_sharding`s themselves.
  Its layers name the mesh they run on, so its step is made for each mesh
  (`Model.step_on`).

`data_parallel=True` (where a builder takes it) uses `rules/data_parallel.shard`
instead: every parameter replicated, the batch split over `data=8`.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules"
REPO = HERE.parent
LEARNING_RATE = 0.1
VOCAB, BATCH, SEQ = 256, 16, 32


class Unavailable(Exception):
    """A model whose library is not installed (or cannot run here): the reason."""


@dataclass(frozen=True)
class Model:
    name: str
    step: Callable[[Any, Any], tuple[Any, Any]]
    params: Any
    batch: dict[str, np.ndarray]
    rules: Path
    shape: tuple[int, ...]
    axes: tuple[str, ...]
    library: str = ""  # the library and version it comes from, for the report
    # For a model whose code names the mesh it runs on (MaxText's layers make their
    # `NamedSharding`s from it): the train step for a mesh, `None` meaning one device.
    bind: Callable[[Any], Callable[[Any, Any], tuple[Any, Any]]] | None = None
    # The parameters' layouts (a PartitionSpec pytree) on this mesh as the library
    # itself gives them, where it has its own (MaxText's logical axis rules).
    native_specs: Any = None
    # The parameters as the library boxes them with their logical axis names, where it does.
    boxed: Any = None

    @property
    def mesh_text(self) -> str:
        return ", ".join(f"{a}={n}" for a, n in zip(self.axes, self.shape, strict=True))

    def step_on(self, mesh: Any = None) -> Callable[[Any, Any], tuple[Any, Any]]:
        """The train step to run on `mesh` (`None`: on one device)."""
        return self.step if self.bind is None else self.bind(mesh)


def _require(module: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise Unavailable(f"{what} is not installed ({err})") from None


def _version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{distribution} {version(distribution)}"
    except PackageNotFoundError:
        return distribution


def tokens(seed: int = 0, batch: int = BATCH, seq: int = SEQ, vocab: int = VOCAB) -> np.ndarray:
    """`(batch, seq + 1)` random token ids: inputs and next-token targets."""
    return np.random.default_rng(seed).integers(0, vocab, (batch, seq + 1)).astype(np.int32)


def cross_entropy(logits: Any, targets: Any) -> Any:
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def sgd(loss_fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], tuple[Any, Any]]:
    """The train step of `loss_fn(params, batch)`: its value and gradient, then SGD."""
    import jax

    def step(params: Any, batch: Any) -> tuple[Any, Any]:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads), loss

    return step


def _data_parallel(model: Model, data_parallel: bool) -> Model:
    if not data_parallel:
        return model
    return Model(
        model.name,
        model.step,
        model.params,
        model.batch,
        RULES / "data_parallel.shard",
        (8,),
        ("data",),
        model.library,
    )


# --- examples/transformer ---------------------------------------------------------------------------


def transformer(data_parallel: bool = False) -> Model:
    sys.path.insert(0, str(REPO / "examples" / "transformer"))
    try:
        example = importlib.import_module("train")
    finally:
        sys.path.pop(0)
    rng = np.random.default_rng(0)
    params = example.init_params(rng)
    seq = tokens(1, example.BATCH, example.SEQ, example.VOCAB)
    batch = {"tokens": seq[:, :-1], "targets": seq[:, 1:]}
    model = Model(
        "transformer", example.train_step, params, batch, example.RULES, (4, 2), ("fsdp", "model"), "example"
    )
    return _data_parallel(model, data_parallel)


# --- Flax NNX: grouped-query attention and a mixture of experts ---------------------------------------


# --- the NNX decoders' shared parts (nnx_moe, nnx_gather_moe) --------------------------------------------

_D, _HEADS, _KV_HEADS, _HEAD_DIM = 64, 4, 2, 16  # GQA: 4 query heads sharing 2 key/value heads


def _gqa_attention(nnx: Any, init: Any) -> Any:
    """The NNX attention of the decoders: causal GQA, no biases."""
    import jax
    import jax.numpy as jnp

    d, heads, kv_heads, head_dim = _D, _HEADS, _KV_HEADS, _HEAD_DIM

    class Attention(nnx.Module):
        def __init__(self, rngs: Any):
            self.q = nnx.Linear(d, heads * head_dim, use_bias=False, kernel_init=init, rngs=rngs)
            self.k = nnx.Linear(d, kv_heads * head_dim, use_bias=False, kernel_init=init, rngs=rngs)
            self.v = nnx.Linear(d, kv_heads * head_dim, use_bias=False, kernel_init=init, rngs=rngs)
            self.o = nnx.Linear(heads * head_dim, d, use_bias=False, kernel_init=init, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            b, t, _ = x.shape
            groups = heads // kv_heads
            q = self.q(x).reshape(b, t, kv_heads, groups, head_dim)
            k = self.k(x).reshape(b, t, kv_heads, head_dim)
            v = self.v(x).reshape(b, t, kv_heads, head_dim)
            scores = jnp.einsum("btkgh,bskh->bkgts", q, k) / np.sqrt(head_dim)
            scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
            out = jnp.einsum("bkgts,bskh->btkgh", jax.nn.softmax(scores, axis=-1), v)
            return self.o(out.reshape(b, t, heads * head_dim))

    return Attention


def _moe_block(nnx: Any, attention: Any, moe: Any) -> Any:
    """A pre-norm block: attention, then the MoE, each on a residual."""

    class Block(nnx.Module):
        def __init__(self, rngs: Any):
            self.norm1 = nnx.RMSNorm(_D, rngs=rngs)
            self.attn = attention(rngs)
            self.norm2 = nnx.RMSNorm(_D, rngs=rngs)
            self.moe = moe(rngs)

        def __call__(self, x: Any) -> Any:
            x = x + self.attn(self.norm1(x))
            return x + self.moe(self.norm2(x))

    return Block


def _nnx_sgd(nnx: Any, model: Any) -> tuple[Any, Callable[[Any, dict], tuple[Any, Any]]]:
    """The model's state (on the host; `jax.ShapeDtypeStruct`s for a model
    made by `nnx.eval_shape`) and an SGD step on it: `(state, batch) -> (new
    state, loss)`, the loss the cross-entropy of next tokens."""
    import jax

    graphdef, state = nnx.split(model)
    if all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(state)):
        state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    else:
        state = jax.device_get(state)

    def step(state: Any, batch: dict) -> tuple[Any, Any]:
        model = nnx.merge(graphdef, state)

        def loss_fn(model: Any) -> Any:
            return cross_entropy(model(batch["tokens"]), batch["targets"])

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, state, grads), loss

    return state, step


def _swiglu_decoder(nnx: Any, attention: Any, *, d: int, ffn: int, vocab: int, layers: int, init: Any) -> Any:
    """A pre-norm decoder class: an embedding, `layers` blocks (`attention`,
    then a SwiGLU MLP of `ffn`, each on a residual, RMSNorm before each), a
    final RMSNorm and an untied output head; no biases."""
    import jax

    class Mlp(nnx.Module):
        def __init__(self, rngs: Any):
            self.gate = nnx.Linear(d, ffn, use_bias=False, kernel_init=init, rngs=rngs)
            self.up = nnx.Linear(d, ffn, use_bias=False, kernel_init=init, rngs=rngs)
            self.down = nnx.Linear(ffn, d, use_bias=False, kernel_init=init, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.down(jax.nn.silu(self.gate(x)) * self.up(x))

    class Block(nnx.Module):
        def __init__(self, rngs: Any):
            self.norm1 = nnx.RMSNorm(d, rngs=rngs)
            self.attn = attention(rngs)
            self.norm2 = nnx.RMSNorm(d, rngs=rngs)
            self.mlp = Mlp(rngs)

        def __call__(self, x: Any) -> Any:
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))

    class Decoder(nnx.Module):
        def __init__(self, rngs: Any):
            self.embed = nnx.Embed(vocab, d, rngs=rngs)
            self.layers = nnx.List([Block(rngs) for _ in range(layers)])
            self.norm = nnx.RMSNorm(d, rngs=rngs)
            self.head = nnx.Linear(d, vocab, use_bias=False, kernel_init=init, rngs=rngs)

        def __call__(self, ids: Any) -> Any:
            x = self.embed(ids)
            for block in self.layers:
                x = block(x)
            return self.head(self.norm(x))

    return Decoder


def nnx_moe(data_parallel: bool = False, layers: int = 2, abstract: bool = False) -> Model:
    """A decoder of `layers` blocks, each GQA (4 query heads sharing 2 key/value
    heads) and an 8-expert top-2 MoE, on a `data=4, model=2` mesh
    (`abstract`: its parameters are `jax.ShapeDtypeStruct`s, nothing initialised)."""
    nnx = _require("flax.nnx", "flax")
    import jax
    import jax.numpy as jnp
    from jax import lax

    d, experts, hidden, top, capacity = _D, 8, 128, 2, 8
    init = nnx.initializers.lecun_normal()

    Attention = _gqa_attention(nnx, init)

    class MoE(nnx.Module):
        def __init__(self, rngs: Any):
            self.router = nnx.Linear(d, experts, use_bias=False, kernel_init=init, rngs=rngs)
            self.w_in = nnx.Param(init(rngs.params(), (experts, d, hidden)))
            self.w_out = nnx.Param(init(rngs.params(), (experts, hidden, d)))

        def __call__(self, x: Any) -> Any:
            b, t, _ = x.shape
            probs = jax.nn.softmax(self.router(x), axis=-1)  # (b, t, experts)
            weight, chosen = lax.top_k(probs, top)  # (b, t, top)
            mask = jax.nn.one_hot(chosen, experts)  # (b, t, top, experts)
            # each row of the batch is a group: its tokens fill each expert's buffer in order
            flat = mask.reshape(b, t * top, experts)
            slot = (jnp.cumsum(flat, axis=1) - 1.0).reshape(b, t, top, experts)
            mask = mask * (slot < capacity)
            where = jax.nn.one_hot(jnp.sum(slot * mask, axis=2).astype(jnp.int32), capacity)
            dispatch = jnp.sum(mask, axis=2)[..., None] * where  # (b, t, experts, capacity)
            combine = jnp.sum(mask * weight[..., None], axis=2)[..., None] * where
            routed = jnp.einsum("btec,btd->becd", dispatch, x)
            h = jax.nn.gelu(jnp.einsum("becd,edf->becf", routed, self.w_in[...]))
            out = jnp.einsum("becf,efd->becd", h, self.w_out[...])
            return jnp.einsum("btec,becd->btd", combine, out)

    Block = _moe_block(nnx, Attention, MoE)

    class Decoder(nnx.Module):
        def __init__(self, rngs: Any):
            self.embed = nnx.Embed(VOCAB, d, rngs=rngs)
            self.blocks = nnx.List([Block(rngs) for _ in range(layers)])
            self.norm = nnx.RMSNorm(d, rngs=rngs)

        def __call__(self, ids: Any) -> Any:
            x = self.embed(ids)
            for block in self.blocks:
                x = block(x)
            return self.embed.attend(self.norm(x))

    made = nnx.eval_shape(lambda: Decoder(nnx.Rngs(0))) if abstract else Decoder(nnx.Rngs(0))
    params, step = _nnx_sgd(nnx, made)

    seq = tokens(2)
    batch = {"tokens": seq[:, :-1], "targets": seq[:, 1:]}
    model = Model(
        "nnx gqa+moe",
        step,
        params,
        batch,
        RULES / "nnx_moe.shard",
        (4, 2),
        ("data", "model"),
        _version("flax"),
    )
    return _data_parallel(model, data_parallel)


def nnx_gather_moe(data_parallel: bool = False, layers: int = 2, grouped: bool = False) -> Model:
    """A decoder of `layers` blocks, each GQA (4 query heads sharing 2 key/value
    heads) and an 8-expert top-2 MoE whose dispatch gathers the tokens into the
    experts' buffers (`x[token_index]`) and whose combine scatter-adds them back
    (`.at[token_index].add`), on a `fsdp=4, model=2` mesh: the gradient of the
    dispatch (of the embedding lookup too) is a scatter-add into zeros. The
    tokens of the whole batch share the buffers (one group of 512 tokens), or
    with `grouped`, each sequence has buffers of its own (GShard's groups), the
    gathers and scatters batched over the groups (`jax.vmap`)."""
    nnx = _require("flax.nnx", "flax")
    import jax
    import jax.numpy as jnp
    from jax import lax

    d, experts, hidden, top = _D, 8, 128, 2
    init = nnx.initializers.lecun_normal()

    Attention = _gqa_attention(nnx, init)

    class MoE(nnx.Module):
        def __init__(self, rngs: Any):
            self.router = nnx.Linear(d, experts, use_bias=False, kernel_init=init, rngs=rngs)
            self.w_in = nnx.Param(init(rngs.params(), (experts, d, hidden)))
            self.w_out = nnx.Param(init(rngs.params(), (experts, hidden, d)))

        def __call__(self, x: Any) -> Any:
            if not grouped:
                b, t, _ = x.shape
                return self.route(x.reshape(1, b * t, d)).reshape(b, t, d)
            return self.route(x)

        def route(self, x: Any) -> Any:
            """Each group (a row of `x`) routed to the experts' buffers of its own."""
            g, n, _ = x.shape
            cap = n * top // experts  # capacity factor 1
            probs = jax.nn.softmax(self.router(x), axis=-1)  # (g, n, experts)
            weight, chosen = lax.top_k(probs, top)  # (g, n, top)
            # each expert's buffer fills in token order; a token past its capacity is dropped
            expert = chosen.reshape(g, n * top)
            onehot = jax.nn.one_hot(expert, experts, dtype=jnp.int32)
            slot = jnp.sum((jnp.cumsum(onehot, axis=1) - 1) * onehot, axis=-1)  # (g, n * top)
            token = jnp.repeat(jnp.arange(n, dtype=jnp.int32), top)

            def buffers(e: Any, s: Any, w: Any) -> tuple[Any, Any]:
                # index[e, c]: the token in slot c of expert e (n: an empty slot), and its gate
                index = jnp.full((experts, cap), n, jnp.int32).at[e, s].set(token, mode="drop")
                return index, jnp.zeros((experts, cap), w.dtype).at[e, s].set(w, mode="drop")

            token_index, gate = jax.vmap(buffers)(expert, slot, weight.reshape(g, n * top))
            with jax.named_scope("dispatch"):  # (g, experts, capacity, d)
                routed = jax.vmap(lambda xs, i: xs.at[i].get(mode="fill", fill_value=0))(x, token_index)
            with jax.named_scope("experts"):
                h = jax.nn.gelu(jnp.einsum("gecd,edf->gecf", routed, self.w_in[...]))
                out = jnp.einsum("gecf,efd->gecd", h, self.w_out[...]) * gate[..., None]
            with jax.named_scope("combine"):
                return jax.vmap(lambda o, i: jnp.zeros((n, d), o.dtype).at[i].add(o, mode="drop"))(
                    out, token_index
                )

    Block = _moe_block(nnx, Attention, MoE)

    class Decoder(nnx.Module):
        def __init__(self, rngs: Any):
            self.embed = nnx.Embed(VOCAB, d, rngs=rngs)
            self.blocks = nnx.List([Block(rngs) for _ in range(layers)])
            self.norm = nnx.RMSNorm(d, rngs=rngs)
            self.head = nnx.Linear(d, VOCAB, use_bias=False, kernel_init=init, rngs=rngs)

        def __call__(self, ids: Any) -> Any:
            x = self.embed(ids)
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    params, step = _nnx_sgd(nnx, Decoder(nnx.Rngs(0)))

    seq = tokens(4)
    batch = {"tokens": seq[:, :-1], "targets": seq[:, 1:]}
    model = Model(
        "nnx gather moe, grouped" if grouped else "nnx gather moe",
        step,
        params,
        batch,
        RULES / ("nnx_gather_moe_grouped.shard" if grouped else "nnx_gather_moe.shard"),
        (4, 2),
        ("fsdp", "model"),
        _version("flax"),
    )
    return _data_parallel(model, data_parallel)


# --- keras-hub -------------------------------------------------------------------------------------------


def keras_gemma(data_parallel: bool = False, layers: int = 2) -> Model:
    """keras-hub's `GemmaBackbone` (4 query heads, 2 key/value heads), its logits
    from the tied embedding, trained through `stateless_call`."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    keras = _require("keras", "keras")
    if keras.backend.backend() != "jax":
        raise Unavailable(
            f"keras runs on the {keras.backend.backend()} backend here (KERAS_BACKEND=jax needed)"
        )
    keras_hub = _require("keras_hub", "keras-hub")
    import jax.numpy as jnp

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=VOCAB,
        num_layers=layers,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=64,
        intermediate_dim=256,
        head_dim=16,
        dropout=0.0,
    )
    if backbone.non_trainable_variables:
        raise Unavailable("this GemmaBackbone has non-trainable variables; the step assumes none")
    names = [v.path for v in backbone.trainable_variables]
    params = {v.path: np.asarray(v.value) for v in backbone.trainable_variables}

    def loss_fn(p: dict, batch: dict) -> Any:
        inputs = {"token_ids": batch["token_ids"], "padding_mask": batch["padding_mask"]}
        hidden, _ = backbone.stateless_call([p[n] for n in names], [], inputs)
        return cross_entropy(hidden @ jnp.transpose(p["token_embedding/embeddings"]), batch["targets"])

    seq = tokens(3)
    batch = {
        "token_ids": seq[:, :-1],
        "padding_mask": np.ones((BATCH, SEQ), np.int32),
        "targets": seq[:, 1:],
    }
    model = Model(
        "keras-hub Gemma",
        sgd(loss_fn),
        params,
        batch,
        RULES / "keras_gemma.shard",
        (4, 2),
        ("fsdp", "model"),
        _version("keras-hub"),
    )
    return _data_parallel(model, data_parallel)


# --- recurrentgemma --------------------------------------------------------------------------------------


def griffin(attention: bool = True) -> Model:
    """recurrentgemma's Griffin: a recurrent (RG-LRU) block and (with `attention`)
    a local-attention block, with the library's default gradient checkpointing."""
    rg = _require("recurrentgemma.jax", "recurrentgemma")
    import jax
    import jax.numpy as jnp

    blocks = (rg.TemporalBlockType.RECURRENT,) + ((rg.TemporalBlockType.ATTENTION,) if attention else ())
    config = rg.GriffinConfig(
        vocab_size=VOCAB,
        width=64,
        mlp_expanded_width=128,
        num_heads=4,
        block_types=blocks,
        embeddings_scale_by_sqrt_dim=True,
        attention_window_size=16,
        logits_soft_cap=30.0,
        lru_width=64,
        scan_type=rg.ScanType.LINEAR_NATIVE,
    )
    network = rg.Griffin(config)
    seq = tokens(4)
    positions = np.broadcast_to(np.arange(SEQ, dtype=np.int32), (BATCH, SEQ)).copy()
    batch = {"tokens": seq[:, :-1], "segment_pos": positions, "targets": seq[:, 1:]}
    variables = jax.jit(network.init)(jax.random.key(0), jnp.asarray(batch["tokens"]), jnp.asarray(positions))
    params = jax.device_get(variables["params"])

    def loss_fn(p: Any, batch: dict) -> Any:
        logits, _ = network.apply({"params": p}, batch["tokens"], batch["segment_pos"], return_cache=False)
        return cross_entropy(logits, batch["targets"])

    return Model(
        "recurrentgemma Griffin",
        sgd(loss_fn),
        params,
        batch,
        RULES / "griffin.shard",
        (4, 2),
        ("fsdp", "model"),
        _version("recurrentgemma"),
    )


# --- penzai ----------------------------------------------------------------------------------------------


def penzai_llamalike() -> Model:
    """penzai's llamalike transformer (2 key/value head groups of 2 query heads,
    SwiGLU), its parameters a dict from penzai label to named array."""
    _require("penzai", "penzai")
    import jax
    from penzai import pz
    from penzai.models.transformer.variants import llamalike_common

    config = llamalike_common.LlamalikeTransformerConfig(
        num_kv_heads=2,
        query_head_multiplier=2,
        embedding_dim=64,
        projection_dim=16,
        mlp_hidden_dim=128,
        num_decoder_blocks=2,
        vocab_size=VOCAB,
        mlp_variant="swiglu",
        tie_embedder_and_logits=False,
    )
    network = llamalike_common.build_llamalike_transformer(config, init_base_rng=jax.random.key(0))
    unbound, frozen = pz.unbind_params(network, freeze=True)
    params = jax.device_get({p.label: p.value for p in frozen})

    def loss_fn(p: dict, batch: dict) -> Any:
        bound = pz.bind_variables(unbound, [pz.ParameterValue(label=k, value=v) for k, v in p.items()])
        logits = bound(pz.nx.wrap(batch["tokens"]).tag("batch", "seq"))
        return cross_entropy(logits.unwrap("batch", "seq", "vocabulary"), batch["targets"])

    seq = tokens(5)
    batch = {"tokens": seq[:, :-1], "targets": seq[:, 1:]}
    return Model(
        "penzai llamalike",
        sgd(loss_fn),
        params,
        batch,
        RULES / "penzai_llamalike.shard",
        (4, 2),
        ("fsdp", "model"),
        _version("penzai"),
    )


# --- MaxText ---------------------------------------------------------------------------------------------


def maxtext_llama(layers: int = 2, iota_embed: bool = False) -> Model:
    """MaxText's llama2 decoder (Flax Linen, scanned layers, full remat: MaxText's
    defaults) built from MaxText's own `base.yml`: 4 heads of 16, MLP 128,
    vocabulary 256, a batch of 8 sequences of 16 tokens, on a `fsdp=4, tensor=2`
    mesh named as MaxText names its axes, with MaxText's logical axis rules.

    The step for a mesh with Explicit axes builds the model with
    `shard_mode: explicit`: MaxText's layers then call `jax.sharding.reshard` on
    their activations and give their contractions `out_sharding=` themselves.
    On a mesh with Auto axes the model has `shard_mode: auto`
    (`with_sharding_constraint`); on one device, the same on a one-device mesh.

    `iota_embed` sets MaxText's `use_iota_embed`: the token embedding is a one-hot
    matmul with an `out_sharding` rather than MaxText's default gather,
    `embedding.at[tokens].get(out_sharding=...)` (which runs under `auto_axes`,
    its gradient too).

    Installing MaxText (tested with maxtext 0.2.3, JAX 0.10.2, flax 0.12.8, Python
    3.11): it declares Python 3.12+ and, in its extras, a whole training stack;
    0.2.4 and later use Python 3.12 syntax, and 0.2.5 wants JAX 0.11.1+. After
    `pip install -e ".[test,models]"`:

        pip install --no-deps --ignore-requires-python maxtext==0.2.3
        pip install omegaconf qwix pathwaysutils aqtp tokamax==0.0.12 grain pillow transformers tiktoken

    (constrained to the installed jax, jaxlib, flax, numpy and optax; no TensorFlow).
    """
    try:
        pyconfig = importlib.import_module("maxtext.configs.pyconfig")
        creation = importlib.import_module("maxtext.utils.model_creation_utils")
        mt_sharding = importlib.import_module("maxtext.utils.sharding")
        max_utils = importlib.import_module("maxtext.utils.max_utils")
    except (ImportError, SyntaxError) as err:  # SyntaxError: a release written for Python 3.12+
        raise Unavailable(f"maxtext cannot be imported ({type(err).__name__}: {err})") from None
    import jax
    from flax import linen as nn
    from jax.sharding import AbstractMesh, AxisType, Mesh

    shape, axes = (4, 2), ("fsdp", "tensor")
    batch_size, seq = 8, 16
    overrides = {
        "run_name": "shardrules",
        "enable_checkpointing": False,
        "log_config": False,
        "jax_cache_dir": "",  # MaxText turns JAX's persistent compilation cache on otherwise
        "hardware": "cpu",
        "skip_jax_distributed_system": True,
        "dataset_type": "synthetic",
        "decoder_block": "llama2",
        "base_num_decoder_layers": layers,
        "base_emb_dim": 64,
        "base_num_query_heads": 4,
        "base_num_kv_heads": 4,
        "head_dim": 16,
        "base_mlp_dim": 128,
        "vocab_size": VOCAB,
        "max_target_length": seq,
        "max_prefill_predict_length": 4,
        "per_device_batch_size": 1.0,
        "attention": "dot_product",
        "dtype": "float32",
        "weight_dtype": "float32",
        "matmul_precision": "highest",
        "enable_dropout": False,
        "use_iota_embed": iota_embed,
        "mesh_axes": list(axes),
        "data_sharding": [list(axes)],
        "ici_fsdp_parallelism": shape[0],
        "ici_tensor_parallelism": shape[1],
    }
    base = str(Path(pyconfig.__file__).with_name("base.yml"))
    configs: dict[str, Any] = {}

    def config(shard_mode: str) -> Any:
        if shard_mode not in configs:
            configs[shard_mode] = pyconfig.initialize(["maxtext", base], shard_mode=shard_mode, **overrides)
        return configs[shard_mode]

    def one_device() -> Any:
        devices = np.asarray(jax.devices()[:1]).reshape((1,) * len(axes))
        return Mesh(devices, axes, axis_types=(AxisType.Auto,) * len(axes))

    seq_ids = tokens(6, batch_size, seq)
    batch = {
        "inputs": seq_ids[:, :-1],
        "inputs_position": np.broadcast_to(np.arange(seq, dtype=np.int32), (batch_size, seq)).copy(),
        "inputs_segmentation": np.ones((batch_size, seq), np.int32),
        "targets": seq_ids[:, 1:],
    }

    def network(mesh: Any) -> tuple[Any, Any]:
        explicit = all(t == AxisType.Explicit for t in mesh.axis_types)
        cfg = config("explicit" if explicit else "auto")
        return creation.from_config(cfg, mesh=mesh), cfg

    def bind(mesh: Any) -> Callable[[Any, Any], tuple[Any, Any]]:
        model, cfg = network(one_device() if mesh is None else mesh)

        def loss_fn(p: Any, batch: dict) -> Any:
            # MaxText maps its layers' logical axis names to mesh axes under these rules
            with nn.logical_axis_rules(cfg.logical_axis_rules):
                logits = model.apply(
                    {"params": p},
                    batch["inputs"],
                    batch["inputs_position"],
                    batch["inputs_segmentation"],
                    enable_dropout=False,
                )
            # MaxText's own loss: one-hot targets (a gather from logits it has laid out would
            # need an `out_sharding` on Explicit axes), its custom-gradient cross-entropy
            targets = jax.nn.one_hot(batch["targets"], cfg.vocab_size)
            xent, _ = max_utils.cross_entropy_with_logits(logits, targets, z_loss=0.0)
            return xent.mean()

        return sgd(loss_fn)

    model, cfg = network(one_device())
    with nn.logical_axis_rules(cfg.logical_axis_rules):
        variables = jax.jit(
            lambda key: model.init(
                {"params": key, "dropout": key},
                batch["inputs"],
                batch["inputs_position"],
                batch["inputs_segmentation"],
                enable_dropout=False,
            )
        )(jax.random.key(0))
    boxed = variables["params"]
    params = jax.device_get(nn.meta.unbox(boxed))
    native = mt_sharding.logical_to_mesh(
        nn.get_partition_spec(boxed), AbstractMesh(shape, axes), rules=cfg.logical_axis_rules
    )
    explicit_mesh = jax.make_mesh(shape, axes, axis_types=(AxisType.Explicit,) * len(axes))
    return Model(
        "MaxText llama2",
        bind(explicit_mesh),
        params,
        batch,
        RULES / "maxtext_llama.shard",
        shape,
        axes,
        _version("maxtext"),
        bind=bind,
        native_specs=native,
        boxed=jax.device_get(boxed),
    )


# --- a 1.1B decoder (TinyLlama's sizes), shapes only ------------------------------------------------------


def nnx_decoder_1b(layers: int = 22, batch: int = 32, seq: int = 512) -> Model:
    """A Flax NNX decoder of TinyLlama-1.1B's sizes (vocabulary 32,000, width
    2,048, 32 query heads of 64 sharing 4 key/value heads, a SwiGLU MLP of
    5,632, `layers` layers, RMSNorm, an untied output head), float32, on a
    `fsdp=32, model=8` mesh (256 devices). Nothing is allocated: the
    parameters and the batch are `jax.ShapeDtypeStruct`s (`nnx.eval_shape`),
    for `step.cost`. The embedding is looked up by a gather (`nnx.Embed`),
    so its gradient is a scatter-add of `(batch, seq, 2048)` into `(32000,
    2048)`."""
    nnx = _require("flax.nnx", "flax")
    import jax
    import jax.numpy as jnp

    vocab, d, heads, kv_heads, head_dim, ffn = 32000, 2048, 32, 4, 64, 5632

    class Attention(nnx.Module):
        def __init__(self, rngs: Any):
            self.q = nnx.Linear(d, heads * head_dim, use_bias=False, rngs=rngs)
            self.k = nnx.Linear(d, kv_heads * head_dim, use_bias=False, rngs=rngs)
            self.v = nnx.Linear(d, kv_heads * head_dim, use_bias=False, rngs=rngs)
            self.o = nnx.Linear(heads * head_dim, d, use_bias=False, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            b, t, _ = x.shape
            groups = heads // kv_heads  # key/value heads repeated for their query heads, as transformers does
            q = self.q(x).reshape(b, t, heads, head_dim)
            k = jnp.repeat(self.k(x).reshape(b, t, kv_heads, head_dim), groups, axis=2)
            v = jnp.repeat(self.v(x).reshape(b, t, kv_heads, head_dim), groups, axis=2)
            scores = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(head_dim)
            scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
            out = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, axis=-1), v)
            return self.o(out.reshape(b, t, heads * head_dim))

    Decoder = _swiglu_decoder(
        nnx, Attention, d=d, ffn=ffn, vocab=vocab, layers=layers, init=nnx.initializers.lecun_normal()
    )

    abstract = nnx.eval_shape(lambda: Decoder(nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)

    def step(state: Any, batch: dict) -> tuple[Any, Any]:
        model = nnx.merge(graphdef, state)

        def loss_fn(model: Any) -> Any:
            return cross_entropy(model(batch["tokens"]), batch["targets"])

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, state, grads), loss

    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return Model(
        f"nnx 1.1B decoder ({layers} layers)",
        step,
        params,
        {"tokens": ids, "targets": ids},  # type: ignore[dict-item]
        RULES / "decoder_1b.shard",
        (32, 8),
        ("fsdp", "model"),
        _version("flax"),
    )


# --- a decoder quantized by qwix ----------------------------------------------------------------------------


def nnx_qwix_decoder(
    weight_qtype: str = "int8", tile_size: int | None = None, quantize: bool = True
) -> Model:
    """A two-block Flax NNX decoder (GQA attention, a SwiGLU MLP, RMSNorm, an
    untied head) on a `fsdp=4, model=2` mesh, its linear layers' weights
    quantized by qwix's post-training quantization (`weight_qtype`; `tile_size`:
    scales per block of that many input rows, else one per output column),
    laid out by the float model's rule file `rules/nnx_decoder.shard`. Each
    quantized kernel is `kernel/array/qvalue` (the kernel's shape) and
    `kernel/array/scale`. `quantize=False`: the same decoder, float.

    The step trains what stays float (the embedding, the norms and the
    quantization scales; the integer values get no gradient) one SGD step on
    the next-token cross-entropy."""
    nnx = _require("flax.nnx", "flax")
    qwix = _require("qwix", "qwix") if quantize else None
    import jax
    import jax.numpy as jnp

    d, ffn, init = _D, 128, nnx.initializers.lecun_normal()
    Attention = _gqa_attention(nnx, init)

    Decoder = _swiglu_decoder(nnx, Attention, d=d, ffn=ffn, vocab=VOCAB, layers=2, init=init)

    seq = tokens(3)
    batch = {"tokens": seq[:, :-1], "targets": seq[:, 1:]}
    model = Decoder(nnx.Rngs(0))
    name, library = "nnx decoder", _version("flax")
    if qwix is not None:
        rules = [qwix.QuantizationRule(module_path=".*", weight_qtype=weight_qtype, tile_size=tile_size)]
        model = qwix.quantize_model(model, qwix.PtqProvider(rules), batch["tokens"])
        name = f"nnx decoder, qwix {weight_qtype}" + (f" tile {tile_size}" if tile_size else "")
        library = f"{library}, {_version('qwix')}"
    graphdef, state = nnx.split(model)

    def step(state: Any, batch: dict) -> tuple[Any, Any]:
        def loss_fn(state: Any) -> Any:
            return cross_entropy(nnx.merge(graphdef, state)(batch["tokens"]), batch["targets"])

        loss, grads = jax.value_and_grad(loss_fn, allow_int=True)(state)

        def update(p: Any, g: Any) -> Any:
            return p - LEARNING_RATE * g if jnp.issubdtype(p.dtype, jnp.floating) else p

        return jax.tree.map(update, state, grads), loss

    return Model(
        name,
        step,
        jax.device_get(state),
        batch,
        RULES / "nnx_decoder.shard",
        (4, 2),
        ("fsdp", "model"),
        library,
    )
