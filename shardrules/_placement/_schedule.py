"""Cutting a transfer's pieces into chunks under a memory cap, and what each
device holds while they move.

A piece in flight takes memory on its target (the copy that arrives, until
it is written into the array it belongs to) and, where the source device has
to cut it out of a larger block, on its source too (the cut, until it is
sent); a piece between processes, as bytes, takes its size on its source and
twice its size on its target (`in_flight`). A chunk is a run of pieces, in leaf order, whose bytes in flight on
every device stay within the cap; a piece larger than the cap travels alone.
So at any moment a device holds, beyond the arrays it keeps and the arrays it
has received, at most the cap plus one piece.

The same walk gives the peak each device reaches (`peaks`): the sources it
still holds (all of them, or with `donate` those of arrays not yet finished),
plus the arrays made so far (an array's block is allocated when its first
piece arrives), plus the chunk in flight.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from ._pieces import Piece


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Pieces that move together, and the leaves finished once they have."""

    pieces: tuple[Piece, ...]
    finished: tuple[int, ...]


def in_flight(piece: Piece) -> dict[int, int]:
    """The bytes `piece` holds on each device while it moves. Between
    processes (`_crossing`) a piece travels as a row of bytes: the row on
    its source, and on its target the row as well as the piece made from it."""
    if piece.crosses:
        return {piece.source: piece.nbytes, piece.target: 2 * piece.nbytes}
    out = {piece.target: piece.nbytes}
    if not piece.whole_source and not piece.stays:
        out[piece.source] = out.get(piece.source, 0) + piece.nbytes
    return out


def chunks(pieces: Sequence[Piece], cap: int | None) -> list[Chunk]:
    """The pieces (in leaf order) cut into chunks of at most `cap` bytes in
    flight per device (`None`: one chunk)."""
    last = {piece.leaf: n for n, piece in enumerate(pieces)}
    bounds: list[tuple[int, int]] = []
    start, held = 0, {}
    for n, piece in enumerate(pieces):
        need = in_flight(piece)
        if cap is not None and n > start and any(held.get(d, 0) + b > cap for d, b in need.items()):
            bounds.append((start, n))
            start, held = n, {}
        for d, b in need.items():
            held[d] = held.get(d, 0) + b
    if pieces:
        bounds.append((start, len(pieces)))
    return [
        Chunk(tuple(pieces[a:b]), tuple(leaf for leaf, n in last.items() if a <= n < b)) for a, b in bounds
    ]


def peaks(
    chunked: Sequence[Chunk],
    sources: Mapping[int, Mapping[int, int]],
    targets: Mapping[int, Mapping[int, int]],
    donate: bool,
) -> dict[int, int]:
    """Each device's highest memory during the transfer. `sources[leaf]`:
    device → bytes of the leaf's source block there (leaves that move);
    `targets[leaf]`: device → bytes of its new block."""
    held: dict[int, int] = {}
    for blocks in sources.values():
        for d, b in blocks.items():
            held[d] = held.get(d, 0) + b
    peak = dict(held)
    started: set[tuple[int, int]] = set()
    for chunk in chunked:
        now = dict(held)
        for piece in chunk.pieces:
            for d, b in in_flight(piece).items():
                now[d] = now.get(d, 0) + b
            key = (piece.leaf, piece.target)
            if key not in started:  # the new block is allocated with its first piece
                started.add(key)
                block = targets[piece.leaf][piece.target]
                now[piece.target] = now.get(piece.target, 0) + block
                held[piece.target] = held.get(piece.target, 0) + block
        for d, b in now.items():
            peak[d] = max(peak.get(d, 0), b)
        if donate:
            for leaf in chunk.finished:
                for d, b in sources.get(leaf, {}).items():
                    held[d] -= b
    return peak
