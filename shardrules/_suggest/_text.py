"""The drafted rule file as text: a header saying what was read and chosen,
the `mesh` line with sizes, one alias per logical role, the parameters'
rules (each with what it covers), what was left to `default`, and the inputs.
"""

from __future__ import annotations

import math
import re
import textwrap
from typing import Any

from .._planning._plan import format_bytes, plural
from . import _largest as L
from . import _roles as R
from ._draft import Draft
from ._leaves import Kind
from ._strategy import Layout, target_text

WIDTH = 100
MAX_LISTED = 200
"""The most kinds of leaves listed one by one in a comment (the rest are counted)."""

ALIAS_COMMENTS = {
    "batch": "the leading (batch) dimension of every input",
    "embed": "the hidden size of weights",
    "heads": "attention heads",
    "mlp": "MLP hidden units (and experts' own)",
    "vocab": "the vocabulary of the embedding and the output head",
    "experts": "stacked experts: expert parallelism",
    "norm": "norm scales (as MaxText's `norm` rule)",
}
LABELS = {
    "embedding": "token embedding",
    "positions": "position embedding",
    "attn_out": "attention output",
    "expert_in": "experts in (gate/up)",
    "expert_out": "experts out (down)",
    "router": "MoE router",
    "mlp_in": "MLP in (gate/up)",
    "mlp_out": "MLP out (down)",
    "lm_head": "output head",
    "conv": "convolutions",
    "bias": "biases",
    "norm": "norms",
    "shape": "not recognised by name",
}


def counted(n: int, noun: str) -> str:
    """`counted(69975, "array")` → `"69,975 arrays"`."""
    return plural(n, noun).replace(str(n), f"{n:,}", 1)


def one_line(text: str) -> str:
    """`text` with unprintable characters escaped, fit for a comment."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def literal(regex: str) -> str:
    """`regex` as a rule-file string: a quote escaped, nothing else changed."""
    return '"' + regex.replace('"', '\\"') + '"'


def shown_key(kind: Kind) -> str:
    return one_line(kind.key)


def label(rule: Draft, layout: Layout) -> str:
    if rule.family == "attn":
        roles = rule.roles
        base = (
            "attention q/k/v"
            if R.QKV in roles or {R.Q, R.KV} <= roles
            else "attention queries"
            if R.Q in roles
            else "attention keys/values"
        )
    else:
        base = LABELS[rule.family]
    if layout.fsdp_dim == "largest":  # split for storage only: no parallel layout to name
        return base
    split = rule.entries is not None and any(
        e == layout.names[r] and layout.axes(r) for e in rule.entries for r in ("heads", "mlp")
    )
    if split and rule.family in ("attn", "mlp_in", "expert_in"):
        base += ", column-parallel"
    elif split and rule.family in ("attn_out", "mlp_out", "expert_out"):
        base += ", row-parallel"
    elif rule.family in ("embedding", "lm_head") and rule.entries and layout.names["vocab"] in rule.entries:
        base += ", vocab-parallel" if layout.axes("vocab") else ""
    elif rule.family == "embedding" and rule.entries and layout.axes("vocab"):
        base += ", vocabulary whole"
    return base


def covers(indices: list[int], kinds: list[Kind]) -> str:
    count = sum(kinds[i].count for i in indices)
    return f"{counted(count, 'array')}, {format_bytes(sum(kinds[i].nbytes for i in indices))}"


_SIZE = re.compile(r"(\d) (B|KiB|MiB|GiB|TiB|PiB|EiB)\b")
_SPEC = re.compile(r"`\([^`]*\)`")


def comment_lines(text: str, indent: str = "") -> list[str]:
    """`text` as comment lines of at most `WIDTH` characters (a size and its unit, and a spec
    in backticks, on one line)."""
    width = WIDTH - len(indent) - 2
    kept = _SIZE.sub(lambda m: m.group(1) + "\0" + m.group(2), one_line(text))
    kept = _SPEC.sub(lambda m: m.group(0).replace(" ", "\0"), kept)
    lines = textwrap.wrap(kept, width, break_long_words=False, break_on_hyphens=False)
    return [f"{indent}# {line}".replace("\0", " ") for line in lines]


def alias_lines(layout: Layout, used: set[str], sizes: dict[str, int]) -> list[str]:
    out = []
    for role, name in layout.names.items():
        if role != "batch" and name not in used:
            continue
        alternatives = layout.targets.get(role, ((),))
        comment = ALIAS_COMMENTS[role]
        if role != "batch" and not any(alternatives):
            comment += f": not split ({layout.strategy})"
        out.append(f"alias {name} = {target_text(alternatives)}  # {comment}")
    return out


def fallback_lines(
    unknown: list[int], moved: dict[int, str], kinds: list[Kind], specs: dict[int, str]
) -> list[str]:
    """The comment above `default`: each kind of leaf it lays out (`moved`:
    recognised ones, with their role and why)."""
    if not unknown and not moved:
        return ["  # No leaf is left to `default` now; it lays out leaves added later by their shape."]
    out = []
    if moved:
        count = sum(kinds[i].count for i in moved)
        out += comment_lines(f"Recognised, but laid out by shape ({counted(count, 'array')}):", "  ")
        out += [
            _listed(i, kinds, specs, f" ({moved[i]})") for i in sorted(moved, key=lambda i: -kinds[i].nbytes)
        ]
    if unknown:
        count = sum(kinds[i].count for i in unknown)
        out.append(
            f"  # Not recognised by name ({counted(count, 'array')}; `*` is any layer or expert number):"
        )
        for i in sorted(unknown, key=lambda i: -kinds[i].nbytes)[:MAX_LISTED]:
            out.append(_listed(i, kinds, specs, ""))
        if len(unknown) > MAX_LISTED:
            out.append(f"  #   and {len(unknown) - MAX_LISTED} more kinds of leaves")
    return out


def _listed(i: int, kinds: list[Kind], specs: dict[int, str], why: str) -> str:
    kind = kinds[i]
    times = f" x{kind.count}" if kind.count > 1 else ""
    return f"  #   {shown_key(kind)} {kind.shape} {kind.dtype}{times} -> {specs[i]}{why}"


def mesh_line(sizes: dict[str, int]) -> str:
    return "mesh " + ", ".join(f"{name}={size}" for name, size in sizes.items())


def devices(sizes: dict[str, int]) -> int:
    return math.prod(sizes.values())


def budget_lines(
    kinds: list[Kind], need: int, budget: int, per_device: dict[int, int], specs: dict[int, str]
) -> list[str]:
    """The header's lines on a budget: met, or what each device holds most of."""
    if need <= budget:
        return comment_lines(f"Within the budget of {format_bytes(budget)} per device.")
    lines = comment_lines(
        f"Over the budget of {format_bytes(budget)} per device by {format_bytes(need - budget)}; "
        "what each device holds most of (all leaves of a kind):"
    )
    for i in sorted(per_device, key=lambda i: -per_device[i])[:5]:
        kind = kinds[i]
        whole = " (whole: no dimension splits)" if specs[i].count("None") == kind.rank else ""
        lines.append(
            f"#   {shown_key(kind)} {kind.shape} x{kind.count}: {specs[i]}, "
            f"{format_bytes(per_device[i])}{whole}"
        )
    lines += comment_lines("A bigger mesh, or a strategy that splits more of the weights, lowers it.")
    return lines


