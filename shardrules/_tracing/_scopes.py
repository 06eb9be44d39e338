"""Automatic activation constraints: find the outputs of named scopes in a traced
function and pin their sharding, without touching the model code.

`jax.named_scope` (and frameworks that name module calls with it, such as Flax
linen) records a name stack on every equation of a jaxpr. A value is an output
of scope `X` when an equation inside `X` produces it and something outside `X`
uses it (or the function returns it); what only the backward pass of a
gradient uses is a residual, not an output. `auto_constrain` traces the function,
finds those outputs, matches each scope's path against the `activations` rules,
and evaluates the jaxpr again with a `with_sharding_constraint` right after each
matched output is produced. Nested `jit` calls are inlined; the bodies of
`scan`, `while`, `cond` and `remat` are rewritten in place.

On a mesh with `Explicit` axes the trace is made without layouts and evaluated
with them (see `_explicit`): the rules also give the contractions' result
layouts, and sub-computations are traced again with their operands' layouts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax._src import source_info_util
from jax.extend import core as jcore

from .._errors import Diagnostic, error_for
from .._interop._paths import LeafInfo
from .._language._load import iter_rules
from .._language._rules import RuleSet
from .._planning._match import Matcher
from .._planning._mesh import pin
from .._planning._spec import LeafError, leaf_spec
from . import _explicit, _layouts

_INLINED = {"jit", "pjit", "closed_call", "core_call"}
_OPAQUE = {"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin"}


def scope_path(eqn: Any) -> str | None:
    """The `/`-joined scope names of an equation, or `None` for the backward pass."""
    names = []
    for item in eqn.source_info.name_stack.stack:
        kind = type(item).__name__
        if kind == "Transform":
            if item.name == "transpose":
                return None
            continue
        names.append(item.name)
    return "/".join(names)


@dataclasses.dataclass
class Constrainer:
    """Matches scope outputs to rules and makes their shardings."""

    rules: RuleSet
    group: str | None  # None: no rules (explicit axes still need result layouts)
    sizes: dict[str, int]
    sharding: Callable[[jax.sharding.PartitionSpec], Any]
    explicit: bool = False  # the mesh has Explicit axes: also decide result layouts (`_explicit`)
    strict: bool = False  # explicit: a layout JAX cannot decide and no rule gives is an error
    abstract_mesh: Any = None  # explicit: the mesh each equation is evaluated under
    inserted: list[tuple[str, tuple[int, ...], Any]] = dataclasses.field(default_factory=list)
    decisions: list[_explicit.Decision] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.group is not None:
            self.rules.group(self.group)
        self._rules = list(iter_rules(self.rules, self.group)) if self.group is not None else []
        self._matcher = Matcher(self._rules)
        self._default = self.rules.defaults.get(self.group) if self.group is not None else None

    def rule_for(self, path: str) -> Any:
        return self._matcher.first(path) or self._default

    def scope_rule(self, path: str, shape: tuple[int, ...], dtype: Any) -> tuple[Any, Any] | None:
        """`(spec, rule)` from the rule of the innermost scope containing `path`
        whose pattern matches it and whose spec fits `shape`; the default rule
        is not used (it would lay out every operation alike)."""
        if not shape:
            return None
        for scope in _prefixes(path, ""):
            rule = self._matcher.first(scope)
            if rule is None:
                continue
            try:
                return leaf_spec(rule, LeafInfo(scope, shape, np.dtype(dtype)), self.sizes, self.rules), rule
            except LeafError:
                continue
        return None

    def constrain(self, path: str, value: Any) -> Any:
        rule = self.rule_for(path)
        shape = tuple(int(d) for d in np.shape(value))
        if rule is None or not shape:
            return value
        info = LeafInfo(path, shape, np.dtype(value.dtype))
        try:
            spec = leaf_spec(rule, info, self.sizes, self.rules)
        except LeafError as err:
            diag = Diagnostic(err.code, "error", f"scope output {err.message}", err.span, path, err.hint)
            raise error_for([diag], self.rules.sources) from None
        self.inserted.append((path, shape, spec))
        return pin(value, self.sharding(spec))


def _prefixes(path: str, base: str) -> list[str]:
    """Scopes that contain `path` and are strictly inside `base`, innermost first."""
    parts = path.split("/") if path else []
    skip = len(base.split("/")) if base else 0
    return ["/".join(parts[:n]) for n in range(len(parts), skip, -1)]


def _outputs(jaxpr: Any, base: str) -> dict[Any, list[str]]:
    """For each variable, the scope paths (inside `base`) it is an output of."""
    paths = [scope_path(e) for e in jaxpr.eqns]
    users: dict[Any, list[str | None]] = {}
    for eqn, path in zip(jaxpr.eqns, paths, strict=True):
        for v in eqn.invars:
            if isinstance(v, jcore.Var):
                users.setdefault(v, []).append(_join(base, path))
    returned = {v for v in jaxpr.outvars if isinstance(v, jcore.Var)}
    out: dict[Any, list[str]] = {}
    for eqn, path in zip(jaxpr.eqns, paths, strict=True):
        if path is None:
            continue
        full = _join(base, path)
        assert full is not None
        for v in eqn.outvars:
            used = users.get(v, [])
            scopes = [
                x
                for x in _prefixes(full, base)
                # Uses by the backward pass (`None`) are residuals, not outputs.
                if v in returned or any(u is not None and not _under(u, x) for u in used)
            ]
            if scopes:
                out[v] = scopes
    return out


def _join(base: str, path: str | None) -> str | None:
    if path is None:
        return None
    return f"{base}/{path}" if base and path else base or path


def _under(path: str, scope: str) -> bool:
    return path == scope or path.startswith(scope + "/")


def _names(jaxpr: Any, base: str, outputs: dict[Any, list[str]]) -> dict[tuple[Any, str], str]:
    """The path each (variable, scope) is matched under: the scope's own path
    when it has one output, `scope/i` (in order of production) when several."""
    per_scope: dict[str, list[Any]] = {}
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            for scope in outputs.get(v, ()):
                per_scope.setdefault(scope, []).append(v)
    names = {}
    for scope, vs in per_scope.items():
        for i, v in enumerate(vs):
            names[(v, scope)] = scope if len(vs) == 1 else f"{scope}/{i}"
    return names


def interpret(
    c: Constrainer, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], base: str = ""
) -> list[Any]:
    """Evaluate `jaxpr`, constraining the outputs of matched scopes."""
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, jcore.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts, strict=True):
        env[v] = x
    for v, x in zip(jaxpr.invars, args, strict=True):
        env[v] = x
    outputs = _outputs(jaxpr, base)
    names = _names(jaxpr, base, outputs)
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        path = _join(base, scope_path(eqn)) or ""
        name = eqn.primitive.name
        name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
        with contextlib.ExitStack() as stack:
            stack.enter_context(
                source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack)
            )
            stack.enter_context(eqn.ctx.manager)
            if c.abstract_mesh is not None:  # the trace had no mesh; the explicit types need it
                stack.enter_context(jax.sharding.use_abstract_mesh(c.abstract_mesh))
            if name in _INLINED:
                inner = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
                if isinstance(inner, jcore.ClosedJaxpr):
                    results = interpret(c, inner.jaxpr, inner.consts, invals, path)
                else:
                    results = interpret(c, inner, (), invals, path)
            elif c.explicit:
                results = _layouts.evaluate(c, eqn, invals, path, interpret)
            else:
                params = eqn.params if name in _OPAQUE else _rewrite_params(c, eqn.params, path)
                results = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(params))
                if not eqn.primitive.multiple_results:
                    results = [results]
        for v, x in zip(eqn.outvars, results, strict=True):
            for scope in outputs.get(v, ()):  # innermost first, so the outermost decides
                x = c.constrain(names[(v, scope)], x)
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _rewrite_params(c: Constrainer, params: dict[str, Any], base: str) -> dict[str, Any]:
    """Rewrite the sub-jaxprs of a control-flow or remat equation."""
    out = dict(params)
    for key, value in params.items():
        if isinstance(value, jcore.ClosedJaxpr):
            out[key] = _rewrite_closed(c, value, base)
        elif isinstance(value, jcore.Jaxpr) and not value.constvars:
            closed = _rewrite_closed(c, jcore.ClosedJaxpr(value, ()), base)
            out[key] = closed.jaxpr if not closed.consts else value
        elif isinstance(value, tuple) and value and all(isinstance(b, jcore.ClosedJaxpr) for b in value):
            out[key] = tuple(_rewrite_closed(c, b, base) for b in value)
    return out


def _rewrite_closed(c: Constrainer, closed: Any, base: str) -> Any:
    if not _has_scopes(closed.jaxpr):
        return closed
    avals = [
        jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
        for v in closed.jaxpr.invars
    ]
    fn = functools.partial(_run_closed, c, closed, base)
    return jax.make_jaxpr(fn)(*avals)


def _run_closed(c: Constrainer, closed: Any, base: str, *args: Any) -> list[Any]:
    return interpret(c, closed.jaxpr, closed.consts, args, base)


def _has_scopes(jaxpr: Any) -> bool:
    for eqn in jaxpr.eqns:
        if scope_path(eqn):
            return True
        for value in eqn.params.values():
            inner = value.jaxpr if isinstance(value, jcore.ClosedJaxpr) else value
            if isinstance(inner, jcore.Jaxpr) and _has_scopes(inner):
                return True
    return False
