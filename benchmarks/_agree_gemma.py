"""`suggest` against the layouts of Gemma 3 (Google's `gemma` package).

The parameter trees are Gemma 3's as `gemma.gm.nn.Transformer` makes them
(text only): `embedder/input_embedding` `(vocab, embed)`; per `layer_N`,
`attn/q_einsum/w` `(heads, embed, head_dim)`, `attn/kv_einsum/w`
`(2, kv_heads, embed, head_dim)`, `attn/attn_vec_einsum/w`
`(heads, head_dim, embed)`, `attn/_query_norm/scale` and `_key_norm/scale`,
`mlp/gating_einsum` `(2, mlp, embed)` (gate and up), `mlp/linear`
`(mlp, embed)` and four norms; `final_norm/scale`; bfloat16. With `gemma`
installed the tree is gemma's own (`jax.eval_shape` of its `init`), else it is
built from those names and shapes (`shapes`), with the sizes of gemma's
`Gemma3_1B` and `Gemma3_4B` configs.

Gemma is trained with kauldron, whose layout for it is
`kd.sharding.FSDPSharding` (`kauldron_specs`): on one mesh axis `devices` of
every device, an array of at most `min_size_to_shard_mb` (4) MiB is
replicated; a larger one is split over `devices` along its largest dimension
that the device count divides (the dimensions in the order of
`numpy.argsort(shape)[::-1]`), else replicated. `suggest`'s `fsdp` splits
each weight's hidden size instead (every dimension of the hidden size: the
one the weights share), so the two agree only where the hidden size is the
largest dimension and the array is over 4 MiB. `fsdp_dim="largest"` with
`min_bytes=4 MiB + 1` (`LARGEST`) drafts kauldron's layout, one rule per role.

Gemma has no tensor-parallel layout of its own; `megatron_specs` is the
Megatron-LM one by hand for `fsdp+tp` (heads, kv heads where they divide,
and MLP hidden units over `model`, the hidden size over `fsdp`, the
embedding vocab-parallel, norms replicated).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import shardrules as sr

LIBRARY = "gemma"
MIN_SIZE_TO_SHARD_MB = 4  # kauldron's FSDPSharding default
CONFIGS = {  # gemma.gm.nn's Gemma3 configs (text only)
    "Gemma3_1B": {"vocab": 262144, "embed": 1152, "mlp": 6 * 1152, "heads": 4, "head_dim": 256, "kv": 1,
                  "layers": 26},
    "Gemma3_4B": {"vocab": 262144, "embed": 2560, "mlp": 2560 * 8 // 2, "heads": 8, "head_dim": 256, "kv": 4,
                  "layers": 34},
}  # fmt: skip
TINY = {"vocab": 256, "embed": 64, "mlp": 256, "heads": 8, "head_dim": 8, "kv": 4, "layers": 2}


def shapes(c: Mapping[str, int]) -> dict[str, Any]:
    """Gemma 3's parameter tree for config `c`, from its names and shapes."""

    def s(*shape: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, jnp.bfloat16)

    d, h = c["embed"], c["head_dim"]
    t = {"params/embedder/input_embedding": s(c["vocab"], d), "params/final_norm/scale": s(d)}
    for i in range(c["layers"]):
        p = f"params/layer_{i}/"
        t[p + "attn/_key_norm/scale"] = s(h)
        t[p + "attn/_query_norm/scale"] = s(h)
        t[p + "attn/attn_vec_einsum/w"] = s(c["heads"], h, d)
        if c["kv"] == c["heads"]:
            t[p + "attn/qkv_einsum/w"] = s(3, c["heads"], d, h)
        else:
            t[p + "attn/kv_einsum/w"] = s(2, c["kv"], d, h)
            t[p + "attn/q_einsum/w"] = s(c["heads"], d, h)
        t[p + "mlp/gating_einsum"] = s(2, c["mlp"], d)
        t[p + "mlp/linear"] = s(c["mlp"], d)
        for norm in ("post_attention_norm", "post_ffw_norm", "pre_attention_norm", "pre_ffw_norm"):
            t[p + norm + "/scale"] = s(d)
    return t


def model(c: Mapping[str, int]) -> Any:
    """gemma's own `Transformer` for config `c` (needs `gemma`)."""
    from gemma.gm.nn import _config, _modules, _transformer

    pattern = (_modules.AttentionType.LOCAL_SLIDING,) * 5 + (_modules.AttentionType.GLOBAL,)
    config = _config.TransformerConfig(
        final_logit_softcap=None, num_embed=c["vocab"], embed_dim=c["embed"], hidden_dim=c["mlp"],
        num_heads=c["heads"], head_dim=c["head_dim"], num_kv_heads=c["kv"], use_post_attn_norm=True,
        use_post_ffw_norm=True, use_qk_norm=True,
        attention_types=_config.make_attention_layers_types(pattern, num_layers=c["layers"]),
        query_pre_attn_norm=_config.QueryPreAttentionNormalisation.BY_ONE_OVER_SQRT_HEAD_DIM,
        attn_logits_soft_cap=None, sliding_window_size=512, transpose_gating_einsum=True,
        local_base_frequency=10_000, global_base_frequency=1_000_000, vision_encoder=None,
    )  # fmt: skip
    return _transformer.Transformer(config=config)


