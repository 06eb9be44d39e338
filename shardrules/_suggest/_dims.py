"""Which dimension of each weight is which: the logical name of every dimension.

Names: `embed` (the hidden size), `heads` and `kv_heads` (attention heads,
queries' and keys'/values'), `mlp` (MLP hidden units), `vocab`, `experts`,
`norm` (a norm scale's hidden dimension), `conv` (a convolution's output
channels), `layers` (stacked layers), `None` (not split: head width, kernel
window, the experts a router scores).

A linear weight's hidden dimension is the one of the hidden size; when two
are (a square matrix), the weight's convention decides: `(out, in)` for
PyTorch's `weight`, `(in, out)` otherwise, so a column-parallel layer (q, k,
v, gate, up) reads its input and a row-parallel one (o, down) writes its
output there. Of the other dimensions, the first is split (heads before a
head's width in keras-hub, MaxText and penzai layouts; penzai's head groups
before the query heads in a group); stacked experts come first. A weight
with no dimension of the hidden size (a latent projection) is read by its
convention alone.
"""

from __future__ import annotations

import dataclasses

from . import _roles as R
from ._facts import Facts
from ._leaves import Kind

FEATURES = {
    R.Q: "heads",
    R.QKV: "heads",
    R.OUT: "heads",
    R.KV: "kv_heads",
    R.MLP_IN: "mlp",
    R.MLP_OUT: "mlp",
    R.EXPERT_IN: "mlp",
    R.EXPERT_OUT: "mlp",
    R.ROUTER: None,
}


@dataclasses.dataclass(frozen=True)
class Dims:
    """The logical name of each dimension; `heads`: how many heads the heads
    dimension holds (`None` where that cannot be told)."""

    names: tuple[str | None, ...]
    heads: int | None = None


def dims_of(kind: Kind, role: R.Role, facts: Facts, index: int) -> Dims | None:
    """The dimensions of `kind` in `role`, or `None` when its shape does not
    fit the role (it is then laid out by shape)."""
    stacked = facts.stacks.get(index, ())
    names: list[str | None] = ["layers" if i in stacked else None for i in range(kind.rank)]
    core = [i for i in range(kind.rank) if i not in stacked]
    shape, hidden = kind.shape, facts.hidden
    name = role.name
    if name == R.NORM:
        at = [i for i in core if shape[i] == hidden]
        if at:
            names[at[0]] = "norm"
        return Dims(tuple(names))
    if name == R.BIAS:
        return _bias(names, core, shape, role, facts)
    if name in (R.EMBEDDING, R.POSITIONS, R.LM_HEAD):
        if len(core) != 2:
            return None
        at = [i for i in core if shape[i] == hidden]
        if not at:
            return None
        embed = at[0] if name == R.LM_HEAD and not role.out_first else at[-1]
        names[embed] = "embed"
        if name != R.POSITIONS:
            names[next(i for i in core if i != embed)] = "vocab"
        return Dims(tuple(names))
    if name == R.CONV:
        if len(core) < 3:
            return None
        names[core[0] if role.out_first else core[-1]] = "conv"
        return Dims(tuple(names))
    if name not in R.LINEAR:
        return None
    if name in (R.EXPERT_IN, R.EXPERT_OUT) and not role.per_expert and len(core) >= 3:
        names[core[0]] = "experts"
        core = core[1:]
    if len(core) < 2:
        return None
    embed = _embed_dim(core, shape, hidden, column=name not in R.ROW, out_first=role.out_first)
    features = [i for i in core if i != embed]
    if name == R.KV and len(features) >= 3 and shape[features[0]] in (2, 3):
        features = features[1:]  # keys and values stacked in one weight (`kv_einsum`)
    if name == R.MLP_IN and len(features) == 2 and shape[features[0]] == 2:
        features = features[1:]  # gate and up stacked in one weight (`gating_einsum`)
    names[embed] = "embed"
    feature = FEATURES[name]
    heads = None
    if feature is not None:
        names[features[0]] = feature
        if feature in ("heads", "kv_heads"):
            heads = _heads(shape[features[0]], len(features) >= 2, feature, facts)
    return Dims(tuple(names), heads)


def _heads(size: int, separate: bool, feature: str, facts: Facts) -> int | None:
    """How many heads a heads dimension of `size` holds: `size` itself when a
    head's width is a dimension of its own; else by the head width, when it
    is known, or assumed for keys/values narrower than the queries (grouped
    heads, where too few of them to split is likely)."""
    if separate:
        return size
    known = not facts.head_dim_source.startswith("assumed")
    grouped = feature == "kv_heads" and 0 < size < facts.q_width
    if (known or grouped) and size % facts.head_dim == 0:
        return size // facts.head_dim
    return None


def _embed_dim(
    core: list[int], shape: tuple[int, ...], hidden: int | None, *, column: bool, out_first: bool
) -> int:
    at = [i for i in core if shape[i] == hidden]
    if len(at) == 1:
        return at[0]
    pool = at or core
    if column:  # the input: last of (out, in), first of (in, out)
        return pool[-1] if out_first else pool[0]
    return pool[0] if out_first else pool[-1]  # the output


def _bias(
    names: list[str | None], core: list[int], shape: tuple[int, ...], role: R.Role, facts: Facts
) -> Dims:
    """A bias: its experts (stacked) and, for a column-parallel layer, its
    output features split like the weight's; a dimension of the hidden size
    as the weights' `embed` (row-parallel layers' outputs)."""
    base = role.of
    if base == R.LM_HEAD and len(core) == 1:
        names[core[0]] = "vocab"
        return Dims(tuple(names))
    if (
        base in (R.EXPERT_IN, R.EXPERT_OUT, R.MLP_IN, R.MLP_OUT)
        and len(core) >= 2
        and shape[core[0]] != facts.hidden
    ):
        names[core[0]] = "experts"
        core = core[1:]
    if not core:
        return Dims(tuple(names))
    if base not in R.COLUMN:
        for i in core:
            if shape[i] == facts.hidden:
                names[i] = "embed"
                break
        return Dims(tuple(names))
    feature = FEATURES[base]
    assert feature is not None
    names[core[0]] = feature
    heads = (
        _heads(shape[core[0]], len(core) >= 2, feature, facts) if feature in ("heads", "kv_heads") else None
    )
    return Dims(tuple(names), heads)
