"""Evaluating one traced equation on a mesh with `Explicit` axes: the layout
of its result from a rule, from JAX, or inferred (see `_explicit`), and its
sub-computations (loop and branch bodies, custom derivatives, remat) traced
again for their operands' layouts. The evaluator of the whole trace
(`_scopes.interpret`) is passed in as `interpret`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax

from .._errors import Diagnostic, ShardRulesError, error_for
from .._pspec import entries
from ._asserts import check
from ._asserts import primitive as asserted
from ._compat import jcore, rebind, scan_counts, while_counts
from ._cotangents import as_primal, backward_rule, source_line
from ._explicit import (
    SHARDING_ERRORS,
    Decision,
    LayoutRefused,
    lift_replicated,
    match_types,
    run_with_layout,
    settled,
    spec_of,
    stacked_error,
    suggestion,
    typed_aval,
)
from ._propagate import axes_of, propagate
from ._regions import elsewhere

if TYPE_CHECKING:
    from ._outputs import Where

Interpret = Callable[
    ..., list[Any]
]  # `_scopes.interpret(c, jaxpr, consts, args, base, backward, seed, live)`


def evaluate(c: Any, eqn: Any, invals: list[Any], at: Where, interpret: Interpret) -> list[Any]:
    """One equation on explicit axes: the layout the model's code states, else
    a rule's for a contraction whose result is laid out like a matched scope
    output, else JAX's where it keeps every axis its operands carried on the
    dimensions the result keeps; where JAX cannot decide, or would drop such
    an axis, the propagated layout (`_propagate`; SR117 with `strict` where
    JAX refused). A rule's unconstrained entries take the layout JAX or the
    propagation gives their dimension (unsharded where another entry uses its
    axes: `settled`). A cotangent whose primal's layout is known (`at.primal`)
    takes it; the gradient's other equations (`at.backward`) take a rule's
    layout only where theirs would be replicated (`_cotangents.backward_rule`).
    See `_explicit`'s docstring."""
    name, multiple = eqn.primitive.name, eqn.primitive.multiple_results
    if eqn.primitive is asserted():  # `with_sharding_constraint`: JAX's assert, on the layout it has
        return [invals[0] if elsewhere(invals[0], c.abstract_mesh) else check(invals[0], eqn.params)]
    path, backward = at.path, at.backward
    params, stated = _stated(_params(c, eqn, invals, at, interpret), c.abstract_mesh)
    shown = f"{path} (backward)".strip() if backward else path  # rules describe the forward pass

    def bind(*values: Any, **extra: Any) -> Any:
        try:
            return rebind(eqn.primitive, values, {**params, **extra})
        except ValueError as err:  # ours (a ShardRulesError) as it is; JAX's: the layout refused
            if isinstance(err, ShardRulesError):
                raise
            raise LayoutRefused(str(err)) from err

    def listed(result: Any) -> list[Any]:
        return list(result) if multiple else [result]

    avals = [v.aval for v in eqn.outvars]
    arrays = [hasattr(x, "shape") and hasattr(x, "dtype") for x in invals]
    operands = tuple((tuple(x.shape), spec_of(x)) for x, a in zip(invals, arrays, strict=True) if a)

    def record(spec: Any, by: str, rule: Any = None, hint: str = "", dropped: Any = ()) -> None:
        shape = tuple(avals[0].shape)
        where = rule.location if rule is not None else None
        c.decisions.append(
            Decision(shown, name, operands, shape, spec, by, where, hint, dropped, source_line(eqn))
        )

    mesh = c.abstract_mesh
    sizes = dict(mesh.shape) if mesh is not None else {}
    if name in _RESHARDS and stated is None:  # a reshard to no layout in the first trace
        if not elsewhere(invals[0], mesh):
            return list(invals[: len(avals)])  # no decision: the value keeps its layout
        # leaving a region on other axis types: the layout it would have had (`_regions`)
        params["dst_sharding"] = c.shadows.leaving(invals[0], mesh) or params["dst_sharding"]
        return listed(bind(*invals))
    if any(elsewhere(x, mesh) for x in invals):  # inside such a region: JAX decides
        result = listed(bind(*invals))
        c.shadows.through(name, invals, eqn.params, result, sizes)
        return result
    if stated is not None:  # the model's code states the layout: kept, not inferred
        try:
            result = bind(*invals)
        except SHARDING_ERRORS as err:
            hint = "the layout is the one the model's code states (`reshard`, `out_sharding=`): check it"
            raise _ambiguous(c, name, shown, operands, hint, err) from None
        if name in _RESHARDS and elsewhere(listed(result)[0], mesh):
            c.shadows.entered(invals[0], listed(result)[0])  # entering a region on other axis types
        elif not backward and axes_of(stated.spec):
            record(spec_of(listed(result)[0]), "model")
        return listed(result)
    if at.primal is not None:  # a cotangent laid out as its primal (`_transpose`, `_cotangents`)
        laid = as_primal(bind, name, invals, at.primal, at.made)
        if laid is not None:  # else JAX refuses that layout here: inferred, as any other
            record(spec_of(listed(laid[0])[0]), laid[1])
            return listed(laid[0])

    with_specs = [
        (tuple(x.shape), spec_of(x)) if a else (None, None) for x, a in zip(invals, arrays, strict=True)
    ]
    propagated = [propagate(name, with_specs, eqn.params, a.shape, sizes) for a in avals]

    def ruled(i: int) -> tuple[Any, Any] | None:
        if backward:  # where the gradient's result would be replicated: its scope output's rule
            return None if axes_of(propagated[i].spec) else backward_rule(c, path, avals[i])
        found = c.scope_rule(path, at.aligned[i], avals[i].dtype)
        if found is None or not any(e is jax.sharding.PartitionSpec.UNCONSTRAINED for e in found[0]):
            return found
        # unconstrained entries take the layout the operands give their dimension
        return settled(found[0], propagated[i].spec), found[1]

    if name == "dot_general" and not backward:
        found = ruled(0)
        if found is not None:
            spec, rule = found
            mesh = jax.sharding.get_abstract_mesh()
            result = bind(*invals, out_sharding=jax.sharding.NamedSharding(mesh, spec))
            record(spec, "rule", rule)
            return listed(result)
    ambiguous: Exception | None = None
    try:
        result = bind(*invals)
    except SHARDING_ERRORS as err:
        ambiguous = err
    else:
        got = listed(result)
        if all(
            axes_of(p.spec) <= axes_of(spec_of(r))
            for p, r in zip(propagated, got, strict=True)
            if hasattr(r, "shape") and p.known
        ):
            dropped = tuple(d for p in propagated for d in p.dropped if p.known)
            if backward and not multiple and not axes_of(spec_of(got[0])) and ruled(0) is not None:
                ambiguous = LayoutRefused("replicated")  # the gradient's scope output's rule lays it out
            elif name == "dot_general" or (dropped and not backward):
                record(spec_of(got[0]), "jax", dropped=dropped)
            if not backward and dropped:  # JAX drops what it must: said all the same
                hint = suggestion(path, spec_of(got[0]), at.aligned[0], c.reach.alias_of)
                c.warn_dropped(eqn, name, path, operands, spec_of(got[0]), dropped, hint)
            if ambiguous is None:
                return got
        # JAX decided, but its layout drops an axis the operands carried on a kept dimension
    if ambiguous is not None and name != "dot_general":
        lifted = lift_replicated(invals, at.made)
        if lifted is not None:  # no real choice: the one sharded operand's layout
            try:
                return listed(bind(*lifted))
            except SHARDING_ERRORS:
                pass
    found = [ruled(i) for i in range(len(avals))]
    specs = [f[0] if f else p.spec for f, p in zip(found, propagated, strict=True)]
    rule = found[0][1] if found[0] is not None and all(found) else None  # every result from a rule
    dropped = () if rule is not None else tuple(d for p in propagated for d in p.dropped)
    if backward:
        hint = "a gradient's operation takes a rule only where it would be replicated and has the shape of its scope's output"
    elif rule is not None:
        hint = f"JAX refuses the layout rule `{rule.pattern}` ({rule.location}) gives it: change that rule's spec"
    else:
        hint = suggestion(path, specs[0], at.aligned[0], c.reach.alias_of)
    if not backward and dropped:  # with `strict`, an error (before SR117: it says more)
        c.warn_dropped(eqn, name, path, operands, specs[0], dropped, hint)
    if c.strict and not backward and rule is None and ambiguous is not None:
        raise _ambiguous(c, name, path, operands, hint, ambiguous)
    hint = "" if backward else hint
    key = _OUT_SHARDING.get(name)
    if key is not None and key in params and not multiple:  # the primitive takes its result's layout
        try:
            result = bind(
                *invals, **{key: jax.sharding.NamedSharding(jax.sharding.get_abstract_mesh(), specs[0])}
            )
        except SHARDING_ERRORS:
            pass
        else:
            if rule is not None:
                record(specs[0], "rule", rule)
            else:
                record(specs[0], "inferred", hint=hint, dropped=dropped)
            return listed(result)
    try:
        result = run_with_layout(bind, invals, specs, multiple)
    except SHARDING_ERRORS as err:
        raise _ambiguous(c, name, shown, operands, hint, err) from None
    if rule is not None:
        record(specs[0], "rule", rule)
    else:
        record(specs[0], "auto_axes", hint=hint, dropped=dropped)
    return listed(result)


