"""What each kind of leaf is in the model, read from the names in its path.

The names are those of the common conventions: transformers and safetensors
checkpoints (`model.layers.3.self_attn.q_proj.weight`), Flax linen and NNX
(`attn/query/kernel`), MaxText (`self_attention/query/kernel`,
`MoeBlock_0/wi_0`), Equinox (`query_proj/weight`), keras-hub
(`decoder_block_0/attention/query/kernel`), haliax and Levanter
(`token_embeddings/weight`, `layers/stacked/self_attn/q_proj/weight`), penzai labels
(`attention/query.weights`), Meta's (`attention.wq.weight`), GPT-2's
(`attn.c_attn.weight`), BERT's (`attention.self.query.weight`), dm-haiku's
(`multi_head_attention/linear/w`, `mlp/~/linear_0/w`) and Gemma's
(`attn/q_einsum/w`, `mlp/gating_einsum`, `mlp/linear`). A linear named by its
kind alone (`linear`, `linear_1`, `Dense_0`) is an attention block's output,
or an MLP block's in or out as its shape says (`_facts`). A role
says which dimension of the weight is which (`_dims`); the role alone does
not decide the layout, the strategy does (`_strategy`).

A weight is read as `(out, in)` when its parameter is called `weight` (PyTorch
and Equinox; not GPT-2's `Conv1D` layers), else as `(in, out)` (`kernel`, `w`,
penzai's `weights`); this only matters for square matrices, where shapes
cannot tell.
"""

from __future__ import annotations

import dataclasses
import re

EMBEDDING = "embedding"
POSITIONS = "positions"
Q = "attn_q"
KV = "attn_kv"
QKV = "attn_qkv"
OUT = "attn_out"
MLP_IN = "mlp_in"
MLP_OUT = "mlp_out"
MLP_LINEAR = "mlp_linear"  # a generically named linear in an MLP block: in or out, told by its shape
EXPERT_IN = "expert_in"
EXPERT_OUT = "expert_out"
ROUTER = "router"
GATE = "gate"  # `mlp.gate`: a router (experts wide) or an MLP gate, told apart by its shape
LM_HEAD = "lm_head"
NORM = "norm"
BIAS = "bias"
CONV = "conv"

COLUMN = frozenset({Q, KV, QKV, MLP_IN, EXPERT_IN})
"""Roles whose output features are split in tensor parallelism (their biases too)."""
ROW = frozenset({OUT, MLP_OUT, EXPERT_OUT})
"""Roles whose input features are split (their biases are replicated)."""
LINEAR = COLUMN | ROW | {ROUTER}

DESCRIPTIONS = {
    EMBEDDING: "token embedding",
    POSITIONS: "position embedding",
    Q: "attention queries",
    KV: "attention keys/values",
    QKV: "attention q/k/v",
    OUT: "attention output",
    MLP_IN: "MLP in (gate/up)",
    MLP_OUT: "MLP out (down)",
    EXPERT_IN: "experts in (gate/up)",
    EXPERT_OUT: "experts out (down)",
    ROUTER: "MoE router",
    LM_HEAD: "output head (logits)",
    NORM: "norms",
    BIAS: "biases",
    CONV: "convolutions",
}

_EMBED = {
    "embed_tokens", "wte", "tok_embeddings", "token_embedding", "token_embedder", "word_embeddings",
    "embedder", "embed", "embeddings", "embedding", "input_embedding", "tok_emb", "token_emb",
    "embed_in", "shared", "word_embedding", "input_embeddings", "token_embeddings",
}  # fmt: skip
TRANSFORMERS_EMBEDDINGS = frozenset({"embed_tokens", "wte", "word_embeddings", "embed_in"})
"""transformers' names for a causal LM's token embedding (Llama, Mistral, Qwen and most
others; GPT-2 and GPT-J; BLOOM and Falcon; GPT-NeoX), whose parameter is `weight`."""
_POSITIONS = {
    "wpe", "position_embedding", "position_embeddings", "pos_emb", "pos_embed", "pos_embedding",
    "positional_embedding", "embed_positions", "token_type_embeddings", "position_embedder",
}  # fmt: skip
_LM_HEAD = {"lm_head", "logits_dense", "unembed", "unembedding", "embed_out", "output_layer", "logits"}
_ROUTER = {"router", "gate_logit", "router_gate", "w_gate", "gating", "switch", "router_logits", "wg"}
_ATTN = {
    "self_attn", "attn", "attention", "self_attention", "selfattention", "mha", "multi_head_attention",
    "cross_attn", "cross_attention", "encdec_attention", "attn_block", "mixer_attn", "self",
}  # fmt: skip
_EXPERTS = {"experts", "expert"}
_SHARED = {"shared_experts", "shared_expert", "shared_mlp"}

