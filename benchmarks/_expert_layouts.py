"""Shape trees of public model configs and the layouts experts give them,
for `benchmarks/suggest.py` and `tests/test_suggest.py`.

The trees hold `jax.ShapeDtypeStruct`s (no weights), named as each project
names its parameters, with the sizes of the public configs:

- transformers checkpoints (safetensors names, `(out, in)` weights):
  Llama-2-7B, Mixtral-8x7B (experts one array each, `block_sparse_moe`),
  Qwen3-30B-A3B (128 experts one array each, `q_norm`/`k_norm`);
- MaxText, `scan_layers: true` (the layer axis at dimension 1): a llama2-7b
  and a mixtral-8x7b decoder, each parameter with its logical axis names;
- keras-hub: a `GemmaBackbone` with Gemma-7B's sizes;
- a Kimi-K2-sized MoE checkpoint header (61 layers, 384 experts, about
  1.03 trillion parameters) with DeepSeek-V3's names, for timing.

The expert layouts are each project's own, from facts in its sources:

- transformers: the models' `base_model_tp_plan` (transformers' configuration
  files; for Mixtral and Qwen3-MoE, the plans of the releases whose
  checkpoints keep one array per expert, as these trees do) and the causal-LM
  head's `_tp_plan` (`lm_head: colwise_gather_output`), laid out by
  `shardrules.convert_hf`; the mesh is one tensor-parallel axis, `model`.
  These models' embeddings are untied (`tie_word_embeddings: false`), so
  `embed_tokens` is in no plan and stays whole on every device: transformers
  adds it (`embedding_rowwise`, vocab-parallel) to tied models' plans only.
- MaxText: `base.yml`'s `logical_axis_rules` (the weights' rules, in order)
  on its `mesh_axes` (axes not in the mesh compared have size 1), applied by
  Flax's `logical_to_mesh_axes` to each parameter's logical names.
- keras-hub: `GemmaBackbone.get_layout_map`'s regexes, matched as
  `keras.distribution.LayoutMap` matches them (one regex found in the path).

Layouts are compared as device → block maps (`agreement`): two specs agree
on a leaf when every device holds the same block of it, so axes of size 1
and other spellings of one layout count as the same.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

import shardrules as sr
from shardrules._planning._blocks import block_index, device_coords


def _s(*shape: int, dtype: Any = jnp.bfloat16) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


# ---------------------------------------------------------------- transformers checkpoints

LLAMA_TP_PLAN = {  # LlamaConfig.base_model_tp_plan, under `model.`; LlamaForCausalLM._tp_plan
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.gate_proj": "colwise",
    "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.down_proj": "rowwise",
    "lm_head": "colwise_gather_output",
}
MIXTRAL_TP_PLAN = {  # MixtralConfig.base_model_tp_plan with per-expert weights (transformers 4.x)
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.block_sparse_moe.gate": "colwise_rep",
    "layers.*.block_sparse_moe.experts.*.w1": "colwise",
    "layers.*.block_sparse_moe.experts.*.w2": "rowwise",
    "layers.*.block_sparse_moe.experts.*.w3": "colwise",
    "lm_head": "colwise_gather_output",
}
QWEN3_MOE_TP_PLAN = {  # Qwen3MoeConfig.base_model_tp_plan with per-expert weights (transformers 4.x)
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.experts.*.gate_proj": "colwise",
    "layers.*.mlp.experts.*.up_proj": "colwise",
    "layers.*.mlp.experts.*.down_proj": "rowwise",
    "layers.*.mlp.gate_proj": "colwise",
    "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.down_proj": "rowwise",
    "lm_head": "colwise_gather_output",
}


def _hf_common(t: dict, vocab: int, d: int) -> None:
    t["model.embed_tokens.weight"] = _s(vocab, d)
    t["model.norm.weight"] = _s(d)
    t["lm_head.weight"] = _s(vocab, d)


def _hf_attention(t: dict, p: str, d: int, heads: int, kv: int, head_dim: int) -> None:
    t[p + "self_attn.q_proj.weight"] = _s(heads * head_dim, d)
    t[p + "self_attn.k_proj.weight"] = _s(kv * head_dim, d)
    t[p + "self_attn.v_proj.weight"] = _s(kv * head_dim, d)
    t[p + "self_attn.o_proj.weight"] = _s(d, heads * head_dim)
    t[p + "input_layernorm.weight"] = _s(d)
    t[p + "post_attention_layernorm.weight"] = _s(d)


def hf_llama2_7b(layers: int = 32) -> dict:
    """Llama-2-7B (meta-llama/Llama-2-7b-hf): 4096 wide, 32 heads, MLP 11008, vocabulary 32000."""
    t: dict = {}
    _hf_common(t, 32000, 4096)
    for i in range(layers):
        p = f"model.layers.{i}."
        _hf_attention(t, p, 4096, 32, 32, 128)
        t[p + "mlp.gate_proj.weight"] = _s(11008, 4096)
        t[p + "mlp.up_proj.weight"] = _s(11008, 4096)
        t[p + "mlp.down_proj.weight"] = _s(4096, 11008)
    return t


def hf_mixtral_8x7b(layers: int = 32) -> dict:
    """Mixtral-8x7B: 4096 wide, 32 heads (8 for keys/values), 8 experts of 14336."""
    t: dict = {}
    _hf_common(t, 32000, 4096)
    for i in range(layers):
        p = f"model.layers.{i}."
        _hf_attention(t, p, 4096, 32, 8, 128)
        t[p + "block_sparse_moe.gate.weight"] = _s(8, 4096)
        for e in range(8):
            q = f"{p}block_sparse_moe.experts.{e}."
            t[q + "w1.weight"] = _s(14336, 4096)
            t[q + "w2.weight"] = _s(4096, 14336)
            t[q + "w3.weight"] = _s(14336, 4096)
    return t


def hf_qwen3_30b_a3b(layers: int = 48) -> dict:
    """Qwen3-30B-A3B: 2048 wide, 32 heads of 128 (4 for keys/values), 128 experts of 768."""
    t: dict = {}
    _hf_common(t, 151936, 2048)
    for i in range(layers):
        p = f"model.layers.{i}."
        _hf_attention(t, p, 2048, 32, 4, 128)
        t[p + "self_attn.q_norm.weight"] = _s(128)
        t[p + "self_attn.k_norm.weight"] = _s(128)
        t[p + "mlp.gate.weight"] = _s(128, 2048)
        for e in range(128):
            q = f"{p}mlp.experts.{e}."
            t[q + "gate_proj.weight"] = _s(768, 2048)
            t[q + "up_proj.weight"] = _s(768, 2048)
            t[q + "down_proj.weight"] = _s(2048, 768)
    return t


def hf_expert_specs(tree: Mapping[str, Any], plan: Mapping[str, str], axis: str, size: int) -> dict:
    """Each leaf's `PartitionSpec` under a transformers tensor-parallel plan."""
    rules = sr.loads(sr.convert_hf(dict(plan), axis=axis).text)
    found = sr.plan(dict(tree), rules, {axis: size})
    return {leaf.path: leaf.spec for leaf in found}


