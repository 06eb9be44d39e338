"""The layout JAX's transpose rule gives a contraction's cotangent: its primal operand's.

On Explicit axes, the gradient of `dot_general(x, y)` with respect to `y` is
another `dot_general` (of `x` and the output's cotangent) whose `out_sharding`
JAX's transpose rule sets to `y`'s own layout, dimensions permuted to the
order that contraction produces (a `transpose` then puts them in `y`'s). The
function is traced once with every value replicated (`_scopes`), so in the
trace that layout is replicated, and says nothing: left alone, the cotangent's
layout would be inferred forwards from its operands, which can differ from
`y`'s, and the update `y - lr * g` then mixes two layouts JAX cannot reconcile
(SR117 with `strict`).

This is done for the cotangents of arguments (`arguments_of`: the step's
parameters, a loop body's operands, and their casts), which an optimizer
update meets with the argument itself. An activation's cotangent only flows on
into the gradient's next operations, and keeps the inferred layout, which may
split it over more axes than the activation itself (an MoE's expert buffers
over the expert axis its operands carry).

`Partners` keeps, for each value a forward contraction uses, that contraction;
`primal_layout` finds, for a gradient's contraction whose traced
`out_sharding` says nothing (`is_transposed`), the forward
contraction it transposes (they share an operand, and its other operand is
the forward result's cotangent, of that result's shape) and gives the spec of
the other forward operand, in the gradient contraction's dimension order. Where
the match is not exact (shapes, dimensions that do not map one to one), it
gives `None` and the layout is inferred as before.
"""

from __future__ import annotations

from typing import Any

from jax.sharding import PartitionSpec

from .._pspec import cotangent, entries, with_entries
from ._explicit import spec_of
from ._layouts import source_line
from ._outputs import forward_path
from ._propagate import axes_of

Partners = dict[Any, list[Any]]
"""A value (a jaxpr variable) → the forward `dot_general`s that take it as an operand."""

KEEP_LAYOUT = {"convert_element_type", "copy", "copy_p", "reduce_precision"}
"""Operations whose result is laid out as their operand: a weight cast to bfloat16 is still the weight."""


def arguments_of(jaxpr: Any) -> set[Any]:
    """The variables of `jaxpr` that are its arguments (a step's parameters
    and batch, a loop body's or inlined call's operands), before `passed_on`
    adds their casts."""
    return set(jaxpr.invars)


def passed_on(arguments: set[Any], eqn: Any) -> None:
    """Add `eqn`'s result to `arguments` where it is an argument cast or copied."""
    if eqn.primitive.name in KEEP_LAYOUT and eqn.invars and eqn.invars[0] in arguments:
        arguments.update(eqn.outvars)


def remember(partners: Partners, eqn: Any) -> None:
    """Record a forward `dot_general` under each of its operand variables."""
    for var in eqn.invars[:2]:
        if hasattr(var, "aval") and not hasattr(var, "val"):  # a variable, not a literal
            partners.setdefault(var, []).append(eqn)


def is_transposed(eqn: Any) -> bool:
    """Whether `eqn`, a gradient's equation, is a `dot_general` whose traced
    `out_sharding` says nothing: the replicated layout the transpose rule
    copies from a primal traced replicated (JAX 0.10 and later), or none
    (JAX 0.8, whose rule copies only a sharded one)."""
    if eqn.primitive.name != "dot_general":
        return False
    spec = getattr(eqn.params.get("out_sharding"), "spec", None)
    return spec is None or not axes_of(spec)


