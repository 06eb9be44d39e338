"""Automatic activation constraints: find the outputs of named scopes in a traced
function and pin their sharding, without touching the model code.

`jax.named_scope` (and frameworks that name module calls with it, such as Flax
linen) records a name stack on every equation of a jaxpr. `_outputs` finds
the outputs of each use of a scope (what an equation of the use makes and
code outside it uses, or the function returns; what only the backward pass of
a gradient uses is a residual, not an output) and the name each is matched
under (`S`, or `S/0`, `S/1`, ... for a use with several). `auto_constrain`
traces the function, matches those names against the `activations` rules,
and evaluates the jaxpr again with a `with_sharding_constraint` right after
each matched output is produced. Nested `jit` calls are inlined; the bodies of
`scan`, `while`, `cond` and `remat` are rewritten in place. The gradient's
equations, and everything inside their sub-computations, get no constraints.

On a mesh with `Explicit` axes the trace is made without layouts and evaluated
with them (see `_explicit`, `_layouts`): the rules also give the layouts of
the contractions whose results are laid out like a matched output, and
sub-computations are traced again with their operands' layouts. A rule that
lays a value out over an Explicit and an Auto axis at once is an error there
(SR207).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType

from .._errors import Diagnostic, ShardRulesWarning, error_for
from .._interop._paths import LeafInfo
from .._language._load import iter_rules
from .._language._rules import RuleSet
from .._planning._blocks import entry_axes
from .._planning._match import Matcher
from .._planning._mesh import pin
from .._planning._spec import LeafError, leaf_spec
from .._pspec import entries
from .._quiet import warn
from . import _compat, _cotangents, _explicit, _layouts, _transpose
from ._compat import jcore
from ._outputs import Aligned, Where, analyse, forward_path, join, scope_path, transposed, under
from ._reach import Reach
from ._regions import Shadows, elsewhere_mesh, mesh_of
from ._seen import Seen

_INLINED = {"jit", "pjit", "closed_call", "core_call"}
_OPAQUE = {"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin"}


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
    shadows: Shadows = dataclasses.field(default_factory=Shadows)  # explicit: see `_regions`
    # which argument leaf a value is, and the rule that laid it out, for messages (`None`: not one)
    origin: Callable[[Any], tuple[str, Any] | None] | None = None
    # explicit: the forward contractions of every jaxpr of the step, by origin (`_transpose`)
    contractions: _transpose.Contractions = dataclasses.field(default_factory=dict)
    # the parameter names of auto-named scopes, and what no scope reaches (`_reach`)
    reach: Reach = dataclasses.field(default_factory=Reach)

    def __post_init__(self) -> None:
        if self.group is not None:
            self.rules.group(self.group)
        self._rules = list(iter_rules(self.rules, self.group)) if self.group is not None else []
        self._matcher = Matcher(self._rules)
        self._default = self.rules.defaults.get(self.group) if self.group is not None else None
        self._warned: set[Any] = set()
        self.seen = Seen(self.rules, self._matcher, self.reach.alias_of)  # SR201, SR211, `scopes`

    def origin_of(self, value: Any) -> tuple[str, Any] | None:
        """Which argument leaf `value` is (`argument `params`, leaf `layers/w``)
        and the rule that laid it out (or `None`), where it is one."""
        return self.origin(value) if self.origin is not None else None

    def rule_for(self, path: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """The rule for a scope output matched as `path`, of `shape` and
        `dtype`: the first whose pattern matches and whose guard holds, else
        the default where its guard holds (as `_compile._fitting`), or `None`.
        A rule matching its parameter name (`_reach`) is taken where none
        matches `path`."""
        rule = self._first(path, shape, dtype)
        if rule is None and self._default is not None and self._matcher.holds(self._default, shape, dtype):
            return self._default
        return rule

    def _first(self, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """The first rule fitting the scope output `name`, else its parameter name."""
        rule = self._matcher.first_fitting(name, shape, dtype)
        alias = self.reach.alias_of(name) if rule is None else None
        return self._matcher.first_fitting(alias, shape, dtype) if alias is not None else rule

    def output_rule(self, path: str, shape: tuple[int, ...], dtype: str) -> Any:
        """`rule_for` a scope output, `None` without an activations group."""
        return self.rule_for(path, shape, _dtype(dtype)) if self.group is not None else None

    def scope_rule(self, path: str, aligned: Sequence[Aligned], dtype: Any) -> tuple[Any, Any] | None:
        """`(spec, rule)` for a result made in scope `path` and aligned with
        the outputs `aligned` (see `_outputs`): the spec of the innermost
        such output inside a scope holding `path` whose name a rule matches,
        whose guard holds for the output's shape and dtype (`dtype`, the
        result's, where the output's is not known) and which fits, reordered
        to the result's dimensions. The spec may hold unconstrained entries
        (`_layouts` settles them). The default rule is not used (it would lay
        out every operation alike)."""
        for entry in sorted((e for e in aligned if under(path, e.scope)), key=lambda e: -len(e.scope)):
            if not entry.dims:
                continue
            kind = _dtype(entry.dtype if entry.dtype is not None else dtype)
            rule = self._first(entry.name, entry.shape, kind)
            if rule is None:
                continue
            try:
                out = leaf_spec(
                    rule, LeafInfo(entry.name, entry.shape, np.dtype(kind)), self.sizes, self.rules
                )
            except (LeafError, TypeError):  # TypeError: not a NumPy dtype (a PRNG key)
                continue
            self.check_axis_types(rule, out, entry.name)
            return jax.sharding.PartitionSpec(*entry.spec_for(out)), rule
        return None

    def constrain(self, path: str, value: Any) -> Any:
        shape = tuple(int(d) for d in np.shape(value))
        if not shape:
            return value
        rule = self.rule_for(path, shape, _dtype(value.dtype))
        if rule is None:
            return value
        info = LeafInfo(path, shape, np.dtype(value.dtype))
        try:
            spec = leaf_spec(rule, info, self.sizes, self.rules)
        except LeafError as err:
            diag = Diagnostic(err.code, "error", f"scope output {err.message}", err.span, path, err.hint)
            raise error_for([diag], self.rules.sources) from None
        self.check_axis_types(rule, spec, path)
        self.inserted.append((path, shape, spec))
        return pin(value, self.sharding(spec))

    def check_axis_types(self, rule: Any, spec: Any, path: str) -> None:
        """SR207: on a mesh with Explicit and Auto axes, a spec over both, which
        neither `reshard` (Explicit axes) nor `with_sharding_constraint` (Auto
        axes) can apply."""
        mesh = self.abstract_mesh
        if mesh is None:
            return
        types = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
        used = [a for entry in entries(spec) for a in entry_axes(entry)]
        explicit = [a for a in used if types.get(a) == AxisType.Explicit]
        auto = [a for a in used if types.get(a) == AxisType.Auto]
        if not (explicit and auto):
            return
        kept = [[a for a in entry_axes(entry) if a not in auto] for entry in entries(spec)]
        one = ", ".join("_" if not k else k[0] if len(k) == 1 else "(" + ", ".join(k) + ")" for k in kept)
        diag = Diagnostic(
            "SR207",
            "error",
            f"activation rule `{rule.pattern or 'default'}` lays `{path}` out over Explicit axes "
            f"({', '.join(explicit)}) and Auto axes ({', '.join(auto)}) of this mesh at once: neither "
            "`jax.sharding.reshard` (Explicit axes only) nor `with_sharding_constraint` (Auto axes only) "
            "can apply it",
            rule.spec.span or rule.span,
            path,
            f"use axes of one type in the rule (its Explicit axes alone: `({one})`), or build the mesh "
            "with one axis type (`jax.make_mesh(..., axis_types=(AxisType.Explicit,) * n)`)",
        )
        raise error_for([diag], self.rules.sources)

    def warn_dropped(
        self,
        eqn: Any,
        primitive: str,
        path: str,
        operands: Sequence[tuple[tuple[int, ...], Any]],
        spec: Any,
        dropped: Sequence[tuple[int, str, str]],
        hint: str,
    ) -> None:
        """SR210 (a `ShardRulesWarning`; an error with `strict`): the layout of
        `primitive`'s result in scope `path` drops mesh axes its operands
        carried on a dimension it keeps (`dropped`: `(dimension, axis, why)`),
        so every device along them computes that dimension whole. Once per
        operation and source line of a traced step."""
        source = _layouts.source_line(eqn)
        key = ("SR210", primitive, path, source, tuple(dropped))
        if key in self._warned:
            return
        self._warned.add(key)
        hint = hint.replace(" (or pass strict=False to infer it)", "")
        diag = _explicit.dropped_diagnostic(primitive, path, source, operands, spec, dropped, hint)
        if self.strict:
            raise error_for([dataclasses.replace(diag, severity="error")], self.rules.sources)
        warning = ShardRulesWarning(diag, self.rules.sources)
        file, _, line = source.rpartition(":")
        if file and line.isdigit():  # shown at the model's line that made the operation
            warn(warning, at=(file, int(line)))
        else:
            warn(warning, stacklevel=2)


def _dtype(dtype: Any) -> Any:
    """`dtype` as a NumPy dtype, for guards; as it is where NumPy has none (a PRNG key's)."""
    try:
        return np.dtype(dtype)
    except TypeError:
        return dtype


def interpret(
    c: Constrainer,
    jaxpr: Any,
    consts: Sequence[Any],
    args: Sequence[Any],
    base: str = "",
    backward: bool = False,
    seed: Sequence[list[Aligned]] | None = None,
    live: Sequence[bool] | None = None,
    made_args: Sequence[bool] = (),
) -> list[Any]:
    """Evaluate `jaxpr` under scope `base`, constraining the outputs of matched
    scopes; `backward`: it is (part of) a gradient, which gets no constraints
    and no rule's layouts; for a sub-computation, `seed`: what its results are
    aligned with, `live`: which of them the forward pass uses (see
    `_outputs.analyse`); `made_args`: which arguments the caller made from
    constants alone (an inlined call's operands)."""
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, jcore.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts, strict=True):
        env[v] = x
    for v, x in zip(jaxpr.invars, args, strict=True):
        env[v] = x
    # values no argument of the whole function reaches (see `_explicit.lift_replicated`)
    made = set(jaxpr.constvars) | {v for v, m in zip(jaxpr.invars, made_args, strict=False) if m}
    partners: _transpose.Partners = {}  # the forward contractions, by operand (`_transpose`)
    arguments = _transpose.arguments_of(jaxpr)
    found = analyse(jaxpr, base, backward, seed, live)
    c.seen.add(found)
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        back = backward or transposed(eqn)
        path = join(base, forward_path(eqn)) or ""
        name = eqn.primitive.name
        aligned = [[] if back else found.aligned.get(v, []) for v in eqn.outvars]
        used = [v in found.live for v in eqn.outvars]
        with contextlib.ExitStack() as stack:
            stack.enter_context(_compat.user_context(eqn))
            stack.enter_context(eqn.ctx.manager)
            if c.abstract_mesh is not None:  # the explicit types need the mesh the trace had
                context = _context_mesh(c.abstract_mesh, invals, eqn.outvars)
                stack.enter_context(jax.sharding.use_abstract_mesh(context))
            # which operands no argument reaches: explicit axes only (`_explicit.lift_replicated`)
            consts = (
                tuple(isinstance(v, jcore.Literal) or v in made for v in eqn.invars) if c.explicit else ()
            )
            if name in _INLINED:
                inner = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
                if isinstance(inner, jcore.ClosedJaxpr):
                    results = interpret(
                        c, inner.jaxpr, inner.consts, invals, path, back, aligned, used, consts
                    )
                else:
                    results = interpret(c, inner, (), invals, path, back, aligned, used, consts)
            elif c.explicit:
                primal = None
                forward = not back or _transpose.recomputed(eqn)  # a remat's gradient computes it again
                if not forward and _transpose.is_transposed(eqn):  # an argument's cotangent: its layout
                    specs = _transpose.primal_layouts(eqn, partners, c.contractions, path)
                    if len(specs) > 1 and c.strict and any(s is not None for s in specs):
                        raise _transpose.undecided(c, eqn, path, specs.values())
                    primal = next(iter(specs)) if len(specs) == 1 else None
                elif not forward and name in _cotangents.INDEXING:  # its primal's layout
                    origin = _transpose.origin(eqn, path)
                    primal = _cotangents.primal_layout(eqn, partners, c.contractions, origin)
                elif forward and name == "dot_general":
                    _transpose.remember(partners, c.contractions, eqn, read, arguments, path)
                elif forward and name in _cotangents.INDEXING:
                    origin = _transpose.origin(eqn, path)
                    _cotangents.remember(partners, c.contractions, eqn, read, origin)
                _transpose.passed_on(arguments, eqn)
                at = Where(path, back, aligned, used, consts, primal)
                results = _layouts.evaluate(c, eqn, invals, at, interpret)
            else:  # the gradient's sub-computations get no constraints
                params = eqn.params if name in _OPAQUE or back else _rewrite_params(c, eqn.params, path, used)
                results = _compat.rebind(eqn.primitive, invals, params)
                if not eqn.primitive.multiple_results:
                    results = [results]
        if c.explicit:
            made.update(v for v, m in zip(eqn.outvars, _made_outputs(eqn, consts), strict=True) if m)
        for v, x in zip(eqn.outvars, results, strict=True):
            for scope in found.outputs.get(v, ()):  # innermost first, so the outermost decides
                x = c.constrain(found.names[(v, scope)], x)
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _context_mesh(mesh: Any, invals: Sequence[Any], outvars: Sequence[Any] = ()) -> Any:
    """The abstract mesh to evaluate an equation under: `mesh`, or, inside a
    region the code moved to other axis types (`jax.sharding.auto_axes`,
    `.at[...].get(out_sharding=...)`: see `_regions`), the mesh all its typed
    operands are on; for an equation with no typed operand (a constant
    broadcast, such as the zeros a gather's gradient scatters into), the mesh
    the trace typed its results on."""
    meshes = [m for m in map(mesh_of, invals) if m is not None]
    if meshes and all(elsewhere_mesh(m, mesh) for m in meshes):
        return meshes[0]
    if not meshes:
        made = [getattr(getattr(getattr(v, "aval", None), "sharding", None), "mesh", None) for v in outvars]
        made = [m for m in made if m is not None]
        if made and all(elsewhere_mesh(m, mesh) for m in made):
            return made[0]
    return mesh


