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
2. any other operation is first left to JAX; when JAX finds its result's
   layout ambiguous, the layout is *inferred*: for a contraction, the
   operands' layouts of the dimensions the result keeps (batch dimensions,
   then the left operand's, then the right one's; an axis already used by an
   earlier dimension is dropped); for another operation, the layout of its
   most sharded operand of the same shape, else replicated. An operation JAX still
   refuses runs under `jax.sharding.auto_axes` with that layout. With
   `strict=True`, an inference in the forward pass is an error (SR117)
   naming the operation's scope, its operands' layouts and the rule line
   that settles it: a rule for the scope output the result is laid out
   like, written in the output's dimensions, or, for a result that is no
   scope's output, the named scope to wrap it in and its rule.

The gradient's operations (a `transpose` in their name stack, and everything
inside the loop bodies and remat regions of such an operation) never take a
rule's layout: rules describe the forward pass. They are recorded under the
scope of the forward operation they differentiate, as `SCOPE (backward)`.

Every such decision is recorded as a `Decision`, which `RuleJit.decisions`
lists.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax._src.core import ShapedArray, ShardingTypeError
from jax._src.named_sharding import DuplicateSpecError
from jax.sharding import NamedSharding, PartitionSpec

from .._planning._blocks import entry_axes

# What JAX raises for a result layout it cannot decide: JAX 0.10 raises a bare
# AssertionError (listing the operands' types) for an element-wise operation on
# operands laid out differently; it is only caught around one primitive's bind.
SHARDING_ERRORS = (ShardingTypeError, DuplicateSpecError, AssertionError)


@dataclasses.dataclass(frozen=True)
class Decision:
    """How the layout of one operation's result was chosen on an explicit mesh.

    - `scope`: the scope path of the operation (`""` outside every scope).
    - `primitive`: the JAX primitive, e.g. `"dot_general"`.
    - `operands`: the operands' shapes and specs, as `(shape, spec)`.
    - `shape`, `spec`: the result's shape and the spec it got.
    - `by`: `"rule"` (an activation rule: see `rule`; for an operation other
      than a contraction, JAX found it ambiguous and it was computed under
      `jax.sharding.auto_axes` with the rule's layout), `"jax"`, `"inferred"`
      (JAX found it ambiguous; see the module's docstring), or `"auto_axes"`
      (inferred, and computed under `jax.sharding.auto_axes`).
    - `rule`: the deciding rule's `FILE:LINE:COL`, for `by == "rule"`.
    - `hint`: for an inferred layout of the forward pass, how to write it in
      the rule file instead: the rule line that settles it (what `strict=True`
      says with SR117).
    """

    scope: str
    primitive: str
    operands: tuple[tuple[tuple[int, ...], PartitionSpec], ...]
    shape: tuple[int, ...]
    spec: PartitionSpec
    by: str
    rule: str | None = None
    hint: str = ""


def is_explicit(mesh: Any) -> bool:
    """Whether any axis of `mesh` (a `Mesh` or `AbstractMesh`) is `Explicit`."""
    return bool(getattr(mesh, "explicit_axes", ()))


def spec_of(value: Any) -> PartitionSpec:
    """The spec in the type of `value` (an array, a tracer or an abstract
    value), padded to its rank."""
    aval = value if isinstance(value, ShapedArray) else jax.typeof(value)
    spec = tuple(getattr(getattr(aval, "sharding", None), "spec", ()) or ())
    return PartitionSpec(*spec, *([None] * (len(aval.shape) - len(spec))))


def _deduplicated(entries: Sequence[Any]) -> PartitionSpec:
    used: set[str] = set()
    out = []
    for entry in entries:
        kept = tuple(a for a in entry_axes(entry) if a not in used)
        used.update(kept)
        out.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return PartitionSpec(*out)


def contraction_spec(lhs: Any, rhs: Any, dimension_numbers: Any) -> PartitionSpec:
    """The inferred layout of a `dot_general`'s result (see the module's docstring)."""
    (lc, rc), (lb, rb) = dimension_numbers
    ls, rs = spec_of(lhs), spec_of(rhs)
    entries = [ls[i] for i in lb]
    entries += [ls[i] for i in range(len(ls)) if i not in lc and i not in lb]
    entries += [rs[i] for i in range(len(rs)) if i not in rc and i not in rb]
    return _deduplicated(entries)