# Primitives that only lay their operand out (what `jax.sharding.reshard` and its kin bind).
_RESHARDS = {"reshard", "mesh_cast", "sharding_cast"}
# The parameter through which a primitive takes its result's layout.
_OUT_SHARDING = {
    "dot_general": "out_sharding",
    "reduce_sum": "out_sharding",
    "reduce_max": "out_sharding",
    "reduce_min": "out_sharding",
    "reduce_prod": "out_sharding",
    "conv_general_dilated": "out_sharding",
    "broadcast_in_dim": "sharding",
    "reshape": "sharding",
}
_SHARDING_PARAMS = ("out_sharding", "sharding", "dst_sharding")


def _stated(params: dict[str, Any], mesh: Any) -> tuple[dict[str, Any], Any]:
    """`params` without the layouts the first trace put there by itself, and
    the layout the model's code states, or `None`.

    The function is traced first with every value replicated, so a layout
    that names no mesh axis (a `broadcast_in_dim`'s, a `reshard` to
    replicated that `jnp` adds around an indexing) says nothing: it is
    removed, and the operation is laid out as any other. A layout that names
    an axis is one the model's code states (`jax.sharding.reshard(x,
    P("data"))`, `jnp.einsum(..., out_sharding=P(...))`) and is kept, and
    so is one on a mesh whose axis types are not `mesh`'s (how JAX enters
    and leaves `auto_axes` regions)."""
    stated = None
    out = dict(params)
    for key in _SHARDING_PARAMS:
        value = params.get(key)
        spec = getattr(value, "spec", None)
        if spec is None:
            continue
        other = getattr(getattr(value, "mesh", None), "axis_types", None) != getattr(mesh, "axis_types", None)
        if axes_of(spec) or getattr(spec, "unreduced", None) or getattr(spec, "reduced", None):
            stated = value
        elif other:
            stated = stated if key != "dst_sharding" else value
        elif key != "dst_sharding":
            out[key] = None
    return out, stated


