"""The public entry points: `plan`, `specs`, `shardings`, `apply`."""

from __future__ import annotations

import os
from typing import Any

import jax
from jax.core import Tracer

from . import _mesh
from ._compile import compile_flat, compile_plan
from ._errors import Diagnostic, error_for
from ._load import load
from ._mesh import MeshLike
from ._paths import flatten
from ._plan import Plan
from ._rules import RuleSet

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


def plan(tree: Any, rules: RulesLike, mesh: MeshLike | None = None, *, group: str = "params") -> Plan:
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

    **Returns:** a `Plan`: per leaf its path, shape, dtype, rule, spec and bytes
    per device, and `plan.diagnostics`. `print(plan)` shows it as a table.

    ```python
    p = shardrules.plan(params, rules, {"fsdp": 4, "model": 2})
    assert p.ok, p.diagnostics
    print(p)
    ```
    """
    ruleset = as_rules(rules)
    return compile_plan(tree, ruleset, _mesh.resolve(mesh, ruleset, concrete=False, what="plan"), group)


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
    return plan(tree, rules, mesh, group=group).specs()


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
    the_plan = compile_plan(tree, ruleset, resolved, group)
    return the_plan.shardings(resolved)  # type: ignore[arg-type]


def apply(
    tree: Any, rules: RulesLike, mesh: jax.sharding.Mesh | None = None, *, group: str = "params"
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

    **Returns:** a pytree like `tree` whose arrays are sharded `jax.Array`s.

    **Raises:** `PlanError`, `MeshError`, `PlacementError`; nothing has moved.

    ```python
    rules = shardrules.load("sharding/mlp.shard")
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    params = shardrules.apply(params, rules, mesh)
    ```
    """
    ruleset = as_rules(rules)
    resolved = _mesh.resolve(mesh, ruleset, concrete=True, what="apply")
    assert isinstance(resolved, jax.sharding.Mesh)
    keyed, treedef = flatten(tree)
    the_plan = compile_flat(keyed, treedef, ruleset, resolved, group)
    the_plan.raise_for_errors()
    leaves = [leaf for _, leaf in keyed]
    _check_inputs(the_plan, leaves, resolved)

    out = list(leaves)
    moving: list[int] = []
    targets: list[jax.sharding.NamedSharding] = []
    for i, lp in enumerate(the_plan.leaves):
        if lp.spec is None:
            continue
        sharding = jax.sharding.NamedSharding(resolved, lp.spec)
        if isinstance(leaves[i], Tracer):
            # Inside a trace there is no data to move: pin the layout instead.
            out[i] = jax.lax.with_sharding_constraint(leaves[i], sharding)
        else:
            moving.append(i)
            targets.append(sharding)
    moved = jax.device_put([leaves[i] for i in moving], targets)
    for i, array in zip(moving, moved, strict=True):
        out[i] = array
    return jax.tree_util.tree_unflatten(treedef, out)


def _check_inputs(the_plan: Plan, leaves: list[Any], mesh: jax.sharding.Mesh) -> None:
    mesh_devices = set(mesh.devices.flat)
    order = _mesh.device_order(mesh)
    problems: list[Diagnostic] = []
    for lp, leaf in zip(the_plan.leaves, leaves, strict=True):
        if lp.spec is None or isinstance(leaf, Tracer):
            continue
        if isinstance(leaf, jax.ShapeDtypeStruct):
            problems.append(
                Diagnostic(
                    "SR107",
                    "error",
                    f"`{lp.path}` is abstract (jax.ShapeDtypeStruct {lp.shape} {lp.dtype}); there is no data to move",
                    path=lp.path,
                    hint="use shardrules.shardings() for abstract trees, or shardrules.apply() on real arrays",
                )
            )
            continue
        if not isinstance(leaf, jax.Array):
            continue
        if leaf.is_deleted():
            problems.append(
                Diagnostic(
                    "SR107",
                    "error",
                    f"`{lp.path}` {lp.shape} has been deleted (donated or freed)",
                    path=lp.path,
                    hint="pass the arrays a donating call returned, not the ones it consumed",
                )
            )
            continue
        if not getattr(leaf, "committed", False):
            continue
        sharding = leaf.sharding
        devices = sharding.device_set
        outside = devices - mesh_devices
        if outside:
            ids = ", ".join(str(d.id) for d in sorted(outside, key=lambda d: d.id))
            problems.append(
                Diagnostic(
                    "SR106",
                    "error",
                    f"`{lp.path}` {lp.shape} is committed to devices outside the mesh (device {ids})",
                    path=lp.path,
                    hint="pass the mesh those arrays live on, or move them first with jax.device_put",
                )
            )
        elif (
            isinstance(sharding, jax.sharding.NamedSharding)
            and devices == mesh_devices
            and _mesh.device_order(sharding.mesh) != order
        ):
            problems.append(
                Diagnostic(
                    "SR106",
                    "error",
                    f"`{lp.path}` {lp.shape} is on the mesh's devices in another order "
                    f"({list(_mesh.device_order(sharding.mesh))} vs the mesh's {list(order)})",
                    path=lp.path,
                    hint="use the mesh the arrays were placed with (x.sharding.mesh), "
                    "or build both meshes the same way",
                )
            )
    if problems:
        raise error_for(problems, the_plan.rules.sources)
