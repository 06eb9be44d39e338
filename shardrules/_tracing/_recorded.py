"""What a `shardrules.jit` step's trace found, and what its processes compare.

`traced_of` is the trace behind a step's `traced`, `decisions` and `scopes`
(and `step.cost`'s owners): the record its call's own trace made when the
step has been lowered or called, else its replicated trace (`_memo`)
evaluated with the layouts; the user's function is traced again only where
no trace of that signature is kept. `layouts_of` is what every process
compares before a step first runs in a multi-process run.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding

from .._interop._paths import path_str
from . import _slips
from ._constrain import Traced
from ._explicit import is_explicit
from ._groups import typed


def traced_of(step: Any, args: tuple[Any, ...]) -> Traced:
    """What `step` (a `RuleJit`) finds tracing itself for arguments like
    `args`, planning it first as a call would (what that warns about shown
    where `traced`, `decisions` or `scopes` was called, after the trace's own
    warnings)."""
    key = step._key(args)
    entry = step._compiled.get(key)
    if entry is not None or step.out_groups is None:
        entry = entry or step._entry(args, stacklevel=5)
        found = record_of(step, entry, args)
    else:
        mesh, in_shardings, groups = step._inputs(args, stacklevel=4)
        entry = step._store(key, args, mesh, in_shardings, None)
        try:
            found = record_of(step, entry, args)
        finally:
            _slips.warn_about_groups(step.fn, args, groups, step.rules, mesh, stacklevel=4)
    if not is_explicit(entry.mesh):
        found.decisions.clear()
    return found


def record_of(step: Any, entry: Any, args: tuple[Any, ...]) -> Traced:
    """What evaluating `step`'s trace with its layouts finds for `entry` (the
    step planned for `args`' signature): recorded when its `jax.jit` was
    traced (lowered, or first called), else evaluated here."""
    done = entry.record
    if done is not None and done.out_shape is not None:
        return Traced(
            list(done.decisions), list(done.scopes), list(done.unmatched), done.out_shape, done.reach
        )
    found = Traced()
    if entry.in_shardings is not None and is_explicit(entry.mesh):
        args = tuple(typed(a, s) for a, s in zip(args, entry.in_shardings, strict=True))
    with step._context(entry.mesh):
        body = step._body(entry.mesh, found, entry.memo)
        found.out_shape = jax.make_jaxpr(body, return_shape=True)(*args)[1]
    return found


def layouts_of(step: Any, args: tuple[Any, ...]) -> tuple[Mesh, list[tuple[str, Any, Any, Any]]]:
    """The mesh and what the processes compare before `step` first runs
    with arguments like `args`: each planned in and out sharding's spec,
    and the activation rules (a digest of what they say)."""
    entry = step._entry(args)
    planned = {"in": entry.in_shardings, "out": entry.out_shardings}
    keyed = jax.tree_util.tree_flatten_with_path(planned, is_leaf=lambda x: x is None)[0]
    layouts = [(path_str(k), None, None, s.spec) for k, s in keyed if isinstance(s, NamedSharding)]
    group = step.activations or ""
    found = [*step.rules.groups.get(group, ()), *filter(None, [step.rules.defaults.get(group)])]
    said = repr([(r.pattern, r.spec, str(r.guard)) for r in found]).encode()
    digest = hashlib.blake2b(said, digest_size=4).hexdigest()
    rules = f"{len(found)} rule{'s' * (len(found) != 1)} #{digest}"
    return entry.mesh, [*layouts, (f"rules {group}" if group else "activation rules", None, None, rules)]
