"""Reading a process's slices of a checkpoint tensor with positioned reads.

`load_checkpoint` reads, for each tensor, only the distinct slices this
process's devices hold, each into a buffer of its own, with the reads
`_planning/_ranges.read_plan` gives (the same reads `Plan.load_cost`
counts): one `os.preadv` per contiguous byte run of a slice, or, where a
layout splits an inner dimension into many small runs, whole rows of the
slices' bounding box in blocks of at most 16 MiB, cut into the slices in
memory. Nothing else of the file is read, and the file is not mapped into memory.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._planning._ranges import MAX_READ, Region, read_plan
from .._planning._shapes import ShapeSourceError


def read_at(fd: int, view: memoryview, offset: int) -> None:
    """Fill `view` with the file's bytes from `offset`: one positioned read
    (`os.preadv`, or `os.pread` where the platform lacks it), continued if the
    system returns fewer bytes than asked.

    **Arguments:**

    - `fd`: an open file descriptor.
    - `view`: a writable byte buffer, at most `MAX_READ` bytes.
    - `offset`: where in the file to start.

    **Raises:** `ShapeSourceError` when the file ends first.

    ```python
    read_at(fd, memoryview(buffer), 4096)
    ```
    """
    done, size = 0, len(view)
    while done < size:
        if hasattr(os, "preadv"):
            got = os.preadv(fd, [view[done:]], offset + done)
        else:  # pragma: no cover - Windows
            data = os.pread(fd, size - done, offset + done)
            got = len(data)
            view[done : done + got] = data
        if got <= 0:
            raise ShapeSourceError(f"the file ends at byte {offset + done}, before the tensor's data does")
        done += got


MAPPED = 1 << 20
"""Buffers this large or larger get an anonymous memory map of their own."""


def allocate(size: int) -> np.ndarray:
    """A writable byte buffer of `size` bytes: from an anonymous memory map of
    its own when it is `MAPPED` bytes or more, page-aligned and given back to
    the system as soon as it is let go (NumPy's large buffers from `malloc`
    may stay with the process after they are freed, raising its peak as
    tensors follow each other: `benchmarks/memory.py` measured 1.20x the
    model with them, 1.00x with these).

    ```python
    allocate(4 << 20)  # 4 MiB, zeros, writable
    ```
    """
    if size < max(MAPPED, 1):
        return np.empty(size, np.uint8)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)  # its pages made at once
    return np.frombuffer(mmap.mmap(-1, size, flags=flags), np.uint8)


def region_of(index: Sequence[slice], shape: Sequence[int]) -> Region:
    """`(start, stop)` per dimension of the index `jax.make_array_from_callback` passes."""
    return tuple(
        (start, stop) for s, n in zip(index, shape, strict=True) for start, stop, _ in [s.indices(n)]
    )


def read_regions(
    fd: int, base: int, shape: tuple[int, ...], dtype: np.dtype, regions: Sequence[Region]
) -> list[np.ndarray]:
    """Each region of the tensor whose data starts at byte `base` of the file,
    read with the reads `read_plan` gives.

    **Arguments:**

    - `fd`: the file, open for reading.
    - `base`: the byte offset of the tensor's first element in the file.
    - `shape`, `dtype`: the tensor's.
    - `regions`: distinct slices, `(start, stop)` per dimension.

    **Returns:** one array per region, in order, of the tensor's dtype.

    ```python
    [top, bottom] = read_regions(fd, 128, (8, 8), np.dtype("float32"), [((0, 4), (0, 8)), ((4, 8), (0, 8))])
    ```
    """
    plan = read_plan(shape, dtype.itemsize, regions)
    buffers = [allocate(r.nbytes) for r in plan.runs]
    out = [
        buffer.view(dtype).reshape(tuple(b - a for a, b in region))
        for buffer, region in zip(buffers, regions, strict=True)
    ]
    if plan.mode == "runs":
        for buffer, runs in zip(buffers, plan.runs, strict=True):
            view, length = memoryview(buffer.data), runs.length
            for i, offset in enumerate(runs.offsets().tolist()):
                for part in range(0, length, MAX_READ):
                    at = i * length + part
                    read_at(fd, view[at : at + min(MAX_READ, length - part)], base + offset + part)
    elif plan.mode == "blocks":
        _read_blocks(fd, base, shape, dtype, regions, out, plan.blocks)
    return out


def _read_blocks(
    fd: int,
    base: int,
    shape: tuple[int, ...],
    dtype: np.dtype,
    regions: Sequence[Region],
    out: list[np.ndarray],
    blocks: Any,
) -> None:
    """Whole rows of `blocks.dim` over the regions' bounding box, a block at a
    time into one buffer, each region's part copied out of it."""
    dim, row = blocks.dim, blocks.row
    scratch = np.empty(blocks.buffer, np.uint8)  # at most 16 MiB, reused block after block
    view = memoryview(scratch.data)
    inner = shape[dim + 1 :]
    wanted = [(region, array) for region, array in zip(regions, out, strict=True) if array.size]
    for outer, first, last, offset in blocks.reads_at():
        size = (last - first) * row
        read_at(fd, view[:size], base + offset)
        block = scratch[:size].view(dtype).reshape((last - first, *inner))
        for region, array in wanted:
            if not all(a <= i < b for i, (a, b) in zip(outer, region, strict=False)):
                continue
            start, stop = region[dim]
            lo, hi = max(first, start), min(last, stop)
            if lo >= hi:
                continue
            at = tuple(i - a for i, (a, _) in zip(outer, region, strict=False))
            array[(*at, slice(lo - start, hi - start))] = block[
                (slice(lo - first, hi - first), *(slice(a, b) for a, b in region[dim + 1 :]))
            ]