def primal_layout(eqn: Any, partners: Partners, read: Any, arguments: set[Any]) -> PartitionSpec | None:
    """The spec, in `eqn`'s result order, of the forward operand whose
    cotangent `eqn` computes (`read`: a variable's current value), where that
    operand is one of `arguments` (a parameter, not an activation), or `None`.

    Several forward contractions may fit (one input feeding `h @ wq` and
    `h @ wk` of one shape): those made by the same line of the model's code,
    in the same scope, as `eqn` are preferred; where the candidates left
    give different layouts, `None` (inferred, as before)."""
    p, q = eqn.invars[:2]
    found: list[tuple[bool, PartitionSpec]] = []
    for shared, ct, shared_is_p in ((p, q, True), (q, p, False)):
        for forward in partners.get(shared, ()):
            if forward is eqn or tuple(forward.outvars[0].aval.shape) != tuple(ct.aval.shape):
                continue
            dims = _mapping(eqn, forward, shared, shared_is_p)
            if dims is None:
                continue
            other = forward.invars[1] if forward.invars[0] is shared else forward.invars[0]
            if other not in arguments:
                continue
            shape, out = tuple(other.aval.shape), tuple(eqn.outvars[0].aval.shape)
            if sorted(dims) != list(range(len(shape))) or any(out[i] != shape[d] for i, d in enumerate(dims)):
                continue
            value = read(other)
            if not hasattr(value, "shape"):
                continue
            spec = spec_of(value)
            have = entries(spec)
            laid = cotangent(with_entries(spec, (have[d] for d in dims)))  # reduced: unreduced
            found.append((_same_origin(eqn, forward), laid))
    if any(same for same, _ in found):
        found = [f for f in found if f[0]]
    specs = {spec for _, spec in found}
    return specs.pop() if len(specs) == 1 else None


def _same_origin(eqn: Any, forward: Any) -> bool:
    """Whether `eqn` and `forward` come from one line of the model's code, in one scope."""
    line = source_line(eqn)
    return bool(line) and line == source_line(forward) and forward_path(eqn) == forward_path(forward)


def _mapping(eqn: Any, forward: Any, shared: Any, shared_is_p: bool) -> list[int] | None:
    """For each dimension of `eqn`'s result, the dimension of the forward
    operand other than `shared` it stands for, or `None` where one does not
    map (see the module's docstring)."""
    (fa_c, fb_c), (fa_b, fb_b) = forward.params["dimension_numbers"]
    if forward.invars[0] is shared and forward.invars[1] is shared:
        return None
    s_is_a = forward.invars[0] is shared
    s_c, o_c = (fa_c, fb_c) if s_is_a else (fb_c, fa_c)
    s_b, o_b = (fa_b, fb_b) if s_is_a else (fb_b, fa_b)
    a_rank, b_rank = (len(v.aval.shape) for v in forward.invars[:2])
    n_batch = len(fa_b)
    a_free = [d for d in range(a_rank) if d not in fa_c and d not in fa_b]
    b_free = [d for d in range(b_rank) if d not in fb_c and d not in fb_b]
    o_free = b_free if s_is_a else a_free
    o_start = n_batch + (
        len(a_free) if s_is_a else 0
    )  # where the other operand's free dims are in the output

    def from_shared(d: int, batch: bool) -> int | None:
        if batch:
            return o_b[list(s_b).index(d)] if d in s_b else None
        return o_c[list(s_c).index(d)] if d in s_c else None

    def from_ct(d: int, batch: bool) -> int | None:
        if batch:
            return o_b[d] if d < n_batch else None
        k = d - o_start
        return o_free[k] if 0 <= k < len(o_free) else None

    (pc, qc), (pb, qb) = eqn.params["dimension_numbers"]
    p_rank, q_rank = (len(v.aval.shape) for v in eqn.invars[:2])
    p_map = from_shared if shared_is_p else from_ct
    q_map = from_ct if shared_is_p else from_shared
    dims = [p_map(d, True) for d in pb]
    dims += [p_map(d, False) for d in range(p_rank) if d not in pc and d not in pb]
    dims += [q_map(d, False) for d in range(q_rank) if d not in qc and d not in qb]
    return None if any(d is None for d in dims) else [d for d in dims if d is not None]
