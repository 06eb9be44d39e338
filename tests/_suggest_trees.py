"""Model-like trees for `suggest`'s campaign, and the check every draft must pass.

`model(draw)` builds a tree of `jax.ShapeDtypeStruct`s from drawn choices: a
transformer (transformers' numbered names, a Flax scan stack, MaxText's
stacked layers), a mixture of experts (stacked or one array per expert), a
convolutional network, and names of any kind (non-ASCII letters and digits,
`*` keys, many layers, odd hidden sizes). `check_draft` drafts a rule file and
asserts what `suggest` promises of it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from hypothesis import strategies as st

import shardrules as sr
from shardrules._cli._lint import lint_file
from shardrules._planning._plan import format_bytes, spec_str
from shardrules._suggest._leaves import normalised
from shardrules._suggest._strategy import StrategyError

ODD = ["блок", "层", "ﬁlter", "ü", "x*y", "*", "٣", "Ⅻ", "a b", "μ", "🙂", "é"]
"""Name pieces: letters above U+00FF, a non-ASCII digit, a `*`, a space."""
HIDDEN = [64, 96, 100, 192, 256, 320, 576, 768, 1000, 2048, 2880]
AXES = ["fsdp", "data", "model", "tensor", "expert", "sequence", "context", "stage", "zz"]
SIZES = [1, 2, 3, 4, 8, 16, 128, 256]


def S(*shape: int, dtype: Any = jnp.bfloat16) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


@st.composite
def names(draw: Any) -> str:
    """A module name: ASCII, or with the odd pieces mixed in."""
    return draw(
        st.sampled_from(["blk", "mod", "unit"])
        | st.lists(st.sampled_from(ODD), min_size=1, max_size=3).map("".join)
    )


@st.composite
def transformer(draw: Any) -> dict[str, Any]:
    d = draw(st.sampled_from(HIDDEN))
    head = draw(st.sampled_from([16, 32, 64, 128]))
    heads = draw(st.integers(1, 16))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
    ff = draw(st.sampled_from([2 * d, 4 * d, 3 * d + 8]))
    vocab = draw(st.sampled_from([1000, 32000, 50257, 128256, 201088]))
    layers = draw(st.sampled_from([1, 2, 3, 16]) | st.integers(1, 300))
    experts = draw(st.sampled_from([0, 0, 4, 8, 128]))
    style = draw(st.sampled_from(["hf", "scan", "maxtext"]))
    tied = draw(st.booleans())
    bias = draw(st.booleans())
    qnorm = draw(st.booleans())
    container = draw(st.sampled_from(["layers", "h", "blocks"]) | names())
    digits = draw(st.sampled_from(["ascii", "ascii", "arabic"]))
    per_expert = draw(st.booleans())
    dense_every = draw(st.sampled_from([0, 0, 2]))  # MoE models with every other layer dense
    sinks = draw(st.booleans())  # gpt-oss's per-head attention sinks
    fused = draw(st.booleans())  # GPT-2's fused q/k/v (`Conv1D`: `(in, out)`)
    dtype = draw(st.sampled_from([jnp.bfloat16, jnp.float32]))
    if per_expert:
        layers = min(layers, 4)
    if style == "scan":
        return _scan(d, head, heads, kv, ff, vocab, min(layers, 64), experts, tied)
    if style == "maxtext":
        return _maxtext(d, head, heads, kv, ff, vocab, min(layers, 64), experts)
    t: dict[str, Any] = {"model.embed_tokens.weight": S(vocab, d, dtype=dtype), "model.norm.weight": S(d)}
    if not tied:
        t["lm_head.weight"] = S(vocab, d, dtype=dtype)
    for i in range(layers):
        number = str(i) if digits == "ascii" else "".join(chr(0x660 + int(c)) for c in str(i))
        p = f"model.{container}.{number}."
        t |= {p + "input_layernorm.weight": S(d), p + "post_attention_layernorm.weight": S(d)}
        if fused:
            t |= {p + "attn.c_attn.weight": S(d, 3 * heads * head, dtype=dtype)}
            t |= {p + "attn.c_proj.weight": S(heads * head, d, dtype=dtype)}
        else:
            t |= {
                p + "self_attn.q_proj.weight": S(heads * head, d, dtype=dtype),
                p + "self_attn.k_proj.weight": S(kv * head, d, dtype=dtype),
                p + "self_attn.v_proj.weight": S(kv * head, d, dtype=dtype),
                p + "self_attn.o_proj.weight": S(d, heads * head, dtype=dtype),
            }
        if sinks:
            t[p + "self_attn.sinks"] = S(heads)
        if bias:
            t |= {
                p + f"self_attn.{n}_proj.bias": S(w * head) for n, w in (("q", heads), ("k", kv), ("v", kv))
            }
        if qnorm:
            t |= {p + "self_attn.q_norm.weight": S(head), p + "self_attn.k_norm.weight": S(head)}
        if not experts or (dense_every and i % dense_every):
            t |= {
                p + "mlp.gate_proj.weight": S(ff, d, dtype=dtype),
                p + "mlp.up_proj.weight": S(ff, d, dtype=dtype),
            }
            t |= {p + "mlp.down_proj.weight": S(d, ff, dtype=dtype)}
        elif per_expert:
            t[p + "mlp.gate.weight"] = S(experts, d)
            for e in range(experts):
                q = f"{p}mlp.experts.{e}."
                t |= {
                    q + "gate_proj.weight": S(ff, d),
                    q + "up_proj.weight": S(ff, d),
                    q + "down_proj.weight": S(d, ff),
                }
        else:
            t |= {
                p + "mlp.router.weight": S(experts, d),
                p + "mlp.router.bias": S(experts),
                p + "mlp.experts.gate_up_proj": S(experts, d, 2 * ff, dtype=dtype),
                p + "mlp.experts.gate_up_proj_bias": S(experts, 2 * ff),
                p + "mlp.experts.down_proj": S(experts, ff, d, dtype=dtype),
                p + "mlp.experts.down_proj_bias": S(experts, d),
            }
    return t


def _scan(
    d: int, head: int, heads: int, kv: int, ff: int, vocab: int, n: int, experts: int, tied: bool
) -> dict:
    attn = {
        "query": {"kernel": S(n, d, heads, head)},
        "key": {"kernel": S(n, d, kv, head)},
        "value": {"kernel": S(n, d, kv, head)},
        "out": {"kernel": S(n, heads, head, d)},
    }
    if experts:
        mlp = {
            "router": {"kernel": S(n, d, experts)},
            "experts": {"wi": S(n, experts, d, ff), "wo": S(n, experts, ff, d)},
        }
    else:
        mlp = {"wi": {"kernel": S(n, d, ff)}, "wo": {"kernel": S(n, ff, d)}}
    params = {
        "embed": {"embedding": S(vocab, d)},
        "layers": {"attn": attn, "mlp": mlp, "attn_norm": {"scale": S(n, d)}, "mlp_norm": {"scale": S(n, d)}},
        "final_norm": {"scale": S(d)},
    }
    if not tied:
        params["lm_head"] = {"kernel": S(d, vocab)}
    return {"params": params}


def _maxtext(d: int, head: int, heads: int, kv: int, ff: int, vocab: int, n: int, experts: int) -> dict:
    attn = {
        "query": {"kernel": S(d, n, heads, head)},
        "key": {"kernel": S(d, n, kv, head)},
        "value": {"kernel": S(d, n, kv, head)},
        "out": {"kernel": S(heads, n, head, d)},
    }
    layer: dict[str, Any] = {"self_attention": attn, "pre_self_attention_layer_norm": {"scale": S(d, n)}}
    if experts:
        layer["MoeBlock_0"] = {
            "gate": {"kernel": S(d, n, experts)},
            "wi_0": S(experts, n, d, ff),
            "wi_1": S(experts, n, d, ff),
            "wo": S(experts, n, ff, d),
        }
    else:
        layer["mlp"] = {
            "wi_0": {"kernel": S(d, n, ff)},
            "wi_1": {"kernel": S(d, n, ff)},
            "wo": {"kernel": S(ff, n, d)},
        }
    decoder = {"layers": layer, "decoder_norm": {"scale": S(d)}, "logits_dense": {"kernel": S(d, vocab)}}
    return {"params": {"decoder": decoder, "token_embedder": {"embedding": S(vocab, d)}}}


@st.composite
def convnet(draw: Any) -> dict[str, Any]:
    """ResNet-like: stages of blocks with conv kernels, batch norms, a classifier."""
    widths = draw(st.lists(st.sampled_from([16, 64, 96, 256, 512, 2048]), min_size=1, max_size=4))
    blocks = draw(st.integers(1, 3))
    t: dict[str, Any] = {
        "stem": {
            "conv": {"kernel": S(7, 7, 3, widths[0])},
            "bn": {"scale": S(widths[0]), "bias": S(widths[0])},
        }
    }
    cin = widths[0]
    for s, w in enumerate(widths):
        for b in range(blocks):
            t[f"stage{s}_block{b}"] = {
                "conv1": {"kernel": S(3, 3, cin, w)},
                "bn1": {"scale": S(w), "bias": S(w)},
                "conv2": {"kernel": S(3, 3, w, w)},
                "bn2": {"scale": S(w), "bias": S(w)},
            }
            cin = w
    t["head"] = {"kernel": S(cin, draw(st.sampled_from([10, 1000, 21843]))), "bias": S(1000)}
    return t


@st.composite
def odd(draw: Any) -> dict[str, Any]:
    """Names no convention uses, nested, with layers numbered in several ways."""
    d = draw(st.sampled_from(HIDDEN))
    top = draw(names())
    layers = draw(st.integers(1, 40))
    leaf = draw(st.sampled_from(["weight", "kernel", "w", "wé", "*"]))
    inner = draw(st.lists(names(), min_size=1, max_size=3, unique=True))
    tree: dict[str, Any] = {top: {}}
    for i in range(layers):
        key = draw(st.sampled_from([str(i), f"layer{i}", f"{top}_{i}", f"L{i}x"]))
        tree[top][key] = {name: {leaf: S(d, draw(st.sampled_from([d, 2 * d, 7])))} for name in inner}
    tree["norm"] = {"scale": S(d)}
    return tree


models = transformer() | convnet() | odd()


@st.composite
def meshes(draw: Any) -> dict[str, int]:
    axes = draw(st.lists(st.sampled_from(AXES), min_size=1, max_size=3, unique=True))
    return {a: draw(st.sampled_from(SIZES)) for a in axes}


strategies = st.sampled_from(["auto", "auto", "dp", "fsdp", "tp", "fsdp+tp", "ep"])
options = st.fixed_dictionaries(
    {},
    optional={
        "embedding": st.sampled_from(["vocab", "whole"]),
        "head_dim": st.sampled_from([64, 128]),
        "max_bytes_per_device": st.sampled_from([1 << 20, 64 << 20, 1 << 30]),
    },
)

_COVERS = re.compile(
    r'^\s*"((?:[^"\\]|\\.)*)"\s*->.*#[^#]*: ([\d,]+) arrays?, ([\d.]+ \w+)(?:; noqa: [\w, ]+)?$'
)
_LISTED = re.compile(r"^\s*#   (.*) (\([\d, ]*\)) (\w+)(?: x(\d+))? -> (P\(.*?\))(?: \(.*\))?$")
_HEADER = re.compile(r"for an even split|([\d.]+ \w+) per device, against")


def draft(tree: Any, mesh: dict[str, int], strategy: str, **options: Any) -> str | None:
    """The draft, or `None` where the strategy cannot be used on this mesh or model."""
    try:
        return sr.suggest(tree, mesh, strategy, **options)
    except StrategyError:
        return None
    except ValueError as err:
        if "cannot be named in a rule file" in str(err) or "no arrays to lay out" in str(err):
            return None
        raise


def check_draft(text: str, tree: Any, mesh: dict[str, int], folder: Path) -> None:
    """What `suggest` promises of a draft: it loads, lints clean (no error, no
    warning it does not acknowledge), `fmt` keeps it, and `sr.plan` lays every
    leaf out as the draft says: each rule takes the arrays its comment counts,
    each leaf listed under `default` gets the spec listed, and the header's
    bytes per device are the plan's."""
    rules = sr.loads(text)
    assert sr.format_text(text) == text
    path = folder / "draft.shard"
    path.write_text(text, encoding="utf-8")
    found = [d for d in lint_file(str(path), tree, mesh).diagnostics if d.severity != "note"]
    said = "Kept whole, it puts" in re.sub(r"\s*\n\s*#\s*", " ", text)  # embedding="whole": SR116, said
    found = [d for d in found if not (said and d.code == "SR116")]
    assert not found, "\n".join(f"{d.code}: {d.message}" for d in found)
    plan = sr.plan(tree, rules, mesh)
    assert not [d for d in plan.errors if not (said and d.code == "SR116")], plan.errors
    arrays = [
        leaf
        for leaf in plan.leaves
        if leaf.shape is not None
        and leaf.dtype is not None
        and math.prod(leaf.shape) > 1
        and leaf.why in ("rule", "default")
    ]
    lines = text.splitlines()
    counted: dict[int, list[Any]] = {}
    taken_by_default = []
    for leaf in arrays:
        assert leaf.rule is not None and leaf.rule.span is not None, leaf
        line = leaf.rule.span.line
        if lines[line - 1].lstrip().startswith("default"):
            taken_by_default.append(leaf)
        else:
            counted.setdefault(line, []).append(leaf)
    for number, line in enumerate(lines, 1):
        found_rule = _COVERS.match(line)
        if found_rule is None:
            continue
        leaves = counted.pop(number, [])
        assert f"{len(leaves):,}" == found_rule.group(2), (line, [x.path for x in leaves][:5])
        assert format_bytes(sum(x.nbytes for x in leaves)) == found_rule.group(3), line
    assert not counted, f"leaves taken by rules whose comment says nothing of them: {counted}"
    listed = {}
    for line in lines:
        found_listed = _LISTED.match(line)
        if found_listed is not None:
            key, shape, dtype, _count, spec = found_listed.groups()
            listed[(key, shape, dtype)] = spec
    if "and more kinds of leaves" not in text and "more kinds of leaves" not in text:
        for leaf in taken_by_default:
            key = (_shown(normalised(leaf.path)), str(leaf.shape), str(leaf.dtype))
            assert key in listed, (key, sorted(listed)[:5])
            assert listed[key] == spec_str(leaf.spec), (key, listed[key], spec_str(leaf.spec))
    if "No leaf is left to `default` now" in text:
        assert not taken_by_default, [x.path for x in taken_by_default]
    flat = re.sub(r"\s*\n#\s*", " ", text)
    per_device = re.search(r"([\d.]+ \w+) per device, against", flat)
    assert per_device is not None, text[:600]
    assert per_device.group(1) == format_bytes(sum(x.bytes_per_device for x in arrays)), per_device.group(0)


def _shown(key: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in key)
