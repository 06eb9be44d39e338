"""`suggest` against a hand layout of a dm-haiku transformer.

The model is haiku's own modules under `hk.transform`: `hk.Embed`, per block
two `hk.LayerNorm`s, `hk.MultiHeadAttention` (its linears `query`, `key`,
`value` and the output projection `linear`) and `hk.nets.MLP` (`linear_0`
up, `linear_1` down, made in its constructor: `mlp/~/linear_0`), a final
`hk.LayerNorm` and an `hk.Linear` head. Haiku has no layout of its own, so
the expert layout is the Megatron-LM one written by hand (`expert_specs`):
column-parallel q/k/v, MLP up and head (output features over the tensor
axis, their biases too), row-parallel attention output and MLP down (input
features over the tensor axis, biases not), the embedding vocab-parallel;
FSDP splits every weight's hidden dimension (and the hidden-size biases)
over its axes; norms are replicated.

`rows()` gives one table row per model size and strategy, or one row saying
why there is none (haiku missing).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax
from jax.sharding import PartitionSpec as P

import shardrules as sr

LIBRARY = "dm-haiku"
MESHES = {  # strategy → the mesh it is drafted and compared on
    "fsdp": {"fsdp": 8},
    "tp": {"data": 2, "model": 4},
    "fsdp+tp": {"fsdp": 2, "model": 4},
}
TINY = {"layers": 2, "width": 32, "heads": 4, "mlp": 128, "vocab": 64}
SMALL = {"layers": 12, "width": 768, "heads": 12, "mlp": 3072, "vocab": 50304}  # GPT-2-small sized


def forward(config: Mapping[str, int]) -> Any:
    """The haiku transformer of `config` under `hk.transform` (logits of a
    `(batch, seq)` int token array)."""
    import haiku as hk

    width, heads = config["width"], config["heads"]

    class Block(hk.Module):
        def __call__(self, x: Any) -> Any:
            h = hk.LayerNorm(-1, create_scale=True, create_offset=True)(x)
            init = hk.initializers.VarianceScaling(1.0)
            h = hk.MultiHeadAttention(heads, width // heads, w_init=init, model_size=width)(h, h, h)
            x = x + h
            h = hk.LayerNorm(-1, create_scale=True, create_offset=True)(x)
            return x + hk.nets.MLP([config["mlp"], width])(h)

    def fn(tokens: Any) -> Any:
        x = hk.Embed(config["vocab"], width)(tokens)
        for i in range(config["layers"]):
            x = Block(name=f"block_{i}")(x)
        x = hk.LayerNorm(-1, create_scale=True, create_offset=True)(x)
        return hk.Linear(config["vocab"], name="lm_head")(x)

    return hk.transform(fn)


def shapes(config: Mapping[str, int]) -> dict[str, Any]:
    """The parameters' shapes (no weights), by their paths as `shardrules` writes them."""
    import jax.numpy as jnp

    model = forward(config)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((2, 8), jnp.int32)))
    return {f"{module}/{name}": leaf for module, inner in params.items() for name, leaf in inner.items()}


_COLUMN = re.compile(r"/(query|key|value|linear_0)/[wb]$|^lm_head/[wb]$")
_ROW = re.compile(r"multi_head_attention/linear/[wb]$|/linear_1/[wb]$")


def expert_specs(tree: Mapping[str, Any], strategy: str, sizes: Mapping[str, int]) -> dict[str, P]:
    """The hand layout of each leaf of the haiku transformer on `sizes`."""
    tensor = "model" if strategy != "fsdp" and "model" in sizes else None
    fsdp: Any = tuple(sizes) if strategy == "fsdp" else ("fsdp" if "fsdp" in sizes else None)
    if isinstance(fsdp, tuple) and len(fsdp) == 1:
        fsdp = fsdp[0]
    out = {}
    for path, leaf in tree.items():
        weight = path.endswith("/w")
        if path.endswith("embed/embeddings"):  # (vocab, hidden)
            spec = P(tensor, fsdp)
        elif _COLUMN.search(path):  # (hidden, out) and (out,)
            spec = P(fsdp, tensor) if weight else P(tensor)
        elif _ROW.search(path):  # (in, hidden) and (hidden,)
            spec = P(tensor, fsdp) if weight else P(fsdp)
        else:  # norms
            spec = P(*([None] * len(leaf.shape)))
        out[path] = spec
    return out


def measure(config: Mapping[str, int], strategy: str) -> Any:
    """`suggest`'s plan against the hand layout: an `_expert_layouts.Agreement`."""
    import _expert_layouts as E

    tree, sizes = shapes(config), MESHES[strategy]
    text = sr.suggest(tree, sizes, strategy=strategy)
    return E.agreement(tree, E.suggested_specs(tree, text, sizes), expert_specs(tree, strategy, sizes), sizes)


def rows() -> list[list[str]]:
    """Per model and strategy: library, model, strategy, leaves agreeing,
    bytes agreeing, and what differs (or why there is no row)."""
    try:
        import haiku  # noqa: F401
    except ImportError as error:
        return [[LIBRARY, "-", "-", "-", "-", f"skipped: dm-haiku is not installed ({error})"]]
    out = []
    for name, config in (("tiny (2 layers, 32 wide)", TINY), ("GPT-2-small sized", SMALL)):
        for strategy in MESHES:
            found = measure(config, strategy)
            out.append(
                [
                    f"{LIBRARY} {_version('dm-haiku')} (Megatron hand layout)",
                    name,
                    f"{strategy} on " + ",".join(f"{a}={n}" for a, n in MESHES[strategy].items()),
                    *found.cells(),
                ]
            )
    return out


def _version(distribution: str) -> str:
    from importlib.metadata import version

    return version(distribution)


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    for row in rows():
        print(row)
