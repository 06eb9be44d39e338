"""The pieces of one array that go from one layout to another.

Under any sharding, each device holds one block of an array (a box: an
interval per dimension). To give a device its block under the new layout,
the box is cut along the old layout's block boundaries; each cut is a
*piece*, taken from one device that holds it under the old layout:

- the device itself where it holds it (the piece *stays*: nothing moves);
- otherwise a holder on the same process (no crossing between processes);
- otherwise the holder that has sent the fewest bytes so far, so that a
  replicated source spreads its sending over its copies.

A piece that moves is a copy from one device to another of `nbytes` bytes;
`bytes_moved` counts only those. The geometry comes from JAX
(`Sharding.devices_indices_map`), so any sharding (a `NamedSharding` on any
mesh, a single device) is cut the same way.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax

Box = tuple[tuple[int, int], ...]
"""An interval `(start, stop)` per dimension of the array."""


@dataclasses.dataclass(frozen=True)
class Piece:
    """One box of one array, copied from a device of the old layout to a
    device of the new one.

    - `leaf`: the array's position among the tree's leaves.
    - `source`, `target`: device ids (equal when the piece stays).
    - `box`: the piece in the array's coordinates.
    - `in_source`, `in_target`: the piece within the source device's block
      and within the target device's block (offsets of the same shape).
    - `whole_source`: the piece is the source device's whole block (no
      slicing there); `whole_target`: it is the target device's whole block
      (nothing to assemble).
    - `nbytes`: its size.
    - `crosses`: its two devices belong to different processes.
    """

    leaf: int
    source: int
    target: int
    box: Box
    in_source: Box
    in_target: Box
    whole_source: bool
    whole_target: bool
    nbytes: int
    crosses: bool = False

    @property
    def stays(self) -> bool:
        return self.source == self.target

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(stop - start for start, stop in self.box)


def _box(index: tuple[slice, ...], shape: tuple[int, ...]) -> Box:
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))


def blocks(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> dict[int, Box]:
    """Each device id's block of an array of `shape` under `sharding`."""
    return {d.id: _box(index, shape) for d, index in sharding.devices_indices_map(shape).items()}


def _within(inner: Box, outer: Box) -> Box:
    return tuple((a - o, b - o) for (a, b), (o, _) in zip(inner, outer, strict=True))


def _contains(outer: Box, inner: Box) -> bool:
    return all(o0 <= i0 and i1 <= o1 for (o0, o1), (i0, i1) in zip(outer, inner, strict=True))


def _cuts(holders: Mapping[Box, Sequence[int]], rank: int) -> list[list[tuple[int, int]]]:
    """The old layout's distinct intervals along each dimension. Its blocks
    are the products of these (a grid), which `leaf_pieces` relies on."""
    cuts = [sorted({box[k] for box in holders}) for k in range(rank)]
    if math.prod(len(c) for c in cuts) != len(holders):
        raise ValueError("the source layout's blocks do not form a grid")
    return cuts


def leaf_pieces(
    leaf: int,
    shape: tuple[int, ...],
    itemsize: int,
    old: Mapping[int, Box],
    new: Mapping[int, Box],
    process_of: Mapping[int, int],
    sent: dict[int, int],
) -> list[Piece]:
    """The pieces giving every device of `new` its block, taken from the
    blocks of `old` (device id → block, as `blocks` returns). `process_of`:
    device id → process index. `sent`: bytes each device has been given to
    send so far, updated (it balances the sending over copies)."""
    holders: dict[Box, list[int]] = {}
    for device, box in old.items():
        holders.setdefault(box, []).append(device)
    cuts = _cuts(holders, len(shape))
    pieces = []
    for target, want in new.items():
        mine = old.get(target)
        if mine is not None and _contains(mine, want):
            size = math.prod(b - a for a, b in want) * itemsize
            pieces.append(
                Piece(
                    leaf,
                    target,
                    target,
                    want,
                    _within(want, mine),
                    _within(want, want),
                    mine == want,
                    True,
                    size,
                )
            )
            continue
        spans = [
            [((a, b), (max(a, w0), min(b, w1))) for a, b in cut if a < w1 and w0 < b]
            for cut, (w0, w1) in zip(cuts, want, strict=True)
        ]
        for combo in itertools.product(*spans):
            source_box = tuple(c for c, _ in combo)  # the old blocks form a grid of the cuts
            part = tuple(p for _, p in combo)
            source = _holder(holders[source_box], target, process_of, sent)
            size = math.prod(b - a for a, b in part) * itemsize
            sent[source] = sent.get(source, 0) + size
            pieces.append(
                Piece(
                    leaf,
                    source,
                    target,
                    part,
                    _within(part, source_box),
                    _within(part, want),
                    part == source_box,
                    part == want,
                    size,
                    process_of.get(source) != process_of.get(target),
                )
            )
    return pieces


def _holder(
    devices: Sequence[int], target: int, process_of: Mapping[int, int], sent: Mapping[int, int]
) -> int:
    """Which of the devices holding a piece sends it to `target`."""
    if target in devices:
        return target
    near = [d for d in devices if process_of.get(d) == process_of.get(target)]
    return min(near or devices, key=lambda d: (sent.get(d, 0), d))


def process_map(*shardings: Any) -> dict[int, int]:
    """Device id → process index for the devices of the given shardings."""
    out: dict[int, int] = {}
    for sharding in shardings:
        for d in sharding.device_set:
            out[d.id] = d.process_index
    return out
