"""`shardrules.reshard`: move an already placed tree to its planned layout on
another mesh, or under another group of the rules.

The plan on the target mesh and every input are checked first (and, with
several processes, compared between them); then `_moves` moves the leaves: with
`donate=True` one at a time, each source freed once its copy exists and
nothing else uses its buffers, so that the extra memory at any moment is about
one leaf and no value is ever lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax.core import Tracer

from .._errors import Diagnostic, Span, error_for
from .._interop._penzai import arrays_of
from .._interop._torchax import to_jax
from .._planning import _check, _memory, _mesh
from .._planning._api import RulesLike, as_rules
from .._planning._check import DEFAULT_REPLICATED_TOLERANCE
from .._planning._compile import compile_leaves
from .._planning._concrete import unconstrained_diagnostics
from .._planning._plan import LeafPlan, Plan
from . import _fingerprint, _moves, _moving, _multihost
from ._exchange import join_timeout


def reshard(
    tree: Any,
    rules: RulesLike,
    mesh: jax.sharding.Mesh | None = None,
    *,
    group: str = "params",
    donate: bool = False,
    max_bytes_in_flight: int | str | None = None,
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
      its source (a piece that stays on its device is copied there). An
      input is never deleted while an array returned as it is, or an input
      still to move, shares a buffer with it; if a move fails part-way (out
      of memory on a later leaf), the error is raised with `error.tree`: the
      whole tree, each leaf its moved copy where its input was deleted, else
      its input, untouched.
    - `max_bytes_in_flight`: move the arrays in pieces, never more than this
      many bytes in flight on any device at once (an int or a size such as
      `"64MiB"`; a piece larger than the cap moves alone), as
      `shardrules.transfer` does: with `donate`, the extra memory is then
      about the cap rather than the largest leaf. Planned on every call; for
      a move repeated on every refit, keep a `shardrules.transfer`.

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
    With `donate=True`, an error while moving (after every check passed)
    carries the whole tree as `error.tree`, as above.

    ```python
    train_mesh = jax.make_mesh((4, 2), ("data", "model"))
    params = shardrules.apply(params, rules, train_mesh)
    rollout_mesh = jax.make_mesh((2, 4), ("replica", "tensor"))
    params = shardrules.reshard(params, rollout_rules, rollout_mesh, donate=True)
    ```
    """
    what = f"reshard(group={group!r})"
    if jax.process_count() > 1:
        with _multihost.joining_on_error(True, what=what):  # a process failing alone still meets the others
            _check_donate(donate)
            cap = _moving.cap(max_bytes_in_flight)
            join_timeout()  # a bad SHARDRULES_JOIN_TIMEOUT is this process's own error
            the_plan, leaves, restore, ruleset, resolved, problems = _prepare(tree, rules, mesh, group, what)
        _agree(the_plan, leaves, resolved, problems, ruleset, what)
    else:
        _check_donate(donate)
        cap = _moving.cap(max_bytes_in_flight)
        the_plan, leaves, restore, ruleset, resolved, problems = _prepare(tree, rules, mesh, group, what)
        if problems:
            raise error_for(problems, ruleset.sources)

    def finish(flat: list[Any]) -> Any:
        out = jax.tree_util.tree_unflatten(the_plan.treedef, flat)
        return restore(out) if restore is not None else out

    if cap is None:
        out = _moves.move(the_plan, leaves, resolved, donate, finish)
    else:
        out = _capped(the_plan, leaves, resolved, donate, cap, finish)
    _check.warn_about(the_plan, DEFAULT_REPLICATED_TOLERANCE)
    return out


