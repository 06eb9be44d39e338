"""What the shapes tell about the model as a whole: its hidden size, which
dimensions are stacked layers, how many experts, how wide a head is.

- **Hidden size**: the commonest size of the norm scales (of a stacked one,
  its larger dimension); in a model without norms, the size found in the
  most weights (each counted once per leaf); between equal counts, the
  larger (a layer count or a head width is smaller than the hidden size).
- **Stacked layers** (`jax.lax.scan` over a layer stack, `nnx.vmap`,
  `eqx.filter_vmap`): a norm scale with two dimensions, one of the hidden
  size, shows where the stack's dimension is (first in Flax and Equinox
  stacks, second in MaxText's with `param_scan_axis: 1`) and how long it is;
  every leaf beside it (under the same path prefix) with that size there is
  stacked the same way.
- **Stacked experts**: an expert weight (or any MLP weight, whatever its
  container is called) with a third dimension before its two.
- **Head width** (to count the heads of a `(heads × head_dim, hidden)` weight,
  for grouped-query attention): given, else the size of a per-head norm
  (`q_norm`) or of a weight's separate head dimension, else 128 (assumed, and
  the rule file says so) where it divides the attention projections' widths,
  else the widest under 128 that does (a 64-wide query projection cannot
  hold 128-wide heads).
"""

from __future__ import annotations

import collections
import dataclasses
import math

from . import _roles as R
from ._leaves import Kind

DEFAULT_HEAD_DIM = 128
ROUTER_MAX_EXPERTS = 1024
"""A `gate` weight this narrow (besides the hidden size) is a router, not an MLP gate."""


@dataclasses.dataclass
class Facts:
    hidden: int | None
    stacks: dict[int, tuple[int, ...]]  # kind index → its stacked (layer) dimensions
    layers: int | None  # how many layers are stacked or numbered
    head_dim: int
    head_dim_source: str  # "given", "from q_norm", "from a head dimension", "assumed..."
    experts: int | None
    roles: list[R.Role | None]
    q_width: int = 0  # the widest query projection's output (to see grouped-query keys/values)
    notes: list[str] = dataclasses.field(default_factory=list)


def facts_of(kinds: list[Kind], head_dim: int | None = None) -> Facts:
    roles = [R.role_of(k.lower) for k in kinds]
    hidden = _hidden(kinds, roles)
    stacks, layers = _stacks(kinds, roles, hidden)
    roles = [_settle_gate(k, r, hidden) for k, r in zip(kinds, roles, strict=True)]
    roles = _settle_linears(kinds, roles, hidden, stacks)
    roles = [
        _settle_experts(k, r, hidden, stacks.get(i, ()))
        for i, (k, r) in enumerate(zip(kinds, roles, strict=True))
    ]
    experts = _experts(kinds, roles, hidden, stacks)
    if head_dim is not None:
        width, source = head_dim, "given"
    else:
        width, source = _head_dim(kinds, roles, hidden, stacks)
    if layers is None:
        numbered = [k.count for k, r in zip(kinds, roles, strict=True) if r is not None and r.name == R.OUT]
        layers = sum(numbered) or None
    q_width = max(
        (max(k.shape) for k, r in zip(kinds, roles, strict=True) if r is not None and r.name == R.Q),
        default=0,
    )
    return Facts(hidden, stacks, layers, width, source, experts, roles, q_width)


def _hidden(kinds: list[Kind], roles: list[R.Role | None]) -> int | None:
    """The hidden size: the commonest size of the norm scales (a stacked scale's
    larger dimension), else the size found in the most weights."""
    norms: collections.Counter[int] = collections.Counter()
    weights: collections.Counter[int] = collections.Counter()
    for kind, role in zip(kinds, roles, strict=True):
        if role is not None and role.name == R.NORM and kind.rank <= 2:
            norms[max(kind.shape)] += kind.count
        elif kind.rank >= 2 and (role is None or role.name != R.BIAS):
            for size in set(kind.shape):
                weights[size] += kind.count
    votes = norms or weights
    if not votes:
        return None
    return max(votes, key=lambda size: (votes[size], size))


