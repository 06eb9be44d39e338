"""The planning entry points: `plan`, `check`, and the `specs` and
`shardings` that placement uses.

Each takes a tree (plain, Flax, NNX, Equinox, Optax, torchax), the rules (a
`RuleSet` or a path) and a mesh, and compiles a `Plan`; nothing moves.

`specs` and `shardings` here are what every placing caller imports (`jit`,
`shard_map`, `init`, `load_checkpoint`, `load_orbax`): they refuse a layout
with an `unconstrained` dimension (SR120). The public `shardrules.specs` and
`shardrules.shardings`, which return such dimensions as
`PartitionSpec.UNCONSTRAINED`, are in `_layouts`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax

from .._errors import Diagnostic, ordered
from .._errors import group as group_findings
from .._interop._paths import flatten
from .._interop._penzai import arrays_of
from .._interop._torchax import to_jax
from .._language._load import load
from .._language._rules import RuleSet
from .._language._sizes import byte_size
from . import _check, _inputs, _memory, _mesh
from ._check import DEFAULT_REPLICATED_THRESHOLD, DEFAULT_REPLICATED_TOLERANCE
from ._compile import compile_plan
from ._concrete import require_concrete
from ._mesh import MeshLike
from ._plan import Plan

RulesLike = RuleSet | str | os.PathLike[str]


def as_rules(rules: RulesLike) -> RuleSet:
    """A `RuleSet`, loading it first if given a path."""
    if isinstance(rules, RuleSet):
        return rules
    if isinstance(rules, (str, os.PathLike)):
        return load(rules)
    raise TypeError(
        f"rules must be a RuleSet (from shardrules.load/loads) or a path to a rule file, "
        f"not {type(rules).__name__}"
    )


def plan(
    tree: Any,
    rules: RulesLike,
    mesh: MeshLike | None = None,
    *,
    group: str = "params",
    device_memory: int | str | None = None,
    replicated_threshold: int | str = DEFAULT_REPLICATED_THRESHOLD,
    replicated_tolerance: float = DEFAULT_REPLICATED_TOLERANCE,
) -> Plan:
    """Compile the rules for a tree, reporting problems instead of raising them.

    **Arguments:**

    - `tree`: any pytree; array leaves may be `jax.Array`s, NumPy arrays or
      `jax.ShapeDtypeStruct`s.
    - `rules`: a `RuleSet`, or the path of a rule file.
    - `mesh`: a `jax.sharding.Mesh`, an `AbstractMesh`, or a dict of axis sizes
      such as `{"data": 2, "model": 4}`; by default JAX's ambient mesh, else the
      rule file's `mesh` line over `jax.devices()`, else none (then specs that
      need sizes, `?` and `auto`, are reported).
    - `group`: which `rules GROUP:` to use.
    - `device_memory`: a per-device budget in bytes (`int`, or text such as
      `"80GiB"`); a plan over it gets an SR110 error.
    - `replicated_threshold`: fully replicated arrays at least this large get
      an SR204 warning (default 64 MiB).
    - `replicated_tolerance`: the share of the plan's bytes (0 to 1) that may
      be fully replicated; over it, an SR116 error (default 0.25). A group
      whose rules shard nothing (pure data parallelism) is never reported.

    **Returns:** a `Plan`: per leaf its path, shape, dtype, rule, spec and bytes
    per device, and `plan.diagnostics`: the errors (SR1xx) and the warnings
    (SR2xx: dead or shadowed rules, sharded scalars, large replicated arrays,
    unused mesh axes). `print(plan)` shows it as a table.

    ```python
    p = shardrules.plan(params, rules, {"fsdp": 4, "model": 2})
    assert p.ok, p.errors
    print(p)
    ```
    """
    ruleset = as_rules(rules)
    tree = to_jax(tree)[0]
    compiled = compile_plan(tree, ruleset, _mesh.resolve(mesh, ruleset, concrete=False, what="plan"), group)
    extra = _check.all_warnings(compiled, byte_size(replicated_threshold))
    extra = (
        _check.tolerance_diagnostics(compiled, replicated_tolerance, byte_size(replicated_threshold)) + extra
    )
    if device_memory is not None:
        extra = _memory.memory_diagnostics(compiled, byte_size(device_memory)) + extra
    return dataclasses.replace(compiled, diagnostics=tuple(ruleset.kept((*compiled.diagnostics, *extra))))


def check(
    tree: Any,
    rules: RulesLike | Plan,
    mesh: MeshLike | None = None,
    *,
    group: str = "params",
    device_memory: int | str | None = None,
    replicated_threshold: int | str = DEFAULT_REPLICATED_THRESHOLD,
    replicated_tolerance: float = DEFAULT_REPLICATED_TOLERANCE,
) -> list[Diagnostic]:
    """Every finding about laying `tree` out with these rules, as a list.

    The checks of `shardrules.plan`, plus, for concrete inputs, where the arrays
    already live (SR106, SR107). Nothing is raised for what is found and nothing
    moves; the `shardrules lint` command prints the same findings.

    **Arguments:**

    - `tree`: the pytree to check.
    - `rules`: a `RuleSet`, the path of a rule file, or a `Plan` already made
      for `tree` (its mesh and group are used).
    - `mesh`, `group`, `device_memory`, `replicated_threshold`,
      `replicated_tolerance`: as for `shardrules.plan`.

    **Returns:** a list of `Diagnostic`s in the order `shardrules lint` prints them (errors,
    then warnings; each by file, line and column), one per cause: a rule that is
    wrong the same way for 160 leaves is one finding naming the first, with
    every leaf in its `paths` and `count` 160 (`plan(...).diagnostics` has one
    per leaf); empty when all is well.

    ```python
    for d in shardrules.check(params, rules, mesh, device_memory="80GiB"):
        print(d.render(rules.sources))
    ```
    """
    tree = to_jax(tree)[0]
    if isinstance(rules, Plan):
        the_plan = rules
        found = list(the_plan.diagnostics)
        if device_memory is not None:
            found += _memory.memory_diagnostics(the_plan, byte_size(device_memory))
    else:
        the_plan = plan(
            tree,
            rules,
            mesh,
            group=group,
            device_memory=device_memory,
            replicated_threshold=replicated_threshold,
            replicated_tolerance=replicated_tolerance,
        )
        found = list(the_plan.diagnostics)
    keyed, _ = flatten(tree)
    if len(keyed) != len(the_plan.leaves):
        raise TypeError(f"the plan has {len(the_plan.leaves)} leaves but the tree has {len(keyed)}")
    if isinstance(the_plan.mesh, jax.sharding.Mesh):
        leaves = arrays_of([leaf for _, leaf in keyed])[0]  # a penzai variable's array
        found += _inputs.placement_diagnostics(the_plan, leaves, the_plan.mesh, abstract_ok=True)
    found = the_plan.rules.kept(found)  # less the warnings the file acknowledges (noqa comments)
    return group_findings(ordered(dict.fromkeys(found)))  # as `shardrules lint` prints them


def placement_specs(
    tree: Any, rules: RulesLike, mesh: MeshLike | None = None, *, group: str = "params"
) -> Any:
    """The `PartitionSpec` pytree of `shardrules.specs` (`_layouts.specs`), for
    placing arrays: what `shard_map` gives as its specs. A dimension a rule
    leaves `unconstrained` is an error here (SR120): placing needs a concrete
    layout."""
    ruleset = as_rules(rules)
    resolved = _mesh.resolve(mesh, ruleset, concrete=False, what="specs")
    the_plan = compile_plan(to_jax(tree)[0], ruleset, resolved, group)
    the_plan.raise_for_errors()
    require_concrete(the_plan)
    return the_plan.specs()


def placement_shardings(
    tree: Any, rules: RulesLike, mesh: jax.sharding.Mesh | None = None, *, group: str = "params"
) -> Any:
    """The `NamedSharding` pytree of `shardrules.shardings` (`_layouts.shardings`),
    for placing arrays: what `jit` gives as its in/out shardings and `init`,
    `load_checkpoint` and `load_orbax` lay arrays out in. A dimension a rule
    leaves `unconstrained` is an error here (SR120)."""
    ruleset = as_rules(rules)
    resolved = _mesh.resolve(mesh, ruleset, concrete=True, what="shardings")
    the_plan = compile_plan(to_jax(tree)[0], ruleset, resolved, group)
    the_plan.raise_for_errors()
    require_concrete(the_plan)
    return the_plan.shardings(resolved)  # type: ignore[arg-type]
