"""Which bytes of a checkpoint file a process reads for its slices of a tensor.

One geometry, shared by the reader of `load_checkpoint` (which issues these
reads) and by `Plan.load_cost` (which counts them), so that the two cannot
disagree.

A tensor is stored in C order. A slice of it (a `start:stop` range per
dimension) is a set of contiguous byte *runs*: take `k`, the innermost
dimension the slice does not cover wholly; every index of the dimensions
before `k` starts one run, `(stop_k - start_k) × (bytes of one index of k)`
long. Adjacent runs are one run already: two runs are separated by the part
of dimension `k` outside the slice, which is never empty. A slice that covers
every dimension wholly is one run; an empty slice, none.

Runs are read one positioned read each (`os.preadv` into the slice's buffer;
a run over `MAX_READ` bytes takes several). Where a layout splits an inner
dimension, runs are many and small (`(_, model)` on a `(4096, 4096)` kernel:
4096 runs per slice), and one system call per few hundred bytes is slower
than reading more bytes: the reader then reads *blocks* instead, the bounding
box of the process's slices of the tensor in whole rows of one dimension, at
most `BLOCK` bytes per read, and cuts each slice out in memory. `read_plan`
chooses, per tensor, whichever costs less when a read is priced at
`READ_COST` bytes and the copy out of the blocks as many bytes again.

```python
one = read_plan((4096, 4096), 2, [((0, 4096), (0, 512))])   # a slice of columns
one.mode, one.reads, one.nbytes        # ("runs", 4096, 4194304)
every = read_plan((4096, 4096), 2, [((0, 4096), (512 * i, 512 * (i + 1))) for i in range(8)])
every.mode, every.reads, every.nbytes  # ("blocks", 2, 33554432): the whole tensor in 16 MiB blocks
```
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np

Region = tuple[tuple[int, int], ...]
"""A slice of a tensor: `(start, stop)` per dimension."""

MAX_READ = 1 << 30
"""The most bytes one read asks for (Linux reads at most 2 GiB - 4 KiB at once)."""
BLOCK = 16 << 20
"""The most bytes one read of the block mode asks for, and so the most the
reader holds besides the slices."""
READ_COST = 8 << 10
"""What one read costs, in bytes read: measured on this project's machines
(`benchmarks/load_reads.py`), a positioned read from the page cache costs
about 1 µs besides its bytes, which move at about 8 GiB/s: the time of 8 KiB."""


def _rows(shape: Sequence[int], itemsize: int) -> list[int]:
    """Bytes of one index of each dimension (the C-order strides, in bytes)."""
    out, size = [], itemsize
    for n in reversed(shape):
        out.append(size)
        size *= n
    return out[::-1]


@dataclasses.dataclass(frozen=True)
class Runs:
    """The contiguous byte runs of one slice of a tensor.

    **Attributes:**

    - `first`: the byte offset (in the tensor's data) of the first run.
    - `outer`: `(index count, bytes between consecutive indices)` for each
      dimension before `k`, the dimensions that start a run per index.
    - `length`: bytes per run.
    - `count`: how many runs (0 for an empty slice).
    """

    first: int
    outer: tuple[tuple[int, int], ...]
    length: int
    count: int

    @property
    def nbytes(self) -> int:
        """Bytes of the slice."""
        return self.count * self.length

    @property
    def reads(self) -> int:
        """Reads issued for the slice: one per run, a run over `MAX_READ` in several."""
        return self.count * -(-self.length // MAX_READ) if self.length else 0

    def offsets(self) -> np.ndarray:
        """Each run's byte offset, in C order of the slice (`int64`)."""
        out = np.full(1, self.first, dtype=np.int64)
        for n, step in self.outer:
            out = (out[:, None] + np.arange(n, dtype=np.int64) * step).reshape(-1)
        return out if self.count else out[:0]


def runs(shape: Sequence[int], itemsize: int, region: Region) -> Runs:
    """The runs of `region` of a tensor of `shape` with `itemsize` bytes per element.

    **Arguments:**

    - `shape`: the tensor's shape.
    - `itemsize`: bytes per element.
    - `region`: `(start, stop)` per dimension.

    **Returns:** a `Runs`.

    ```python
    runs((8, 8), 4, ((0, 8), (0, 4))).count   # 8 runs of 16 bytes
    ```
    """
    rows = _rows(shape, itemsize)
    if any(stop <= start for start, stop in region):
        return Runs(0, (), 0, 0)
    k = len(shape) - 1
    while k >= 0 and region[k] == (0, shape[k]):
        k -= 1
    first = sum(start * row for (start, _), row in zip(region, rows, strict=True))
    if k < 0:  # the whole tensor
        return Runs(0, (), math.prod(shape) * itemsize, 1)
    outer = tuple((stop - start, rows[d]) for d, (start, stop) in enumerate(region[:k]))
    length = (region[k][1] - region[k][0]) * rows[k]
    return Runs(first, outer, length, math.prod(n for n, _ in outer))


@dataclasses.dataclass(frozen=True)
class Blocks:
    """The block reads covering several slices of one tensor: whole rows of
    dimension `dim` of their bounding box, at most `BLOCK` bytes (or one row)
    per read, for every index of the dimensions before `dim` in the box.

    **Attributes:**

    - `box`: the bounding box `(start, stop)` of the slices in dimensions
      `0 .. dim`.
    - `dim`: the dimension whose rows are read whole.
    - `row`: bytes of one row of `dim`.
    - `per_read`: rows per read.
    - `strides`: bytes of one index of each dimension before `dim`.
    """

    box: Region
    dim: int
    row: int
    per_read: int
    strides: tuple[int, ...]

    @property
    def reads(self) -> int:
        """How many reads."""
        start, stop = self.box[self.dim]
        outer = math.prod(b - a for a, b in self.box[: self.dim])
        return outer * -(-(stop - start) // self.per_read)

    @property
    def nbytes(self) -> int:
        """Bytes read."""
        return math.prod(b - a for a, b in self.box) * self.row

    @property
    def buffer(self) -> int:
        """Bytes of the one buffer a read goes into."""
        start, stop = self.box[self.dim]
        return min(self.per_read, stop - start) * self.row

    def reads_at(self) -> Iterator[tuple[tuple[int, ...], int, int, int]]:
        """Each read: the indices of the dimensions before `dim`, the rows
        `[first, last)` of `dim` it covers, and its byte offset in the tensor."""
        start, stop = self.box[self.dim]
        rows, strides = self.row, self.strides
        for outer in itertools.product(*(range(a, b) for a, b in self.box[: self.dim])):
            base = sum(i * s for i, s in zip(outer, strides, strict=True))
            for first in range(start, stop, self.per_read):
                last = min(first + self.per_read, stop)
                yield outer, first, last, base + first * rows


def blocks(shape: Sequence[int], itemsize: int, regions: Sequence[Region]) -> Blocks | None:
    """The block reads covering `regions` (non-empty), or `None` for a scalar."""
    if not shape or not regions:
        return None
    rows = _rows(shape, itemsize)
    dim = next(d for d, row in enumerate(rows) if row <= BLOCK or d == len(shape) - 1)
    box = tuple((min(r[d][0] for r in regions), max(r[d][1] for r in regions)) for d in range(dim + 1))
    return Blocks(box, dim, rows[dim], max(1, BLOCK // rows[dim]), tuple(rows[:dim]))


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """How the reader reads one tensor's slices: each slice's runs, or blocks.

    **Attributes:**

    - `mode`: `"runs"` or `"blocks"` (`"none"`: nothing to read).
    - `runs`: the runs of each slice (given for both modes: what the layout makes).
    - `blocks`: the block reads, in the `"blocks"` mode; else `None`.
    - `reads`, `nbytes`: the reads the reader issues and the bytes they ask for.
    - `held`: the most bytes the reader holds at once for the tensor: its
      slices, and the block buffer in the `"blocks"` mode.
    """

    mode: str
    runs: tuple[Runs, ...]
    blocks: Blocks | None
    reads: int
    nbytes: int
    held: int

    @property
    def run_count(self) -> int:
        """The contiguous runs of the slices: the reads of the `"runs"` mode."""
        return sum(r.count for r in self.runs)


def read_plan(shape: Sequence[int], itemsize: int, regions: Sequence[Region]) -> ReadPlan:
    """How `load_checkpoint` reads the distinct `regions` one process holds of
    a tensor: one read per run, or blocks, whichever costs less: a read is
    priced at `READ_COST` bytes, and blocks pay for the copy of the slices out
    of them as for reading those bytes again (runs when equal).

    **Arguments:**

    - `shape`, `itemsize`: the tensor's shape and bytes per element.
    - `regions`: the distinct slices, `(start, stop)` per dimension.

    **Returns:** a `ReadPlan`.

    ```python
    read_plan((4096, 4096), 2, [((512 * i, 512 * (i + 1)), (0, 4096)) for i in range(8)]).reads  # 8
    ```
    """
    shape = tuple(shape)
    each = tuple(runs(shape, itemsize, region) for region in regions)
    held = sum(r.nbytes for r in each)
    reads, nbytes = sum(r.reads for r in each), held
    if not held:
        return ReadPlan("none", each, None, 0, 0, 0)
    box = blocks(shape, itemsize, [region for region, r in zip(regions, each, strict=True) if r.count])
    # blocks: their reads, their bytes, and the slices copied out of them once more
    if box is not None and box.reads * READ_COST + box.nbytes + held < reads * READ_COST + nbytes:
        return ReadPlan("blocks", each, box, box.reads, box.nbytes, held + box.buffer)
    return ReadPlan("runs", each, None, reads, nbytes, held)
