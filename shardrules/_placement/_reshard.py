"""`shardrules.reshard`: move an already placed tree to its planned layout on
another mesh, or under another group of the rules.

The plan on the target mesh and every input are checked first; then the
leaves move one at a time, so that with `donate=True` each source is freed as
soon as its copy exists and the extra memory at any moment is about one leaf.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
from jax.core import Tracer

from .._errors import Diagnostic, Span, error_for
from .._interop._penzai import arrays_of
from .._interop._torchax import to_jax
from .._planning import _check, _mesh
from .._planning._api import RulesLike, as_rules
from .._planning._check import DEFAULT_REPLICATED_TOLERANCE
from .._planning._compile import compile_leaves
from .._planning._concrete import unconstrained_diagnostics
from .._planning._plan import LeafPlan, Plan
from . import _fingerprint, _multihost


def reshard(
    tree: Any,
    rules: RulesLike,
    mesh: jax.sharding.Mesh | None = None,
    *,
    group: str = "params",
    donate: bool = False,
) -> Any:
    """Move an already placed tree to its planned layout on another mesh or group.

    For a tree of `jax.Array`s placed on some mesh (by `apply`, `init`, a
    checkpoint load or a jitted step): plan `group` for the tree on `mesh`
    (other devices, another shape, other axis names), check the plan and every
    input, then move each array to its planned sharding. On any error nothing
    has moved and nothing is deleted. Arrays already in their planned sharding
    are returned as they are (no copy, never deleted).

    **Arguments:**

    - `tree`: a pytree whose array leaves are live `jax.Array`s (not deleted,
      not traced, not NumPy: place host data with `apply`); other leaves are
      returned as they are.
    - `rules`: a `RuleSet`, or the path of a rule file.
    - `mesh`: the target `jax.sharding.Mesh`; by default JAX's ambient mesh
      (`jax.set_mesh`), else the rule file's `mesh` line over `jax.devices()`.
    - `group`: which `rules GROUP:` gives the target layout (`"params"`, or an
      optimizer group for a ZeRO-1 layout, ...).
    - `donate`: delete each source array as soon as its copy is made, one
      leaf at a time, so the extra memory is about the largest leaf rather
      than the whole tree. The input tree is unusable afterwards. By
      default the inputs are kept, and the arrays move in one batched
      `jax.device_put`. Either way a moved array shares no memory with
      its source (a piece that stays on its device is copied there).

    In a multi-process run every process calls it with the same global arrays;
    the processes first compare their plans and meshes (SR112, SR114, as
    `apply` does), then JAX moves each array, across processes where the
    target's shards live elsewhere. Inside `jax.jit` there is nothing to move:
    a traced leaf is an error (SR107); use `constrain` there.

    **Returns:** a pytree like `tree` whose arrays are sharded as planned on
    `mesh`, with the same values.

    **Raises:** `MeshError`, `PlanError`, `GroupNotFoundError`, `TreeError`,
    `PlacementError` (SR107: a traced, deleted, abstract or NumPy leaf; SR110:
    over the devices' memory), `ProcessMismatchError`; `TypeError` for a mesh
    without devices or a `donate` that is not a bool. Nothing has moved.

    ```python
    train_mesh = jax.make_mesh((4, 2), ("data", "model"))
    params = shardrules.apply(params, rules, train_mesh)
    rollout_mesh = jax.make_mesh((2, 4), ("replica", "tensor"))
    params = shardrules.reshard(params, rollout_rules, rollout_mesh, donate=True)
    ```
    """
    if not isinstance(donate, bool):
        raise TypeError(f"reshard's donate must be True or False, not {donate!r}")
    what = f"reshard(group={group!r})"
    if jax.process_count() > 1:
        with _multihost.joining_on_error(True, what=what):
            the_plan, leaves, restore, ruleset, resolved, problems = _prepare(tree, rules, mesh, group)
        _agree(the_plan, leaves, resolved, problems, ruleset, what)
    else:
        the_plan, leaves, restore, ruleset, resolved, problems = _prepare(tree, rules, mesh, group)
        if problems:
            raise error_for(problems, ruleset.sources)
    out = _move(the_plan, leaves, resolved, donate)
    _check.warn_about(the_plan, DEFAULT_REPLICATED_TOLERANCE)
    return restore(out) if restore is not None else out


def _prepare(
    tree: Any, rules: RulesLike, mesh: jax.sharding.Mesh | None, group: str
) -> tuple[Plan, list[Any], Any, Any, jax.sharding.Mesh, list[Diagnostic]]:
    """Everything `reshard` checks on this process: the mesh, the plan on it,
    the inputs, the memory the devices report. Raises for a mesh or a group
    that cannot be used; returns the other problems found."""
    ruleset = as_rules(rules)
    resolved = _mesh.resolve(mesh, ruleset, concrete=True, what="reshard")
    assert isinstance(resolved, jax.sharding.Mesh)
    tree, restore = to_jax(tree, plain_torch="error", what="reshard")
    the_plan, leaves = compile_leaves(tree, ruleset, resolved, group)
    problems = list(the_plan.errors) or unconstrained_diagnostics(the_plan)  # SR120
    if not problems:
        problems = input_diagnostics(the_plan, arrays_of(leaves)[0], resolved)
    if not problems:
        budget = _mesh.memory_limit(resolved)
        if budget is not None:
            problems = _check.memory_diagnostics(the_plan, budget)
    return the_plan, leaves, restore, ruleset, resolved, problems


def _span(lp: LeafPlan) -> Span | None:
    return lp.rule.span if lp.rule is not None else None


def input_diagnostics(the_plan: Plan, leaves: list[Any], mesh: jax.sharding.Mesh) -> list[Diagnostic]:
    """SR107 for each array leaf that is not a live, placed `jax.Array`; SR106
    for an array spread over several processes whose devices are not the
    target mesh's (JAX moves such arrays only within one set of devices)."""
    problems = []
    devices = set(mesh.devices.flat)
    for lp, leaf in zip(the_plan.leaves, leaves, strict=True):
        if lp.spec is None:
            continue
        if isinstance(leaf, Tracer):
            message = (
                f"`{lp.path}` {lp.shape} is traced (reshard was called inside jax.jit or another transform)"
            )
            hint = (
                "call shardrules.reshard outside jit on the arrays a step returned; inside jit, "
                "use shardrules.constrain (or jit's out_shardings) for a layout on the same mesh"
            )
        elif isinstance(leaf, jax.ShapeDtypeStruct):
            message = f"`{lp.path}` is abstract (jax.ShapeDtypeStruct {lp.shape} {lp.dtype}); there is no data to move"
            hint = "use shardrules.shardings() for abstract trees"
        elif not isinstance(leaf, jax.Array):
            message = f"`{lp.path}` ({type(leaf).__name__}, shape {lp.shape}) is not a placed jax.Array"
            hint = "place host arrays with shardrules.apply, then reshard"
        elif leaf.is_deleted():
            message = f"`{lp.path}` {lp.shape} has been deleted (donated or freed)"
            hint = (
                "pass the arrays a donating call returned (also reshard(..., donate=True)), "
                "not the ones it consumed"
            )
        elif not leaf.is_fully_addressable and leaf.sharding.device_set != devices:
            ids = sorted(d.id for d in leaf.sharding.device_set)
            problems.append(
                Diagnostic(
                    "SR106",
                    "error",
                    f"`{lp.path}` {lp.shape} lives on devices of several processes ({len(ids)} devices, "
                    f"ids {ids[0]}..{ids[-1]}), not on the target mesh's {len(devices)} devices; JAX moves "
                    "an array across processes only onto the same set of devices",
                    _span(lp),
                    lp.path,
                    hint="reshard onto a mesh over the same devices (any shape, any axis names), or gather "
                    "the array (jax.experimental.multihost_utils.process_allgather) and shardrules.apply it",
                    cause="lives on devices of several processes, not on the target mesh's devices",
                )
            )
            continue
        else:
            continue
        problems.append(Diagnostic("SR107", "error", message, _span(lp), lp.path, hint=hint))
    return problems


def _agree(
    the_plan: Plan,
    leaves: list[Any],
    mesh: jax.sharding.Mesh,
    problems: list[Diagnostic],
    ruleset: Any,
    what: str,
) -> None:
    """Every process's plan, tree shapes and mesh compared before anything
    moves (SR112/SR114), as for `apply`: the global arrays' data is the same
    array on every process, so only the fully addressable leaves are hashed."""
    arrays = arrays_of(leaves)[0]
    rows, same, specs = _multihost._fingerprints(the_plan, arrays, mesh, "sample", bool(problems), False)
    prepared = _multihost.Prepared(
        the_plan,
        leaves,
        problems,
        rows,
        same,
        what,
        False,
        specs,
        _fingerprint.mesh_fingerprint(mesh),
    )
    _multihost.agree(prepared, ruleset)


def _move(the_plan: Plan, leaves: list[Any], mesh: jax.sharding.Mesh, donate: bool) -> Any:
    """The tree with each planned leaf in its sharding (the checks are done); a
    penzai variable's array moved, and a new variable in the old one's place."""
    leaves, rewrap = arrays_of(leaves)
    rebuild = rewrap if rewrap is not None else list
    cache = the_plan.rules._plan_cache
    targets: dict[int, jax.sharding.NamedSharding] = {}
    for i, lp in enumerate(the_plan.leaves):
        if lp.spec is not None:
            new = functools.partial(jax.sharding.NamedSharding, mesh, lp.spec)
            targets[i] = cache.memo((mesh, lp.spec), new)
    out = list(leaves)
    moving = [i for i, target in targets.items() if leaves[i].sharding != target]
    if not donate:
        moved = jax.device_put([leaves[i] for i in moving], [targets[i] for i in moving])
        for i, array in zip(moving, moved, strict=True):
            out[i] = _unshared(array, leaves[i])
        return jax.tree_util.tree_unflatten(the_plan.treedef, rebuild(out))
    # An array kept as it is somewhere in the tree (or twice in it) is freed
    # only when no result uses it: after its last copy, and never if kept.
    kept = {id(leaves[i]) for i in targets if i not in set(moving)}
    last = {id(leaves[i]): i for i in moving}
    for i in moving:
        source = leaves[i]
        copy = jax.device_put(source, targets[i])
        if id(source) not in kept and last[id(source)] == i:
            copy = _unshared(copy, source).block_until_ready()  # the copy exists before its source goes
            source.delete()
        out[i] = copy
    return jax.tree_util.tree_unflatten(the_plan.treedef, rebuild(out))


def _pointers(array: jax.Array) -> set[int] | None:
    try:
        return {shard.data.unsafe_buffer_pointer() for shard in array.addressable_shards}
    except Exception:  # a backend without buffer pointers: assume every buffer is shared
        return None


def _unshared(copy: jax.Array, source: jax.Array) -> jax.Array:
    """`copy` with buffers of its own. `jax.device_put` reuses a source's
    buffer for a piece that stays on its device (and neither donates nor
    honours `may_alias=False` there), so deleting the source (or, later, the
    copy) would delete that piece of the other too: those pieces are copied
    on their device."""
    mine = _pointers(source)
    shards = copy.addressable_shards
    if mine is not None and not any(s.data.unsafe_buffer_pointer() in mine for s in shards):
        return copy
    parts = [
        jax.device_put(s.data, s.device, may_alias=False)
        if mine is None or s.data.unsafe_buffer_pointer() in mine
        else s.data
        for s in shards
    ]
    return jax.make_array_from_single_device_arrays(copy.shape, copy.sharding, parts)