def _made_outputs(eqn: Any, made_in: Sequence[bool]) -> list[bool]:
    """Which results of `eqn` are made from constants alone, given which of
    its operands are (`made_in`): all of them when every operand is; for an
    inlined call, each result its body makes from such operands alone."""
    if eqn.primitive.name in _INLINED:
        inner = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
        jaxpr = inner.jaxpr if isinstance(inner, jcore.ClosedJaxpr) else inner
        made = set(jaxpr.constvars) | {v for v, m in zip(jaxpr.invars, made_in, strict=True) if m}
        for sub in jaxpr.eqns:
            flags = [isinstance(v, jcore.Literal) or v in made for v in sub.invars]
            made.update(v for v, m in zip(sub.outvars, _made_outputs(sub, flags), strict=True) if m)
        return [isinstance(v, jcore.Literal) or v in made for v in jaxpr.outvars]
    return [all(made_in)] * len(eqn.outvars)


def _rewrite_params(c: Constrainer, params: dict[str, Any], base: str, live: list[bool]) -> dict[str, Any]:
    """Rewrite the sub-jaxprs of a control-flow or remat equation whose results
    the forward pass uses as `live` says (a sub-jaxpr with as many results as
    the equation: a loop body, a branch, a remat's)."""
    out = dict(params)
    for key, value in params.items():
        if isinstance(value, jcore.ClosedJaxpr):
            out[key] = _rewrite_closed(c, value, base, live)
        elif isinstance(value, jcore.Jaxpr) and not value.constvars:
            closed = _rewrite_closed(c, jcore.ClosedJaxpr(value, ()), base, live)
            out[key] = closed.jaxpr if not closed.consts else value
        elif isinstance(value, tuple) and value and all(isinstance(b, jcore.ClosedJaxpr) for b in value):
            out[key] = tuple(_rewrite_closed(c, b, base, live) for b in value)
    return out


def _rewrite_closed(c: Constrainer, closed: Any, base: str, live: list[bool]) -> Any:
    if not _has_scopes(closed.jaxpr):
        return closed
    avals = [
        jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
        for v in closed.jaxpr.invars
    ]
    ours = live if len(closed.jaxpr.outvars) == len(live) else None
    fn = functools.partial(_run_closed, c, closed, base, ours)
    return jax.make_jaxpr(fn)(*avals)


def _run_closed(c: Constrainer, closed: Any, base: str, live: list[bool] | None, *args: Any) -> list[Any]:
    return interpret(c, closed.jaxpr, closed.consts, args, base, live=live)


def _has_scopes(jaxpr: Any) -> bool:
    for eqn in jaxpr.eqns:
        if scope_path(eqn):
            return True
        for value in eqn.params.values():
            inner = value.jaxpr if isinstance(value, jcore.ClosedJaxpr) else value
            if isinstance(inner, jcore.Jaxpr) and _has_scopes(inner):
                return True
    return False