def _stacks(
    kinds: list[Kind], roles: list[R.Role | None], hidden: int | None
) -> tuple[dict[int, tuple[int, ...]], int | None]:
    """Which dimensions of each kind are stacked layers, and how many layers."""
    found: dict[tuple[str, ...], tuple[int, int]] = {}  # path prefix → (position, layers)
    for kind, role in zip(kinds, roles, strict=True):
        if role is None or role.name != R.NORM or kind.rank != 2 or hidden is None:
            continue
        others = [i for i, size in enumerate(kind.shape) if size != hidden]
        if len(others) != 1:
            continue
        where = _module_at(kind.lower)
        found.setdefault(kind.tokens[:where], (others[0], kind.shape[others[0]]))
    out: dict[int, tuple[int, ...]] = {}
    layers = None
    for index, kind in enumerate(kinds):
        for prefix, (position, size) in found.items():
            if (
                kind.tokens[: len(prefix)] == prefix
                and len(kind.tokens) > len(prefix)
                and kind.rank > position
                and kind.shape[position] == size
                and (kind.rank >= 2)
            ):
                out[index] = (position,)
                layers = size
                break
    return out, layers


def _module_at(tokens: tuple[str, ...]) -> int:
    """Where the norm module's own name starts in a norm's path."""
    for i in range(len(tokens) - 1, -1, -1):
        if R._NORM.search(tokens[i]):
            return i
    return max(len(tokens) - 1, 0)


def _settle_gate(kind: Kind, role: R.Role | None, hidden: int | None) -> R.Role | None:
    """`mlp.gate` is a router when its other dimension is narrow (the experts)."""
    if role is None or role.name != R.GATE:
        return role
    rest = [s for s in kind.shape if s != hidden]
    name = R.ROUTER if rest and max(rest) <= ROUTER_MAX_EXPERTS else R.MLP_IN
    return dataclasses.replace(role, name=name)


def _settle_linears(
    kinds: list[Kind], roles: list[R.Role | None], hidden: int | None, stacks: dict[int, tuple[int, ...]]
) -> list[R.Role | None]:
    """The linears of an MLP block named by their kind alone (`mlp/linear_0`,
    `mlp/linear`) as the MLP's in (gate/up) or out (down), and their biases
    as their weights (a bias with no weight beside it: out if it is of the
    hidden size, else in)."""
    settled: dict[tuple[str, ...], str | None] = {}
    out = list(roles)
    for index, (kind, role) in enumerate(zip(kinds, roles, strict=True)):
        if role is not None and role.name == R.MLP_LINEAR:
            name = _linear_way(kind, role, hidden, stacks.get(index, ()))
            out[index] = None if name is None else dataclasses.replace(role, name=name)
            lower = kind.lower
            settled[lower[:-1] if lower[-1] in R._PARAMS else lower] = name
    for index, (kind, role) in enumerate(zip(kinds, roles, strict=True)):
        if role is not None and role.name == R.BIAS and role.of == R.MLP_LINEAR:
            core = [s for i, s in enumerate(kind.shape) if i not in stacks.get(index, ())]
            guess = R.MLP_OUT if core and core[-1] == hidden else R.MLP_IN
            out[index] = dataclasses.replace(role, of=settled.get(kind.lower[:-1], guess))
    return out


def _linear_way(kind: Kind, role: R.Role, hidden: int | None, stacked: tuple[int, ...]) -> str | None:
    """In or out: the side of the hidden size (the other not of it); else, for
    a block of another width (a vision tower beside a text model), in where
    it widens and out where it narrows. A square weight: `None` (unknown)."""
    core = [s for i, s in enumerate(kind.shape) if i not in stacked]
    if len(core) < 2:
        return None
    inputs, outputs = (core[-1], core[-2]) if role.out_first else (core[-2], core[-1])
    if (inputs == hidden) != (outputs == hidden):
        return R.MLP_OUT if outputs == hidden else R.MLP_IN
    if inputs == outputs:
        return None
    return R.MLP_IN if outputs > inputs else R.MLP_OUT