def _ambiguous(c: Any, name: str, path: str, operands: Any, hint: str, err: Exception) -> Exception:
    """SR117: JAX cannot decide the layout of `name`'s result, in our words."""
    from .._planning._plan import spec_str

    shown = ", ".join(f"{shape} {spec_str(s)}" for shape, s in operands) or "none"
    said = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    where = f"in scope `{path}`" if path else "outside every named scope"
    diag = Diagnostic(
        "SR117",
        "error",
        f"JAX cannot decide the layout of the result of `{name}` {where} on this mesh's Explicit axes "
        f"(operands: {shown}); JAX says: {said}",
        None,
        path or None,
        hint,
        cause=f"`{name}` result layout undecided",
    )
    return error_for([diag], c.rules.sources)


def _params(c: Any, eqn: Any, invals: list[Any], at: Where, interpret: Interpret) -> dict[str, Any]:
    """`eqn`'s parameters, with its sub-computations traced again for the
    layouts of `invals` (a loop's carry keeping its layout), under its scope
    path, as part of the gradient where `eqn` is, and with what its results
    are aligned with passed on to the sub-computation's results."""
    name, params = eqn.primitive.name, dict(eqn.params)
    typed = [typed_aval(x) for x in invals]
    retrace = functools.partial(_retrace, interpret, c, at=at)
    if name == "scan":
        n, carry = scan_counts(params)
        for i, x in enumerate(invals[n + carry :]):  # JAX slices each step out of dimension 0
            if hasattr(x, "shape") and len(x.shape) and axes_of(entries(spec_of(x))[:1]):
                raise stacked_error(c.rules, at.path, source_line(eqn), i, x, c.origin_of(x))
        # a stacked result's first dimension is the loop's; the body makes one slice
        seed = at.aligned[:carry] + [
            [e._replace(dims=e.dims[1:]) for e in entries if e.dims] for entries in at.aligned[carry:]
        ]

        def scan_body(given: list[Any]) -> Any:
            avals = [typed_aval(x) for x in invals[: n + carry]]
            avals += [typed_aval(x, drop_leading=True) for x in invals[n + carry :]]
            return retrace(eqn.params["jaxpr"], avals, (n, carry), seed=seed, given=given)

        params["jaxpr"] = _loop(c, scan_body, invals, n, at.made)
    elif name == "while":
        cn, bn = while_counts(params, len(invals))

        def while_body(given: list[Any]) -> Any:
            typed = [typed_aval(x) for x in invals]
            return retrace(eqn.params["body_jaxpr"], typed[cn:], (bn, len(typed) - cn - bn), given=given)

        params["body_jaxpr"] = _loop(c, while_body, invals, cn + bn, at.made)
        typed = [typed_aval(x) for x in invals]
        params["cond_jaxpr"] = retrace(
            params["cond_jaxpr"], typed[:cn] + typed[cn + bn :], seed=[], live=[True]
        )
    elif name == "cond":
        first = retrace(params["branches"][0], typed[1:])
        rest = [retrace(b, typed[1:], like=first.out_avals) for b in params["branches"][1:]]
        params["branches"] = (first, *rest)
    elif name in ("custom_jvp_call", "custom_vjp_call") and isinstance(
        params.get("call_jaxpr"), jcore.ClosedJaxpr
    ):
        params["call_jaxpr"] = retrace(params["call_jaxpr"], typed)
    elif name in ("checkpoint", "remat2") and isinstance(params.get("jaxpr"), jcore.Jaxpr):
        closed = retrace(jcore.ClosedJaxpr(params["jaxpr"], ()), typed)
        if not closed.consts:
            params["jaxpr"] = closed.jaxpr
    return params


