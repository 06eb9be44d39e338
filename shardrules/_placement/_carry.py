"""Moving a transfer's pieces, chunk by chunk, on this process's devices.

For each chunk: every piece this process sends is cut from its source block
(where it is not the whole block) and copied to its target device; pieces
between processes go through `_crossing`. Each new block is then made on its
device: a block that is one whole piece is that piece; one whose pieces all
arrive in this chunk is assembled from them; one whose pieces span chunks is
allocated with its first piece and written in place (a donated update) as
the others arrive. The chunk is waited for (`block_until_ready`), so no more
than one chunk is ever in flight; then, with `verify`, each piece's checksum
in its new block is compared with its checksum at the source; then the
finished arrays are made and, with `donate`, their sources deleted.

A piece that stays on its device is still copied there, so that a new array
shares no buffer with its source: deleting either (`donate`, or the caller
later) never takes part of the other with it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _crossing
from ._checksums import sums
from ._pieces import Box, Piece
from ._schedule import Chunk

# The programs below take offsets as arguments and sizes as static: one compile
# per shape, however many places a piece of that shape comes from or goes to.


@functools.partial(jax.jit, static_argnums=2)
def _slice(block: jax.Array, starts: tuple[Any, ...], sizes: tuple[int, ...]) -> jax.Array:
    return lax.dynamic_slice(block, starts, sizes)


def cut(block: jax.Array, box: Box) -> jax.Array:
    """The part `box` of a block (a new buffer on its device)."""
    return _slice(block, _starts(box), _sizes(box))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _assemble(parts: tuple[jax.Array, ...], offsets: tuple[Any, ...], shape: Any, dtype: Any) -> jax.Array:
    out = jnp.zeros(shape, dtype)
    for part, offset in zip(parts, offsets, strict=True):
        out = lax.dynamic_update_slice(out, part, offset)
    return out


@functools.partial(jax.jit, donate_argnums=0)
def _write(block: jax.Array, parts: tuple[jax.Array, ...], offsets: tuple[Any, ...]) -> jax.Array:
    for part, offset in zip(parts, offsets, strict=True):
        block = lax.dynamic_update_slice(block, part, offset)
    return block


def _plain(block: jax.Array) -> jax.Array:
    """A shard's data as an array of its one device, with no mesh in its type:
    the shard of an array on a one-device mesh with Explicit axes is that
    array itself, whose type names the mesh's axes, which the programs above
    (a reshape of a dimension `split` over a size-1 axis) cannot take. No
    copy: `jax.device_put` onto the device it is on aliases it."""
    if isinstance(block.sharding, jax.sharding.SingleDeviceSharding):
        return block
    (device,) = block.devices()
    return jax.device_put(block, jax.sharding.SingleDeviceSharding(device))


def _starts(box: Box) -> tuple[np.int32, ...]:
    return tuple(np.int32(a) for a, _ in box)


def _sizes(box: Box) -> tuple[int, ...]:
    return tuple(b - a for a, b in box)


@functools.partial(jax.jit, static_argnums=2)
def _checksum(block: jax.Array, starts: tuple[Any, ...], sizes: tuple[int, ...]) -> jax.Array:
    return sums(lax.dynamic_slice(block, starts, sizes))


def checksum(block: jax.Array, box: Box) -> jax.Array:
    """`sums` of the part `box` of a block, computed on its device."""
    return _checksum(block, _starts(box), _sizes(box))


class Mover:
    """One run of a transfer on this process: the sources, the blocks made so
    far, and the finished arrays.

    - `sources[leaf]`: the input array of each leaf that moves.
    - `targets[leaf]`: its new sharding; `shapes`, `dtypes` per leaf.
    - `counts[(leaf, device)]`: how many pieces the device's new block has.
    - `devices`: every device of both layouts, by id.
    - `send`: copies a piece to a device of this process (by default one
      batched `jax.device_put` per chunk).
    - `crosses`: whether a piece goes between processes (through
      `_crossing`); by default, where its two devices' processes differ.
    """

    def __init__(
        self,
        sources: Mapping[int, jax.Array],
        targets: Mapping[int, jax.sharding.Sharding],
        counts: Mapping[tuple[int, int], int],
        devices: Mapping[int, Any],
        verify: bool,
        send: Callable[[jax.Array, Any], jax.Array] | None = None,
        crosses: Callable[[Piece], bool] | None = None,
    ) -> None:
        self.sources = dict(sources)
        self.held = {
            leaf: {s.device.id: _plain(s.data) for s in x.addressable_shards}
            for leaf, x in self.sources.items()
        }
        self.targets = targets
        self.counts = counts
        self.devices = devices
        self.mine = {d for d, device in devices.items() if device.process_index == jax.process_index()}
        self.verify = verify
        self.send = send
        self.crosses = crosses or (
            lambda p: devices[p.source].process_index != devices[p.target].process_index
        )
        self.blocks: dict[tuple[int, int], jax.Array] = {}
        self.arrived: dict[tuple[int, int], int] = {}
        self.mismatches: list[Piece] = []

    def move(self, chunk: Chunk) -> list[jax.Array]:
        """Move one chunk; returns what is in flight (for the caller to see
        before it is dropped). Every new block of the chunk is computed when
        this returns."""
        arrived: dict[tuple[int, int], list[tuple[Piece, jax.Array]]] = {}
        checks: list[tuple[Piece, jax.Array]] = []
        crossing: list[Piece] = []
        flight: list[jax.Array] = []
        sending: list[tuple[Piece, jax.Array]] = []
        for piece in chunk.pieces:
            if self.crosses(piece):
                crossing.append(piece)  # every process meets in the exchange (the same rounds)
                continue
            if piece.source not in self.mine:
                continue  # between two devices of another process
            block = self.held[piece.leaf][piece.source]
            if self.verify:
                checks.append((piece, checksum(block, piece.in_source)))
            part = block if piece.whole_source else cut(block, piece.in_source)
            if piece.stays and piece.whole_source:
                part = jax.device_put(part, self.devices[piece.target], may_alias=False)
            elif not piece.stays:
                if not piece.whole_source:
                    flight.append(part)
                sending.append((piece, part))
                continue
            arrived.setdefault((piece.leaf, piece.target), []).append((piece, part))
        for piece, part in self._send_all(sending):
            arrived.setdefault((piece.leaf, piece.target), []).append((piece, part))
        if crossing:
            got, sent_sums = _crossing.exchange(
                crossing,
                self.held,
                self.devices,
                self.mine,
                self.verify,
                {i: x.dtype for i, x in self.sources.items()},
            )
            for piece, part in got:
                arrived.setdefault((piece.leaf, piece.target), []).append((piece, part))
            checks.extend(sent_sums)
        made = []
        for key, parts in arrived.items():
            flight.extend(part for _, part in parts)
            made.append(self._place(key, parts))
        jax.block_until_ready(made + flight)
        if self.verify:
            self._check(checks)
        return flight

    def _send_all(self, sending: Sequence[tuple[Piece, jax.Array]]) -> list[tuple[Piece, jax.Array]]:
        """Each piece copied to its target device: in one batched
        `jax.device_put` (or one call of `send` each, where one is given)."""
        if self.send is not None:
            return [(p, self.send(part, self.devices[p.target])) for p, part in sending]
        if not sending:
            return []
        moved = jax.device_put([part for _, part in sending], [self.devices[p.target] for p, _ in sending])
        return list(zip((p for p, _ in sending), moved, strict=True))

    def _place(self, key: tuple[int, int], parts: Sequence[tuple[Piece, jax.Array]]) -> jax.Array:
        """The new block of `key` with `parts` written in."""
        leaf, _ = key
        before = self.arrived.get(key, 0)
        self.arrived[key] = before + len(parts)
        if before == 0 and len(parts) == 1 and parts[0][0].whole_target:
            block = parts[0][1]  # the whole block in one piece
        else:
            arrays, offsets = tuple(a for _, a in parts), tuple(_starts(p.in_target) for p, _ in parts)
            block = self.blocks.get(key)
            if block is None:  # made on its device with its first pieces; any others written in later
                shape = self.targets[leaf].shard_shape(self.sources[leaf].shape)
                block = _assemble(arrays, offsets, shape, self.sources[leaf].dtype)
            else:
                block = _write(block, arrays, offsets)
        self.blocks[key] = block
        return block

    def _check(self, checks: Sequence[tuple[Piece, jax.Array]]) -> None:
        """Each piece's checksum where it arrived against its source's."""
        got = [checksum(self.blocks[(p.leaf, p.target)], p.in_target) for p, _ in checks]
        for (piece, want), have in zip(checks, got, strict=True):
            if not np.array_equal(np.asarray(want), np.asarray(have)):
                self.mismatches.append(piece)

    def finish(self, leaf: int) -> jax.Array:
        """The finished array of `leaf` (its blocks dropped from the mover)."""
        x, sharding = self.sources[leaf], self.targets[leaf]
        parts = []
        for device in sharding.addressable_devices_indices_map(x.shape):
            parts.append(self.blocks.pop((leaf, device.id)))
        return jax.make_array_from_single_device_arrays(x.shape, sharding, parts, dtype=x.dtype)

    def release(self, leaf: int) -> None:
        """Forget the source blocks of `leaf` (the caller deletes the array)."""
        self.held.pop(leaf, None)