def _settle_experts(
    kind: Kind, role: R.Role | None, hidden: int | None, stacked: tuple[int, ...]
) -> R.Role | None:
    """An MLP weight with a third dimension ahead of its two (stacked layers
    aside) holds stacked experts, whatever its container is called."""
    if role is None or role.name not in (R.MLP_IN, R.MLP_OUT) or role.per_expert:
        return role
    core = [s for i, s in enumerate(kind.shape) if i not in stacked]
    if role.name == R.MLP_IN and len(core) == 3 and core[0] == 2 and hidden in core[1:]:
        return role  # gate and up in one weight (Gemma's `gating_einsum`), not two experts
    if len(core) >= 3 and core[0] != hidden:
        return dataclasses.replace(role, name=R.EXPERT_IN if role.name == R.MLP_IN else R.EXPERT_OUT)
    return role


def _experts(
    kinds: list[Kind], roles: list[R.Role | None], hidden: int | None, stacks: dict[int, tuple[int, ...]]
) -> int | None:
    for index, (kind, role) in enumerate(zip(kinds, roles, strict=True)):
        if role is not None and role.name in (R.EXPERT_IN, R.EXPERT_OUT) and not role.per_expert:
            core = [s for i, s in enumerate(kind.shape) if i not in stacks.get(index, ())]
            if len(core) >= 3:
                return core[0]
    for kind, role in zip(kinds, roles, strict=True):
        if role is not None and role.name == R.ROUTER:
            rest = [s for s in kind.shape if s != hidden]
            if rest:
                return rest[-1] if len(rest) == 1 else rest[0]
    return None


def _head_dim(
    kinds: list[Kind], roles: list[R.Role | None], hidden: int | None, stacks: dict[int, tuple[int, ...]]
) -> tuple[int, str]:
    for kind, role in zip(kinds, roles, strict=True):
        if role is not None and role.name == R.NORM and any(t in ("q_norm", "k_norm") for t in kind.lower):
            return kind.shape[-1], "from q_norm"
    for index, (kind, role) in enumerate(zip(kinds, roles, strict=True)):
        if role is None or role.name not in (R.Q, R.KV, R.OUT):
            continue
        core = [s for i, s in enumerate(kind.shape) if i not in stacks.get(index, ())]
        if len(core) >= 3:  # (heads, hidden, head_dim), (hidden, heads, head_dim): the last non-hidden
            rest = [s for s in core if s != hidden]
            if rest:
                return rest[-1], "from a head dimension"
    widths = _projection_widths(kinds, roles, hidden, stacks)
    if all(w % DEFAULT_HEAD_DIM == 0 for w in widths):
        return DEFAULT_HEAD_DIM, "assumed"
    common = math.gcd(*widths)
    width = max(w for w in range(1, DEFAULT_HEAD_DIM + 1) if common % w == 0)
    return width, f"assumed: the widest up to {DEFAULT_HEAD_DIM} that divides the attention projections"


def _projection_widths(
    kinds: list[Kind], roles: list[R.Role | None], hidden: int | None, stacks: dict[int, tuple[int, ...]]
) -> list[int]:
    """The heads-times-head-width sizes of the attention projections whose
    heads and head width are one dimension (`(heads × head_dim, hidden)`)."""
    out = []
    for index, (kind, role) in enumerate(zip(kinds, roles, strict=True)):
        if role is None or role.name not in (R.Q, R.KV, R.QKV, R.OUT):
            continue
        core = [s for i, s in enumerate(kind.shape) if i not in stacks.get(index, ())]
        if len(core) != 2:
            continue
        rest = [s for s in core if s != hidden]
        if len(rest) <= 1:
            out.append(rest[0] if rest else core[0])
    return out
