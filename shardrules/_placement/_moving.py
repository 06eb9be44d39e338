"""A transfer's plan for one tree, and running it.

`layout_of` turns two shardings per leaf into `Moves`: the leaves that move,
their pieces (`_pieces`), how many pieces make each new block; `Moves.chunks`
cuts them for a cap (`_schedule`, kept per cap). `run_moves` moves the chunks
one after another (`_carry`): each waited for before the next, each leaf's
array made as soon as its last piece has arrived and, with `donate`, its
source deleted then (inputs that share buffers together, once the last of
them is done, never while one is returned as it is: see `_moves`).
`shardrules.transfer` and `shardrules.reshard(max_bytes_in_flight=...)` both
use it.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from .._errors import Diagnostic, Span, error_for
from .._language._rules import RuleSet
from .._language._sizes import byte_size
from .._planning._plan import LeafPlan, Plan
from . import _carry, _moves, _schedule
from ._pieces import Piece, blocks, leaf_pieces


@dataclasses.dataclass(frozen=True)
class MovedLeaf:
    """One leaf of a transfer: its path, shape and dtype, its layout before
    (`source`) and after (`target`, as `PartitionSpec`s), its pieces, and the
    bytes that change device (`bytes_moved`). A leaf that is not an array
    (passed through as it is) has `None` for shape, dtype and layouts, and
    no pieces."""

    path: str
    shape: tuple[int, ...] | None
    dtype: np.dtype | None
    source: jax.sharding.PartitionSpec | None
    target: jax.sharding.PartitionSpec | None
    pieces: tuple[Piece, ...]
    bytes_moved: int


@dataclasses.dataclass
class Moves:
    """A transfer planned for one tree signature: its leaves, their source
    and target shardings, the pieces and how many each new block has, and
    the chunks for each cap used so far."""

    treedef: Any
    leaves: list[MovedLeaf]
    spans: list[Span | None]
    sources: list[jax.sharding.Sharding | None]
    targets: list[jax.sharding.Sharding | None]
    moving: list[int]
    pieces: list[Piece]
    counts: dict[tuple[int, int], int]
    devices: dict[int, Any]
    planned: list[LeafPlan]
    source_spans: list[Span | None]
    chunked: dict[int | None, list[_schedule.Chunk]] = dataclasses.field(default_factory=dict)

    def chunks(self, cap: int | None) -> list[_schedule.Chunk]:
        if cap not in self.chunked:
            self.chunked[cap] = _schedule.chunks(self.pieces, cap)
        return self.chunked[cap]


def layout_of(
    target: Plan,
    sources: Sequence[jax.sharding.Sharding | None],
    targets: Sequence[jax.sharding.Sharding | None],
    keep_equal: bool = False,
    source_spans: Sequence[Span | None] | None = None,
) -> Moves:
    """The moves taking each leaf of `target` (the target plan, for paths,
    shapes, dtypes and rule lines) from its source sharding to its target
    sharding (`None`: not an array, nothing moves). A leaf whose source
    sharding is its target's moves too, each piece copied on its own device
    (a new array on the target mesh, sharing no buffer with its source),
    unless `keep_equal` (`reshard`'s contract: returned as it is).
    `source_spans`: the source rules' lines, for messages about the inputs."""
    devices: dict[int, Any] = {}
    for sharding in [*sources, *targets]:
        if sharding is not None:
            for d in sharding.device_set:
                devices[d.id] = d
    process_of = {i: d.process_index for i, d in devices.items()}
    sent: dict[int, int] = {}
    leaves, spans, moving, pieces = [], [], [], []
    for i, (new, a, b) in enumerate(zip(target.leaves, sources, targets, strict=True)):
        spans.append(new.rule.span if new.rule is not None else None)
        if a is None or b is None or new.shape is None:
            leaves.append(MovedLeaf(new.path, None, None, None, None, (), 0))
            continue
        shape, dtype = tuple(new.shape), np.dtype(new.dtype)
        mine: list[Piece] = []
        if not (keep_equal and a == b):
            moving.append(i)
            if 0 not in shape:
                mine = leaf_pieces(
                    i, shape, dtype.itemsize, blocks(a, shape), blocks(b, shape), process_of, sent
                )
                pieces.extend(mine)
        moved = sum(p.nbytes for p in mine if not p.stays)
        leaves.append(MovedLeaf(new.path, shape, dtype, _spec(a), _spec(b), tuple(mine), moved))
    counts: dict[tuple[int, int], int] = {}
    for p in pieces:
        counts[(p.leaf, p.target)] = counts.get((p.leaf, p.target), 0) + 1
    return Moves(
        target.treedef,
        leaves,
        spans,
        list(sources),
        list(targets),
        moving,
        pieces,
        counts,
        devices,
        list(target.leaves),
        list(source_spans) if source_spans is not None else [None] * len(leaves),
    )


def _spec(sharding: jax.sharding.Sharding) -> jax.sharding.PartitionSpec | None:
    return sharding.spec if isinstance(sharding, jax.sharding.NamedSharding) else None


# Test hooks: how a piece is copied to a device of this process, which pieces go
# between processes, and a look at each chunk while its pieces are in flight.
_send_hook = None
_crossing_hook = None
_observe = None


def run_moves(
    layout: Moves,
    arrays: list[Any],
    cap: int | None,
    donate: bool,
    verify: bool,
    rebuild: Any,
    rules: RuleSet,
    what: str = "Transfer.run(donate=True)",
    finish: str = "shardrules.reshard(error.tree, target_rules, target_mesh) moves the rest",
) -> list[Any]:
    """Every chunk of `layout` moved; `arrays` (the tree's leaves) with each
    moving array's new one. `rebuild`: the tree from leaves like `arrays`;
    `rules`: the target rules (for messages).

    With `donate`, each group of inputs sharing buffers is deleted once
    all of its arrays are finished, never while one of them is returned
    as it is (see `_moves`); an error after some inputs were deleted
    carries the whole tree (`error.tree`)."""
    out = list(arrays)
    mover = _carry.Mover(
        {i: arrays[i] for i in layout.moving},
        {i: layout.targets[i] for i in layout.moving},  # type: ignore[misc]
        layout.counts,
        layout.devices,
        verify,
        send=_send_hook,
        crosses=_crossing_hook,
    )
    planned = [i for i, sharding in enumerate(layout.sources) if sharding is not None]
    pointers = {i: _moves._pointers(arrays[i]) for i in planned} if donate else {}
    group = _moves._groups(pointers)
    moving = set(layout.moving)
    kept = {group[i] for i in planned if i not in moving or pointers[i] is None} if donate else set()
    unfinished: dict[int, set[int]] = {}
    members: dict[int, list[int]] = {}
    if donate:
        for i in layout.moving:
            unfinished.setdefault(group[i], set()).add(i)
        for i in planned:
            members.setdefault(group[i], []).append(i)
    deleted: set[int] = set()

    def finished(i: int, array: jax.Array) -> None:
        out[i] = array
        if not donate:
            return
        waiting = unfinished[group[i]]
        waiting.discard(i)
        if waiting or group[i] in kept:
            return
        for j in members[group[i]]:
            if not arrays[j].is_deleted():
                arrays[j].delete()
                deleted.add(j)

    try:
        for i in layout.moving:
            leaf = layout.leaves[i]
            if not leaf.pieces:  # an empty array: nothing to cut, a new one (sharing no buffer)
                assert leaf.shape is not None and leaf.dtype is not None
                finished(i, jax.device_put(np.zeros(leaf.shape, leaf.dtype), layout.targets[i]))
        for chunk in layout.chunks(cap):
            flight = mover.move(chunk)
            if _observe is not None:
                _observe(mover, chunk)
            del flight
            if mover.mismatches:
                piece = mover.mismatches[0]
                raise error_for([_mismatch(layout, piece, len(mover.mismatches))], rules.sources)
            for i in chunk.finished:
                finished(i, mover.finish(i))
                mover.release(i)
    except BaseException as error:
        if not deleted:
            raise
        partial = [out[j] if j in deleted else arrays[j] for j in range(len(arrays))]
        raise _moves._carrying(  # noqa: B904
            error, lambda: rebuild(partial), len(deleted), len(moving), what, finish
        )
    return out


def _mismatch(layout: Moves, piece: Piece, count: int) -> Diagnostic:
    leaf = layout.leaves[piece.leaf]
    box = ", ".join(f"{a}:{b}" for a, b in piece.box)
    more = f" ({count} pieces differ)" if count > 1 else ""
    return Diagnostic(
        "SR132",
        "error",
        f"`{leaf.path}` {leaf.shape}: the piece [{box}] copied from device {piece.source} to device "
        f"{piece.target} does not match its source (checksums differ){more}",
        layout.spans[piece.leaf],
        leaf.path,
        hint="the copy was corrupted on the way (a faulty device, link or host memory); the source is "
        "intact and was not deleted: run the transfer again, and check the devices involved",
        cause="piece differs from its source after the transfer",
    )


def cap(value: Any) -> int | None:
    """A `max_bytes_in_flight` argument checked: `None`, or a positive number
    of bytes (an integer, NumPy's included, or a size such as `"64MiB"`)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            size = byte_size(value)
        except ValueError as err:
            raise ValueError(f"max_bytes_in_flight={value!r}: {err}") from None
    elif isinstance(value, bool):
        size = 0
    else:
        try:
            size = operator.index(value)
        except TypeError:
            size = 0
    if size < 1:
        raise ValueError(
            f"max_bytes_in_flight must be a positive number of bytes or a size like '64MiB', not {value!r}"
        )
    return size
