"""Layouts that must be concrete (SR120).

A spec entry `unconstrained` lets the compiler choose a dimension's layout:
it means something only to a sharding constraint on a traced value
(`PartitionSpec.UNCONSTRAINED`). Placing arrays needs every dimension either
on mesh axes or unsharded: `apply`, `reshard`, `init`, `load_checkpoint`,
`load_orbax`, `jit`'s in/out shardings and `shard_map`'s specs refuse a plan
with an unconstrained dimension, before anything moves, naming the rule's
entry, the leaf and its shape.
"""

from __future__ import annotations

from typing import Any

from jax.sharding import PartitionSpec

from .._errors import Diagnostic, error_for
from .._language._rules import Rule
from .._pspec import entries as spec_entries
from ._plan import LeafPlans, Plan

_UNCONSTRAINED = PartitionSpec.UNCONSTRAINED


def is_concrete(spec: PartitionSpec | None) -> bool:
    """Whether `spec` has no `PartitionSpec.UNCONSTRAINED` entry (`None`: yes)."""
    return spec is None or all(entry is not _UNCONSTRAINED for entry in spec_entries(spec))


PLACING = "placing arrays needs a concrete layout"
NO_AUTO_AXES = "a `NamedSharding` on a mesh without Auto axes needs a concrete layout (`sr.specs` gives it)"


def unconstrained_diagnostics(plan: Plan, why: str = PLACING) -> list[Diagnostic]:
    """SR120 for each leaf of `plan` with an unconstrained dimension (one per
    leaf: `_errors.group` makes one finding of each rule's); `why` says what
    needs the layout concrete."""
    leaves = plan.leaves
    parts: list[tuple[Any, ...]]
    if isinstance(leaves, LeafPlans):
        paths, kinds, parts = leaves.tables()
    else:
        paths = [leaf.path for leaf in leaves]
        kinds = list(range(len(leaves)))
        parts = [(leaf.shape, leaf.dtype, leaf.rule, leaf.spec) for leaf in leaves]
    bad = {i for i, part in enumerate(parts) if not is_concrete(part[3])}
    if not bad:
        return []
    found = []
    for path, kind in zip(paths, kinds, strict=True):
        if kind in bad:
            shape, dtype, rule, spec = parts[kind][:4]
            found.append(_finding(path, shape, dtype, rule, spec, why))
    return found


def require_concrete(plan: Plan, why: str = PLACING) -> None:
    """Raise `PlanError` (SR120) if a leaf of `plan` has an unconstrained dimension."""
    found = unconstrained_diagnostics(plan, why)
    if found:
        raise error_for(found, plan.rules.sources)


def _finding(
    path: str, shape: tuple[int, ...], dtype: Any, rule: Rule | None, spec: PartitionSpec, why: str
) -> Diagnostic:
    dims = [d for d, entry in enumerate(spec_entries(spec)) if entry is _UNCONSTRAINED]
    which = f"dimension {dims[0]}" if len(dims) == 1 else "dimensions " + ", ".join(map(str, dims))
    verb = "is" if len(dims) == 1 else "are"
    tail = f"{verb} `unconstrained`, but {why}"
    span = None
    if rule is not None:
        entries = [e for e in rule.spec.entries if e.kind == "unconstrained"]
        span = entries[0].span if entries and entries[0].span is not None else rule.spec.span or rule.span
    return Diagnostic(
        "SR120",
        "error",
        f"{which} of `{path}` (shape {shape}, {dtype}) {tail}",
        span,
        path,
        "use `_` or a mesh axis for this dimension in a rule of this group; `unconstrained` is for "
        "activation rules, where the compiler chooses the layout (constrain, auto_constrain, jit's activations)",
        ((path, shape),),
        f"{which} {tail}",
    )
