"""Checks on the input arrays of a plan: where they already live and whether
they can move (catalogue: docs/diagnostics.md).

- SR106/SR107 (error): inputs committed elsewhere, or with no data to move
  (a dtype JAX cannot hold, SR115, is found when compiling: `_dtypes`).
- SR111 (error): arrays to be used together live on different devices.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

from .._errors import Diagnostic, Span, error_for
from . import _mesh
from ._plan import LeafPlan, Plan


def _unplaceable(leaf: Any) -> str:
    """Why `jax.device_put` would refuse `leaf`, or `""`. (A dtype JAX cannot
    hold is an error of the plan, SR115: such a leaf has no spec.)"""
    if isinstance(leaf, np.ma.MaskedArray):
        return "masked arrays are not supported"
    if not isinstance(leaf, (np.ndarray, np.generic)):
        return "only NumPy arrays and jax.Arrays can be moved"
    return ""


def _rule_span(leaf: LeafPlan) -> Span | None:
    """Where the rule that planned `leaf` is written, if a rule did."""
    return leaf.rule.span if leaf.rule is not None else None


def placement_diagnostics(
    plan: Plan, leaves: Sequence[Any], mesh: jax.sharding.Mesh, *, abstract_ok: bool = False
) -> list[Diagnostic]:
    """SR106/SR107: input arrays that cannot be moved as planned (with
    `abstract_ok`, `jax.ShapeDtypeStruct` leaves are not reported)."""
    mesh_devices = set(mesh.devices.flat)
    order = _mesh.device_order(mesh)
    problems: list[Diagnostic] = []
    for lp, leaf in zip(plan.leaves, leaves, strict=True):
        if lp.spec is None or isinstance(leaf, Tracer):
            continue
        if isinstance(leaf, jax.ShapeDtypeStruct):
            if abstract_ok:
                continue
            problems.append(
                Diagnostic(
                    "SR107",
                    "error",
                    f"`{lp.path}` is abstract (jax.ShapeDtypeStruct {lp.shape} {lp.dtype}); there is no data to move",
                    _rule_span(lp),
                    lp.path,
                    hint="use shardrules.shardings() for abstract trees, or shardrules.apply() on real arrays",
                )
            )
            continue
        if not isinstance(leaf, jax.Array):
            problem = _unplaceable(leaf)
            if problem:
                problems.append(
                    Diagnostic(
                        "SR107",
                        "error",
                        f"`{lp.path}` ({type(leaf).__name__}, shape {lp.shape}) cannot become a jax.Array: {problem}",
                        _rule_span(lp),
                        lp.path,
                        "convert it first (e.g. np.asarray(x, np.float32)), or keep it out of the tree",
                    )
                )
            continue
        if leaf.is_deleted():
            problems.append(
                Diagnostic(
                    "SR107",
                    "error",
                    f"`{lp.path}` {lp.shape} has been deleted (donated or freed)",
                    _rule_span(lp),
                    lp.path,
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
                    f"`{lp.path}` {lp.shape} is committed to devices outside the mesh "
                    f"({'device' if len(outside) == 1 else 'devices'} {ids})",
                    _rule_span(lp),
                    lp.path,
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
                    _rule_span(lp),
                    lp.path,
                    hint="use the mesh the arrays were placed with (x.sharding.mesh), "
                    "or build both meshes the same way",
                )
            )
    return problems


def _devices_of(array: jax.Array) -> tuple[frozenset[int], tuple[int, ...] | None]:
    sharding = array.sharding
    ids = frozenset(d.id for d in sharding.device_set)
    order = _mesh.device_order(sharding.mesh) if isinstance(sharding, jax.sharding.NamedSharding) else None
    return ids, order


def _ids(ids: Iterable[int]) -> str:
    return "{" + ", ".join(str(i) for i in sorted(ids)) + "}"


def check_devices(**trees: Any) -> None:
    """Check that arrays to be used together live on the same devices.

    Call it before a jitted step with the trees it takes, named as you like:
    `check_devices(params=params, batch=batch)`. Only committed `jax.Array`s
    count (what `jax.device_put` with a sharding, `shardrules.apply` or a jitted
    function returned); NumPy arrays and uncommitted arrays go anywhere.

    **Raises:** `PlacementError` (SR111) naming the first two leaves, as
    `NAME/PATH`, that sit on different devices or on the same devices in
    another mesh order — the mistake behind JAX's "incompatible devices" error.

    ```python
    params = shardrules.apply(params, rules, mesh)
    batch = jax.device_put(batch, other_devices)
    shardrules.check_devices(params=params, batch=batch)   # PlacementError: SR111 ...
    ```
    """
    from .._interop._paths import flatten, path_str
    from .._interop._penzai import arrays_of

    reference: tuple[str, frozenset[int], tuple[int, ...] | None] | None = None
    for name, tree in trees.items():
        keyed, _ = flatten(tree)
        arrays = arrays_of([leaf for _, leaf in keyed])[0]  # a penzai variable's array
        for (keypath, _), leaf in zip(keyed, arrays, strict=True):
            if not isinstance(leaf, jax.Array) or isinstance(leaf, Tracer) or not leaf.committed:
                continue
            if leaf.is_deleted():
                continue
            path = f"{name}/{path_str(keypath)}" if keypath else name
            ids, order = _devices_of(leaf)
            if reference is None:
                reference = (path, ids, order)
                continue
            ref_path, ref_ids, ref_order = reference
            if ids != ref_ids:
                message = f"`{ref_path}` is on devices {_ids(ref_ids)} but `{path}` is on devices {_ids(ids)}"
            elif order is not None and ref_order is not None and order != ref_order:
                message = (
                    f"`{ref_path}` and `{path}` are on the same devices in another mesh order "
                    f"({list(ref_order)} vs {list(order)})"
                )
            else:
                continue
            raise error_for(
                [
                    Diagnostic(
                        "SR111",
                        "error",
                        message + "; arrays used together must share their devices",
                        path=path,
                        hint="place both with the same mesh (shardrules.apply(tree, rules, mesh) "
                        "for each), or move one with jax.device_put",
                    )
                ]
            )
