"""The public entry points: `plan`, `check`, `specs`, `shardings`, `apply`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import jax
from jax.core import Tracer

from .._errors import Diagnostic, error_for, ordered
from .._interop._paths import flatten
from .._interop._torchax import to_jax
from .._language._load import load
from .._language._parse import byte_size
from .._language._rules import RuleSet
from .._placement import _multihost
from .._placement._agree import check_mode
from . import _check, _mesh
from ._check import DEFAULT_REPLICATED_THRESHOLD
from ._compile import compile_leaves, compile_plan
from ._mesh import MeshLike
from ._plan import LeafPlan, Plan

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
    if device_memory is not None:
        extra = _check.memory_diagnostics(compiled, byte_size(device_memory)) + extra
    return dataclasses.replace(compiled, diagnostics=(*compiled.diagnostics, *extra))


def check(
    tree: Any,
    rules: RulesLike | Plan,
    mesh: MeshLike | None = None,
    *,
    group: str = "params",
    device_memory: int | str | None = None,
    replicated_threshold: int | str = DEFAULT_REPLICATED_THRESHOLD,
) -> list[Diagnostic]:
    """Every finding about laying `tree` out with these rules, as a list.

    The checks of `shardrules.plan`, plus, for concrete inputs, where the arrays
    already live (SR106, SR107). Nothing is raised for what is found and nothing
    moves; the `shardrules lint` command prints the same findings.

    **Arguments:**

    - `tree`: the pytree to check.
    - `rules`: a `RuleSet`, the path of a rule file, or a `Plan` already made
      for `tree` (its mesh and group are used).
    - `mesh`, `group`, `device_memory`, `replicated_threshold`: as for
      `shardrules.plan`.

    **Returns:** a list of `Diagnostic`s in the order `shardrules lint` prints them (errors,
    then warnings; each by file, line and column); empty when all is well.

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
            found += _check.memory_diagnostics(the_plan, byte_size(device_memory))
    else:
        the_plan = plan(
            tree,
            rules,
            mesh,
            group=group,
            device_memory=device_memory,
            replicated_threshold=replicated_threshold,
        )
        found = list(the_plan.diagnostics)
    keyed, _ = flatten(tree)
    if len(keyed) != len(the_plan.leaves):
        raise TypeError(f"the plan has {len(the_plan.leaves)} leaves but the tree has {len(keyed)}")
    if isinstance(the_plan.mesh, jax.sharding.Mesh):
        leaves = [leaf for _, leaf in keyed]
        found += _check.placement_diagnostics(the_plan, leaves, the_plan.mesh, abstract_ok=True)
    return ordered(dict.fromkeys(found))  # as `shardrules lint` prints them


def specs(tree: Any, rules: RulesLike, mesh: MeshLike | None = None, *, group: str = "params") -> Any:
    """The `PartitionSpec` for every leaf, as a pytree like `tree`.

    Leaves that are not arrays get `None`. Specs have one entry per array
    dimension. Use them as `shard_map` `in_specs`/`out_specs`, or with
    `NamedSharding`.

    **Arguments:** as for `shardrules.plan`.

    **Returns:** a pytree of `PartitionSpec` (and `None`).

    **Raises:** `PlanError` (with every problem found) if the rules do not fit.

    ```python
    specs = shardrules.specs(params, rules, mesh)
    specs["layers"]["attn"]["q_proj"]["kernel"]   # P(None, 'fsdp', 'model')
    ```
    """
    ruleset = as_rules(rules)
    resolved = _mesh.resolve(mesh, ruleset, concrete=False, what="specs")
    tree = to_jax(tree)[0]
    return compile_plan(tree, ruleset, resolved, group).specs()


def shardings(
    tree: Any, rules: RulesLike, mesh: jax.sharding.Mesh | None = None, *, group: str = "params"
) -> Any:
    """The `NamedSharding` for every leaf, as a pytree like `tree`.

    For `jax.jit(..., in_shardings=..., out_shardings=...)` and checkpoint
    restore targets. Leaves that are not arrays get `None`.

    **Arguments:** as for `shardrules.plan`, but the mesh must have devices: the
    argument, else the ambient mesh, else the rule file's `mesh` line.

    **Returns:** a pytree of `NamedSharding` (and `None`).
    """
    ruleset = as_rules(rules)
    resolved = _mesh.resolve(mesh, ruleset, concrete=True, what="shardings")
    tree = to_jax(tree)[0]
    the_plan = compile_plan(tree, ruleset, resolved, group)
    return the_plan.shardings(resolved)  # type: ignore[arg-type]