def header(
    kinds: list[Kind],
    facts: Any,
    layout: Layout,
    sizes: dict[str, int],
    total: int,
    need: int,
    budget: int | None,
    per_device: dict[int, int],
    specs: dict[int, str],
    idle: list[str],
) -> list[str]:
    """The comment lines heading the file: what was drafted, read and chosen
    (`idle`: the mesh axes that split no weight of the draft)."""
    n = devices(sizes)
    arrays = sum(k.count for k in kinds)
    chosen = layout.strategy + (f" (auto: {layout.why})" if layout.why else "")
    lines = comment_lines(
        f"Drafted by `shardrules suggest`, strategy {chosen}, for {counted(arrays, 'array')} "
        f"({format_bytes(total)}) on {', '.join(f'{a}={s}' for a, s in sizes.items())}: "
        f"{format_bytes(need)} per device, against {format_bytes(total // n)} for an even split "
        f"over {counted(n, 'device')}."
    )
    split = {
        a
        for role, alternatives in layout.targets.items()
        if role != "batch"
        for alt in alternatives
        for a in alt
    }
    copies = [f"{a}={s}" for a, s in sizes.items() if s > 1 and (a not in split or a in idle)]
    if layout.narrowed:
        lines += comment_lines(layout.narrowed[0].upper() + layout.narrowed[1:] + ".")
    if layout.fsdp_dim == "largest":
        lines += comment_lines(L.header(layout, sizes, layout.min_bytes))
    if copies and layout.strategy != "dp":
        lines += comment_lines(
            f"{', '.join(copies)} {'holds' if len(copies) == 1 else 'hold'} whole copies of the weights "
            "(data parallelism): it splits the batch only."
        )
    read = [f"hidden size {facts.hidden}" if facts.hidden else "no hidden size found"]
    if facts.layers:
        stacked = "stacked" if facts.stacks else "numbered"
        read.append(f"{facts.layers} layers ({stacked})")
    if facts.experts:
        read.append(f"{facts.experts} experts")
    if any(r is not None and r.name in (R.Q, R.KV, R.QKV) for r in facts.roles):
        source = facts.head_dim_source
        if source.startswith("assumed"):
            source += "; set head_dim to change"
        read.append(f"heads {facts.head_dim} wide ({source})")
    lines += comment_lines("Read from the paths and shapes: " + "; ".join(read) + ".")
    if budget is not None:
        lines += budget_lines(kinds, need, budget, per_device, specs)
    lines += comment_lines(
        "Check each rule against the model, then run `shardrules lint` on this file in CI."
    )
    return lines
