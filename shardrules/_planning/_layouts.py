"""The public `specs` and `shardings`: a group's layouts for a tree, as
`PartitionSpec` and `NamedSharding` pytrees, `unconstrained` dimensions
included (as `PartitionSpec.UNCONSTRAINED`).

What placement uses (`jit`'s in/out shardings, `shard_map`'s specs, `init`,
`load_checkpoint`, `load_orbax`) is `_api.placement_specs` and
`_api.placement_shardings`: the same
layouts, but an unconstrained dimension is an error there (SR120, `_concrete`).
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import AxisType, Mesh

from .._interop._torchax import to_jax
from . import _mesh
from ._api import RulesLike, as_rules
from ._check import warn_unseen
from ._compile import compile_plan
from ._concrete import NO_AUTO_AXES, require_concrete
from ._mesh import MeshLike


def specs(tree: Any, rules: RulesLike, mesh: MeshLike | None = None, *, group: str = "params") -> Any:
    """The `PartitionSpec` for every leaf, as a pytree like `tree`.

    Leaves that are not arrays get `None` (a leaf that hides arrays shardrules
    cannot see is warned about: SR213). Specs have one entry per array
    dimension. Use them as `shard_map` `in_specs`/`out_specs`, or with
    `NamedSharding`. A dimension a rule leaves `unconstrained` (activation
    rules) is `PartitionSpec.UNCONSTRAINED`: fine for
    `jax.lax.with_sharding_constraint`, refused where arrays are placed (SR120).

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
    the_plan = compile_plan(tree, ruleset, resolved, group)
    found = the_plan.specs()
    warn_unseen(the_plan)  # SR213: leaves hiding arrays, `None` here
    return found


def shardings(
    tree: Any, rules: RulesLike, mesh: jax.sharding.Mesh | None = None, *, group: str = "params"
) -> Any:
    """The `NamedSharding` for every leaf, as a pytree like `tree`.

    For `jax.jit(..., in_shardings=..., out_shardings=...)` and checkpoint
    restore targets. Leaves that are not arrays get `None`. A dimension a rule
    leaves `unconstrained` (activation rules) is `PartitionSpec.UNCONSTRAINED`
    in its sharding: fine for `jax.lax.with_sharding_constraint`, refused by
    `jax.jit` and `jax.device_put` (and, with SR120, by `shardrules.jit`). On a
    mesh without `Auto` axes, where JAX has no such `NamedSharding`, it is an
    error (SR120); `shardrules.specs` gives the spec.

    **Arguments:** as for `shardrules.plan`, but the mesh must have devices: the
    argument, else the ambient mesh, else the rule file's `mesh` line.

    **Returns:** a pytree of `NamedSharding` (and `None`).
    """
    ruleset = as_rules(rules)
    resolved = _mesh.resolve(mesh, ruleset, concrete=True, what="shardings")
    tree = to_jax(tree)[0]
    the_plan = compile_plan(tree, ruleset, resolved, group)
    if isinstance(resolved, Mesh) and AxisType.Auto not in tuple(resolved.axis_types):
        the_plan.raise_for_errors()
        require_concrete(the_plan, NO_AUTO_AXES)  # SR120 rather than JAX's ValueError
    found = the_plan.shardings(resolved)  # type: ignore[arg-type]
    warn_unseen(the_plan)  # SR213: leaves hiding arrays, `None` here
    return found
