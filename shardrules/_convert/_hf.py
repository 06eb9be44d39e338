"""`convert_hf`: a transformers tensor-parallel plan as a rule file.

A plan (`base_model_tp_plan` in a model's config, or a `tp_plan` given to
`from_pretrained`) maps module or parameter names, with `*` for a layer's
number (`layers.*.self_attn.q_proj`), to a style. transformers looks a
parameter up by its own name, then by its module's name (`...q_proj.weight`
and `...q_proj.bias` under `layers.*.self_attn.q_proj`); a parameter no key
names is replicated. The style says which dimension of the parameter is split
over the tensor-parallel mesh axis, as transformers loads it:

- colwise styles: a weight's dimension -2 (`nn.Linear`'s output features),
  a bias's last;
- rowwise styles: a weight's last dimension (input features); a bias is
  replicated;
- `embedding_rowwise`: dimension 0 (the vocabulary), `embedding_colwise`:
  dimension 1 (the hidden size); `grouped_gemm`: dimension 0 (the experts);
- styles that only change the forward pass's communication: replicated.

Packed styles (gate and up projections interleaved in one weight) and `local`
(weights divided by the mesh size) have no `PartitionSpec`: reported. Keys
match at any depth (after the base model's `model.`, or an optimizer state's
path), with `.` or `/` between names.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from ._common import Conversion, SourceError, check_count, finish, is_name, pattern_literal, read_text, shown
from ._documents import parse_json

_COLWISE = ("(..., {a}, _)", "(..., {a})", None)
_ROWWISE = ("(..., {a})", "replicated", None)
_REPLICATED = ("replicated", "replicated", None)

STYLES: dict[str, tuple[str, str, str | None]] = {
    "colwise": _COLWISE,
    "colwise_rep": _COLWISE,
    "colwise_gather_output": _COLWISE,
    "local_colwise": _COLWISE,
    "rowwise": _ROWWISE,
    "rowwise_rep": _ROWWISE,
    "rowwise_split_input": _ROWWISE,
    "local_rowwise": _ROWWISE,
    "embedding_rowwise": ("({a}, ...)", "({a}, ...)", None),
    "embedding_colwise": ("(_, {a}, ...)", "(..., {a})", None),
    "grouped_gemm": ("({a}, ...)", "({a}, ...)", None),
    "replicate": _REPLICATED,
    "replicated_with_grad_allreduce": _REPLICATED,
    "gather": _REPLICATED,
    "all_reduce": _REPLICATED,
    "all_reduce_output": _REPLICATED,
    "ep_router": _REPLICATED,
    "megamoe_router": _REPLICATED,
    "moe_tp_experts": _REPLICATED,
    "megamoe_experts": _REPLICATED,
    "moe_identity_expert": _REPLICATED,
    "mla_kv_a_proj": _REPLICATED,
    "sequence_parallel": (
        "replicated",
        "replicated",
        "its parameters are replicated (converted), but it also splits the module's input and output "
        "over the sequence dimension: an activation layout, not converted (write it in `rules activations:`)",
    ),
}
"""Style → (a weight's spec, a bias's spec, a note), `{a}` standing for the axis."""

UNCONVERTIBLE = {
    "packed_colwise": "splits gate and up projections packed in one weight, each device holding a slice "
    "of each half: no PartitionSpec describes that",
    "packed_rowwise": "splits gate and up projections packed in one weight along its last dimension, each "
    "device holding a slice of each half: no PartitionSpec describes that",
    "local_packed_rowwise": "splits packed weights as `packed_rowwise` does: no PartitionSpec describes that",
    "local": "divides each weight by the mesh size on every device: a change of values, not a layout",
}


def convert_hf(
    plan: str | os.PathLike[str] | Mapping[str, Any], *, axis: str = "model", source: str | None = None
) -> Conversion:
    """Convert a transformers tensor-parallel plan to a rule file.

    **Arguments:**

    - `plan`: the path of a JSON file holding the plan (an object mapping
      module names to styles, or a model's `config.json` with a
      `base_model_tp_plan`), or that object already read.
    - `axis`: the mesh axis tensor parallelism splits over.
    - `source`: what to call the plan in the provenance comment (default: the
      path, or `<plan>`).

    **Returns:** a `Conversion`: `mesh AXIS`, a rule per plan key (and one
    for its `bias` where a bias is laid out differently), most specific keys
    first, and `default -> replicated` (parameters no key names).

    **Raises:** `FileNotFoundError` or `OSError` for a file that cannot be
    read; `ValueError` for one that is not JSON (or nested too deeply),
    holds no plan or more than 10,000 entries, or an `axis` that cannot be a
    mesh axis name.
    """
    if not is_name(axis):
        raise SourceError(f"--axis {shown(axis)}: not a mesh axis name (letters, digits and _)")
    if isinstance(plan, (str, os.PathLike)):
        where = source or os.fspath(plan)
        return from_document(parse_json(read_text(plan, "a JSON tensor-parallel plan"), where), axis, where)
    return from_document(plan, axis, source or "<plan>")


def from_document(data: Any, axis: str, where: str) -> Conversion:
    """`convert_hf` of a JSON document already read (`data`: whatever it
    holds; `where`: the source, for messages and the provenance comment)."""
    if not is_name(axis):
        raise SourceError(f"--axis {shown(axis)}: not a mesh axis name (letters, digits and _)")
    styles, what = _plan_of(data, where)
    notes: list[str] = []
    entries: list[tuple[int, int, list[str]]] = []  # (segments, order, rule lines)
    for order, (key, style) in enumerate(styles.items()):
        lines = _rules_for(key, style, axis, notes)
        if lines:
            entries.append((len(key.split(".")), order, lines))
    body = [f"mesh {axis}", "", "rules params:"]
    for _, _, lines in sorted(entries, key=lambda e: (-e[0], e[1])):
        body += ["  " + line for line in lines]
    body.append("  default -> replicated")
    read = [
        f"Read: {what} ({len(styles)} keys); its styles split parameters over the mesh axis `{axis}`.",
        "A key matches a module (its parameters) or a parameter, `*` any layer number, at any depth.",
    ]
    if isinstance(data, Mapping) and data.get("base_model_ep_plan") and what != "base_model_ep_plan":
        read.append("Not read: base_model_ep_plan (the plan for expert parallelism).")
    return finish("hf", where, read, body, notes)


def _plan_of(data: Any, where: str) -> tuple[dict[str, str], str]:
    """The plan `data` holds and what it is called."""
    if not isinstance(data, Mapping):
        raise SourceError(
            f"{where}: expected a JSON object (a plan or a config.json), got {type(data).__name__}"
        )
    for key in ("base_model_tp_plan", "tp_plan"):
        if key in data and not isinstance(data[key], str):
            plan, what = data[key], key
            break
    else:
        plan, what = data, "the tensor-parallel plan"
        if not data or not all(isinstance(v, str) for v in data.values()):
            raise SourceError(
                f"{where}: no tensor-parallel plan: expected an object of module name -> style, or a "
                "config.json holding `base_model_tp_plan`"
            )
    if not isinstance(plan, Mapping):
        raise SourceError(f"{where}: {what} is {shown(plan)}, not an object of module name -> style")
    check_count(len(plan), where, f"entries in {what}")
    bad = [
        f"{shown(k)}: {shown(v)}" for k, v in plan.items() if not isinstance(k, str) or not isinstance(v, str)
    ]
    if bad:
        more = f" and {len(bad) - 5:,} more" if len(bad) > 5 else ""
        raise SourceError(f"{where}: {what}: entries that are not name -> style: {', '.join(bad[:5])}{more}")
    return dict(plan), what


def _rules_for(key: str, style: str, axis: str, notes: list[str]) -> list[str]:
    """The rule lines for one plan key (none, with a note, if it does not convert)."""
    if style in UNCONVERTIBLE:
        notes.append(
            f"`{shown(key)}`: {style} {UNCONVERTIBLE[style]}; its parameters fall to the rules below"
        )
        return [f"# {pattern_literal(_pattern(key))} -> ?  # {style}: not converted"]
    if style not in STYLES:
        known = ", ".join(sorted([*STYLES, *UNCONVERTIBLE]))
        notes.append(
            f"`{shown(key)}`: unknown style {shown(repr(style))} (known: {known}); its parameters fall to the "
            "rules below"
        )
        return [f"# {pattern_literal(_pattern(key))} -> ?  # {shown(style)}: unknown style"]
    dead = _never_matches(key)
    if dead:
        notes.append(f"`{shown(key)}`: {dead}, so it never applies in transformers; not converted")
        return [f"# {pattern_literal(_pattern(key))} -> ?  # {style}: never applies"]
    weight, bias, note = STYLES[style]
    if note:
        notes.append(f"`{shown(key)}`: {style}: {note}")
    lines = []
    if bias != weight and key.rsplit(".", 1)[-1] != "bias":
        lines.append(f"{pattern_literal(_pattern(key, 'bias'))} -> {bias.format(a=axis)}  # {style}")
    last = bias if key.rsplit(".", 1)[-1] == "bias" else weight
    lines.append(f"{pattern_literal(_pattern(key, None))} -> {last.format(a=axis)}  # {style}")
    return lines


def _never_matches(key: str) -> str | None:
    """Why transformers never finds `key`, or `None`: it looks a parameter up
    with each whole number between dots read as `*`."""
    if re.search(r"\.\d+(\.|$)", key):
        return "it names a layer by its number (transformers reads layer numbers as `*`)"
    if any("*" in part and part != "*" for part in key.split(".")):
        return "it has `*` inside a name (`*` stands for a whole layer number)"
    return None


def _pattern(key: str, param: str | None = None) -> str:
    """The regular expression for the parameters `key` names: the key itself (a
    parameter) or a parameter of it (a module) when `param` is `None`, else
    only its parameter `param`; at any depth, `.` or `/` between names."""
    parts = [r"\d+" if part == "*" else re.escape(part) for part in key.split(".")]
    body = "(^|[./])" + "[./]".join(parts)
    return body + (rf"[./]{re.escape(param)}$" if param else r"([./][^./]+)?$")