def _loop(
    c: Any, trace: Callable[[list[Any]], Any], invals: list[Any], first: int, made: Sequence[bool]
) -> Any:
    """A loop's body traced again (`trace(given)`, which fills `given` with
    the layouts the body gives its carry, operands `first ...` of
    `invals`). A carry that starts as a value the function makes from
    constants alone (`made`), replicated, takes the layout the body gives
    it, and the body is traced again: JAX, tracing with layouts, makes such
    a value (the zeros a gradient accumulates a loop's constant's cotangent
    into) in the layout of what it accumulates, where the first trace made
    it replicated; the carry's type would otherwise replicate what the body
    computes sharded. Laying a constant out moves no data. What a trace
    given up on recorded is forgotten."""
    decisions, inserted = len(c.decisions), len(c.inserted)
    contractions = {k: len(v) for k, v in c.contractions.items()}
    while True:  # each pass lays out at least one more carry: at most one pass per carry, and one more
        given: list[Any] = []
        del c.decisions[decisions:], c.inserted[inserted:]
        for k in [k for k in c.contractions if k not in contractions]:
            del c.contractions[k]
        for k, n in contractions.items():
            del c.contractions[k][n:]
        traced = trace(given)
        moved = False
        for i, spec in enumerate(given):
            k = first + i
            x = invals[k]
            free = k < len(made) and made[k] and hasattr(x, "shape")  # made by the function from constants
            if free and axes_of(spec) and not axes_of(spec_of(x)):
                invals[k], moved = jax.sharding.reshard(x, spec), True
        if not moved:
            return traced


def _retrace(
    interpret: Interpret,
    c: Any,
    closed: Any,
    avals: list[Any],
    carry: tuple[int, int] | None = None,
    like: Sequence[Any] | None = None,
    *,
    at: Where,
    seed: list[list[Any]] | None = None,
    live: list[bool] | None = None,
    given: list[Any] | None = None,
) -> Any:
    """`closed` traced again for operands typed `avals`, evaluated by
    `interpret` under `at`'s scope path (and as part of the gradient where
    `at` is); `carry=(start, count)`: those results take the layouts of the
    operands `start .. start+count` (a loop's carry); `like`: every result
    takes the layout of these avals (the branches of a `cond`); `seed`: what
    the results are aligned with and `live`: which of them the forward pass
    uses (by default, as `at` says of the equation's); `given`: filled with
    the layouts the body gives the carry, before they are matched."""
    seed = at.aligned if seed is None else seed
    live = at.live if live is None else live

    def run(*args: Any) -> list[Any]:
        results = interpret(c, closed.jaxpr, closed.consts, args, at.path, at.backward, seed, live)
        if carry is not None:
            start, count = carry
            if given is not None:
                given[:] = [spec_of(r) if hasattr(r, "shape") else None for r in results[:count]]
            results[:count] = match_types(results[:count], args[start : start + count])
        if like is not None:
            results = match_types(results, like)
        return results

    return jax.make_jaxpr(run)(*avals)
