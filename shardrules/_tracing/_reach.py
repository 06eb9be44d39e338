"""What activation rules can name beyond scope paths, and what they cannot
reach at all.

**Parameter names.** Frameworks name the modules they make without a name
after their class (Flax linen's `Einsum_0`, `Dense_1`), which differs from
the names the parameters are stored under (a module that keeps its weight in
its parent's scope: `mlp/gating_einsum`). The output of a use of such an
*auto-named* scope (its last segment is a class name and a number,
`[A-Z][A-Za-z0-9]*_N`) is also matched under its *weight's* name, where
that is unambiguous:

- the weights of a scope are the argument leaves of the step (parameters)
  that its forward contractions (`dot_general`, convolutions) take as an
  operand, and that its gathers index (an embedding table), directly or
  through casts, reshapes and transposes, in the scope or in scopes inside
  it, inlined calls and the constants of loops and branches included;
- the scope is named after its weight when it has exactly one, and no
  operation outside the scope uses that parameter as a weight: the name
  is the parameter's path in its argument, as `params` rules match it
  (`params/mlp/gating_einsum`), with `/0`, `/1`, ... after it for a use
  with several outputs, as the scope's own name has;
- a scope with several weights, or whose weight an operation outside it
  uses too (a tied embedding), has no such name, and `refused` says why;
  one with none (a norm) has none either. Inside a `lax.scan` over stacked
  layers, a weight sliced from the stack is named by the stack's path.

A scope output's own name is matched first; the parameter's only where no
activation rule matches the scope's.

**Unreached operations.** An operation of the forward pass outside every
named scope is the output of none, so no activation rule reaches it. Those
whose layout is a choice (gathers, scatters, selects, contractions,
reductions, slices, concatenations, sorts; not element-wise operations,
which follow their operands) and whose result is not a scalar are listed by
kind with their source lines, for `explain --step`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from ._compat import jcore
from ._cotangents import source_line
from ._outputs import forward_path, join, transposed, under

AUTO_NAMED = re.compile(r"[A-Z][A-Za-z0-9]*_\d+")
"""A scope segment a framework makes from a class name and a number (`Einsum_0`)."""

_CONTRACTIONS = {"dot_general", "conv_general_dilated"}
_PASS = {"convert_element_type", "copy", "copy_p", "reshape", "transpose", "squeeze", "reduce_precision"}
_KINDS = (
    ("gather", ("gather",)),
    ("scatter", ("scatter", "scatter-add", "scatter_add", "scatter_mul", "scatter_min", "scatter_max")),
    ("select", ("select_n",)),
    ("contraction", ("dot_general", "conv_general_dilated")),
    ("reduction", ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin")),
    ("slice", ("dynamic_slice", "dynamic_update_slice")),
    ("concatenate", ("concatenate",)),
    ("sort", ("sort", "top_k")),
    ("cumulative", ("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")),
)
_KIND = {p: kind for kind, names in _KINDS for p in names}


@dataclasses.dataclass(frozen=True)
class Unreached:
    """Operations of one kind outside every named scope: the `kind`
    (`gather`, `select`, ...), the primitives, and the distinct source lines
    (`FILE:LINE`, `""` where JAX does not say), in the order first met."""

    kind: str
    primitives: tuple[str, ...]
    count: int
    sources: tuple[str, ...]


@dataclasses.dataclass
class Reach:
    """What `find` found: `aliases` (auto-named scope path -> its weight's
    path), `refused` (auto-named scope path -> why its weight is ambiguous),
    and the `unreached` operations by kind."""

    aliases: dict[str, str] = dataclasses.field(default_factory=dict)
    refused: dict[str, str] = dataclasses.field(default_factory=dict)
    unreached: list[Unreached] = dataclasses.field(default_factory=list)

    def alias_of(self, name: str) -> str | None:
        """The parameter name of the scope output `name` (`S`, or `S/N` for a
        use with several outputs), or `None`."""
        found = self.aliases.get(name)
        if found is not None:
            return found
        head, _, tail = name.rpartition("/")
        if tail.isdigit() and head in self.aliases:
            return f"{self.aliases[head]}/{tail}"
        return None


def _auto_scopes(path: str) -> list[str]:
    """The auto-named scopes holding an operation of scope `path`, outermost first."""
    parts = path.split("/") if path else []
    return ["/".join(parts[:end]) for end in range(1, len(parts) + 1) if AUTO_NAMED.fullmatch(parts[end - 1])]


def _inner(value: Any) -> Any:
    return value.jaxpr if isinstance(value, jcore.ClosedJaxpr) else value


def _sub_jaxprs(eqn: Any) -> list[tuple[Any, list[int | None]]]:
    """Each sub-computation of `eqn` with, per argument of it, the operand of
    `eqn` it is (`None`: not one, as a loop's carried values)."""
    out: list[tuple[Any, list[int | None]]] = []
    n = len(eqn.invars)
    for key, value in eqn.params.items():
        for item in value if isinstance(value, tuple) else (value,):
            jaxpr = _inner(item)
            if not isinstance(jaxpr, jcore.Jaxpr):
                continue
            m = len(jaxpr.invars)
            if eqn.primitive.name == "scan":  # constants and the stacks sliced per trip, not carries
                consts = int(eqn.params.get("num_consts", 0))
                carries = range(consts, consts + int(eqn.params.get("num_carry", 0)))
                mapping: list[int | None] = [None if i in carries or i >= n else i for i in range(m)]
            elif m == n:
                mapping = list(range(n))
            elif eqn.primitive.name == "cond" and m == n - 1:
                mapping = list(range(1, n))
            elif eqn.primitive.name == "while":
                skip = int(eqn.params.get("cond_nconsts", 0)) if key == "body_jaxpr" else 0
                consts = int(eqn.params.get(f"{key.split('_')[0]}_nconsts", 0))
                mapping = [skip + i if i < consts else None for i in range(m)]
            else:
                mapping = [None] * m
            out.append((jaxpr, mapping))
    return out


class _Walk:
    def __init__(self) -> None:
        self.weights: dict[str, list[str]] = {}  # auto-named scope -> its weights, in order
        self.used_in: dict[str, list[str]] = {}  # parameter -> the scopes of the operations weighing with it
        self.unreached: dict[str, tuple[list[str], int, list[str]]] = {}

    def walk(self, jaxpr: Any, params: Sequence[str | None], base: str, line: str = "") -> None:
        """Walk `jaxpr` under scope `base`, its arguments' parameter paths
        `params`; `line`: the source line of the call it is the body of (an
        operation inside `jnp.where` is said at the line that calls it)."""
        known: dict[Any, str] = {v: p for v, p in zip(jaxpr.invars, params, strict=False) if p is not None}
        for eqn in jaxpr.eqns:
            if transposed(eqn):  # the gradient's: rules describe the forward pass
                continue
            path = join(base, forward_path(eqn)) or ""
            name = eqn.primitive.name
            operands = [known.get(v) if isinstance(v, jcore.Var) else None for v in eqn.invars]
            if name in _PASS and operands and operands[0] is not None:
                for v in eqn.outvars:
                    known[v] = operands[0]
            if name in _CONTRACTIONS:
                weights = [p for p in operands if p is not None]
            else:
                weights = [p for p in operands[:1] if p is not None] if name == "gather" else []
            for p in weights:
                if path not in self.used_in.setdefault(p, []):
                    self.used_in[p].append(path)
            for scope in _auto_scopes(path):
                mine = self.weights.setdefault(scope, [])
                mine.extend(p for p in weights if p not in mine)
            here = source_line(eqn) or line
            if not path and name in _KIND and any(getattr(v.aval, "shape", ()) for v in eqn.outvars):
                prims, count, sources = self.unreached.setdefault(_KIND[name], ([], 0, []))
                self.unreached[_KIND[name]] = (
                    prims + [name] * (name not in prims),
                    count + 1,
                    sources + [here] * (here not in sources),
                )
            for sub, mapping in _sub_jaxprs(eqn):
                self.walk(sub, [operands[i] if i is not None else None for i in mapping], path, here)

    def reach(self) -> Reach:
        found = Reach()
        for scope, weights in self.weights.items():
            if not weights:  # no parameter to name it after (a norm, an activation): nothing to say
                continue
            if len(weights) > 1:
                shown = ", ".join(f"`{w}`" for w in weights)
                found.refused[scope] = f"its operations take {len(weights)} parameters as weights: {shown}"
            else:
                others = [s for s in self.used_in[weights[0]] if not under(s, scope)]
                if others:
                    shown = ", ".join(f"`{s}`" if s else "outside every named scope" for s in others)
                    found.refused[scope] = f"its weight `{weights[0]}` is also used as a weight in {shown}"
                else:
                    found.aliases[scope] = weights[0]
        order = [kind for kind, _ in _KINDS]
        for kind in sorted(self.unreached, key=order.index):
            prims, count, sources = self.unreached[kind]
            found.unreached.append(Unreached(kind, tuple(prims), count, tuple(sources)))
        return found


def find(jaxpr: Any, params: Sequence[str | None]) -> Reach:
    """The parameter names of the auto-named scopes of `jaxpr` (its
    arguments' paths `params`, `None` for one that is no parameter), the
    scopes refused one, and the operations no scope reaches (see the
    module's docstring)."""
    walk = _Walk()
    walk.walk(jaxpr, params, "")
    return walk.reach()