def inferred_spec(primitive: str, invals: Sequence[Any], params: dict[str, Any], aval: Any) -> PartitionSpec:
    """The inferred layout of one result `aval` of an operation."""
    if primitive == "dot_general":
        return contraction_spec(invals[0], invals[1], params["dimension_numbers"])
    same = [spec_of(v) for v in invals if getattr(v, "shape", None) == aval.shape]
    if same:  # the most sharded operand of the result's shape (a broadcast mask is not)
        return max(same, key=lambda spec: sum(len(entry_axes(e)) for e in spec))
    return PartitionSpec(*([None] * len(aval.shape)))


def settled(spec: PartitionSpec, natural: PartitionSpec) -> PartitionSpec:
    """`spec` (a rule's, in the result's dimensions) with each unconstrained
    entry replaced by the layout `natural` gives that dimension (what JAX, or
    where JAX cannot decide the inference, lays the result out as), or
    unsharded where that uses axes another entry of `spec` uses: JAX refuses
    `PartitionSpec.UNCONSTRAINED` in an `out_sharding` and on Explicit axes."""
    unconstrained = PartitionSpec.UNCONSTRAINED
    used = {a for entry in spec if entry is not unconstrained for a in entry_axes(entry)}
    padded = tuple(natural) + (None,) * (len(spec) - len(natural))
    out = []
    for entry, now in zip(spec, padded, strict=False):
        if entry is unconstrained:
            entry = None if set(entry_axes(now)) & used else now
        out.append(entry)
    return PartitionSpec(*out)


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
        if any(entry_axes(e) for e in spec):
            sharded.setdefault(tuple(x.shape), set()).add(spec)
    if not sharded or any(len(specs) > 1 for specs in sharded.values()):
        return None
    out, changed = [], False
    for x, constant in zip(invals, made, strict=True):
        specs = sharded.get(tuple(x.shape), set()) if is_array(x) and constant else set()
        if specs and not any(entry_axes(e) for e in spec_of(x)):
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
    spec = tuple(spec_of(value))
    if drop_leading:
        shape, spec = shape[1:], spec[1:]
    return jax.ShapeDtypeStruct(
        shape, aval.dtype, sharding=NamedSharding(sharding.mesh, PartitionSpec(*spec)), weak_type=weak
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
        "_" if e is None else e if isinstance(e, str) else "(" + ", ".join(e) + ")" for e in spec
    )


def suggestion(scope: str, spec: PartitionSpec, aligned: Sequence[Any] = ()) -> str:
    """The rule line that would settle an operation in `scope` whose result
    would be laid out as `spec`: a rule for the innermost scope output the
    result is laid out like (`aligned`, see `_outputs`), written in that
    output's dimensions; for a result that is no such output, the scope to
    wrap it in first."""
    if not scope:
        return (
            "the operation is outside every named scope: wrap the code that makes it in "
            f'`jax.named_scope(NAME)` and add `"NAME$" -> ({_entries(spec)})` under `rules activations:`'
        )
    inside = sorted(
        (e for e in aligned if scope == e.scope or scope.startswith(e.scope + "/")),
        key=lambda e: -len(e.scope),
    )
    if not inside:
        return (
            f"its result is not an output of scope `{scope}` (it is used inside the scope, or reshaped or "
            "reduced before it leaves it), so no rule for the scope gives its layout: wrap the code that "
            f'makes it in `jax.named_scope(NAME)` and add `"{re.escape(scope)}/NAME$" -> ({_entries(spec)})` '
            "under `rules activations:` (or pass strict=False to infer it)"
        )
    entry = inside[0]
    return (
        f'add `"{re.escape(entry.name)}$" -> ({_entries(entry.output_spec(tuple(spec)))})` under '
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
        f"JAX cannot decide a layout while tracing `{name}`: the function is traced first without "
        f"layouts, and an array it closes over (rather than takes as an argument) keeps its layout on "
        f"this mesh's Explicit axes, or a layout is set inside it (`shardrules.constrain`, "
        f"`jax.sharding.reshard`); JAX says: {said}",
        None,
        None,
        "pass the arrays the function uses as its arguments (with `in_groups` in `sr.jit`), and give "
        "layouts inside it with `activations` rules and `out_groups` rather than constrain/reshard calls",
        cause="closed-over array on Explicit axes",
    )
    return error_for([diag], getattr(rules, "sources", None))
