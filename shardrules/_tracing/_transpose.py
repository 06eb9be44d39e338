"""The layout JAX's transpose rule gives a contraction's cotangent: its primal operand's.

On Explicit axes, the gradient of `dot_general(x, y)` with respect to `y` is
another `dot_general` (of the output's cotangent and `x`, in that order)
whose `out_sharding` JAX's transpose rule sets to `y`'s own layout,
dimensions permuted to the order that contraction produces (a `transpose`
then puts them in `y`'s). The function is traced once with every value
replicated (`_scopes`), so in the trace that layout is replicated, and says
nothing: left alone, the cotangent's layout would be inferred forwards from
its operands, which can differ from `y`'s, and the update `y - lr * g` then
mixes two layouts JAX cannot reconcile (SR117 with `strict`), or the
gradient silently loses an axis (every device then holds and computes the
part of it that axis would have split off).

This is done for the cotangents of arguments (`arguments_of`: the step's
parameters, a loop body's, branch's, remat's or inlined call's operands, and
what only casts, copies, transposes, reshapes or slices them: `passed_on`),
which an optimizer update meets with the argument itself. An activation's
cotangent only flows on into the gradient's next operations, and keeps the
inferred layout, which may split it over more axes than the activation
itself (an MoE's expert buffers over the expert axis its operands carry).

Every forward contraction evaluated is recorded (`remember`) with the layouts
its argument operands had, twice: in `Partners`, under its operand variables,
for the gradients in the same jaxpr, and in `Contractions`, under where the
model's code made it (`origin`: the frames of the code running, file, line
and columns, and the scope), for the gradients in another jaxpr: the forward
pass and the gradient of a `lax.cond`, `lax.scan`, `fori_loop`, inner
`jax.jit` or `jax.checkpoint` are separate sub-computations (a remat's
gradient computes its forward values again: those are recorded as forward
contractions too, `recomputed`), and JAX gives the gradient's equations the
source of the forward equation they transpose. `primal_layouts` finds, for
a gradient's contraction whose traced `out_sharding` says nothing
(`is_transposed`), the forward contractions it may transpose: those sharing
an operand with it in its own jaxpr whose other operand is the forward
result's cotangent (of that result's shape), and those of its origin in
other jaxprs whose result has the shape of its first operand (the cotangent
JAX's rule puts first). Those of its own origin are preferred; where every
candidate left agrees on the spec of the other forward operand, in the
gradient contraction's dimension order, and that operand is an argument,
that is its layout. Where the match is not exact (shapes, dimensions that do
not map one to one, candidates that disagree or an activation among them),
the layout is inferred as before; with `strict`, candidates that disagree,
an argument among them, are an error (`undecided`, SR117): the gradient may
not be laid out as its parameter, and nothing says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from jax.sharding import PartitionSpec

from .._pspec import cotangent, entries, with_entries
from ._cotangents import source_line
from ._explicit import spec_of
from ._outputs import _REMAT_SCOPE
from ._propagate import axes_of


class Contraction(NamedTuple):
    """A forward `dot_general` as evaluated: the spec of each operand that is
    an argument of its jaxpr (`None` for an activation), and its `origin`."""

    eqn: Any
    specs: tuple[PartitionSpec | None, ...]
    origin: tuple[Any, str]


Partners = dict[Any, list[Any]]
"""A value (a jaxpr variable) → the forward `dot_general`s of its jaxpr that take it as an operand."""

Contractions = dict[tuple[Any, str], list[Any]]
"""An origin (`origin`: where the model's code made it, its scope path) → the forward `dot_general`s
it made (`Contraction`s), in every jaxpr of a step; `_cotangents` keeps its gathers and scatters
there too, under `(("indexing", frames), path)`."""

KEEP_LAYOUT = {"convert_element_type", "copy", "copy_p", "reduce_precision"}
"""Operations whose result is laid out as their operand: a weight cast to bfloat16 is still the weight."""

VIEWS = KEEP_LAYOUT | {"transpose", "reshape", "squeeze", "expand_dims", "slice", "dynamic_slice"}
"""Operations whose result is the operand seen another way (`w.T`, a head-split
reshape, one layer of a stack): a contraction with it is one with the argument,
whose cotangent JAX lays out as that view is."""


def arguments_of(jaxpr: Any) -> set[Any]:
    """The variables of `jaxpr` that are its arguments (a step's parameters
    and batch, a loop body's or inlined call's operands), before `passed_on`
    adds their views."""
    return set(jaxpr.invars)


def passed_on(arguments: set[Any], eqn: Any) -> None:
    """Add `eqn`'s result to `arguments` where it is a view of an argument (`VIEWS`)."""
    if eqn.primitive.name in VIEWS and eqn.invars and eqn.invars[0] in arguments:
        arguments.update(eqn.outvars)


def recomputed(eqn: Any) -> bool:
    """Whether `eqn` computes a forward value again inside a remat's gradient."""
    return any(item.name == _REMAT_SCOPE for item in eqn.source_info.name_stack.stack)


def remember(
    partners: Partners, contractions: Contractions, eqn: Any, read: Any, arguments: set[Any], path: str
) -> None:
    """Record a forward `dot_general` made in scope `path` (`read`: a
    variable's current value) under each of its operand variables and under
    its origin."""
    specs = []
    for var in eqn.invars[:2]:
        value = read(var) if var in arguments else None
        specs.append(spec_of(value) if hasattr(value, "shape") else None)
    found = Contraction(eqn, tuple(specs), origin(eqn, path))
    for var in eqn.invars[:2]:
        if hasattr(var, "aval") and not hasattr(var, "val"):  # a variable, not a literal
            partners.setdefault(var, []).append(found)
    if found.origin[0]:
        contractions.setdefault(found.origin, []).append(found)


def origin(eqn: Any, path: str) -> tuple[Any, str]:
    """Where the model's code made `eqn`: the frames of its code that were
    running (file, line and columns: one line may make several
    contractions, and one helper be called from several lines), else its
    `FILE:LINE`, else `""` (JAX does not say); and its scope `path`. JAX
    gives a gradient's equations the source of the forward one they
    transpose."""
    try:
        from jax._src import source_info_util

        frames = tuple(
            (f.file_name, f.start_line, f.start_column, f.end_line, f.end_column)
            for f in source_info_util.user_frames(eqn.source_info.traceback)
        )
    except (ImportError, AttributeError, TypeError):  # another JAX: its line, where it says
        frames = ()
    return frames or source_line(eqn), path


def is_transposed(eqn: Any) -> bool:
    """Whether `eqn`, a gradient's equation, is a `dot_general` whose traced
    `out_sharding` says nothing: the replicated layout the transpose rule
    copies from a primal traced replicated (JAX 0.10 and later), or none
    (JAX 0.8, whose rule copies only a sharded one)."""
    if eqn.primitive.name != "dot_general":
        return False
    spec = getattr(eqn.params.get("out_sharding"), "spec", None)
    return spec is None or not axes_of(spec)


def primal_layouts(
    eqn: Any, partners: Partners, contractions: Contractions, path: str
) -> dict[PartitionSpec | None, PartitionSpec | None]:
    """The specs, in `eqn`'s result order, of the forward operands whose
    cotangent `eqn` (made in scope `path`) may compute, `None` for an
    activation (see the module's docstring), each to the operand's own
    spec: one is the layout JAX's transpose rule gives it; none, or
    several, leave it to be inferred."""
    made = origin(eqn, path)
    same: list[Fit] = []  # made by eqn's line and scope, sharing an operand
    other: list[Fit] = []  # sharing an operand, made elsewhere
    seen: set[int] = set()
    p, q = eqn.invars[:2]
    for shared, shared_is_p in ((p, True), (q, False)):
        for forward in partners.get(shared, ()):
            operands = forward.eqn.invars[:2]
            if forward.eqn is eqn or (operands[0] is shared and operands[1] is shared):
                continue
            seen.add(id(forward))
            fit = _fitting(eqn, forward, operands[0] is shared, shared_is_p)
            if fit is not None:
                (same if made[0] and forward.origin == made else other).append(fit)
    elsewhere: list[Fit] = []  # made by eqn's line and scope in another jaxpr
    for forward in contractions.get(made, ()) if made[0] else ():
        if id(forward) in seen or forward.eqn is eqn:
            continue
        for s_is_a in (True, False):  # JAX's rule: dot_general(cotangent, the other primal operand)
            if tuple(forward.eqn.invars[0 if s_is_a else 1].aval.shape) == tuple(q.aval.shape):
                fit = _fitting(eqn, forward, s_is_a, False)
                if fit is not None:
                    elsewhere.append(fit)
    return dict(same or elsewhere or other)


def undecided(c: Any, eqn: Any, path: str, specs: Iterable[PartitionSpec | None]) -> Exception:
    """SR117 (with `strict`): the gradient contraction `eqn` may be the
    cotangent of forward operands laid out as `specs` (`None`: an
    activation; an argument's among them), made by one expression of the
    model's code in one scope, and which it is cannot be told: its layout
    would be inferred, and may not be the argument's."""
    from .._errors import Diagnostic, error_for
    from .._planning._plan import spec_str

    source = source_line(eqn)
    shown = ", ".join(sorted({"an activation" if s is None else spec_str(s) for s in specs}))
    where = f"in scope `{path}`" if path else "outside every named scope"
    at = f" at {source}" if source else ""
    diag = Diagnostic(
        "SR117",
        "error",
        f"the gradient's `dot_general` {where}{at} computes the cotangent of one of several "
        f"contractions made there, whose operands it may stand for are laid out differently ({shown}): "
        "JAX lays a cotangent out as its operand is, and which operand this is cannot be told from the "
        "trace, so its layout would be inferred and the gradient may not be laid out as its parameter",
        None,
        f"{path} (backward)".strip(),
        "make each contraction on a line of its own (or inside a `jax.named_scope` of its own), "
        "or pass strict=False to infer the layout",
        cause="gradient layout undecided",
    )
    return error_for([diag], c.rules.sources)


Fit = tuple[PartitionSpec | None, PartitionSpec | None]
"""A forward operand's spec in a gradient contraction's result order, and its own (`None`: an activation)."""


def _fitting(eqn: Any, forward: Contraction, s_is_a: bool, shared_is_p: bool) -> Fit | None:
    """The spec `eqn`'s result takes if it transposes `forward` (its operand
    `0` if `s_is_a` else `1` being `eqn`'s operand `0` if `shared_is_p` else
    `1`, the other the cotangent of `forward`'s result), with the forward
    operand's own (`(None, None)` where that operand is an activation);
    `None` where the shapes or dimensions do not fit."""
    ct = eqn.invars[1 if shared_is_p else 0]
    if tuple(forward.eqn.outvars[0].aval.shape) != tuple(ct.aval.shape):
        return None
    dims = _mapping(eqn, forward.eqn, s_is_a, shared_is_p)
    if dims is None:
        return None
    other = forward.eqn.invars[1 if s_is_a else 0]
    shape, out = tuple(other.aval.shape), tuple(eqn.outvars[0].aval.shape)
    if sorted(dims) != list(range(len(shape))) or any(out[i] != shape[d] for i, d in enumerate(dims)):
        return None
    own = forward.specs[1 if s_is_a else 0]
    return (
        (None, None) if own is None else (cotangent(with_entries(own, (entries(own)[d] for d in dims))), own)
    )  # reduced: unreduced


def _mapping(eqn: Any, forward: Any, s_is_a: bool, shared_is_p: bool) -> list[int] | None:
    """For each dimension of `eqn`'s result, the dimension of the forward
    operand other than the shared one (`forward`'s operand `0` if `s_is_a`)
    it stands for, or `None` where one does not map (see the module's
    docstring)."""
    (fa_c, fb_c), (fa_b, fb_b) = forward.params["dimension_numbers"]
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
