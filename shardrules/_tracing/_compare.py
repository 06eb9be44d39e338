"""A step on its mesh against the same step on one device: `Comparison`.

A layout should change where the math runs, never what it computes (up to
the order of floating-point sums). `RuleJit.compare` runs the step both ways
on the same inputs and reports, per output leaf, the largest absolute and
relative difference, so that a layout change, or a `shard_map` kernel, can
be shown not to change the results.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

from .._interop._paths import flatten, path_str
from ._compat import trace_state_clean


@dataclasses.dataclass(frozen=True)
class LeafDifference:
    """How one output leaf differs between the mesh and one device.

    **Attributes:** `path` (the leaf's path in the output, `""` for a lone
    array), `shape`, `max_abs` (the largest `|mesh - one device|`),
    `max_rel` (the largest of that over `|one device|`, where it is not 0),
    `close` (`numpy.allclose` under the comparison's tolerances).
    """

    path: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    close: bool


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What `RuleJit.compare` found (see there).

    **Attributes:** `leaves` (a `LeafDifference` per array leaf of the
    output: every array compared), `rtol`, `atol`; `ok` (every leaf close),
    `different` (the leaves that are not), `worst` (the leaf with the
    largest relative difference, a different one first, or `None` for an
    output with no array).
    """

    leaves: tuple[LeafDifference, ...]
    rtol: float
    atol: float

    @property
    def ok(self) -> bool:
        return all(leaf.close for leaf in self.leaves)

    @property
    def different(self) -> tuple[LeafDifference, ...]:
        """The leaves that are not close under the tolerances, in output order."""
        return tuple(leaf for leaf in self.leaves if not leaf.close)

    @property
    def worst(self) -> LeafDifference | None:
        if not self.leaves:
            return None
        return max(self.leaves, key=lambda leaf: (not leaf.close, leaf.max_rel, leaf.max_abs))

    def __str__(self) -> str:
        worst = self.worst
        if worst is None:
            return "no array in the output"
        compared = f"{len(self.leaves)} output array{'s' * (len(self.leaves) != 1)} compared"
        if self.ok:
            said = (
                f"the same on the mesh and on one device (rtol={self.rtol:g}, atol={self.atol:g}): {compared}"
            )
        else:
            different = self.different
            named = ", ".join(f"`{leaf.path or '(output)'}`" for leaf in different[:3])
            more = f" and {len(different) - 3} more" if len(different) > 3 else ""
            said = (
                f"DIFFERENT on the mesh and on one device (rtol={self.rtol:g}, atol={self.atol:g}): "
                f"{len(different)} of {compared} differ ({named}{more})"
            )
        return (
            f"{said}; largest difference at `{worst.path or '(output)'}` "
            f"{worst.shape}: {worst.max_abs:.3g} absolute, {worst.max_rel:.3g} relative"
        )


def shapes_only(args: Sequence[Any]) -> tuple[Any, ...]:
    """`args` with every array leaf a `ShapeDtypeStruct` with no layout."""

    def one(leaf: Any) -> Any:
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            return jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype)
        return leaf

    return tuple(jax.tree.map(one, a) for a in args)


def one_device_mesh(mesh: Any) -> Any:
    """A mesh of `mesh`'s axis names and types, every axis of size 1, on one device."""
    names = tuple(mesh.axis_names)
    return jax.make_mesh(
        (1,) * len(names), names, axis_types=tuple(mesh.axis_types), devices=[mesh.devices.flat[0]]
    )


def on_one_device(run: Callable[..., Any], args: tuple[Any, ...], mesh: Any) -> Any:
    """`run(*args)` as the one-device run on `mesh` (`one_device_mesh`'s):
    with `mesh` JAX's mesh, and each array leaf of `args`, grouped or not, a
    plain value on its device.

    An array laid out on the step's mesh (placed by `sr.apply`, an output of
    the step, made under `jax.set_mesh`) carries that mesh with it: in its
    type on Explicit axes, in its committed sharding on Auto ones; and the
    caller's `jax.set_mesh(...)` is the mesh JAX checks every argument
    against. Left so, the one-device run is refused (JAX's "incompatible
    devices", or its context mesh not matching an argument's), and a group's
    layout would move only the leaves that have a group. Here every leaf is
    on the one device, and the run lays it out as its group says there.
    NumPy arrays and Python scalars carry no mesh, and are left as they are."""
    device = mesh.devices.flat[0]

    def one(leaf: Any) -> Any:
        if isinstance(leaf, jax.Array) and not isinstance(leaf, Tracer):
            return jax.device_put(leaf, device)
        return leaf

    moved = tuple(jax.tree.map(one, a) for a in args)
    with jax.set_mesh(mesh) if trace_state_clean() else contextlib.nullcontext():
        return run(*moved)


def compare_outputs(sharded: Any, single: Any, rtol: float, atol: float) -> Comparison:
    """The `Comparison` of two outputs of the same structure."""
    got, _ = flatten(sharded)
    want, _ = flatten(single)
    leaves = []
    for (keys, a), (_, b) in zip(got, want, strict=True):
        if not hasattr(a, "shape") or not hasattr(b, "shape"):
            continue
        x, y = np.asarray(jax.device_get(a)), np.asarray(jax.device_get(b))
        if x.dtype.kind not in "fciub" or x.dtype == np.bool_:
            same = bool(np.array_equal(x, y))
            leaves.append(LeafDifference(path_str(keys), x.shape, 0.0 if same else float("inf"), 0.0, same))
            continue
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        diff = np.abs(x64 - y64)
        scale = np.abs(y64)
        rel = np.divide(diff, scale, out=np.zeros_like(diff), where=scale > 0)
        leaves.append(
            LeafDifference(
                path_str(keys),
                x.shape,
                float(diff.max()) if diff.size else 0.0,
                float(rel.max()) if rel.size else 0.0,
                bool(np.allclose(x64, y64, rtol=rtol, atol=atol)),
            )
        )
    return Comparison(tuple(leaves), rtol, atol)
