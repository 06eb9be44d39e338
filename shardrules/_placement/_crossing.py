"""Pieces that go from a device of one process to a device of another.

`jax.device_put` reaches only this process's devices, so such pieces travel
in a collective program that every process holding one of its devices runs:
`jax.lax.ppermute` over a one-axis mesh of the devices involved, where each
device sends at most one piece and receives at most one. The pieces of a
chunk are grouped into rounds of that kind (every process derives the same
rounds from the same plan); in each round a piece travels as bytes (its
bits, padded to the round's largest piece, with its checksum appended when
verifying) and is turned back into its dtype and shape on arrival. A process
sends only its devices' pieces and keeps only what its devices receive.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ._checksums import bits_of, sums
from ._pieces import Box, Piece

_AXIS = "pieces"
_SUM_BYTES = 8  # the two 32-bit words of a checksum


def rounds(pieces: Sequence[Piece]) -> list[list[Piece]]:
    """`pieces` grouped so that in each group no device sends twice or
    receives twice (greedy, largest first, so that a round's pieces are of
    like sizes and little is padded; the same on every process)."""
    out: list[tuple[set[int], set[int], list[Piece]]] = []
    for piece in sorted(pieces, key=lambda p: (-p.nbytes, p.leaf, p.source, p.target)):
        for senders, receivers, group in out:  # noqa: B007 (the group found is used below)
            if piece.source not in senders and piece.target not in receivers:
                break
        else:
            senders, receivers, group = set(), set(), []
            out.append((senders, receivers, group))
        senders.add(piece.source)
        receivers.add(piece.target)
        group.append(piece)
    return [group for _, _, group in out]


def _as_bits(x: jax.Array) -> jax.Array:
    """`x` as unsigned integers of its item size (complex: its two parts;
    elements narrower than a byte: their values as bytes, exactly)."""
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        x = jnp.stack([x.real, x.imag], axis=-1)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8)
    if bits_of(x.dtype) < 8:
        x = x.astype(jnp.float8_e4m3fn if jnp.issubdtype(x.dtype, jnp.floating) else jnp.int8)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[x.dtype.itemsize]
    return lax.bitcast_convert_type(x, unsigned)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _pack_part(
    block: jax.Array, starts: tuple[Any, ...], sizes: tuple[int, ...], length: int, verify: bool
) -> jax.Array:
    part = lax.dynamic_slice(block, starts, sizes)
    row = lax.bitcast_convert_type(_as_bits(part), jnp.uint8).ravel()
    if verify:
        row = jnp.concatenate([row, lax.bitcast_convert_type(sums(part), jnp.uint8).ravel()])
    return jnp.pad(row, (0, length - row.size))[None]


def _pack(block: jax.Array, box: Box, length: int, verify: bool) -> jax.Array:
    """One row of a round: the piece's bytes, its checksum, then zeros."""
    return _pack_part(block, tuple(np.int32(a) for a, _ in box), tuple(b - a for a, b in box), length, verify)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _unpack(row: jax.Array, shape: tuple[int, ...], dtype: Any, verify: bool) -> tuple[jax.Array, jax.Array]:
    """A received row back as the piece (and the checksum sent with it)."""
    dtype = np.dtype(dtype)
    complex_ = jnp.issubdtype(dtype, jnp.complexfloating)
    part_dtype = np.dtype(np.float32 if dtype == np.complex64 else np.float64) if complex_ else dtype
    narrow = not complex_ and dtype != np.bool_ and bits_of(dtype) < 8
    if narrow:  # sent as bytes holding the values (`_as_bits`)
        part_dtype = np.dtype(jnp.float8_e4m3fn if jnp.issubdtype(dtype, jnp.floating) else np.int8)
    item = part_dtype.itemsize if part_dtype != np.bool_ else 1
    inner = (*shape, 2) if complex_ else shape
    count = int(np.prod(inner, dtype=np.int64)) * item
    data = row[0, :count]
    if part_dtype == np.bool_:
        part = data.reshape(inner) != 0
    elif item == 1:
        part = lax.bitcast_convert_type(data.reshape(inner), part_dtype)
    else:
        part = lax.bitcast_convert_type(data.reshape((*inner, item)), part_dtype)
    if complex_:
        part = lax.complex(part[..., 0], part[..., 1]).astype(dtype)
    elif narrow:
        part = part.astype(dtype)
    if not verify:
        return part, jnp.zeros(2, jnp.uint32)
    return part, lax.bitcast_convert_type(row[0, count : count + _SUM_BYTES].reshape(2, 4), jnp.uint32)


@functools.lru_cache(maxsize=64)
def _permute(devices: tuple[Any, ...], perm: tuple[tuple[int, int], ...]) -> Any:
    mesh = Mesh(np.array(devices), (_AXIS,))

    def body(rows: jax.Array) -> jax.Array:
        return lax.ppermute(rows, _AXIS, perm)

    spec = PartitionSpec(_AXIS)
    # The rows go in place of the rows sent (donated): one row per device at a time.
    return mesh, jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec), donate_argnums=0)


def exchange(
    pieces: Sequence[Piece],
    held: Mapping[int, Mapping[int, jax.Array]],
    devices: Mapping[int, Any],
    mine: set[int],
    verify: bool,
    dtypes: Mapping[int, Any],
) -> tuple[list[tuple[Piece, jax.Array]], list[tuple[Piece, jax.Array]]]:
    """Move `pieces` between processes. Returns the pieces this process's
    devices received (each on its target device) and, with `verify`, the
    checksum sent with each."""
    got: list[tuple[Piece, jax.Array]] = []
    checks: list[tuple[Piece, jax.Array]] = []
    for group in rounds(pieces):
        ids = sorted({p.source for p in group} | {p.target for p in group})
        if not mine.intersection(ids):
            continue  # this process holds none of the round's devices
        length = max(p.nbytes for p in group) + (_SUM_BYTES if verify else 0)
        length = max(length, 1)
        position = {d: n for n, d in enumerate(ids)}
        perm = tuple((position[p.source], position[p.target]) for p in group)
        mesh, permute = _permute(tuple(devices[d] for d in ids), perm)
        sending = {p.source: p for p in group}
        rows = []
        for d in ids:
            if d not in mine:
                continue
            piece = sending.get(d)
            if piece is not None:
                rows.append(_pack(held[piece.leaf][d], piece.in_source, length, verify))
            else:
                rows.append(jnp.zeros((1, length), jnp.uint8, device=devices[d]))
        sharding = NamedSharding(mesh, PartitionSpec(_AXIS))
        local = [d for d in mesh.devices.flat if d.id in mine]
        rows_by_device = dict(zip([d.id for d in local], rows, strict=True))
        array = jax.make_array_from_single_device_arrays(
            (len(ids), length), sharding, [rows_by_device[d.id] for d in local]
        )
        out = {s.device.id: s.data for s in permute(array).addressable_shards}
        for piece in group:
            if piece.target in mine:
                part, sent = _unpack(out[piece.target], piece.shape, np.dtype(dtypes[piece.leaf]), verify)
                got.append((piece, part))
                if verify:
                    checks.append((piece, sent))
    return got, checks
