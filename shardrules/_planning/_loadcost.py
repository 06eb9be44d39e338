"""What loading a checkpoint into a plan's layout costs each host: `Plan.load_cost`.

Hosts are as `_hosts` models them: devices in mesh order, each host a run of
consecutive devices. For every array leaf, each host's distinct slices (the
blocks its devices hold, each once) are handed to `_ranges.read_plan`, the
function the reader of `load_checkpoint` reads with, so the reads and bytes
counted here are those the reader issues.

Peak host memory is what the reader holds at once: `load_checkpoint` reads one
tensor's distinct local slices (and, reading blocks, one block buffer), makes
its array, and lets them go before the next tensor; the peak is the largest
such tensor. The arrays already made are on the devices and are not counted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._errors import Diagnostic
from .._pspec import entries
from ._blocks import block_index, device_coords
from ._hosts import HostsError, check_hosts
from ._mesh import sizes_of
from ._plan import LeafPlan, Plan, format_bytes, plural
from ._ranges import ReadPlan, Region, read_plan


@dataclasses.dataclass(frozen=True)
class HostLoad:
    """What one host reads to load a checkpoint into the plan's layout.

    **Attributes:**

    - `host`: the host's index (0-based); it holds devices `devices`.
    - `devices`: the positions of its devices in mesh order (`mesh.devices.flat`).
    - `bytes_read`: bytes its reads ask for (the bytes of its distinct slices,
      or more where the reader reads whole rows in blocks).
    - `reads`: positioned reads the reader issues.
    - `runs`: contiguous byte runs its distinct slices make in the file (the
      reads it would take to read exactly their bytes, one run at a time).
    - `slices`: its distinct slices, over every array (a slice once however
      many of its devices hold it).
    - `peak_bytes`: the most host memory the reader holds at once: the largest
      tensor's distinct local slices (and block buffer) until its array is made.
    """

    host: int
    devices: tuple[int, ...]
    bytes_read: int
    reads: int
    runs: int
    slices: int
    peak_bytes: int


@dataclasses.dataclass(frozen=True)
class LoadCost:
    """What `load_checkpoint` reads on each host to load a checkpoint into a
    plan's layout. Made by `Plan.load_cost`.

    **Attributes:**

    - `hosts`: one `HostLoad` per host, in order.
    - `devices_per_host`: devices each host drives.
    - `data_bytes`: the bytes of every array, counted once (the checkpoint's data).
    - `findings`: SR220 warnings, one per rule whose leaves make many more
      byte runs than slices on a host.

    `str()` gives a table, consecutive hosts with the same figures on one row.

    ```python
    cost = sr.plan(shapes, rules, {"fsdp": 16, "model": 8}).load_cost(hosts=16)
    cost.worst.bytes_read, cost.worst.reads, cost.peak_bytes
    ```
    """

    hosts: tuple[HostLoad, ...]
    devices_per_host: int
    data_bytes: int
    findings: tuple[Diagnostic, ...] = ()

    @property
    def bytes_read(self) -> int:
        """Bytes read by all the hosts together."""
        return sum(h.bytes_read for h in self.hosts)

    @property
    def reads(self) -> int:
        """Reads issued by all the hosts together."""
        return sum(h.reads for h in self.hosts)

    @property
    def worst(self) -> HostLoad:
        """The host that reads the most bytes (then the most reads; the first of equals)."""
        return max(self.hosts, key=lambda h: (h.bytes_read, h.reads, -h.host))

    @property
    def peak_bytes(self) -> int:
        """The most host memory any host's reader holds at once."""
        return max((h.peak_bytes for h in self.hosts), default=0)

    def to_json(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict: `hosts`, `devices_per_host`,
        `data_bytes`, `bytes_read`, `reads`, `peak_bytes`, `worst_host` and
        `rows` (one `{"host", "devices", "bytes_read", "reads", "runs",
        "slices", "peak_bytes"}` per host, `devices` as `[first, last]`)."""
        return {
            "hosts": len(self.hosts),
            "devices_per_host": self.devices_per_host,
            "data_bytes": self.data_bytes,
            "bytes_read": self.bytes_read,
            "reads": self.reads,
            "peak_bytes": self.peak_bytes,
            "worst_host": self.worst.host if self.hosts else None,
            "rows": [
                {
                    "host": h.host,
                    "devices": [h.devices[0], h.devices[-1]],
                    "bytes_read": h.bytes_read,
                    "reads": h.reads,
                    "runs": h.runs,
                    "slices": h.slices,
                    "peak_bytes": h.peak_bytes,
                }
                for h in self.hosts
            ],
        }

    def table(self) -> str:
        """Per host (consecutive hosts with equal figures on one row): its
        devices, bytes read, reads, byte runs, distinct slices and peak host
        memory; then the totals."""
        header = ("hosts", "devices", "read", "reads", "runs", "slices", "peak")
        rows: list[tuple[str, ...]] = [header]
        for first, last in _same_rows(self.hosts):
            a, b = self.hosts[first], self.hosts[last]
            rows.append(
                (
                    str(a.host) if first == last else f"{a.host}-{b.host}",
                    f"{a.devices[0]}-{b.devices[-1]}",
                    format_bytes(a.bytes_read),
                    f"{a.reads:,}",
                    f"{a.runs:,}",
                    f"{a.slices:,}",
                    format_bytes(a.peak_bytes),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = [
            "  ".join(
                c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
            for r in rows
        ]
        if self.hosts:
            worst = self.worst
            lines.append(
                f"{plural(len(self.hosts), 'host')} × {plural(self.devices_per_host, 'device')}: "
                f"{format_bytes(self.bytes_read)} read in {self.reads:,} reads for "
                f"{format_bytes(self.data_bytes)} of data; most on host {worst.host}: "
                f"{format_bytes(worst.bytes_read)} in {worst.reads:,} reads, peak {format_bytes(self.peak_bytes)}"
            )
        return "\n".join(line.rstrip() for line in lines)

    def __str__(self) -> str:
        return self.table()


def _same_rows(hosts: tuple[HostLoad, ...]) -> list[tuple[int, int]]:
    """Runs `(first, last)` of consecutive hosts with the same figures."""
    out: list[tuple[int, int]] = []

    def figures(h: HostLoad) -> tuple[int, ...]:
        return (h.bytes_read, h.reads, h.runs, h.slices, h.peak_bytes)

    for i, h in enumerate(hosts):
        if out and figures(hosts[out[-1][1]]) == figures(h):
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def host_regions(
    shape: tuple[int, ...], spec_entries: tuple[Any, ...], sizes: Mapping[str, int], hosts: int
) -> list[list[Region]]:
    """Each host's distinct slices of an array laid out by `spec_entries`, in
    the order its devices first hold them.

    **Arguments:**

    - `shape`: the array's shape.
    - `spec_entries`: the `PartitionSpec`'s entries (fewer than the rank: the
      rest unsharded).
    - `sizes`: the mesh's axis sizes, in mesh order.
    - `hosts`: how many hosts share the devices (it divides their number).

    **Returns:** per host, a list of regions, `(start, stop)` per dimension.

    ```python
    host_regions((8, 4), ("x",), {"x": 4}, 2)  # [[((0, 2), (0, 4)), ((2, 4), (0, 4))], ...]
    ```
    """
    coords = device_coords(sizes)
    devices = math.prod(sizes.values())
    columns, widths = [], []
    for d, n in enumerate(shape):
        index, count = block_index(spec_entries[d] if d < len(spec_entries) else None, coords, sizes)
        columns.append(index)
        widths.append(n // count)
    keys = np.stack(columns, axis=1) if columns else np.zeros((devices, 0), np.int64)
    per = devices // hosts
    out = []
    for h in range(hosts):
        distinct = dict.fromkeys(map(tuple, keys[h * per : (h + 1) * per].tolist()))
        out.append(
            [tuple((b * w, (b + 1) * w) for b, w in zip(key, widths, strict=True)) for key in distinct]
        )
    return out


def leaf_reads(leaf: LeafPlan, sizes: Mapping[str, int], hosts: int, cache: dict) -> list[ReadPlan] | None:
    """Each host's `ReadPlan` for one array leaf (`None` for a leaf with no
    layout or no bytes); kinds of leaf already seen are taken from `cache`."""
    if leaf.shape is None or leaf.dtype is None or leaf.spec is None:
        return None
    key = (leaf.shape, leaf.dtype.itemsize, tuple(map(_hashable, entries(leaf.spec))))
    found = cache.get(key)
    if found is None:
        regions = host_regions(leaf.shape, key[2], sizes, hosts)
        found = cache[key] = [read_plan(leaf.shape, leaf.dtype.itemsize, r) for r in regions]
    return found


def _hashable(entry: Any) -> Any:
    return tuple(entry) if isinstance(entry, list) else entry


def load_cost(plan: Plan, hosts: int = 1) -> LoadCost:
    """`Plan.load_cost`: per host, what `load_checkpoint` reads and holds."""
    from ._slow_reads import slow_read_warnings

    if isinstance(hosts, bool) or not isinstance(hosts, int):
        raise TypeError(f"hosts must be an int, not {type(hosts).__name__}")
    if plan.mesh is None:
        raise HostsError(
            "load_cost needs the mesh's sizes: plan on a mesh (a Mesh, AbstractMesh or dict of sizes)"
        )
    sizes = sizes_of(plan.mesh)
    per = check_hosts(sizes, hosts, what=f"hosts={hosts}")
    totals = np.zeros((hosts, 5), np.int64)  # bytes read, reads, runs, slices, peak
    cache: dict = {}
    for leaf in plan.leaves:
        reads = leaf_reads(leaf, sizes, hosts, cache)
        if reads is None:
            continue
        for h, r in enumerate(reads):
            totals[h, :4] += (r.nbytes, r.reads, r.run_count, sum(x.count > 0 for x in r.runs))
            totals[h, 4] = max(totals[h, 4], r.held)
    rows = tuple(
        HostLoad(h, tuple(range(h * per, (h + 1) * per)), *(int(x) for x in totals[h])) for h in range(hosts)
    )
    return LoadCost(rows, per, plan.total_bytes, tuple(slow_read_warnings(plan, sizes, hosts, cache)))