# Module names → role; `None` in the second column: only inside an attention block.
_Q = {"q_proj", "wq", "query_proj", "to_q", "q_einsum", "q_a_proj", "q_b_proj", "q_lin"}
_Q_IN_ATTN = {"q", "query"}
_K = {"k_proj", "wk", "key_proj", "to_k", "k_lin", "kv_a_proj_with_mqa", "kv_a_proj", "kv_b_proj"}
_K_IN_ATTN = {"k", "key"}
_V = {"v_proj", "wv", "value_proj", "to_v", "v_lin", "kv_proj", "wkv", "kv_einsum"}
_V_IN_ATTN = {"v", "value"}
_QKV = {"qkv_proj", "qkv", "wqkv", "c_attn", "query_key_value", "qkv_einsum", "w_qkv", "in_proj_qkv"}
_O = {"o_proj", "attention_output", "attn_vec_einsum", "output_proj", "to_out", "out_lin", "attn_out"}
_O_IN_ATTN = {"out_proj", "out", "wo", "o", "c_proj", "proj", "output", "dense", "linear"}
_UP = {
    "gate_proj", "up_proj", "gate_up_proj", "w1", "w3", "wi", "wi_0", "wi_1", "fc1", "fc_in", "c_fc",
    "dense_h_to_4h", "ffw_gating", "ffw_gating_2", "gating_einsum", "linear1", "lin1", "w_in", "fc_1",
    "gating_linear", "value_linear", "up", "in_proj", "wi_gate", "wi_up", "linear_in", "up_gate_proj",
    "mlp_in", "ffn_in", "ff_in", "ffn_up", "ffn_gate",
}  # fmt: skip
_DOWN = {
    "down_proj", "w2", "wo", "fc2", "fc_out", "c_proj", "dense_4h_to_h", "ffw_linear", "linear2", "lin2",
    "w_out", "fc_2", "out_linear", "down", "out_proj", "linear_einsum", "linear_out", "output",
    "mlp_out", "ffn_out", "ff_out", "ffn_down",
}  # fmt: skip
_MLP_BLOCK = re.compile(
    r"^(mlp|ffn|ffw|ff|feed_?forward|mlp_?block|ffn_?block|feed_?forward_?block)(_?\d+)?$"
)
"""An MLP block (`mlp`, `ffn`, Gemma's `FeedForward` as `mlp`, Flax's `MlpBlock_0`)."""
_GENERIC_LINEAR = re.compile(r"^(linear|dense|fc|lin)(_?\d+)?$")
"""A linear layer named by its kind alone (haiku's `linear_0`, Flax's `Dense_1`, Gemma's
`linear`): in an MLP block its shape tells its direction (`_facts`)."""
_PARAMS = {"weight", "weights", "kernel", "w", "embedding", "embeddings", "scale", "input_embedding"}
_BIASES = {"bias", "b", "biases"}
_NORM = re.compile(r"norm|^(ln|ln_?\d+|ln_f|ln_\w+|\w+_ln|bn|bn_?\d+|\w+_bn)$|^(gamma|beta)$")
_CONV1D = {"c_attn", "c_proj", "c_fc"}
"""GPT-2's layers: `Conv1D`, whose `weight` is `(in, out)`."""
_CONV = re.compile(r"conv|patch_embed|stem")


@dataclasses.dataclass(frozen=True)
class Role:
    """A kind's role; for a bias, `of` is the role of the layer it belongs to.
    `out_first`: the weight is `(out, in)`; `per_expert`: one expert's weight
    in a path numbering the experts."""

    name: str
    of: str | None = None
    out_first: bool = False
    per_expert: bool = False