# ---------------------------------------------------------------- MaxText

MAXTEXT_MESH_AXES = (
    "diloco", "data", "stage", "fsdp", "fsdp_transpose", "context", "context_usp_ulysses",
    "context_autoregressive", "tensor", "tensor_sequence", "expert", "autoregressive",
)  # fmt: skip
MAXTEXT_WEIGHT_RULES = (  # base.yml's logical_axis_rules for weights, in their order
    ("vocab", ("tensor", "tensor_sequence", "autoregressive")),
    ("embed_vocab", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert")),
    ("heads", ("tensor", "tensor_sequence", "autoregressive")),
    ("q_heads", ("tensor", "tensor_sequence", "autoregressive")),
    ("kv_heads", ("tensor", "tensor_sequence", "autoregressive")),
    ("qkv", None),
    ("kv", None),
    ("kv_head_dim", None),
    ("exp", "expert"),
    ("mlp_moe", ("fsdp_transpose", "tensor", "tensor_sequence", "autoregressive")),
    ("embed_moe", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses")),
    ("embed_moe", ("fsdp", "context", "context_usp_ulysses")),
    ("mlp", ("fsdp_transpose", "tensor", "tensor_sequence", "autoregressive")),
    ("embed", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert")),
    ("embed", ("fsdp", "context", "context_usp_ulysses", "expert")),
    ("norm", ("tensor",)),
    ("layers", "stage"),
)


def maxtext_decoder(
    *, d: int, heads: int, kv: int, head_dim: int, mlp: int, layers: int, vocab: int, experts: int = 0
) -> tuple[dict, dict[str, tuple[str | None, ...]]]:
    """A MaxText decoder's parameters (scanned, the layer axis second) and their logical names."""
    named: dict[str, tuple[tuple[int, ...], tuple[str | None, ...]]] = {
        "params/token_embedder/embedding": ((vocab, d), ("vocab", "embed_vocab")),
        "params/decoder/decoder_norm/scale": ((d,), ("norm",)),
        "params/decoder/logits_dense/kernel": ((d, vocab), ("embed_vocab", "vocab")),
    }
    layer = {
        "pre_self_attention_layer_norm/scale": ((d,), ("norm",)),
        "post_self_attention_layer_norm/scale": ((d,), ("norm",)),
        "self_attention/query/kernel": ((d, heads, head_dim), ("embed", "q_heads", "kv")),
        "self_attention/key/kernel": ((d, kv, head_dim), ("embed", "kv_heads", "kv_head_dim")),
        "self_attention/value/kernel": ((d, kv, head_dim), ("embed", "kv_heads", "kv_head_dim")),
        "self_attention/out/kernel": ((heads, head_dim, d), ("heads", "kv", "embed")),
    }
    if experts:
        layer["MoeBlock_0/gate/kernel"] = ((d, experts), ("embed", None))
        layer["MoeBlock_0/wi_0"] = ((experts, d, mlp), ("exp", "embed_moe", "mlp_moe"))
        layer["MoeBlock_0/wi_1"] = ((experts, d, mlp), ("exp", "embed_moe", "mlp_moe"))
        layer["MoeBlock_0/wo"] = ((experts, mlp, d), ("exp", "mlp_moe", "embed_moe"))
    else:
        layer["mlp/wi_0/kernel"] = ((d, mlp), ("embed", "mlp"))
        layer["mlp/wi_1/kernel"] = ((d, mlp), ("embed", "mlp"))
        layer["mlp/wo/kernel"] = ((mlp, d), ("mlp", "embed"))
    for path, (shape, names) in layer.items():  # nn.scan with param_scan_axis=1
        named["params/decoder/layers/" + path] = (
            (shape[0], layers, *shape[1:]),
            (names[0], "layers", *names[1:]),
        )
    tree = {path: _s(*shape) for path, (shape, _) in named.items()}
    return tree, {path: names for path, (_, names) in named.items()}


def maxtext_llama2_7b() -> tuple[dict, dict]:
    """models/llama2-7b.yml: 4096 wide, 32 heads of 128, MLP 11008, 32 layers, vocabulary 32000."""
    return maxtext_decoder(d=4096, heads=32, kv=32, head_dim=128, mlp=11008, layers=32, vocab=32000)


def maxtext_mixtral_8x7b() -> tuple[dict, dict]:
    """models/mixtral-8x7b.yml: 4096 wide, 32 heads (8 for keys/values), 8 experts of 14336."""
    return maxtext_decoder(d=4096, heads=32, kv=8, head_dim=128, mlp=14336, layers=32, vocab=32000, experts=8)


def maxtext_expert_specs(names: Mapping[str, tuple[str | None, ...]]) -> dict[str, PartitionSpec | None]:
    """Each parameter's spec under MaxText's rules, over all of MaxText's mesh axes."""
    from flax.linen import partitioning

    rules = [(name, axes) for name, axes in MAXTEXT_WEIGHT_RULES]
    to_mesh = partitioning.logical_to_mesh_axes  # pyright: ignore[reportPrivateImportUsage]
    return {path: to_mesh(n, rules) for path, n in names.items()}


# ---------------------------------------------------------------- keras-hub


def keras_gemma_7b(layers: int = 28) -> dict:
    """keras-hub's GemmaBackbone with Gemma-7B's sizes: 3072 wide, 16 heads of 256, MLP 24576."""
    d, heads, head_dim, ff = 3072, 16, 256, 24576
    t = {"token_embedding/embeddings": _s(256000, d), "final_normalization/scale": _s(d)}
    for i in range(layers):
        p = f"decoder_block_{i}/"
        t[p + "pre_attention_norm/scale"] = _s(d)
        t[p + "attention/query/kernel"] = _s(heads, d, head_dim)
        t[p + "attention/key/kernel"] = _s(heads, d, head_dim)
        t[p + "attention/value/kernel"] = _s(heads, d, head_dim)
        t[p + "attention/attention_output/kernel"] = _s(heads, head_dim, d)
        t[p + "pre_ffw_norm/scale"] = _s(d)
        t[p + "ffw_gating/kernel"] = _s(d, ff)
        t[p + "ffw_gating_2/kernel"] = _s(d, ff)
        t[p + "ffw_linear/kernel"] = _s(ff, d)
    return t


def keras_gemma_layout_map(model: str = "model", data: str = "batch") -> dict[str, tuple[str | None, ...]]:
    """GemmaBackbone.get_layout_map(mesh, model_parallel_dim_name, data_parallel_dim_name)."""
    return {
        "token_embedding/embeddings": (model, data),
        "decoder_block.*attention.*(query|key|value).kernel": (model, data, None),
        "decoder_block.*attention_output.kernel": (model, None, data),
        "decoder_block.*ffw_gating.kernel": (data, model),
        "decoder_block.*ffw_gating_2.kernel": (data, model),
        "decoder_block.*ffw_linear.kernel": (model, data),
    }


def keras_expert_specs(tree: Mapping[str, Any], layout: Mapping[str, tuple[str | None, ...]]) -> dict:
    """Each variable's spec as keras' LayoutMap finds it: its path as a key, else
    the one regex found in the path; no match: replicated."""
    out = {}
    for path, leaf in tree.items():
        if path in layout:
            axes = layout[path]
        else:
            found = [key for key in layout if re.search(key, path)]
            assert len(found) <= 1, (path, found)
            axes = layout[found[0]] if found else (None,) * len(leaf.shape)
        out[path] = PartitionSpec(*axes)
    return out


# ---------------------------------------------------------------- a 1T-parameter MoE header


def kimi_k2_header(layers: int = 61, experts: int = 384) -> dict:
    """Kimi-K2-sized (DeepSeek-V3 architecture, names as its safetensors index):
    7168 wide, MLA attention, layer 0 dense, 384 experts of 2048 and a shared one."""
    d, vocab, moe_ff, dense_ff = 7168, 163840, 2048, 18432
    t = {
        "model.embed_tokens.weight": _s(vocab, d),
        "model.norm.weight": _s(d),
        "lm_head.weight": _s(vocab, d),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = _s(d)
        t[p + "post_attention_layernorm.weight"] = _s(d)
        t[p + "self_attn.q_a_proj.weight"] = _s(1536, d)
        t[p + "self_attn.q_a_layernorm.weight"] = _s(1536)
        t[p + "self_attn.q_b_proj.weight"] = _s(64 * 192, 1536)
        t[p + "self_attn.kv_a_proj_with_mqa.weight"] = _s(576, d)
        t[p + "self_attn.kv_a_layernorm.weight"] = _s(512)
        t[p + "self_attn.kv_b_proj.weight"] = _s(64 * 256, 512)
        t[p + "self_attn.o_proj.weight"] = _s(d, 64 * 128)
        if i == 0:
            for name, shape in (
                ("gate_proj", (dense_ff, d)),
                ("up_proj", (dense_ff, d)),
                ("down_proj", (d, dense_ff)),
            ):
                t[f"{p}mlp.{name}.weight"] = _s(*shape)
            continue
        t[p + "mlp.gate.weight"] = _s(experts, d)
        t[p + "mlp.gate.e_score_correction_bias"] = _s(experts, dtype=jnp.float32)
        for name, shape in (("gate_proj", (moe_ff, d)), ("up_proj", (moe_ff, d)), ("down_proj", (d, moe_ff))):
            t[f"{p}mlp.shared_experts.{name}.weight"] = _s(*shape)
            for e in range(experts):
                t[f"{p}mlp.experts.{e}.{name}.weight"] = _s(*shape)
    return t


def header_json(tree: Mapping[str, Any]) -> dict[str, list[Any]]:
    """A shapes file (`sr.load_shapes`) for a flat tree of `ShapeDtypeStruct`s."""
    return {path: [list(leaf.shape), str(leaf.dtype)] for path, leaf in tree.items()}


# ---------------------------------------------------------------- comparing layouts


def _blocks(
    spec: PartitionSpec | None, shape: tuple[int, ...], sizes: Mapping[str, int]
) -> list[tuple[Any, int]]:
    """Which block of each dimension each device holds (axes of size 1 or not in
    `sizes` hold none)."""
    coords = device_coords(dict(sizes))
    entries = list(spec) if spec is not None else []
    entries += [None] * (len(shape) - len(entries))
    out = []
    for entry in entries:
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        axes = tuple(a for a in axes if sizes.get(a, 1) > 1)
        block, count = block_index(axes or None, coords, dict(sizes))
        out.append((block.tobytes(), count))
    return out


def same_layout(
    a: PartitionSpec | None, b: PartitionSpec | None, shape: tuple[int, ...], sizes: Mapping[str, int]
) -> bool:
    """Whether every device holds the same block of an array of `shape` under `a` and `b`."""
    return _blocks(a, shape, sizes) == _blocks(b, shape, sizes)


@dataclass
class Agreement:
    leaves: int = 0
    same_leaves: int = 0
    bytes: int = 0
    same_bytes: int = 0
    differ: dict[str, list[str]] = field(default_factory=dict)  # "ours vs theirs" → paths

    @property
    def leaf_share(self) -> float:
        return self.same_leaves / self.leaves

    @property
    def byte_share(self) -> float:
        return self.same_bytes / self.bytes

    def cells(self) -> list[str]:
        """Table cells: leaves agreeing / total, bytes agreeing / total (each
        with its share), and what differs (`ours vs theirs: N leaves`)."""
        from shardrules._planning._plan import format_bytes

        differ = "; ".join(f"{k}: {len(v)} leaves" for k, v in sorted(self.differ.items()))
        return [
            f"{self.same_leaves} / {self.leaves} ({100 * self.leaf_share:.1f}%)",
            f"{format_bytes(self.same_bytes)} / {format_bytes(self.bytes)} ({100 * self.byte_share:.1f}%)",
            differ or "nothing differs",
        ]


def agreement(
    tree: Mapping[str, Any],
    ours: Mapping[str, PartitionSpec | None],
    theirs: Mapping[str, PartitionSpec | None],
    sizes: Mapping[str, int],
    skip: Callable[[str], bool] = lambda path: False,
) -> Agreement:
    """Leaf by leaf (arrays of more than one element), how often `ours` and
    `theirs` lay a leaf out the same way on a mesh of `sizes`."""
    found = Agreement()
    cache: dict[tuple[Any, ...], bool] = {}
    for path, leaf in tree.items():
        shape = tuple(leaf.shape)
        if math.prod(shape) <= 1 or skip(path):
            continue
        nbytes = math.prod(shape) * np.dtype(leaf.dtype).itemsize
        key = (shape, ours[path], theirs[path])
        same = cache.get(key)
        if same is None:
            same = cache[key] = same_layout(ours[path], theirs[path], shape, sizes)
        found.leaves += 1
        found.bytes += nbytes
        if same:
            found.same_leaves += 1
            found.same_bytes += nbytes
        else:
            found.differ.setdefault(f"{ours[path]} vs {theirs[path]}", []).append(path)
    return found


def trimmed(
    specs: Mapping[str, PartitionSpec | None], sizes: Mapping[str, int]
) -> dict[str, PartitionSpec | None]:
    """`specs` without the axes of size 1 (MaxText names all twelve of its axes),
    to show them; `agreement` gives the same answer either way."""
    out: dict[str, PartitionSpec | None] = {}
    for path, spec in specs.items():
        if spec is None:
            out[path] = None
            continue
        entries = []
        for entry in spec:
            axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
            axes = tuple(a for a in axes if sizes.get(a, 1) > 1)
            entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
        out[path] = PartitionSpec(*entries)
    return out


def suggested_specs(
    tree: Mapping[str, Any], text: str, sizes: Mapping[str, int]
) -> dict[str, PartitionSpec | None]:
    found = sr.plan(dict(tree), sr.loads(text), dict(sizes))
    assert found.ok, found.errors
    return {leaf.path: leaf.spec for leaf in found}
