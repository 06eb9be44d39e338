"""Cotangents laid out as what they are the cotangent of: an indexing
operation's primal operand, and a rule's scope output.

JAX's transpose rules lay a cotangent out as its primal value. The gradient
of a gather (`emb[tokens]`, `x[token_index]`, `jnp.take`) with respect to its
operand is a `scatter-add` of the gather's cotangent into zeros of the
operand's shape, which JAX makes in the operand's layout (`lax.full(...,
sharding=operand.aval.sharding)`); the gradient of a scatter (`.at[i].add`,
`.at[i].set`) with respect to its updates is a `gather` of the result's
cotangent, in the updates' layout where JAX's rule can give it. The
function is traced once with every value replicated (`_scopes`), so in that
trace those layouts are replicated: left alone, an embedding's gradient
would be computed whole on every device, and an MoE's dispatched tokens'
cotangents too.

Every forward `gather`, `scatter` and `scatter-add` evaluated is recorded
(`remember`, beside the contractions of `_transpose`) with the layout its
primal operand had (a gather's operand, a scatter's updates): under its
index operand (a variable its gradient shares, in the same jaxpr) and under
its origin (where the model's code made it, and its scope: the gradient of a
remat region, loop body or branch is another jaxpr). A gradient's
`scatter-add` whose dimension numbers are those of the transpose of a
recorded gather (its operand of the gather operand's shape, its updates of
the gather result's), or a gradient's `gather` that transposes a recorded
scatter, takes that primal layout (`primal_layout`), argument or activation
alike, where every candidate agrees on it. `as_primal` then binds it: the
zeros a `scatter-add` starts from (a constant, which moves no data) laid out
so first, JAX's own rule asked, and where it refuses or gives another
layout, the operation computed under `jax.sharding.auto_axes` with it (as
the partitioner does on Auto axes); where JAX refuses that too, the layout
is inferred as any other's.

A gradient's operation recorded under scope `S (backward)` whose layout
would otherwise be replicated (JAX lays it out with no mesh axis, or cannot
lay it out and the inference gives it none), and whose result has the shape
of an output of `S` (named `S`, or `S/0`, `S/1`, ...) that an activation rule
matches, takes that rule's spec (`backward_rule`): the cotangent of a scope
output laid out as the output. A layout that already splits the result is
left alone: a rule never makes a gradient's operation less split.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .._interop._paths import LeafInfo
from .._planning._spec import LeafError, leaf_spec
from ._explicit import SHARDING_ERRORS, run_with_layout, spec_of
from ._propagate import axes_of

GATHERS = {"gather"}
SCATTERS = {"scatter", "scatter-add", "scatter_add"}
INDEXING = GATHERS | SCATTERS
_ADDS = {"scatter-add", "scatter_add"}  # a gather's transpose


def source_line(eqn: Any) -> str:
    """`FILE:LINE` of the user's code that made `eqn` (from the trace's
    source information), or `""` where JAX does not say."""
    try:
        from jax._src import source_info_util

        frame = source_info_util.user_frame(eqn.source_info.traceback)
    except (ImportError, AttributeError):  # another JAX: the source is not named
        return ""
    if frame is None:
        return ""
    return f"{frame.file_name}:{frame.start_line}"


def _dims(dnums: Any, *names: str) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(getattr(dnums, n, ()) or ()) for n in names)


_GATHER = ("offset_dims", "collapsed_slice_dims", "start_index_map", "operand_batching_dims")
_SCATTER = (
    "update_window_dims",
    "inserted_window_dims",
    "scatter_dims_to_operand_dims",
    "operand_batching_dims",
)


class Indexing(NamedTuple):
    """A forward gather or scatter as evaluated: the spec of its primal
    operand (a gather's operand, a scatter's updates), and its origin."""

    eqn: Any
    spec: PartitionSpec
    origin: tuple[Any, str]


def _key(var: Any) -> tuple[str, Any]:
    return ("indexing", var)


def remember(
    partners: dict[Any, list[Any]], contractions: dict[Any, list[Any]], eqn: Any, read: Any, origin: Any
) -> None:
    """Record a forward gather or scatter (`eqn`, made at `origin`: see
    `_transpose.origin`) with the layout of its primal operand; in
    `partners` (its jaxpr's) under its index operand, in `contractions`
    (the step's) under its origin."""
    primal = eqn.invars[0] if eqn.primitive.name in GATHERS else eqn.invars[2]
    value = read(primal)
    if not hasattr(value, "shape"):
        return
    found = Indexing(eqn, spec_of(value), origin)
    index = eqn.invars[1]
    if hasattr(index, "aval") and not hasattr(index, "val"):
        partners.setdefault(_key(index), []).append(found)
    contractions.setdefault((("indexing", origin[0]), origin[1]), []).append(found)


def _transposes(eqn: Any, forward: Any) -> bool:
    """Whether the gradient's `eqn` is JAX's transpose of the forward `forward`."""
    shape = lambda v: tuple(v.aval.shape)  # noqa: E731
    f = forward.eqn
    if eqn.primitive.name in _ADDS and f.primitive.name in GATHERS:  # a gather's operand's cotangent
        same = shape(eqn.invars[0]) == shape(f.invars[0]) and shape(eqn.invars[2]) == shape(f.outvars[0])
        mine, theirs = eqn.params["dimension_numbers"], f.params["dimension_numbers"]
        return same and _dims(mine, *_SCATTER) == _dims(theirs, *_GATHER)
    if eqn.primitive.name in GATHERS and f.primitive.name in SCATTERS:  # a scatter's updates' cotangent
        same = shape(eqn.invars[0]) == shape(f.invars[0]) and shape(eqn.outvars[0]) == shape(f.invars[2])
        mine, theirs = eqn.params["dimension_numbers"], f.params["dimension_numbers"]
        return same and _dims(mine, *_GATHER) == _dims(theirs, *_SCATTER)
    return False


def primal_layout(
    eqn: Any, partners: dict[Any, list[Any]], contractions: dict[Any, list[Any]], origin: Any
) -> PartitionSpec | None:
    """The layout of the primal operand whose cotangent the gradient's
    gather or scatter-add `eqn` (made at `origin`) computes: those recorded
    under its index operand in its own jaxpr, else under its origin in
    others; `None` where none fits or they disagree."""
    if eqn.primitive.name not in INDEXING or len(eqn.invars) < 2:
        return None
    near = [f for f in partners.get(_key(eqn.invars[1]), ()) if f.eqn is not eqn and _transposes(eqn, f)]
    far = contractions.get((("indexing", origin[0]), origin[1]), ())  # JAX may not say where: its scope
    found = near or [f for f in far if f.eqn is not eqn and _transposes(eqn, f)]
    specs = {f.spec for f in found}
    return next(iter(specs)) if len(specs) == 1 else None


def as_primal(
    bind: Callable[..., Any], name: str, invals: list[Any], spec: PartitionSpec, made: Sequence[bool]
) -> tuple[Any, str] | None:
    """`eqn` bound with its result laid out as `spec` (its primal operand's),
    and who decided (`"jax"`, or `"auto_axes"` where JAX's rule refuses it or
    gives another), or `None` where JAX refuses it."""
    mesh = jax.sharding.get_abstract_mesh()
    if name == "dot_general":  # JAX's transpose rule: the primal's layout as its `out_sharding`
        try:
            return bind(*invals, out_sharding=NamedSharding(mesh, spec)), "jax"
        except SHARDING_ERRORS:
            return None
    zeros = name in SCATTERS and made[:1] == (True,) and hasattr(invals[0], "shape")
    if zeros and not axes_of(spec_of(invals[0])):  # the zeros it starts from, as JAX makes them
        try:
            invals = [jax.sharding.reshard(invals[0], spec), *invals[1:]]  # moves no data
        except SHARDING_ERRORS:
            return None
    try:
        result = bind(*invals)
    except SHARDING_ERRORS:
        pass
    else:
        if spec_of(result) == spec:
            return result, "jax"
    try:
        return run_with_layout(bind, invals, [spec], False), "auto_axes"
    except SHARDING_ERRORS:
        return None


def backward_rule(c: Any, path: str, aval: Any) -> tuple[PartitionSpec, Any] | None:
    """`(spec, rule)` for a gradient's result `aval` in scope `path`: the
    rule of an output of that scope of its shape (see the module's
    docstring), or `None`."""
    if not path or c.group is None or not aval.shape:
        return None
    shape, outputs = tuple(int(d) for d in aval.shape), c.seen.outputs
    numbered = itertools.takewhile(outputs.__contains__, (f"{path}/{i}" for i in itertools.count()))
    for name in ([path] if path in outputs else []) + list(numbered):  # S, or a use's S/0, S/1, ...
        shapes = outputs[name]
        if shape not in shapes:
            continue
        rule = c.output_rule(name, shape, shapes[shape])
        if rule is None:
            continue
        try:
            spec = leaf_spec(rule, LeafInfo(name, shape, np.dtype(shapes[shape])), c.sizes, c.rules)
        except (LeafError, TypeError):
            continue
        if any(e is PartitionSpec.UNCONSTRAINED for e in spec):
            continue
        c.check_axis_types(rule, spec, name)
        return spec, rule
    return None