def role_of(tokens: tuple[str, ...]) -> Role | None:
    """The role that the lower-case `tokens` of a normalised path name, or
    `None` for names this module does not know."""
    tokens = tuple(t for t in tokens if t != "~")  # haiku: `mlp/~/linear_0`, a submodule made in `__init__`
    if not tokens:
        return None
    last = tokens[-1]
    if any(_NORM.search(t) for t in tokens[-3:] if t not in _PARAMS and t not in _BIASES) or (
        len(tokens) >= 2 and _NORM.search(tokens[-2])
    ):
        return Role(NORM)
    if last in _BIASES:
        base = _module_role(tokens[:-1], tokens[:-1][-1] if len(tokens) > 1 else "", False)
        return Role(BIAS, of=base.name if base is not None else None)
    if last.endswith("_bias"):  # MaxText's `wi_0_bias`, DeepSeek's `e_score_correction_bias`
        module = last.removesuffix("_bias")
        base = _module_role((*tokens[:-1], module), module, False)
        if base is None and len(tokens) > 1:
            base = _module_role(tokens[:-1], tokens[-2], False)
        return Role(BIAS, of=base.name if base is not None else None)
    if last in _PARAMS:
        module, chain = (tokens[-2] if len(tokens) > 1 else last), tokens[:-2]
    else:  # a parameter named by its role (`experts.gate_up_proj`, MaxText's `MoeBlock_0/wi_0`)
        module, chain = last, tokens[:-1]
    out_first = last == "weight" and module not in _CONV1D
    role = _module_role((*chain, module), module, out_first)
    if role is None and last in ("embedding", "embeddings", "input_embedding"):
        role = Role(EMBEDDING)
    return role


_STATES = {"params", "param", "mu", "nu", "opt_state", "state", "model", "ema", "trace"}
"""Containers a train state puts the whole model under (`params/head/kernel`, Adam's
`mu/head/kernel`): a module right under them is at the model's top level."""


def _top(chain: tuple[str, ...]) -> bool:
    """Whether a module under `chain` is at the model's top level (under train-state containers only)."""
    return all(t in _STATES or t.isdigit() or t == "*" for t in chain)


def _module_role(tokens: tuple[str, ...], module: str, out_first: bool) -> Role | None:
    chain = tokens[:-1]
    in_attn = any(t in _ATTN or "attention" in t or "attn" in t for t in chain[-3:])
    experts = [i for i, t in enumerate(chain) if t in _EXPERTS or t.startswith("moeblock")]
    shared = any(t in _SHARED for t in chain)
    in_experts = bool(experts) and not shared
    per_expert = in_experts and any(chain[i + 1 : i + 2] == ("*",) for i in experts)
    if module in _EMBED:
        return Role(EMBEDDING)
    if module in _POSITIONS:
        return Role(POSITIONS)
    if module in _LM_HEAD or (module == "output" and len(tokens) <= 2) or (module == "head" and _top(chain)):
        return Role(LM_HEAD, out_first=out_first)
    if module in _ROUTER or module == "gate":
        return Role(ROUTER if module != "gate" else GATE, out_first=out_first)
    name = _attention(module, chain, in_attn)
    if name is None:
        name = _mlp(module, chain, in_attn)
    if name is None:
        if _CONV.search(module):
            return Role(CONV, out_first=out_first)
        return None
    if name in (MLP_IN, MLP_OUT) and in_experts:
        name = EXPERT_IN if name == MLP_IN else EXPERT_OUT
    return Role(name, out_first=out_first, per_expert=per_expert)


def _attention(module: str, chain: tuple[str, ...], in_attn: bool) -> str | None:
    if module in _Q or (in_attn and module in _Q_IN_ATTN):
        return Q
    if module in _K or module in _V or (in_attn and (module in _K_IN_ATTN or module in _V_IN_ATTN)):
        return KV
    if module in _QKV or (in_attn and module == "in_proj"):
        return QKV
    if module in _O or (in_attn and module in _O_IN_ATTN):
        if module == "dense" and chain[-1:] != ("output",):
            return None
        return OUT
    return None


def _mlp(module: str, chain: tuple[str, ...], in_attn: bool) -> str | None:
    parent = chain[-1] if chain else ""
    if module == "dense" and parent in ("intermediate", "output"):  # BERT: intermediate.dense, output.dense
        return MLP_IN if parent == "intermediate" else MLP_OUT
    if _GENERIC_LINEAR.match(module):
        return MLP_LINEAR if not in_attn and any(_MLP_BLOCK.match(t) for t in chain[-2:]) else None
    if module in _UP:
        return MLP_IN
    if module in _DOWN:
        return MLP_OUT
    return None


def transformers_embedding(tokens: tuple[str, ...]) -> bool:
    """Whether the lower-case `tokens` of a path name a token embedding as
    transformers does (`model.embed_tokens.weight`, `transformer.wte.weight`)."""
    return len(tokens) >= 2 and tokens[-1] == "weight" and tokens[-2] in TRANSFORMERS_EMBEDDINGS
