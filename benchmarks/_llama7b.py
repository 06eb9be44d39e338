"""A 7B-like decoder, shapes only: Llama-2-7B's sizes, its layers stacked and
run with `jax.lax.scan`, each layer rematerialised (`jax.checkpoint`), an Adam
step. Nothing is allocated: the parameters, the optimizer state and the batch
are `jax.ShapeDtypeStruct`s, for `step.cost` and `shardrules explain/lint --step`.

- vocabulary 32,000, model width 4,096, 32 heads of 128, a SwiGLU MLP of
  11,008, 32 layers, RMSNorm, rotary position embeddings, causal attention,
  untied embedding and output head: 6.74e9 parameters, as Llama-2-7B;
- parameters in bf16; Adam's moments in float32 (a step: the moments and
  parameters updated, the state donated, as trainers do);
- the layer body is `jax.checkpoint`ed with the default policy (nothing saved
  but the layer's input), so the backward pass recomputes each layer's
  forward.

From the repository root:
`shardrules explain benchmarks/rules/llama7b.shard --step benchmarks._llama7b:check_step --cost --target v5p:8x8x4`.
`benchmarks/target_cost.py` costs a global batch of `BATCH_PER_FSDP` sequences of
`SEQ` tokens per slice of the mesh's `fsdp` axis (the batch is split over `fsdp`
alone): 256 x 2,048 on `fsdp=64, model=4`; `check_step` (the command line) half
that, `CHECK_BATCH_PER_FSDP`, so that the one-chip ideal it also compiles can be
planned.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

VOCAB, D, HEADS, HEAD_DIM, FF, LAYERS = 32000, 4096, 32, 128, 11008, 32
SEQ, BATCH_PER_FSDP = 2048, 4
# `check_step`'s batch per `fsdp` slice: the command line always compiles the one-chip ideal too, and
# at 4 per slice (256 sequences on one v5p chip) the TPU compiler cannot plan it (one 128 GiB value).
CHECK_BATCH_PER_FSDP = 2
LEARNING_RATE, B1, B2, EPS = 3e-4, 0.9, 0.95, 1e-8


def rms_norm(x: Any, scale: Any) -> Any:
    x32 = x.astype(jnp.float32)
    out = x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6)
    return (out * scale.astype(jnp.float32)).astype(x.dtype)


def rotary(x: Any) -> Any:
    """Rotary position embedding of `(batch, seq, heads, head_dim)`."""
    t, half = x.shape[1], x.shape[-1] // 2
    freq = 1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
    angle = jnp.arange(t, dtype=jnp.float32)[:, None] * freq[None, :]
    cos, sin = jnp.cos(angle)[None, :, None, :], jnp.sin(angle)[None, :, None, :]
    a, b = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([a * cos - b * sin, a * sin + b * cos], -1).astype(x.dtype)


def attention(p: dict, x: Any) -> Any:
    b, t, _ = x.shape
    heads = {}
    for name in ("q", "k", "v"):
        with jax.named_scope(name):
            heads[name] = x @ p[name]["kernel"]
    q, k, v = (heads[n].reshape(b, t, HEADS, HEAD_DIM) for n in ("q", "k", "v"))
    q, k = rotary(q), rotary(k)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / math.sqrt(HEAD_DIM)
    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
    probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, t, HEADS * HEAD_DIM)
    return out @ p["o"]["kernel"]


def mlp(p: dict, x: Any) -> Any:
    with jax.named_scope("gate"):
        g = x @ p["gate"]["kernel"]
    with jax.named_scope("up"):
        u = x @ p["up"]["kernel"]
    return (jax.nn.silu(g) * u) @ p["down"]["kernel"]


def layer(x: Any, p: dict) -> tuple[Any, None]:
    """One decoder layer (the scan's body): `p` is one layer's slice of the stack."""
    with jax.named_scope("attn"):
        x = x + attention(p["attn"], rms_norm(x, p["norm1"]["scale"]))
    with jax.named_scope("mlp"):
        x = x + mlp(p["mlp"], rms_norm(x, p["norm2"]["scale"]))
    return x, None


def forward(params: dict, tokens: Any) -> Any:
    x = params["embed"]["embedding"][tokens]
    with jax.named_scope("layers"):
        x, _ = jax.lax.scan(jax.checkpoint(layer), x, params["layers"])
    return rms_norm(x, params["norm"]["scale"]) @ params["head"]["kernel"]


def loss_fn(params: dict, batch: dict) -> Any:
    logits = forward(params, batch["tokens"]).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1).mean()


def train_step(state: dict, batch: dict) -> tuple[dict, Any]:
    """One Adam step (bias-corrected, float32 moments) on `state = {"params", "mu", "nu", "count"}`."""
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch)
    count = state["count"] + 1
    mu = jax.tree.map(lambda m, g: B1 * m + (1 - B1) * g.astype(jnp.float32), state["mu"], grads)
    nu = jax.tree.map(lambda n, g: B2 * n + (1 - B2) * jnp.square(g.astype(jnp.float32)), state["nu"], grads)
    c1, c2 = 1 - B1 ** count.astype(jnp.float32), 1 - B2 ** count.astype(jnp.float32)

    def update(p: Any, m: Any, n: Any) -> Any:
        step = LEARNING_RATE * (m / c1) / (jnp.sqrt(n / c2) + EPS)
        return (p.astype(jnp.float32) - step).astype(p.dtype)

    params = jax.tree.map(update, state["params"], mu, nu)
    return {"params": params, "mu": mu, "nu": nu, "count": count}, loss


def param_shapes(layers: int = LAYERS, dtype: Any = jnp.bfloat16) -> dict:
    def s(*shape: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype)

    L = layers
    return {
        "embed": {"embedding": s(VOCAB, D)},
        "layers": {
            "norm1": {"scale": s(L, D)},
            "attn": {
                "q": {"kernel": s(L, D, HEADS * HEAD_DIM)},
                "k": {"kernel": s(L, D, HEADS * HEAD_DIM)},
                "v": {"kernel": s(L, D, HEADS * HEAD_DIM)},
                "o": {"kernel": s(L, HEADS * HEAD_DIM, D)},
            },
            "norm2": {"scale": s(L, D)},
            "mlp": {
                "gate": {"kernel": s(L, D, FF)},
                "up": {"kernel": s(L, D, FF)},
                "down": {"kernel": s(L, FF, D)},
            },
        },
        "norm": {"scale": s(D)},
        "head": {"kernel": s(D, VOCAB)},
    }


def shapes(batch: int, seq: int = SEQ, layers: int = LAYERS) -> tuple[dict, dict]:
    """The train state's and a batch's shapes: `batch` sequences of `seq` tokens."""
    params = param_shapes(layers)
    f32 = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, jnp.float32), params)
    state = {"params": params, "mu": f32, "nu": f32, "count": jax.ShapeDtypeStruct((), jnp.int32)}
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return state, {"tokens": tokens, "targets": tokens}


def parameter_count(layers: int = LAYERS) -> int:
    return sum(math.prod(a.shape) for a in jax.tree.leaves(param_shapes(layers)))


def make_step(rules: Any, mesh: Any) -> Any:
    import shardrules as sr

    return sr.jit(
        train_step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None), donate=(0,)
    )


def check_step(rules: Any, mesh: Any) -> tuple[Any, tuple[dict, dict]]:
    """The step and its arguments' shapes, the batch `CHECK_BATCH_PER_FSDP` per `fsdp` slice
    (for `shardrules explain/lint --step benchmarks._llama7b:check_step`)."""
    return make_step(rules, mesh), shapes(CHECK_BATCH_PER_FSDP * dict(mesh.shape).get("fsdp", 1))
