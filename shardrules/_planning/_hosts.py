"""Bytes per host for a mesh spread over several hosts, with no devices at hand.

A mesh description (axis sizes) and a number of hosts say which device holds
which shard, given how devices are numbered: here, in mesh order (row-major
over the axes as written), each host holding a run of consecutive devices. That
is how `jax.make_mesh` and `mesh_utils.create_device_mesh` lay out GPU clusters
and TPU pods: the leading axes cross hosts, the trailing ones stay within one.

Two figures per host: the bytes on its devices (every device's shards, so a
replicated array counts once per device) and the distinct bytes (each shard
once: what the host reads from a checkpoint, or needs in host memory to feed
its devices).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import numpy as np
from jax.sharding import PartitionSpec

from .._pspec import entries
from ._blocks import block_index, device_coords, entry_axes
from ._plan import Plan


class HostsError(ValueError):
    """A number of hosts that does not fit the mesh."""


def check_hosts(sizes: Mapping[str, int] | None, hosts: int, what: str = "") -> int:
    """Devices per host; raises `HostsError` when the hosts cannot share the mesh
    evenly. `what` names the number in messages (default `--hosts N`)."""
    what = what or f"--hosts {hosts}"
    if hosts < 1:
        raise HostsError(f"{what}: give a number of hosts of at least 1")
    if not sizes:
        raise HostsError("--hosts needs mesh sizes: pass --mesh AXIS=SIZE,... or give sizes in the mesh line")
    devices = math.prod(sizes.values())
    if devices % hosts:
        divisors = [n for n in range(1, devices + 1) if devices % n == 0]
        shown = ", ".join(map(str, divisors[:12])) + (", ..." if len(divisors) > 12 else "")
        raise HostsError(
            f"{what}: the mesh has {devices} devices, which do not split evenly over {hosts} hosts "
            f"(numbers of hosts that do: {shown})"
        )
    return devices // hosts


@functools.lru_cache(maxsize=256)
def _pieces(shape: tuple[int, ...], names: tuple[str, ...], spec: tuple, hosts: int) -> np.ndarray:
    """For each host, how many distinct shards of an array with this spec its devices hold."""
    sizes = dict(zip(names, shape, strict=True))
    coords = device_coords(sizes)
    held = np.ones(hosts, np.int64)
    for entry in spec:
        if not entry_axes(entry):
            continue
        index, _ = block_index(entry, coords, sizes)
        blocks = np.sort(index.reshape(hosts, -1), axis=1)  # row h: the shard index on host h's devices
        held *= 1 + (np.diff(blocks, axis=1) != 0).sum(axis=1)
    return held


def leaf_host_bytes(
    bytes_per_device: int, spec: PartitionSpec, sizes: Mapping[str, int], hosts: int
) -> np.ndarray:
    """Distinct bytes of one array on each host."""
    names = tuple(sizes)
    key = tuple(tuple(e) if isinstance(e, (tuple, list)) else e for e in entries(spec))
    return bytes_per_device * _pieces(tuple(sizes[n] for n in names), names, key, hosts)


def host_bytes(plan: Plan, sizes: Mapping[str, int], hosts: int) -> tuple[int, int]:
    """(bytes on one host's devices, most distinct bytes any host holds) for the plan."""
    per_host = check_hosts(sizes, hosts)
    distinct = np.zeros(hosts, np.int64)
    for leaf in plan.leaves:
        if leaf.spec is not None and leaf.bytes_per_device:
            distinct += leaf_host_bytes(leaf.bytes_per_device, leaf.spec, sizes, hosts)
    return plan.bytes_per_device * per_host, int(distinct.max()) if hosts else 0
