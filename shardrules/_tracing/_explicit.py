"""Explicit mesh axes: evaluate a traced function so that the rule file settles
what JAX leaves ambiguous.

On a mesh whose axes are `Explicit` (what `jax.make_mesh` makes since JAX
0.8), an array's layout is part of its type and every operation must know the
layout of its result. JAX refuses a contraction over a sharded dimension
without an `out_sharding`, and a few other operations whose result layout it
cannot infer. `auto_constrain` and `shardrules.jit` trace the function once
without layouts, then evaluate the trace with the explicit layouts; for each
operation:

1. a contraction (`dot_general`) of the forward pass whose result is laid
   out like an output of its scope that an activation rule matches (it
   becomes that output through element-wise operations, or a `transpose`
   such as `jax.vmap` adds: see `_outputs`) gets that rule's spec, in the
   result's own dimension order, as its `out_sharding` (the innermost such
   scope whose rule matches, whose guard holds for that output and which
   fits; an `unconstrained` entry takes the layout JAX, or else the
   inference below, gives that dimension, or none where another entry uses
   those axes: `settled`). A contraction whose result is used only inside
   its scope, or reshaped or reduced before it leaves it, takes no rule:
   the rule describes the scope's output, not every value made inside it;
2. any other operation is first left to JAX, and JAX's layout is kept
   where it keeps every mesh axis the operands carried on the dimensions the
   result keeps; where JAX finds the result's layout ambiguous, or its
   layout would drop such an axis, the layout is *propagated* from the
   operands (`_propagate`: each result dimension takes the axes of the
   operand dimension it comes from; an axis is dropped only where an
   earlier dimension uses it, which still splits the work, or where it does
   not divide the dimension, which loses it and is warned about as SR210). An operation JAX still refuses runs under
   `jax.sharding.auto_axes` with that layout. With `strict=True`, a layout
   JAX refused and no rule gives, in the forward pass, is an error (SR117),
   and so is SR210, naming the operation's scope, its operands' layouts and
   the rule line that settles it: a rule for the scope output the result is
   laid out like, written in the output's dimensions, or, for a result that
   is no scope's output, the named scope to wrap it in and its rule.
3. a layout the model's code states (`jax.sharding.reshard(x, P(...))`,
   `jnp.einsum(..., out_sharding=P(...))`: the function is traced under the
   mesh's abstract form, so they work as under `jax.set_mesh`) is kept and
   recorded as decided by the model. The first trace sees every value
   replicated, so a layout it states that names no mesh axis says nothing
   and is dropped.

The gradient's operations (a `transpose` in their name stack, and everything
inside the loop bodies and remat regions of such an operation) are recorded
under the scope of the forward operation they differentiate, as `SCOPE
(backward)`. Rules describe the forward pass: a gradient's operation takes a
rule's layout only where it would be replicated and has the shape of its
scope's output that the rule matches (`_cotangents`); cotangents of
arguments' contractions (`_transpose`) and of gathers and scatters
(`_cotangents`) are laid out as their primal operands.

Every such decision is recorded as a `Decision`, which `RuleJit.decisions`
lists.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from .._planning._blocks import entry_axes
from .._pspec import entries, padded, with_entries
from ._compat import DuplicateSpecError, ShapedArray, ShardingTypeError


class LayoutRefused(Exception):
    """A `ValueError` JAX raised binding one operation with its operands'
    layouts: a result that keeps its operand's layout on a dimension it no
    longer divides (`jnp.fft.rfft` along a sharded dimension: 16 over 2
    devices, 9 results). The operation's shapes were accepted by the first
    trace (without layouts), so what JAX refuses is the layout."""


# What JAX raises for a result layout it cannot decide: JAX 0.10 raises a bare
# AssertionError (listing the operands' types) for an element-wise operation on
# operands laid out differently, and every version a ValueError (`LayoutRefused`)
# for a layout that does not divide; it is only caught around one primitive's bind.
SHARDING_ERRORS = (ShardingTypeError, DuplicateSpecError, AssertionError, LayoutRefused)


@dataclasses.dataclass(frozen=True)
class Decision:
    """How the layout of one operation's result was chosen on an explicit mesh.

    - `scope`: the scope path of the operation (`""` outside every scope).
    - `primitive`: the JAX primitive, e.g. `"dot_general"`.
    - `operands`: the operands' shapes and specs, as `(shape, spec)`.
    - `shape`, `spec`: the result's shape and the spec it got.
    - `by`: `"rule"` (an activation rule: see `rule`; for an operation other
      than a contraction, JAX found it ambiguous and it was computed under
      `jax.sharding.auto_axes` with the rule's layout), `"model"` (the
      model's code states it: `jax.sharding.reshard`, `out_sharding=`),
      `"jax"`, `"inferred"` (JAX found it ambiguous, or would have dropped an
      axis the operands carried; see the module's docstring), or
      `"auto_axes"` (inferred, and computed under `jax.sharding.auto_axes`).
    - `rule`: the deciding rule's `FILE:LINE:COL`, for `by == "rule"`.
    - `hint`: for an inferred layout of the forward pass, how to write it in
      the rule file instead: the rule line that settles it (what `strict=True`
      says with SR117).
    - `dropped`: for an inferred layout, the mesh axes its operands carried
      on a dimension the result keeps that it could not keep, as
      `(dimension, axis, why)` (SR210).
    - `source`: `FILE:LINE` of the code that made the operation, where JAX
      says.
    """

    scope: str
    primitive: str
    operands: tuple[tuple[tuple[int, ...], PartitionSpec], ...]
    shape: tuple[int, ...]
    spec: PartitionSpec
    by: str
    rule: str | None = None
    hint: str = ""
    dropped: tuple[tuple[int, str, str], ...] = ()
    source: str = ""


def is_explicit(mesh: Any) -> bool:
    """Whether any axis of `mesh` (a `Mesh` or `AbstractMesh`) is `Explicit`."""
    return bool(getattr(mesh, "explicit_axes", ()))


def spec_of(value: Any) -> PartitionSpec:
    """The spec in the type of `value` (an array, a tracer or an abstract
    value), padded to its rank."""
    aval = value if isinstance(value, ShapedArray) else jax.typeof(value)
    spec = getattr(getattr(aval, "sharding", None), "spec", None)
    return padded(spec if spec is not None else PartitionSpec(), len(aval.shape))


def settled(spec: PartitionSpec, natural: PartitionSpec) -> PartitionSpec:
    """`spec` (a rule's, in the result's dimensions) with each unconstrained
    entry replaced by the layout `natural` gives that dimension (what JAX, or
    where JAX cannot decide the inference, lays the result out as), or
    unsharded where that uses axes another entry of `spec` uses: JAX refuses
    `PartitionSpec.UNCONSTRAINED` in an `out_sharding` and on Explicit axes."""
    unconstrained = PartitionSpec.UNCONSTRAINED
    mine, theirs = entries(spec), entries(natural)
    used = {a for entry in mine if entry is not unconstrained for a in entry_axes(entry)}
    aligned = theirs + (None,) * (len(mine) - len(theirs))
    out = []
    for entry, now in zip(mine, aligned, strict=False):
        if entry is unconstrained:
            entry = None if set(entry_axes(now)) & used else now
        out.append(entry)
    return with_entries(spec, out)


def lift_replicated(invals: Sequence[Any], made: Sequence[bool]) -> list[Any] | None:
    """`invals` with each fully replicated operand that the function made from
    constants alone (`made`) laid out as the one sharded operand of its shape,
    or `None` when that is no answer (no such operand, or sharded ones that
    disagree). An argument or a value computed from one is never moved here:
    if it is replicated, the layout of the result is a choice (see `evaluate`).

    The function is traced first without layouts, so a value it makes there
    (a broadcast constant, `jnp.where`'s fill value, a mask) is replicated on
    the explicit axes, where JAX, tracing with layouts, would have made it in
    the layout of the operand it meets; an element-wise operation then refuses
    the mix. Taking a slice of a replicated value moves no data, and the
    result's layout is the sharded operand's: nothing is left to decide.
    """

    def is_array(x: Any) -> bool:
        return hasattr(x, "shape") and hasattr(x, "dtype") and len(x.shape) > 0

    sharded: dict[tuple[int, ...], set[PartitionSpec]] = {}
    for x in filter(is_array, invals):
        spec = spec_of(x)
        if any(entry_axes(e) for e in entries(spec)):
            sharded.setdefault(tuple(x.shape), set()).add(spec)
    if not sharded or any(len(specs) > 1 for specs in sharded.values()):
        return None
    out, changed = [], False
    for x, constant in zip(invals, made, strict=True):
        specs = sharded.get(tuple(x.shape), set()) if is_array(x) and constant else set()
        if specs and not any(entry_axes(e) for e in entries(spec_of(x))):
            x, changed = jax.sharding.reshard(x, next(iter(specs))), True
        out.append(x)
    return out if changed else None


def typed_aval(value: Any, drop_leading: bool = False) -> jax.ShapeDtypeStruct:
    """`value`'s shape, dtype and layout, for tracing a sub-computation
    (`drop_leading`: one slice along the first dimension, as `scan` sees it)."""
    aval = jax.typeof(value)
    sharding = getattr(aval, "sharding", None)
    shape = tuple(aval.shape)
    weak = bool(getattr(aval, "weak_type", False))
    if sharding is None or not isinstance(sharding, NamedSharding):
        return jax.ShapeDtypeStruct(shape[1:] if drop_leading else shape, aval.dtype, weak_type=weak)
    spec = spec_of(value)
    if drop_leading:
        shape, spec = shape[1:], with_entries(spec, entries(spec)[1:])
    return jax.ShapeDtypeStruct(
        shape, aval.dtype, sharding=NamedSharding(sharding.mesh, spec), weak_type=weak
    )


def untyped(value: Any) -> jax.ShapeDtypeStruct:
    """`value`'s shape and dtype without a layout, to trace the function once."""
    aval = jax.typeof(value)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=bool(getattr(aval, "weak_type", False)))


def run_with_layout(
    bind: Callable[..., Any], invals: Sequence[Any], specs: Sequence[PartitionSpec], multiple: bool
) -> Any:
    """`bind(*invals)` under `jax.sharding.auto_axes`, its results laid out as `specs`."""
    out = specs if multiple else specs[0]
    return jax.sharding.auto_axes(bind, out_sharding=out)(*invals)


def match_types(values: Sequence[Any], like: Sequence[Any]) -> list[Any]:
    """`values` resharded, where their layout differs, to the layouts of `like`
    (arrays or abstract values): a loop's carry keeps its type from one
    iteration to the next, and a `cond`'s branches give the same types."""
    out = []
    for value, target in zip(values, like, strict=True):
        if hasattr(value, "shape") and hasattr(target, "shape") and len(value.shape) == len(target.shape):
            spec = spec_of(target)
            if spec_of(value) != spec:
                value = jax.sharding.reshard(value, spec)
        out.append(value)
    return out


def _entries(spec: Any) -> str:
    return ", ".join(
        "_" if e is None else e if isinstance(e, str) else "(" + ", ".join(e) + ")" for e in entries(spec)
    )


def scope_pattern(scope: str) -> str:
    """A pattern for the scope `scope` and its like in the other layers: each
    `/`-separated segment escaped, a segment of digits alone (a layer's
    index, `layers/0/attn`) written `\\d+`, so that one rule covers every
    layer (`layers/\\d+/attn`)."""
    return "/".join(
        r"\d+" if part.isascii() and part.isdigit() else re.escape(part) for part in scope.split("/")
    )


def suggestion(
    scope: str,
    spec: PartitionSpec,
    aligned: Sequence[Any] = (),
    alias_of: Callable[[str], str | None] = lambda name: None,
) -> str:
    """The rule line that would settle an operation in `scope` whose result
    would be laid out as `spec`: a rule for the innermost scope output the
    result is laid out like (`aligned`, see `_outputs`), written in that
    output's dimensions; for a result that is no such output, the scope to
    wrap it in first. Layers' indices in the scope are written `\\d+`
    (`scope_pattern`); the number of one of several outputs is kept. An
    output with a parameter name (`alias_of`, `_reach.Reach.alias_of`: an
    auto-named scope's weight) is written with that name, as the weight's
    rules are."""
    if not scope:
        return (
            "the operation is outside every named scope: wrap it alone in "
            f'`jax.named_scope(NAME)` and add `"NAME$" -> ({_entries(spec)})` under `rules activations:`'
        )
    inside = sorted(
        (e for e in aligned if scope == e.scope or scope.startswith(e.scope + "/")),
        key=lambda e: -len(e.scope),
    )
    if not inside:
        return (
            f"its result is not an output of scope `{scope}` (it is used inside the scope, or reshaped or "
            "reduced before it leaves it), so no rule for the scope gives its layout: wrap that operation "
            f'alone in `jax.named_scope(NAME)` and add `"{scope_pattern(scope)}/NAME$" -> ({_entries(spec)})` '
            "under `rules activations:` (or pass strict=False to infer it)"
        )
    entry = inside[0]
    alias = alias_of(entry.name)
    pattern = (
        scope_pattern(alias)
        if alias is not None
        else scope_pattern(entry.scope) + re.escape(entry.name[len(entry.scope) :])  # `/1`: its second output
    )
    return (
        f'add `"{pattern}$" -> ({_entries(entry.output_spec(entries(spec)))})` under '
        "`rules activations:` (or pass strict=False to infer it)"
    )


def closed_over_error(fn: Any, err: Exception, rules: Any) -> Exception:
    """SR117 for a sharding error met while tracing `fn` without layouts: only
    arrays `fn` closes over still have theirs then."""
    from .._errors import Diagnostic, error_for

    said = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    name = getattr(fn, "__name__", type(fn).__name__)
    diag = Diagnostic(
        "SR117",
        "error",
        f"JAX cannot decide a layout while tracing `{name}`: the function is traced first with its "
        f"arguments replicated, and the layouts of arrays it closes over (rather than takes as "
        f"arguments), or set inside it (`shardrules.constrain`, `jax.sharding.reshard`), are kept on "
        f"this mesh's Explicit axes, where JAX cannot combine them for this operation; JAX says: {said}",
        None,
        None,
        "pass the arrays the function uses as its arguments (with `in_groups` in `sr.jit`), so that "
        "their layouts come from the rules; give the operation that JAX refuses its layout in the code "
        "(`out_sharding=P(...)`), or give layouts with `activations` rules rather than constrain calls",
        cause="closed-over array on Explicit axes",
    )
    return error_for([diag], getattr(rules, "sources", None))


def stacked_error(
    rules: Any,
    path: str,
    source: str,
    index: int,
    value: Any,
    origin: tuple[str, Any] | None,
) -> Exception:
    """SR117 for a `scan` over a dimension its operand's layout splits across
    devices (JAX cannot slice one step of it), naming the operand, the
    argument leaf it is and the rule that sharded it where known (`origin`:
    its label and rule), and the fix."""
    from .._errors import Diagnostic, error_for
    from .._planning._plan import spec_str

    laid = spec_of(value)
    spec = entries(laid)
    axes = ", ".join(f"`{a}`" for a in entry_axes(spec[0]))
    label, rule = origin if origin is not None else ("", None)
    where = f"in scope `{path}`" if path else "outside every named scope"
    at = f" at {source}" if source else ""
    which = f" ({label})" if label else ""
    rest = (None, *spec[1:])
    if rule is not None:
        first = (
            f"leave the stacked dimension unsharded in the rule that shards it: `_` for it, e.g. "
            f'`"{rule.pattern}" -> ({_entries(rest)})`, or a spec beginning with `...`'
        )
    else:
        first = f"leave the stacked dimension unsharded where its layout comes from (`({_entries(rest)})`)"
    diag = Diagnostic(
        "SR117",
        "error",
        f"`scan` {where}{at} loops over dimension 0 of its scanned operand {index}, "
        f"{tuple(value.shape)} {spec_str(laid)}{which}, which is sharded over {axes}: on this mesh's "
        "Explicit axes JAX cannot slice one step out of a dimension split across devices",
        rule.span if rule is not None else None,
        path or None,
        f"{first}; or reshard it before the loop (`jax.sharding.reshard(x, "
        f"P({', '.join(repr(e) for e in rest)}))`), or loop over a dimension that is not sharded",
        cause="scan over a sharded dimension",
    )
    return error_for([diag], getattr(rules, "sources", None))


def dropped_diagnostic(
    primitive: str,
    path: str,
    source: str,
    operands: Sequence[tuple[tuple[int, ...], Any]],
    spec: Any,
    dropped: Sequence[tuple[int, str, str]],
    hint: str,
) -> Any:
    """SR210's diagnostic (see `Constrainer.warn_dropped`; `lint --step` makes
    the same from a `Decision`)."""
    from .._errors import Diagnostic
    from .._planning._plan import spec_str

    shown = ", ".join(f"{shape} {spec_str(s)}" for shape, s in operands) or "none"
    lost = "; ".join(f"`{axis}` on dimension {d} ({why})" for d, axis, why in dropped)
    where = f"in scope `{path}`" if path else "outside every named scope"
    at = f" at {source}" if source else ""
    axes = ", ".join(dict.fromkeys(f"`{axis}`" for _, axis, _ in dropped))
    return Diagnostic(
        "SR210",
        "warning",
        f"`{primitive}` {where}{at} drops {'a mesh axis' if len(set(a for _, a, _ in dropped)) == 1 else 'mesh axes'} "
        f"its operands carried on Explicit axes: its result "
        f"is laid out {spec_str(spec)} without {lost} (operands: {shown}), so every device along "
        f"{axes} computes that dimension whole",
        None,
        path or None,
        f"{hint}; an axis the result does not use at all is dropped only where the dimension's size "
        "does not divide by it: make the dimension a multiple of the axes' sizes, or lay the operand "
        "out over an axis that divides it",
        cause=f"`{primitive}` drops {axes}",
    )
