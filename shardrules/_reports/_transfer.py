"""The bytes each device must receive to go from one layout of an array to
another: what `shardrules diff` reports as *to move*.

A device receives the part of its new shard that it does not hold under the
old layout. Devices are matched by their position in mesh order (row-major
over the axes as written, `mesh.devices.flat`): the device at position `i` of
the old mesh is the device at position `i` of the new one, as when both meshes
are made by `jax.make_mesh` over the same devices. A position the old mesh does
not have (a larger new mesh) holds nothing yet.

The shards of an evenly divided dimension are equal intervals, so the share of
a new shard that a device already holds does not depend on the dimension's
length: it is computed once per pair of specs and meshes and scaled by each
array's size.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .._planning._blocks import block_index, device_coords, entry_axes

Entry = None | str | tuple[str, ...]
Spec = tuple[Entry, ...]
Sizes = tuple[tuple[str, int], ...]  # a mesh's (axis, size) in order, hashable


_CACHED_DEVICES = 4096  # larger meshes are not cached: 256 shares of 4,096 devices are 8 MiB


def held_share(old: Spec, old_sizes: Sizes, new: Spec, new_sizes: Sizes, rank: int) -> tuple[np.ndarray, int]:
    """For each device of the new mesh, `(numerator, denominator)`: the share
    of the array (not of the shard) that the device needs under `new` and
    already holds under `old`, as `numerator[d] / denominator`. The
    denominator divides the size of every array that both layouts divide
    evenly. Cached for meshes of up to `_CACHED_DEVICES` devices."""
    if math.prod(s for _, s in new_sizes) <= _CACHED_DEVICES:
        return _cached_share(old, old_sizes, new, new_sizes, rank)
    return _share(old, old_sizes, new, new_sizes, rank)


@functools.lru_cache(maxsize=256)
def _cached_share(
    old: Spec, old_sizes: Sizes, new: Spec, new_sizes: Sizes, rank: int
) -> tuple[np.ndarray, int]:
    return _share(old, old_sizes, new, new_sizes, rank)


def _share(old: Spec, old_sizes: Sizes, new: Spec, new_sizes: Sizes, rank: int) -> tuple[np.ndarray, int]:
    n_new = math.prod(s for _, s in new_sizes) if new_sizes else 1
    n_old = math.prod(s for _, s in old_sizes) if old_sizes else 1
    both = min(n_new, n_old)
    new_coords, old_coords = device_coords(dict(new_sizes)), device_coords(dict(old_sizes), both)
    dict_new, dict_old = dict(new_sizes), dict(old_sizes)
    numerator = np.ones(n_new, dtype=np.int64)
    numerator[both:] = 0  # positions the old mesh lacks hold nothing
    denominator = 1
    old_entries = list(old) + [None] * (rank - len(old))
    new_entries = list(new) + [None] * (rank - len(new))
    for old_entry, new_entry in zip(old_entries, new_entries, strict=True):
        j, nb = block_index(new_entry, new_coords, dict_new)
        i, na = block_index(old_entry, old_coords, dict_old)
        length = math.lcm(na, nb)  # the dimension as `length` units: both splits fall on units
        a, b = length // na, length // nb
        j = j[:both]
        overlap = np.clip(np.minimum((i + 1) * a, (j + 1) * b) - np.maximum(i * a, j * b), 0, None)
        numerator[:both] *= overlap
        denominator *= length
    return numerator, denominator


def to_receive(
    shard_bytes: int, old: Spec, old_sizes: Sizes, new: Spec, new_sizes: Sizes, rank: int
) -> np.ndarray:
    """The bytes each device of the new mesh (in mesh order) receives to hold
    its shard (`shard_bytes`) of an array of `rank` dimensions laid out by
    `new`, coming from `old`. Both layouts divide the array evenly."""
    numerator, denominator = held_share(old, old_sizes, new, new_sizes, rank)
    new_dict = dict(new_sizes)
    nbytes = shard_bytes * math.prod(math.prod(new_dict[a] for a in entry_axes(e)) for e in new)
    if nbytes % denominator == 0:
        return shard_bytes - (nbytes // denominator) * numerator
    held = [nbytes * int(n) // denominator for n in numerator]  # exact, in Python integers
    return shard_bytes - np.array(held, dtype=np.int64)
