"""Shape-only trees the size of real models, and rule files for them (no data)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _s(*shape: int, dtype=jnp.bfloat16) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def deepseek_v3(layers: int = 61, experts: int = 256, adam: bool = True) -> dict:
    """A DeepSeek-V3-shaped MoE: per-expert gate/up/down weights; with Adam `mu`/`nu`."""
    d, moe_ff, dense_ff, vocab = 7168, 2048, 18432, 129280
    params: dict = {
        "embed": {"embedding": _s(vocab, d)},
        "final_norm": {"scale": _s(d)},
        "lm_head": {"kernel": _s(d, vocab)},
    }
    blocks = {}
    for i in range(layers):
        block: dict = {
            "attn": {
                "q_a_proj": {"kernel": _s(d, 1536)},
                "q_b_proj": {"kernel": _s(1536, 24576)},
                "kv_a_proj": {"kernel": _s(d, 576)},
                "kv_b_proj": {"kernel": _s(512, 32768)},
                "o_proj": {"kernel": _s(16384, d)},
                "q_norm": {"scale": _s(1536)},
                "kv_norm": {"scale": _s(512)},
            },
            "attn_norm": {"scale": _s(d)},
            "mlp_norm": {"scale": _s(d)},
        }
        if i < 3:
            block["mlp"] = {
                n: {"kernel": _s(d, dense_ff) if n != "down_proj" else _s(dense_ff, d)}
                for n in ("gate_proj", "up_proj", "down_proj")
            }
        else:
            block["moe"] = {
                "router": {"kernel": _s(d, experts)},
                "experts": {
                    str(e): {
                        "gate_proj": {"kernel": _s(d, moe_ff)},
                        "up_proj": {"kernel": _s(d, moe_ff)},
                        "down_proj": {"kernel": _s(moe_ff, d)},
                    }
                    for e in range(experts)
                },
                "shared": {
                    n: {"kernel": _s(d, moe_ff) if n != "down_proj" else _s(moe_ff, d)}
                    for n in ("gate_proj", "up_proj", "down_proj")
                },
            }
        blocks[f"layers_{i}"] = block
    params["blocks"] = blocks
    if not adam:
        return params
    f32 = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), params)
    return {"params": params, "opt_state": {"count": _s(dtype=jnp.int32), "mu": f32, "nu": f32}}


def llama3_70b(adam: bool = False) -> dict:
    """A Llama-3-70B-shaped tree (80 layers, GQA, bf16)."""
    d, ff, vocab, kv = 8192, 28672, 128256, 1024
    layers = {
        f"layers_{i}": {
            "attn": {
                "q_proj": {"kernel": _s(d, d)},
                "k_proj": {"kernel": _s(d, kv)},
                "v_proj": {"kernel": _s(d, kv)},
                "o_proj": {"kernel": _s(d, d)},
            },
            "mlp": {
                "gate_proj": {"kernel": _s(d, ff)},
                "up_proj": {"kernel": _s(d, ff)},
                "down_proj": {"kernel": _s(ff, d)},
            },
            "attn_norm": {"scale": _s(d)},
            "mlp_norm": {"scale": _s(d)},
        }
        for i in range(80)
    }
    params = {
        "embed": {"embedding": _s(vocab, d)},
        "blocks": layers,
        "final_norm": {"scale": _s(d)},
        "lm_head": {"kernel": _s(d, vocab)},
    }
    if not adam:
        return params
    f32 = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), params)
    return {"params": params, "opt_state": {"count": _s(dtype=jnp.int32), "mu": f32, "nu": f32}}


# Real rules for both trees, placed after `filler` rules for parts these trees
# lack (vision towers, adapters...), as in files shared between model variants.
REAL_RULES = [
    (r"embed/embedding$", "(model, fsdp)"),
    (r"lm_head/kernel$", "(fsdp, model)"),
    (r"attn/(q|k|v|q_a|q_b|kv_a|kv_b)_proj/kernel$", "(fsdp, model)"),
    (r"attn/o_proj/kernel$", "(model, fsdp)"),
    (r"experts/\d+/(gate|up)_proj/kernel$", "(fsdp, model)"),
    (r"experts/\d+/down_proj/kernel$", "(model, fsdp)"),
    (r"(mlp|shared)/(gate|up)_proj/kernel$", "(fsdp, model)"),
    (r"(mlp|shared)/down_proj/kernel$", "(model, fsdp)"),
    (r"router/kernel$", "(fsdp, _)"),
    (r"(norm|_norm)/scale$", "replicated"),
    (r"count$", "replicated"),
]


def rule_pairs(n_rules: int = 64) -> list[tuple[str, str]]:
    """`n_rules` (regex, spec) pairs: fillers first, the real rules last."""
    fillers = [
        (rf"vision_tower/block_{i}/(attn|mlp)/w{i % 7}$", "(fsdp, model)")
        for i in range(n_rules - len(REAL_RULES))
    ]
    return fillers + REAL_RULES


def rule_file(n_rules: int = 64) -> str:
    """The same rules as a .shard file."""
    lines = ["mesh data, fsdp, model", "", "rules params:"]
    lines += [f'  "{pattern}" -> {spec}' for pattern, spec in rule_pairs(n_rules)]
    return "\n".join(lines) + "\n"
