"""What `Transfer.run` checks of the arrays it is given, before anything
moves: each is a live, placed array (SR107, as for `reshard`), laid out as the
source rules say (SR131, at the source rule's line, saying how it differs:
another layout, or the same one over devices in another order).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from .._errors import Diagnostic, error_for
from .._language._rules import RuleSet
from .._planning._plan import spec_repr
from ._moving import Moves
from ._reshard import input_diagnostics


def check_inputs(
    layout: Moves,
    arrays: list[Any],
    source_mesh: jax.sharding.Mesh,
    source_rules: RuleSet,
    target_rules: RuleSet,
) -> None:
    """Raise SR107 (at the target rules' lines) for leaves that are not
    live placed arrays, then SR131 (at the source rules' lines) for those
    not in the source layout."""
    problems = [
        p
        for p in input_diagnostics(
            layout.planned, arrays, source_mesh, "Transfer.run", "Transfer.run(..., donate=True)"
        )
        if p.code == "SR107"
    ]
    if problems:
        raise error_for(problems, target_rules.sources)
    for i, sharding in enumerate(layout.sources):
        x, leaf = arrays[i], layout.leaves[i]
        if sharding is None or leaf.shape is None or x.sharding.is_equivalent_to(sharding, len(leaf.shape)):
            continue
        problems.append(
            Diagnostic(
                "SR131",
                "error",
                f"`{leaf.path}` {leaf.shape} is not in the transfer's source layout: "
                + _difference(x.sharding, sharding, leaf.source),
                layout.source_spans[i],
                leaf.path,
                hint="pass the arrays as the source rules place them (shardrules.apply with the "
                "source rules and mesh, or the step whose out_shardings they are), or move "
                "arbitrary layouts with shardrules.reshard(tree, rules, mesh, max_bytes_in_flight=...)",
                cause="not in the transfer's source layout",
            )
        )
    if problems:
        raise error_for(problems, source_rules.sources)


def mesh_text(mesh: jax.sharding.Mesh) -> str:
    """`data=3, model=2 on devices 0-5`."""
    sizes = ", ".join(f"{name}={size}" for name, size in mesh.shape.items())
    ids = [d.id for d in mesh.devices.flat]
    if ids == list(range(ids[0], ids[0] + len(ids))):
        where = f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else f"{ids[0]}"
    elif len(ids) <= 8:
        where = ", ".join(map(str, ids))
    else:
        where = f"{ids[0]}, {ids[1]}, ... ({len(ids)} devices)"
    return f"{sizes} on devices {where}"


def _describe(sharding: jax.sharding.Sharding) -> str:
    if isinstance(sharding, jax.sharding.NamedSharding):
        return f"{spec_repr(sharding.spec)} on a mesh {dict(sharding.mesh.shape)}"
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return f"on device {next(iter(sharding.device_set)).id} alone"
    return type(sharding).__name__


def _difference(have: jax.sharding.Sharding, want: jax.sharding.Sharding, spec: Any) -> str:
    """How an array's layout differs from the planned one, in words."""
    if (
        isinstance(have, jax.sharding.NamedSharding)
        and isinstance(want, jax.sharding.NamedSharding)
        and have.spec == want.spec
        and dict(have.mesh.shape) == dict(want.mesh.shape)
    ):
        ids = [d.id for d in np.asarray(have.mesh.devices).flat]
        planned = [d.id for d in np.asarray(want.mesh.devices).flat]
        return (
            f"it is laid out as planned, {spec_repr(spec)} on a mesh {dict(want.mesh.shape)}, but over devices "
            f"{ids} where the source mesh has {planned}"
        )
    return (
        f"it is laid out as {_describe(have)}, the source plan says {spec_repr(spec)} on the source mesh "
        f"{dict(want.mesh.shape) if isinstance(want, jax.sharding.NamedSharding) else want}"
    )