def gemma_shapes(c: Mapping[str, int]) -> dict[str, Any]:
    """The tree gemma's own `Transformer.init` makes for config `c`, flat by path."""
    m = model(c)
    tree = jax.eval_shape(lambda: m.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path): leaf for path, leaf in flat}


def kauldron_specs(tree: Mapping[str, Any], devices: int, axis: str = "devices") -> dict[str, P]:
    """kauldron's `FSDPSharding` layout of `tree` on `devices` devices."""
    out = {}
    for path, leaf in tree.items():
        shape = tuple(leaf.shape)
        spec: list[str | None] = [None] * len(shape)
        if math.prod(shape) * np.dtype(leaf.dtype).itemsize > MIN_SIZE_TO_SHARD_MB * 2**20:
            for i in np.argsort(shape)[::-1]:
                if shape[i] % devices == 0:
                    spec[int(i)] = axis
                    break
        out[path] = P(*spec)
    return out


def megatron_specs(tree: Mapping[str, Any], sizes: Mapping[str, int]) -> dict[str, P]:
    """The Megatron-LM fsdp+tp layout by hand on a mesh with `fsdp` and `model`."""
    tp = sizes["model"]

    def heads(n: int) -> str | None:
        return "model" if n % tp == 0 else None

    out = {}
    for path, leaf in tree.items():
        shape = tuple(leaf.shape)
        if path.endswith("input_embedding"):
            spec = P("model", "fsdp")
        elif path.endswith("/q_einsum/w"):
            spec = P(heads(shape[0]), "fsdp", None)
        elif path.endswith("/kv_einsum/w") or path.endswith("/qkv_einsum/w"):
            spec = P(None, heads(shape[1]), "fsdp", None)
        elif path.endswith("/attn_vec_einsum/w"):
            spec = P(heads(shape[0]), None, "fsdp")
        elif path.endswith("/gating_einsum"):
            spec = P(None, "model", "fsdp")
        elif path.endswith("/mlp/linear"):
            spec = P("model", "fsdp")
        else:
            spec = P(*([None] * len(shape)))
        out[path] = spec
    return out


LARGEST = {"fsdp_dim": "largest", "min_bytes": MIN_SIZE_TO_SHARD_MB * 2**20 + 1}
"""`suggest`'s options for kauldron's layout: arrays over 4 MiB split along their largest dimension."""


def measure(tree: Mapping[str, Any], strategy: str, **options: Any) -> Any:
    """`suggest`'s plan of `tree` (with `options`, such as `LARGEST`) against
    kauldron's (`fsdp`, on `devices=8`) or the Megatron one (`fsdp+tp`, on
    `fsdp=2, model=4`)."""
    import _expert_layouts as E

    if strategy == "fsdp":
        sizes = {"devices": 8}
        theirs = kauldron_specs(tree, 8)
    else:
        sizes = {"fsdp": 2, "model": 4}
        theirs = megatron_specs(tree, sizes)
    text = sr.suggest(dict(tree), sizes, strategy=strategy, **options)
    return E.agreement(tree, E.suggested_specs(tree, text, sizes), theirs, sizes)


KAULDRON_RULES = f"""mesh devices=8

rules params:
  default -> auto(devices, min_bytes={MIN_SIZE_TO_SHARD_MB * 2**20 + 1})
"""
"""kauldron's `FSDPSharding` as a rule file: `auto` splits the largest
dimension that divides, of arrays of at least `min_bytes` (over 4 MiB)."""


def measure_rule_file(tree: Mapping[str, Any]) -> Any:
    """`KAULDRON_RULES`' plan of `tree` against kauldron's own layout."""
    import _expert_layouts as E

    sizes = {"devices": 8}
    return E.agreement(tree, E.suggested_specs(tree, KAULDRON_RULES, sizes), kauldron_specs(tree, 8), sizes)


def _source() -> tuple[str, Any]:
    try:
        from importlib.metadata import version

        import gemma.gm.nn._transformer  # noqa: F401
    except Exception as error:  # gemma or one of its many dependencies is missing
        return f"names and shapes by hand (gemma not importable: {type(error).__name__})", shapes
    return f"gemma {version('gemma')}'s own tree", gemma_shapes


def rows() -> list[list[str]]:
    """Per config and strategy: library, model, strategy, leaves agreeing,
    bytes agreeing, and what differs."""
    source, build = _source()
    out = []
    for name, config in (("tiny", TINY), *CONFIGS.items()):
        tree = build(config)
        for strategy, expert, options in (
            ("fsdp", "kauldron FSDPSharding", {}),
            ("fsdp", "kauldron FSDPSharding", LARGEST),
            ("fsdp+tp", "Megatron hand layout", {}),
        ):
            found = measure(tree, strategy, **options)
            mesh = "devices=8" if strategy == "fsdp" else "fsdp=2,model=4"
            said = ", `fsdp_dim=largest, min_bytes=4MiB + 1`" if options else ""
            out.append(
                [
                    f"{LIBRARY} ({expert}; {source})",
                    name,
                    f"{strategy}{said} on {mesh}",
                    *found.cells(),
                ]
            )
        found = measure_rule_file(tree)
        out.append(
            [
                f"{LIBRARY} (kauldron FSDPSharding; {source})",
                name,
                "`default -> auto(devices, min_bytes=4MiB + 1)` on devices=8 (no `suggest`)",
                *found.cells(),
            ]
        )
    return out


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    for row in rows():
        print(row)
