"""`shardrules.apply`: check a whole plan, then lay the tree out on the mesh.

One process moves everything in one batched `jax.device_put`; in a
multi-process run each process puts only its own shards (`_multihost`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.core import Tracer

from .._errors import error_for
from .._interop._penzai import arrays_of
from .._interop._torchax import to_jax
from .._language._rules import RuleSet
from .._language._sizes import byte_size
from .._planning import _check, _inputs, _memory, _mesh
from .._planning._api import RulesLike, as_rules
from .._planning._check import DEFAULT_REPLICATED_TOLERANCE
from .._planning._compile import compile_leaves
from .._planning._concrete import require_concrete
from .._planning._plan import LeafPlan, Plan
from . import _multihost
from ._exchange import join_timeout
from ._fingerprint import check_mode


def apply(
    tree: Any,
    rules: RulesLike,
    mesh: jax.sharding.Mesh | None = None,
    *,
    group: str = "params",
    device_memory: int | str | None = None,
    process_local: bool = False,
    verify: str | bool = "sample",
    replicated_tolerance: float = DEFAULT_REPLICATED_TOLERANCE,
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
    - `verify`: in a multi-process run, how much of the data the processes
      compare before anything moves. They always compare their meshes and,
      for each leaf, its path, shape, dtype and planned spec (SR112 when they
      differ); `verify` adds a hash of the values: `"sample"` (or `True`)
      hashes every byte of a leaf up to 1 MiB, and of a larger one 64 evenly
      spaced runs of 4 KiB plus its last 4 KiB (260 KiB, taken on the devices
      for a `jax.Array`); `"full"` every byte; `"off"` (or `False`) none.
      Each process waits at most `SHARDRULES_JOIN_TIMEOUT` seconds
      (environment variable, read at each call; default 60) for the others
      to join it. See docs/multihost.md.
    - `replicated_tolerance`: the share of the plan's bytes (0 to 1) that may
      be fully replicated, every device holding them whole, before a
      `ShardRulesWarning` (SR116) says so; default 0.25. A group whose rules
      shard nothing (pure data parallelism) is replicated on purpose and never
      warned about.

    After placing, a `ShardRulesWarning` (a `UserWarning`: Python's warning
    filters control it) also names each rule of the group that matches no leaf
    of the tree (SR201): a pattern written for other paths. (Where the
    group's `default` takes leaves such a rule, or a rule anchored with `^`,
    was evidently written for, `apply` raises SR125 before anything moves.)

    **Returns:** a pytree like `tree` whose arrays are sharded `jax.Array`s.

    **Raises:** `PlanError`, `MeshError`, `PlacementError`; `TypeError` for a
    mesh without devices; `ValueError` for another `verify` (or a bad
    `SHARDRULES_JOIN_TIMEOUT`); in a multi-process run,
    `ProcessMismatchError`: SR112 when the processes' meshes, specs or trees
    differ, the mesh holds no device of some process, or another process
    stopped on an error of its own, SR114 when
    another process did not join in time. Nothing has moved.

    ```python
    rules = shardrules.load("sharding/mlp.shard")
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    params = shardrules.apply(params, rules, mesh)
    ```
    """
    if jax.process_count() > 1:  # each process puts its own shards: see _multihost
        # Whatever fails on this process before the exchange (a bad argument too),
        # the others hear of it. The plan and the mesh are compared whatever `verify` says.
        with _multihost.joining_on_error(True, what=f"apply(group={group!r})"):
            mode = check_mode(verify)
            join_timeout()  # a bad SHARDRULES_JOIN_TIMEOUT is an error of this process
            ruleset = as_rules(rules)
            resolved = _mesh.resolve(mesh, ruleset, concrete=True, what="apply")
            assert isinstance(resolved, jax.sharding.Mesh)
            _multihost.require_every_process(resolved, f"apply(group={group!r})")
            tree, restore = to_jax(tree, plain_torch="error", what="apply")
            budget = byte_size(device_memory) if device_memory is not None else None
            prepared = _multihost.prepare(
                tree, ruleset, resolved, group=group, budget=budget, process_local=process_local, verify=mode
            )
        _multihost.agree(prepared, ruleset)
        placed = place(
            prepared.plan, prepared.leaves, resolved, ruleset, make=_multihost.from_host(process_local)
        )
        _check.warn_about(prepared.plan, replicated_tolerance)
        return restore(placed) if restore is not None else placed
    check_mode(verify)
    ruleset = as_rules(rules)
    resolved = _mesh.resolve(mesh, ruleset, concrete=True, what="apply")
    assert isinstance(resolved, jax.sharding.Mesh)
    tree, restore = to_jax(tree, plain_torch="error", what="apply")  # torchax tensors: their jax arrays
    the_plan, leaves = compile_leaves(tree, ruleset, resolved, group)
    the_plan.raise_for_errors()
    require_concrete(the_plan)  # SR120: `unconstrained` is for activations, not for placing
    budget = byte_size(device_memory) if device_memory is not None else _mesh.memory_limit(resolved)
    problems = _inputs.placement_diagnostics(the_plan, arrays_of(leaves)[0], resolved)
    if budget is not None:
        problems += _memory.memory_diagnostics(the_plan, budget)
    if problems:
        raise error_for(problems, ruleset.sources)
    result = place(the_plan, leaves, resolved, ruleset)
    _check.warn_about(the_plan, replicated_tolerance)
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
    done before: this only moves. A penzai variable's array is moved, and a new
    variable holding it takes the old one's place (`_penzai.arrays_of`)."""
    leaves, rewrap = arrays_of(leaves)
    out = list(leaves)
    moving: list[int] = []
    targets: list[jax.sharding.NamedSharding] = []
    for i, lp in enumerate(the_plan.leaves):
        if lp.spec is None:
            continue
        new = functools.partial(jax.sharding.NamedSharding, mesh, lp.spec)
        sharding = ruleset._plan_cache.memo((mesh, lp.spec), new)
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
    if rewrap is not None:
        out = rewrap(out)
    return jax.tree_util.tree_unflatten(the_plan.treedef, out)
