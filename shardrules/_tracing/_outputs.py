"""What the scopes of a traced program produce: which values are the outputs
of which named scope, the names they are matched under, and which values are
laid out like an output (before `_scopes` constrains them and `_layouts` gives
contractions their layouts).

- **Uses.** Each time code enters a scope (`with jax.named_scope("attn")` in a
  Python loop, a module called twice) is one *use* of it; JAX gives every
  entry its own name-stack item, and the uses of one path are told apart by
  it. A value is an output of a use of scope `S` when an equation of that use
  makes it and something outside that use (after `S`, or a later use of `S`)
  uses it, or the function returns it; what only the gradient uses is a
  residual, not an output.
- **Names.** A use with one output has it matched as `S`; a use with several
  has them matched as `S/0`, `S/1`, ... in the order they are made.
- **Laid out like an output.** A value is aligned with an output of `S` when
  it becomes that output through operations inside `S` that keep every
  dimension where it is (element-wise ones, whose other operands may be
  broadcast) or only reorder them (`transpose`, which `jax.vmap` adds): the
  dimensions it maps to are known, so an output's spec can be given to it.
  A contraction whose result is aligned with a matched output takes that
  output's spec, reordered to its own dimensions (`_layouts`); one whose
  result is reshaped, reduced or only used inside the scope does not.
- **The gradient.** Equations of the backward pass (a `transpose` in their
  name stack, or anywhere inside a sub-computation of such an equation) have
  no outputs and nothing is aligned through them: rules describe the forward
  pass.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from .._pspec import entries as spec_entries
from ._compat import jcore

# A scope JAX wraps around a remat's forward pass when the gradient computes it
# again; it names no scope of the model.
_REMAT_SCOPE = "rematted_computation"
# `jnp.einsum` names a scope with its subscripts (`bhqk,bkhd->bqhd`): a name of
# no module, which changes with the letters. Not a scope: the result is an output
# of the scope around it, named by that scope's path (and its place among that
# use's outputs, `attn/1`), or of a `jax.named_scope` the code puts around it.
_SUBSCRIPTS = re.compile(r"[A-Za-z. ]*(?:,[A-Za-z. ]*)*(?:->[A-Za-z. ]*)?")


def is_subscripts(name: str) -> bool:
    """Whether a name-stack item's `name` is one `jnp.einsum` gives its
    scope: its subscripts, operands' and result's (`bqhd,bkhd->bhqk`)."""
    return ("," in name or "->" in name) and _SUBSCRIPTS.fullmatch(name) is not None


_CALLS = {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call"}
_ELEMENTWISE_EXTRA = {"convert_element_type", "select_n", "clamp", "add_any", "copy", "copy_p"}


class Aligned(NamedTuple):
    """A value laid out like the output `name` (shape `shape`, dtype `dtype`:
    what a rule's guard is asked about) of scope `scope`: its dimension `i`
    is the output's dimension `dims[i]`."""

    scope: str
    name: str
    shape: tuple[int, ...]
    dims: tuple[int, ...]
    use: int | None = None  # the use of `scope` (None: a use outside this jaxpr)
    dtype: Any = None  # None: not known (the value's own is used)

    def spec_for(self, out_spec: Any) -> tuple[Any, ...]:
        """The value's spec from the output's."""
        have = list(spec_entries(out_spec))
        padded = have + [None] * (len(self.shape) - len(have))
        return tuple(padded[d] for d in self.dims)

    def output_spec(self, spec: Sequence[Any]) -> tuple[Any, ...]:
        """The output's spec that gives the value `spec` (`None` where the
        value has no dimension for the output's, as a scan's stacked one)."""
        out: list[Any] = [None] * len(self.shape)
        for i, d in enumerate(self.dims):
            out[d] = spec[i] if i < len(spec) else None
        return tuple(out)


class Where(NamedTuple):
    """Where an equation is evaluated: its scope path, whether it belongs to
    the gradient, what each of its results is aligned with, whether the
    forward pass uses each (the others are residuals: only the gradient uses
    them), which operands the function makes from constants alone (a
    mask, a fill value: no argument reaches them), and for a gradient
    contraction computing an argument's cotangent, the argument's layout in
    its result's dimensions (`_transpose`)."""

    path: str
    backward: bool
    aligned: list[list[Aligned]]
    live: list[bool]
    made: tuple[bool, ...] = ()  # per operand: made by the trace from constants alone
    primal: Any = None  # a gradient contraction's layout: its argument's, as JAX's transpose rule gives


@dataclasses.dataclass
class Outputs:
    """`analyse`'s findings for one jaxpr."""

    outputs: dict[Any, list[str]]  # variable -> the scopes it is an output of, innermost first
    names: dict[tuple[Any, str], str]  # (variable, scope) -> the name it is matched under
    aligned: dict[Any, list[Aligned]]
    several: dict[str, list[str]]  # scope -> its outputs' names, for uses with several
    live: set[Any]  # variables the forward pass uses or returns


def transposed(eqn: Any) -> bool:
    """Whether `eqn` belongs to a gradient (a `transpose` in its name stack)."""
    return any(
        type(item).__name__ == "Transform" and item.name == "transpose"
        for item in eqn.source_info.name_stack.stack
    )


def _scope_items(eqn: Any) -> list[Any]:
    return [
        item
        for item in eqn.source_info.name_stack.stack
        if type(item).__name__ != "Transform" and item.name != _REMAT_SCOPE and not is_subscripts(item.name)
    ]


def forward_path(eqn: Any) -> str:
    """The scope path of an equation, its transforms (`jvp`, `transpose`,
    `vmap`) left out."""
    return "/".join(item.name for item in _scope_items(eqn))


def scope_path(eqn: Any) -> str | None:
    """The `/`-joined scope names of an equation, or `None` for the backward pass."""
    return None if transposed(eqn) else forward_path(eqn)


def join(base: str, path: str | None) -> str | None:
    if path is None:
        return None
    return f"{base}/{path}" if base and path else base or path


def under(path: str, scope: str) -> bool:
    return path == scope or path.startswith(scope + "/")


def prefixes(path: str, base: str) -> list[str]:
    """Scopes that contain `path` and are strictly inside `base`, innermost first."""
    parts = path.split("/") if path else []
    skip = len(base.split("/")) if base else 0
    return ["/".join(parts[:n]) for n in range(len(parts), skip, -1)]


def _uses(eqn: Any, base: str) -> dict[str, int]:
    """For each scope strictly inside `base` that holds `eqn`, which use of it."""
    items = _scope_items(eqn)
    full = join(base, "/".join(item.name for item in items)) or ""
    scopes = prefixes(full, base)[::-1]  # outermost first, as the items are
    levels = [id(item) for item in items for _ in item.name.split("/")]  # a name may hold a `/`
    if len(scopes) != len(levels):  # not expected; the path alone then tells uses apart
        return dict.fromkeys(scopes, 0)
    return dict(zip(scopes, levels, strict=True))


def analyse(
    jaxpr: Any,
    base: str,
    backward: bool,
    seed: Sequence[list[Aligned]] | None = None,
    live: Sequence[bool] | None = None,
) -> Outputs:
    """The outputs of the scopes in `jaxpr` (evaluated under scope `base`;
    `backward`: as part of a gradient), their names, and what is aligned with
    them (`seed`: what the jaxpr's own results are aligned with; `live`:
    which of them the forward pass uses, where the jaxpr is a sub-computation
    whose other results are residuals, as a loop body's under `jax.grad`)."""
    eqns = [] if backward else [e for e in jaxpr.eqns if not transposed(e)]
    forward = {id(e) for e in eqns}
    uses = {id(e): _uses(e, base) for e in eqns}
    users: dict[Any, list[dict[str, int] | None]] = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if isinstance(v, jcore.Var):
                # Uses by the backward pass (`None`) are residuals, not outputs.
                users.setdefault(v, []).append(uses[id(eqn)] if id(eqn) in forward else None)
    returned = {
        v
        for i, v in enumerate(jaxpr.outvars)
        if isinstance(v, jcore.Var) and (live is None or i >= len(live) or live[i])
    }
    outputs: dict[Any, list[str]] = {}
    per_use: dict[tuple[str, int], list[Any]] = {}
    for eqn in eqns:
        mine = uses[id(eqn)]
        for v in eqn.outvars:
            scopes = [
                s
                for s in sorted(mine, key=len, reverse=True)
                if v in returned or any(u is not None and u.get(s) != mine[s] for u in users.get(v, ()))
            ]
            if scopes:
                outputs[v] = scopes
                for s in scopes:
                    per_use.setdefault((s, mine[s]), []).append(v)
    names: dict[tuple[Any, str], str] = {}
    several: dict[str, list[str]] = {}
    aligned: dict[Any, list[Aligned]] = {}
    for (scope, use), vs in per_use.items():
        for i, v in enumerate(vs):
            name = names[(v, scope)] = scope if len(vs) == 1 else f"{scope}/{i}"
            if len(vs) > 1:
                several.setdefault(scope, []).append(name)
            shape = tuple(v.aval.shape)
            _add(aligned, v, Aligned(scope, name, shape, tuple(range(len(shape))), use, v.aval.dtype))
    if not backward:
        for v, entries in zip(jaxpr.outvars, seed or (), strict=False):
            for entry in entries if isinstance(v, jcore.Var) else ():
                _add(aligned, v, entry)
    for eqn in reversed(eqns):
        _align_through(eqn, aligned, join(base, forward_path(eqn)) or "", uses[id(eqn)])
    used = {v for v, us in users.items() if any(u is not None for u in us)}
    return Outputs(outputs, names, aligned, several, returned | used)


def _add(aligned: dict[Any, list[Aligned]], v: Any, entry: Aligned) -> None:
    found = aligned.setdefault(v, [])
    if all((e.scope, e.name, e.dims) != (entry.scope, entry.name, entry.dims) for e in found):
        found.append(entry)


def _align_through(
    eqn: Any, aligned: dict[Any, list[Aligned]], path: str | None = None, uses: dict[str, int] | None = None
) -> None:
    """What `eqn`'s results are aligned with, passed on to the operands whose
    dimensions it keeps in place or reorders; with `path` (the equation's
    scope path) and `uses`, only for outputs of the scopes and uses that hold
    `eqn`."""
    for k, out in enumerate(eqn.outvars):
        entries = aligned.get(out, ())
        if path is not None:
            entries = [
                e
                for e in entries
                if under(path, e.scope) and (e.use is None or (uses or {}).get(e.scope) == e.use)
            ]
        if not entries:
            continue
        for i, dims in _operand_dims(eqn, k):
            v = eqn.invars[i]
            if isinstance(v, jcore.Var):
                for entry in entries:
                    _add(aligned, v, entry._replace(dims=tuple(entry.dims[d] for d in dims)))


def _operand_dims(eqn: Any, k: int) -> list[tuple[int, tuple[int, ...]]]:
    """The operands of `eqn` its result `k` is laid out like, as `(operand,
    dims)`: the operand's dimension `j` is the result's dimension `dims[j]`.
    An element-wise operation keeps its operands of the result's shape in
    place (broadcast ones are not laid out like it), `transpose` reorders
    its operand, and a call (a nested `jit`, a custom derivative: `jnp.where`,
    `jax.nn.relu`) does what its body does; nothing else is followed."""
    name, out = eqn.primitive.name, eqn.outvars[k]
    if name == "transpose":
        dims = [0] * len(eqn.params["permutation"])
        for i, p in enumerate(eqn.params["permutation"]):
            dims[p] = i
        return [(0, tuple(dims))]
    if name in elementwise():
        same = [i for i, v in enumerate(eqn.invars) if _shape(v) is not None and _shape(v) == _shape(out)]
        return [(i, tuple(range(len(_shape(out) or ())))) for i in same]
    inner = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
    inner = getattr(inner, "jaxpr", inner)
    if name not in _CALLS or not isinstance(inner, jcore.Jaxpr) or len(inner.invars) != len(eqn.invars):
        return []
    result = inner.outvars[k]
    if not isinstance(result, jcore.Var) or _shape(result) is None:
        return []
    shape = _shape(result) or ()
    found: dict[Any, list[Aligned]] = {result: [Aligned("", "", shape, tuple(range(len(shape))))]}
    for e in reversed(inner.eqns):
        _align_through(e, found)
    return [(i, entry.dims) for i, v in enumerate(inner.invars) for entry in found.get(v, ())]


def _shape(v: Any) -> tuple[int, ...] | None:
    shape = getattr(v.aval, "shape", None)
    return None if shape is None else tuple(shape)


@functools.cache
def elementwise() -> frozenset[str]:
    """The element-wise primitives: JAX batches them as vectorized or
    broadcasting operations (`neg`, `tanh`, `add`, `max`, ...)."""
    names = set(_ELEMENTWISE_EXTRA)
    try:
        from jax._src.interpreters import batching

        for prim, rule in batching.fancy_primitive_batchers.items():
            if isinstance(rule, functools.partial) and rule.func in (
                batching.vectorized_batcher,
                batching.broadcast_batcher,
            ):
                names.add(prim.name)
    except (ImportError, AttributeError):  # another JAX: the common ones by name
        names |= {"neg", "exp", "log", "tanh", "logistic", "erf", "sqrt", "rsqrt", "abs", "sign"}
        names |= {"add", "sub", "mul", "div", "max", "min", "pow", "integer_pow", "square"}
    return frozenset(names)