def _capped(
    the_plan: Plan,
    leaves: list[Any],
    mesh: jax.sharding.Mesh,
    donate: bool,
    cap: int,
    finish: Any,
) -> Any:
    """The moves of `shardrules.transfer`, from each array's own sharding to
    its planned one, under the cap."""
    arrays, rewrap = arrays_of(leaves)
    rebuild = rewrap if rewrap is not None else list
    sources = [
        x.sharding if lp.spec is not None else None for lp, x in zip(the_plan.leaves, arrays, strict=True)
    ]
    targets = [
        jax.sharding.NamedSharding(mesh, lp.spec) if lp.spec is not None else None for lp in the_plan.leaves
    ]
    layout = _moving.layout_of(the_plan, sources, targets, keep_equal=True)
    out = _moving.run_moves(
        layout,
        arrays,
        cap,
        donate,
        False,
        lambda flat: finish(rebuild(flat)),
        the_plan.rules,
        "shardrules.reshard(donate=True)",
    )
    return finish(rebuild(out))


def _check_donate(donate: Any) -> None:
    if not isinstance(donate, bool):
        raise TypeError(f"reshard's donate must be True or False, not {donate!r}")


def _prepare(
    tree: Any, rules: RulesLike, mesh: jax.sharding.Mesh | None, group: str, what: str
) -> tuple[Plan, list[Any], Any, Any, jax.sharding.Mesh, list[Diagnostic]]:
    """Everything `reshard` checks on this process: the mesh, the plan on it,
    the inputs, the memory the devices report. Raises for a mesh or a group
    that cannot be used; returns the other problems found."""
    ruleset = as_rules(rules)
    resolved = _mesh.resolve(mesh, ruleset, concrete=True, what="reshard")
    assert isinstance(resolved, jax.sharding.Mesh)
    _multihost.require_every_process(resolved, what)  # several processes: each holds some of the mesh
    tree, restore = to_jax(tree, plain_torch="error", what="reshard")
    the_plan, leaves = compile_leaves(tree, ruleset, resolved, group)
    problems = list(the_plan.errors) or unconstrained_diagnostics(the_plan)  # SR120
    if not problems:
        problems = input_diagnostics(the_plan.leaves, arrays_of(leaves)[0], resolved)
    if not problems:
        budget = _mesh.memory_limit(resolved)
        if budget is not None:
            problems = _memory.memory_diagnostics(the_plan, budget)
    return the_plan, leaves, restore, ruleset, resolved, problems


def _span(lp: LeafPlan) -> Span | None:
    return lp.rule.span if lp.rule is not None else None


def input_diagnostics(
    planned: Sequence[LeafPlan],
    leaves: list[Any],
    mesh: jax.sharding.Mesh,
    call: str = "shardrules.reshard",
    donating: str = "reshard(..., donate=True)",
) -> list[Diagnostic]:
    """SR107 for each array leaf that is not a live, placed `jax.Array`; SR106
    for an array spread over several processes whose devices are not the
    target mesh's (JAX moves such arrays only within one set of devices).
    `call`, `donating`: how the messages name the call that moves, and a
    donating call of it."""
    problems = []
    devices = set(mesh.devices.flat)
    for lp, leaf in zip(planned, leaves, strict=True):
        if lp.spec is None:
            continue
        if isinstance(leaf, Tracer):
            message = (
                f"`{lp.path}` {lp.shape} is traced ({call} was called inside jax.jit or another transform)"
            )
            hint = (
                f"call {call} outside jit on the arrays a step returned; inside jit, "
                "use shardrules.constrain (or jit's out_shardings) for a layout on the same mesh"
            )
        elif isinstance(leaf, jax.ShapeDtypeStruct):
            message = f"`{lp.path}` is abstract (jax.ShapeDtypeStruct {lp.shape} {lp.dtype}); there is no data to move"
            hint = "use shardrules.shardings() for abstract trees"
        elif not isinstance(leaf, jax.Array):
            message = f"`{lp.path}` ({type(leaf).__name__}, shape {lp.shape}) is not a placed jax.Array"
            hint = f"place host arrays with shardrules.apply, then call {call}"
        elif leaf.is_deleted():
            message = f"`{lp.path}` {lp.shape} has been deleted (donated or freed)"
            hint = f"pass the arrays a donating call returned (also {donating}), not the ones it consumed"
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
