"""How `suggest` lays out a decoder quantized by qwix, against the same
suggestion for the float decoder carried to the quantized forms.

qwix's post-training quantization turns each linear layer's `.../kernel` into
`kernel/array/qvalue` (the kernel's shape, an integer dtype) and
`kernel/array/scale`. `suggest` on the quantized tree should lay each `qvalue`
out as it lays the float kernel out, and each scale along the dimensions it
shares with its values: the rule file suggested for the float decoder, planned
against the quantized tree, is the reference (`sr.plan` carries a float rule
to its parameter's quantized forms). Compared leaf by leaf with
`_expert_layouts.agreement`. `rows()` is a table's rows; empty without qwix.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import jax

import shardrules as sr

HERE = Path(__file__).resolve().parent
SIZES = {"fsdp": 4, "model": 2}
STRATEGY = "fsdp+tp"


def _module(name: str) -> Any:
    found = sys.modules.get(name)
    if found is None:
        spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
        assert spec is not None and spec.loader is not None
        found = importlib.util.module_from_spec(spec)
        sys.modules[name] = found
        spec.loader.exec_module(found)
    return found


def _flat(state: Any) -> dict[str, jax.ShapeDtypeStruct]:
    """A tree's array leaves by their paths, as shapes."""
    from shardrules._interop._paths import leaf_paths

    leaves = jax.tree_util.tree_leaves(state)
    return {p: jax.ShapeDtypeStruct(x.shape, x.dtype) for p, x in zip(leaf_paths(state), leaves, strict=True)}


def measure(options: dict[str, Any]) -> tuple[str, Any]:
    """(the model's name, `Agreement`) for one quantization of the decoder."""
    models, layouts = _module("_models"), _module("_expert_layouts")
    quantized = models.nnx_qwix_decoder(**options)
    float_tree = _flat(models.nnx_qwix_decoder(quantize=False).params)
    tree = _flat(quantized.params)
    carried = layouts.suggested_specs(tree, sr.suggest(float_tree, SIZES, strategy=STRATEGY), SIZES)
    ours = layouts.suggested_specs(tree, sr.suggest(tree, SIZES, strategy=STRATEGY), SIZES)
    return quantized.name, layouts.agreement(tree, ours, carried, SIZES)


def rows() -> list[list[str]]:
    """One row per quantization: library, model, leaves agreeing / total,
    bytes agreeing / total, and the leaves that differ. Empty without qwix."""
    if importlib.util.find_spec("qwix") is None:
        return []
    out = []
    for options in ({}, {"weight_qtype": "int4", "tile_size": 16}):
        name, found = measure(options)
        mesh = ", ".join(f"{a}={n}" for a, n in SIZES.items())
        out.append(["qwix PTQ", name, f"{STRATEGY}, {mesh}", *found.cells()])
    return out


if __name__ == "__main__":
    for row in rows():
        print("| " + " | ".join(row) + " |")
