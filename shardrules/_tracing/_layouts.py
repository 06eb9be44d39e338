"""Evaluating one traced equation on a mesh with `Explicit` axes: the layout
of its result from a rule, from JAX, or inferred (see `_explicit`), and its
sub-computations (loop and branch bodies, custom derivatives, remat) traced
again for their operands' layouts. The evaluator of the whole trace
(`_scopes.interpret`) is passed in as `interpret`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.extend import core as jcore

from .._errors import Diagnostic, error_for
from ._explicit import (
    SHARDING_ERRORS,
    Decision,
    inferred_spec,
    match_types,
    run_with_layout,
    spec_of,
    suggestion,
    typed_aval,
)

Interpret = Callable[..., list[Any]]  # `_scopes.interpret(c, jaxpr, consts, args, base)`


def evaluate(c: Any, eqn: Any, invals: list[Any], path: str, interpret: Interpret) -> list[Any]:
    """One equation on explicit axes: a rule's layout for a contraction in a
    matched scope, else JAX's; where JAX cannot decide, an inferred layout
    (or SR117 with `strict`). See `_explicit`'s docstring."""
    name, multiple = eqn.primitive.name, eqn.primitive.multiple_results
    params = _params(c, eqn, invals, path, interpret)
    backward = any(
        type(i).__name__ == "Transform" and i.name == "transpose" for i in eqn.source_info.name_stack.stack
    )  # rules describe the forward pass; this is its gradient
    shown = f"{_forward_path(eqn)} (backward)".strip() if backward else path

    def bind(*values: Any, **extra: Any) -> Any:
        return eqn.primitive.bind(*values, **eqn.primitive.get_bind_params({**params, **extra}))

    def listed(result: Any) -> list[Any]:
        return list(result) if multiple else [result]

    avals = [v.aval for v in eqn.outvars]
    operands = tuple(
        (tuple(x.shape), spec_of(x)) for x in invals if hasattr(x, "shape") and hasattr(x, "dtype")
    )

    def record(spec: Any, by: str, rule: Any = None) -> None:
        shape = tuple(avals[0].shape)
        where = rule.location if rule is not None else None
        c.decisions.append(Decision(shown, name, operands, shape, spec, by, where))

    if name == "dot_general":
        found = c.scope_rule(path, tuple(avals[0].shape), avals[0].dtype)
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
    specs = []
    for aval in avals:
        found = c.scope_rule(path, tuple(aval.shape), aval.dtype)
        specs.append(found[0] if found else inferred_spec(name, invals, eqn.params, aval))
    if c.strict and not backward:
        raise _ambiguous(c, name, path, operands, specs[0], ambiguous)
    if name == "dot_general":
        try:
            result = bind(
                *invals, out_sharding=jax.sharding.NamedSharding(jax.sharding.get_abstract_mesh(), specs[0])
            )
        except SHARDING_ERRORS:
            pass
        else:
            record(specs[0], "inferred")
            return listed(result)
    try:
        result = run_with_layout(bind, invals, specs, multiple)
    except SHARDING_ERRORS as err:
        raise _ambiguous(c, name, shown, operands, specs[0], err) from None
    record(specs[0], "auto_axes")
    return listed(result)


def _forward_path(eqn: Any) -> str:
    """The scope path of an equation, its transforms (`transpose`, `jvp`) left out."""
    return "/".join(
        item.name for item in eqn.source_info.name_stack.stack if type(item).__name__ != "Transform"
    )


def _ambiguous(c: Any, name: str, path: str, operands: Any, spec: Any, err: Exception) -> Exception:
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
        suggestion(path, spec),
        cause=f"`{name}` result layout undecided",
    )
    return error_for([diag], c.rules.sources)


def _params(c: Any, eqn: Any, invals: list[Any], path: str, interpret: Interpret) -> dict[str, Any]:
    """`eqn`'s parameters, with its sub-computations traced again for the
    layouts of `invals` (a loop's carry keeping its layout)."""
    name, params = eqn.primitive.name, dict(eqn.params)
    typed = [typed_aval(x) for x in invals]
    if name == "scan":
        n, carry = params["num_consts"], params["num_carry"]
        avals = typed[: n + carry] + [typed_aval(x, drop_leading=True) for x in invals[n + carry :]]
        params["jaxpr"] = _retrace(interpret, c, params["jaxpr"], path, avals, (n, carry))
    elif name == "while":
        cn, bn = params["cond_nconsts"], params["body_nconsts"]
        carry = typed[cn + bn :]
        params["cond_jaxpr"] = _retrace(interpret, c, params["cond_jaxpr"], path, typed[:cn] + carry)
        params["body_jaxpr"] = _retrace(
            interpret, c, params["body_jaxpr"], path, typed[cn : cn + bn] + carry, (bn, len(carry))
        )
    elif name == "cond":
        first = _retrace(interpret, c, params["branches"][0], path, typed[1:])
        rest = [
            _retrace(interpret, c, b, path, typed[1:], like=first.out_avals) for b in params["branches"][1:]
        ]
        params["branches"] = (first, *rest)
    elif name in ("custom_jvp_call", "custom_vjp_call") and isinstance(
        params.get("call_jaxpr"), jcore.ClosedJaxpr
    ):
        params["call_jaxpr"] = _retrace(interpret, c, params["call_jaxpr"], path, typed)
    elif name == "checkpoint" and isinstance(params.get("jaxpr"), jcore.Jaxpr):
        closed = _retrace(interpret, c, jcore.ClosedJaxpr(params["jaxpr"], ()), path, typed)
        if not closed.consts:
            params["jaxpr"] = closed.jaxpr
    return params


def _retrace(
    interpret: Interpret,
    c: Any,
    closed: Any,
    base: str,
    avals: list[Any],
    carry: tuple[int, int] | None = None,
    like: Sequence[Any] | None = None,
) -> Any:
    """`closed` traced again for operands typed `avals`, evaluated by
    `interpret`; `carry=(start, count)`: those results take the layouts of
    the operands `start .. start+count` (a loop's carry); `like`: every
    result takes the layout of these avals (the branches of a `cond`)."""

    def run(*args: Any) -> list[Any]:
        results = interpret(c, closed.jaxpr, closed.consts, args, base)
        if carry is not None:
            start, count = carry
            results[:count] = match_types(results[:count], args[start : start + count])
        if like is not None:
            results = match_types(results, like)
        return results

    return jax.make_jaxpr(run)(*avals)
