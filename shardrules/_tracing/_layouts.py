"""Evaluating one traced equation on a mesh with `Explicit` axes: the layout
of its result from a rule, from JAX, or inferred (see `_explicit`), and its
sub-computations (loop and branch bodies, custom derivatives, remat) traced
again for their operands' layouts. The evaluator of the whole trace
(`_scopes.interpret`) is passed in as `interpret`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.extend import core as jcore

from .._errors import Diagnostic, error_for
from ._explicit import (
    SHARDING_ERRORS,
    Decision,
    inferred_spec,
    lift_replicated,
    match_types,
    run_with_layout,
    settled,
    spec_of,
    suggestion,
    typed_aval,
)
from ._outputs import Where

Interpret = Callable[
    ..., list[Any]
]  # `_scopes.interpret(c, jaxpr, consts, args, base, backward, seed, live)`


def evaluate(c: Any, eqn: Any, invals: list[Any], at: Where, interpret: Interpret) -> list[Any]:
    """One equation on explicit axes: a rule's layout for a contraction whose
    result is laid out like a matched scope output, else JAX's; where JAX
    cannot decide, an inferred layout (or SR117 with `strict`). A rule's
    unconstrained entries take the layout JAX or the inference gives their
    dimension (unsharded where another entry uses its axes: `settled`). The
    gradient's equations (`at.backward`) never take a rule's layout. See
    `_explicit`'s docstring."""
    name, multiple = eqn.primitive.name, eqn.primitive.multiple_results
    path, backward = at.path, at.backward
    params = _params(c, eqn, invals, at, interpret)
    shown = f"{path} (backward)".strip() if backward else path  # rules describe the forward pass

    def bind(*values: Any, **extra: Any) -> Any:
        return eqn.primitive.bind(*values, **eqn.primitive.get_bind_params({**params, **extra}))

    def listed(result: Any) -> list[Any]:
        return list(result) if multiple else [result]

    avals = [v.aval for v in eqn.outvars]
    operands = tuple(
        (tuple(x.shape), spec_of(x)) for x in invals if hasattr(x, "shape") and hasattr(x, "dtype")
    )

    def record(spec: Any, by: str, rule: Any = None, hint: str = "") -> None:
        shape = tuple(avals[0].shape)
        where = rule.location if rule is not None else None
        c.decisions.append(Decision(shown, name, operands, shape, spec, by, where, hint))

    def ruled(i: int) -> tuple[Any, Any] | None:
        found = None if backward else c.scope_rule(path, at.aligned[i], avals[i].dtype)
        if found is None or not any(e is jax.sharding.PartitionSpec.UNCONSTRAINED for e in found[0]):
            return found
        # unconstrained entries take JAX's layout (for a contraction, `contraction_spec` is
        # JAX's where JAX decides; other operations get here only once JAX refused them)
        return settled(found[0], inferred_spec(name, invals, eqn.params, avals[i])), found[1]

    if name == "dot_general":
        found = ruled(0)
        if found is not None:
            spec, rule = found
            mesh = jax.sharding.get_abstract_mesh()
            result = bind(*invals, out_sharding=jax.sharding.NamedSharding(mesh, spec))
            record(spec, "rule", rule)
            return listed(result)
    try:
        result = bind(*invals)
    except SHARDING_ERRORS as err:
        ambiguous: Exception = err
    else:
        if name == "dot_general":
            record(spec_of(result), "jax")
        return listed(result)
    lifted = None if name == "dot_general" else lift_replicated(invals, at.made)
    if lifted is not None:  # no real choice: the one sharded operand's layout
        try:
            return listed(bind(*lifted))
        except SHARDING_ERRORS:
            pass
    found = [ruled(i) for i in range(len(avals))]
    specs = [
        f[0] if f else inferred_spec(name, invals, eqn.params, a) for f, a in zip(found, avals, strict=True)
    ]
    rule = found[0][1] if found[0] is not None and all(found) else None  # every result from a rule
    if backward:
        hint = "no activation rule applies to the gradient's operations: they follow the forward pass"
    elif rule is not None:
        hint = f"JAX refuses the layout rule `{rule.pattern}` ({rule.location}) gives it: change that rule's spec"
    else:
        hint = suggestion(path, specs[0], at.aligned[0])
    if c.strict and not backward and rule is None:
        raise _ambiguous(c, name, path, operands, hint, ambiguous)
    if name == "dot_general":
        try:
            result = bind(
                *invals, out_sharding=jax.sharding.NamedSharding(jax.sharding.get_abstract_mesh(), specs[0])
            )
        except SHARDING_ERRORS:
            pass
        else:
            record(specs[0], "inferred", hint="" if backward else hint)
            return listed(result)
    try:
        result = run_with_layout(bind, invals, specs, multiple)
    except SHARDING_ERRORS as err:
        raise _ambiguous(c, name, shown, operands, hint, err) from None
    if rule is not None:
        record(specs[0], "rule", rule)
    else:
        record(specs[0], "auto_axes", hint="" if backward else hint)
    return listed(result)


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
        n, carry = params["num_consts"], params["num_carry"]
        avals = typed[: n + carry] + [typed_aval(x, drop_leading=True) for x in invals[n + carry :]]
        # a stacked result's first dimension is the loop's; the body makes one slice
        seed = at.aligned[:carry] + [
            [e._replace(dims=e.dims[1:]) for e in entries if e.dims] for entries in at.aligned[carry:]
        ]
        params["jaxpr"] = retrace(params["jaxpr"], avals, (n, carry), seed=seed)
    elif name == "while":
        cn, bn = params["cond_nconsts"], params["body_nconsts"]
        carry = typed[cn + bn :]
        params["cond_jaxpr"] = retrace(params["cond_jaxpr"], typed[:cn] + carry, seed=[], live=[True])
        params["body_jaxpr"] = retrace(params["body_jaxpr"], typed[cn : cn + bn] + carry, (bn, len(carry)))
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
) -> Any:
    """`closed` traced again for operands typed `avals`, evaluated by
    `interpret` under `at`'s scope path (and as part of the gradient where
    `at` is); `carry=(start, count)`: those results take the layouts of the
    operands `start .. start+count` (a loop's carry); `like`: every result
    takes the layout of these avals (the branches of a `cond`); `seed`: what
    the results are aligned with and `live`: which of them the forward pass
    uses (by default, as `at` says of the equation's)."""
    seed = at.aligned if seed is None else seed
    live = at.live if live is None else live

    def run(*args: Any) -> list[Any]:
        results = interpret(c, closed.jaxpr, closed.consts, args, at.path, at.backward, seed, live)
        if carry is not None:
            start, count = carry
            results[:count] = match_types(results[:count], args[start : start + count])
        if like is not None:
            results = match_types(results, like)
        return results

    return jax.make_jaxpr(run)(*avals)
