"""Which block of an array each device holds, from mesh sizes alone.

Devices are numbered in mesh order: row-major over the axes as written, the
position of a device in `mesh.devices.flat` (how `jax.make_mesh` lays out GPU
clusters and TPU pods, hosts holding runs of consecutive devices). A spec
entry naming several axes splits its dimension with the first axis major, as
JAX does. Shared by the device pictures, the bytes `diff` moves and the bytes
per host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from jax.sharding import PartitionSpec

UNCONSTRAINED = "unconstrained"
"""How plan files and reports write `PartitionSpec.UNCONSTRAINED`."""


def entry_axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes of one `PartitionSpec` entry (`None` → `()`). An
    unconstrained entry (`PartitionSpec.UNCONSTRAINED`, or `"unconstrained"`
    as a plan file writes it) names none: it counts as unsharded."""
    if entry is None or entry is PartitionSpec.UNCONSTRAINED or entry == UNCONSTRAINED:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def device_coords(sizes: Mapping[str, int], count: int | None = None) -> dict[str, np.ndarray]:
    """Each axis's index for the devices at positions `0 .. count-1` (default:
    every device of the mesh)."""
    positions = np.arange(int(np.prod(list(sizes.values()))) if count is None else count, dtype=np.int64)
    out: dict[str, np.ndarray] = {}
    for name, size in reversed(list(sizes.items())):
        out[name] = positions % size
        positions = positions // size
    return out


def block_index(
    entry: Any, coords: Mapping[str, np.ndarray], sizes: Mapping[str, int]
) -> tuple[np.ndarray, int]:
    """The block of one dimension each device holds under the spec entry
    `entry`, and how many blocks the entry makes."""
    count = next(iter(coords.values())).shape[0] if coords else 1
    block, blocks = np.zeros(count, dtype=np.int64), 1
    for axis in entry_axes(entry):
        block = block * sizes[axis] + coords[axis]
        blocks *= sizes[axis]
    return block, blocks
