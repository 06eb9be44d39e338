"""Regions of a trace that JAX computes on other axis types.

Some `jnp` functions (`jnp.repeat`, `.at[...].get(out_sharding=...)`) compute
part of their work under `jax.sharding.auto_axes`: the trace moves the values
onto a copy of the mesh whose axes are `Auto` (a `reshard` to it), computes,
and moves the result back (a `reshard` to the mesh) with the layout the
function chose from its operands' layouts. The first trace sees every value
replicated, so that layout is replicated there, whatever the operands are
laid out as when the trace is evaluated with their layouts.

So the layout each value had when it entered such a region is carried
through the region's operations as a *shadow* (by the same propagation as
anywhere else: `_propagate`), and a value leaving the region to no layout
takes its shadow's: what the function would have chosen had it been traced
with the layouts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
from jax.core import Tracer
from jax.sharding import NamedSharding, PartitionSpec

from .._pspec import entries, with_entries
from ._explicit import spec_of
from ._propagate import axes_of, propagate


def mesh_of(value: Any) -> Any:
    """The abstract mesh `value`'s type names, or `None` (also for a Python or
    NumPy scalar, which is typed on whatever mesh is current)."""
    if not isinstance(value, (jax.Array, Tracer)):
        return None
    try:
        return getattr(getattr(jax.typeof(value), "sharding", None), "mesh", None)
    except TypeError:
        return None


def elsewhere(value: Any, mesh: Any) -> bool:
    """Whether `value` is typed on `mesh`'s axes with other axis types."""
    return elsewhere_mesh(mesh_of(value), mesh)


def elsewhere_mesh(other: Any, mesh: Any) -> bool:
    """Whether `other` is `mesh`'s axes with other axis types."""
    return (
        other is not None
        and mesh is not None
        and getattr(other, "axis_names", None) == mesh.axis_names
        and other.axis_types != mesh.axis_types
    )


class Shadows:
    """The layouts values inside regions on other axis types would have (see
    the module's docstring), keyed by the values themselves (kept alive here,
    so that their ids stay theirs while the trace is evaluated)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Any, PartitionSpec]] = {}

    def get(self, value: Any) -> PartitionSpec | None:
        found = self._by_id.get(id(value))
        return found[1] if found is not None and found[0] is value else None

    def put(self, value: Any, spec: PartitionSpec) -> None:
        if axes_of(spec):
            self._by_id[id(value)] = (value, spec)

    def entered(self, operand: Any, result: Any) -> None:
        """`operand` moved into a region as `result`: its layout is the shadow."""
        self.put(result, spec_of(operand))

    def through(
        self, name: str, invals: Sequence[Any], params: Mapping[str, Any], results: Sequence[Any], sizes: Any
    ) -> None:
        """An operation inside a region: its results' shadows from its operands'."""
        specs = [self.get(x) for x in invals]
        if not any(s is not None for s in specs):
            return
        operands = [
            (tuple(x.shape), s) if hasattr(x, "shape") else (None, None)
            for x, s in zip(invals, specs, strict=True)
        ]
        for r in results:
            if hasattr(r, "shape"):
                self.put(r, propagate(name, operands, params, r.shape, sizes).spec)

    def leaving(self, operand: Any, mesh: Any) -> NamedSharding | None:
        """The layout for `operand` leaving its region to no layout: its shadow's
        on `mesh`, or `None` where it has none."""
        spec = self.get(operand)
        if spec is None or len(entries(spec)) != len(getattr(operand, "shape", ())):
            return None
        return NamedSharding(mesh, with_entries(spec, entries(spec)))