def apply(
    tree: Any,
    rules: RulesLike,
    mesh: jax.sharding.Mesh | None = None,
    *,
    group: str = "params",
    device_memory: int | str | None = None,
    process_local: bool = False,
    verify: str | bool = "sample",
) -> Any:
    """Lay a pytree out on the mesh as the rules say.

    The whole plan is checked first: rules against the tree and the mesh, and
    every input array (not deleted, not abstract, not committed to devices
    outside the mesh or to the mesh's devices in another order). Only then is
    data moved, in one batched `jax.device_put`. On any error nothing moves and
    the input is unchanged. Inside `jax.jit`, traced leaves get a
    `jax.lax.with_sharding_constraint` with the planned sharding instead.

    **Arguments:**

    - `tree`: a pytree of arrays (`jax.Array` or NumPy); leaves that are not
      arrays are returned as they are.
    - `rules`: a `RuleSet`, or the path of a rule file.
    - `mesh`: a `jax.sharding.Mesh`; by default JAX's ambient mesh (`jax.set_mesh`),
      else the rule file's `mesh` line laid over `jax.devices()`.
    - `group`: which `rules GROUP:` to use.
    - `device_memory`: the per-device budget (bytes, or text such as `"80GiB"`);
      by default the smallest memory limit the mesh's devices report, if they
      report one (GPUs and TPUs do; CPUs do not). A plan over it is an SR110
      error, raised before anything moves.
    - `process_local`: in a multi-process run, each process passes only its
      own slice of the arrays (its part of the batch), and the global arrays
      are assembled from the slices (`jax.make_array_from_process_local_data`);
      by default every process passes the whole tree. One process: no effect.
    - `verify`: in a multi-process run, how the processes check that they
      pass the same tree before anything moves (SR112): `"sample"` (or `True`)
      hashes every byte of a leaf up to 1 MiB, and of a larger one 64 evenly
      spaced runs of 4 KiB plus its last 4 KiB (260 KiB, taken on the devices
      for a `jax.Array`); `"full"` every byte; `"off"` (or `False`) skips the
      check. See docs/multihost.md.

    **Returns:** a pytree like `tree` whose arrays are sharded `jax.Array`s.

    **Raises:** `PlanError`, `MeshError`, `PlacementError`; `TypeError` for a
    mesh without devices; `ValueError` for another `verify`; in a multi-process
    run, `ProcessMismatchError` (SR112) when the processes' trees differ or
    another process stopped on an error of its own. Nothing has moved.

    ```python
    rules = shardrules.load("sharding/mlp.shard")
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    params = shardrules.apply(params, rules, mesh)
    ```
    """
    mode = check_mode(verify)
    if jax.process_count() > 1:  # each process puts its own shards: see _multihost
        # Whatever fails on this process before the exchange, the others hear of it.
        with _multihost.joining_on_error(exchanging=mode != "off"):
            ruleset = as_rules(rules)
            resolved = _mesh.resolve(mesh, ruleset, concrete=True, what="apply")
            assert isinstance(resolved, jax.sharding.Mesh)
            tree, restore = to_jax(tree, plain_torch="error", what="apply")
            budget = byte_size(device_memory) if device_memory is not None else None
            prepared = _multihost.prepare(
                tree, ruleset, resolved, group=group, budget=budget, process_local=process_local, verify=mode
            )
        _multihost.agree(prepared, ruleset)
        placed = place(
            prepared.plan, prepared.leaves, resolved, ruleset, make=_multihost.from_host(process_local)
        )
        return restore(placed) if restore is not None else placed
    ruleset = as_rules(rules)
    resolved = _mesh.resolve(mesh, ruleset, concrete=True, what="apply")
    assert isinstance(resolved, jax.sharding.Mesh)
    tree, restore = to_jax(tree, plain_torch="error", what="apply")  # torchax tensors: their jax arrays
    the_plan, leaves = compile_leaves(tree, ruleset, resolved, group)
    the_plan.raise_for_errors()
    budget = byte_size(device_memory) if device_memory is not None else _mesh.memory_limit(resolved)
    problems = _check.placement_diagnostics(the_plan, leaves, resolved)
    if budget is not None:
        problems += _check.memory_diagnostics(the_plan, budget)
    if problems:
        raise error_for(problems, ruleset.sources)
    result = place(the_plan, leaves, resolved, ruleset)
    return restore(result) if restore is not None else result


def place(
    the_plan: Plan,
    leaves: list[Any],
    mesh: jax.sharding.Mesh,
    ruleset: RuleSet,
    make: Callable[[Any, LeafPlan, jax.sharding.NamedSharding], Any] | None = None,
) -> Any:
    """The tree of `the_plan` with each planned leaf in its sharding: a traced
    leaf pinned to it, an array made by `make(leaf, leaf_plan, sharding)` when
    that returns one (a multi-process run builds its own shards), and the
    others moved together in one batched `jax.device_put`. The checks are
    done before: this only moves."""
    out = list(leaves)
    moving: list[int] = []
    targets: list[jax.sharding.NamedSharding] = []
    for i, lp in enumerate(the_plan.leaves):
        if lp.spec is None:
            continue
        sharding = ruleset._plan_cache.named_sharding(mesh, lp.spec)
        if isinstance(leaves[i], Tracer):
            # Inside a trace there is no data to move: pin the layout instead.
            out[i] = _mesh.pin(leaves[i], sharding)
            continue
        made = make(leaves[i], lp, sharding) if make is not None else None
        if made is not None:
            out[i] = made
        else:
            moving.append(i)
            targets.append(sharding)
    if moving:
        moved = jax.device_put([leaves[i] for i in moving], targets)
        for i, array in zip(moving, moved, strict=True):
            out[i] = array
    return jax.tree_util.tree_unflatten(the_plan.treedef, out)
