"""Which devices hold which block of an array: the device grid of a planned
leaf, shared by the text picture of `shardrules explain` and the HTML report.

Devices are numbered in mesh order (row-major over the axes as written), the
position of each device in `mesh.devices.flat`. The grid covers the last two
dimensions of an array (the only one of a 1-D array); leading dimensions that
are split are described in words and the grid shows their first block.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import TYPE_CHECKING

import numpy as np

from .._planning._blocks import block_index, device_coords, entry_axes
from .._pspec import entries as spec_entries
from .._pspec import padded

if TYPE_CHECKING:
    from .._planning._plan import LeafPlan

MAX_CELLS = 64  # a larger grid is described in words
MAX_ROWS = MAX_COLUMNS = 16  # a taller or wider grid does not fit a terminal
MAX_TEXT_WIDTH = 100  # the widest text grid drawn


def axis_blocks(axes: tuple[str, ...], sizes: dict[str, int]) -> list[str]:
    """The label of each block along one dimension: the mesh-axis indices
    holding it (the first axis major), e.g. `model=1 fsdp=0`."""
    labels = [""]
    for axis in axes:
        labels = [f"{lab} {axis}={i}".strip() for lab in labels for i in range(sizes.get(axis, 1))]
    return labels


@dataclasses.dataclass(frozen=True)
class Grid:
    """The blocks of a leaf's last two dimensions.

    `rows`/`columns` name the mesh axes splitting each of the two dimensions,
    `labels[r][c]` the mesh-axis indices of block (r, c), `devices[r][c]` the
    devices holding it (empty when the grid is too large to list, see
    `too_large`), `copies` how many devices hold each block, and `leading` one
    `dim I: AXES` text per split leading dimension."""

    rows: tuple[str, ...]
    columns: tuple[str, ...]
    shape: tuple[int, int]
    labels: list[list[str]]
    devices: list[list[list[int]]]
    copies: int
    leading: list[str]

    @property
    def too_large(self) -> bool:
        rows, cols = self.shape
        return rows * cols > MAX_CELLS or rows > MAX_ROWS or cols > MAX_COLUMNS

    def note(self) -> str:
        """`each block on N devices; dim 0 over expert (first block shown)`."""
        text = f"each block on {self.copies} device{'s' if self.copies != 1 else ''}"
        if self.leading:
            text += f"; {', '.join(self.leading)} (the grid shows its first block)"
        return text


def grid_of(leaf: LeafPlan, sizes: dict[str, int]) -> Grid | None:
    """The device grid of a planned array leaf, or `None` for a scalar or a
    leaf with no spec."""
    spec, shape = leaf.spec, leaf.shape
    if spec is None or not shape:
        return None
    entries = list(spec_entries(padded(spec, len(shape))))
    used = {a for e in entries for a in entry_axes(e)}
    copies = math.prod(n for a, n in sizes.items() if a not in used)
    leading_axes = [a for e in entries[:-2] for a in entry_axes(e)]
    leading = [f"dim {i} over {'/'.join(entry_axes(e))}" for i, e in enumerate(entries[:-2]) if entry_axes(e)]
    rows_axes = entry_axes(entries[-2]) if len(shape) >= 2 else ()
    cols_axes = entry_axes(entries[-1])
    row_labels, col_labels = axis_blocks(rows_axes, sizes), axis_blocks(cols_axes, sizes)
    labels = [[" ".join(filter(None, (r, c))) or "all" for c in col_labels] for r in row_labels]
    found = Grid(rows_axes, cols_axes, (len(row_labels), len(col_labels)), labels, [], copies, leading)
    if found.too_large:
        return found
    sizes = {**sizes, **{a: 1 for a in used if a not in sizes}}  # no sizes (no mesh): one block
    coords = device_coords(sizes)
    rows, _ = block_index(rows_axes, coords, sizes)
    cols, _ = block_index(cols_axes, coords, sizes)
    first = np.ones_like(rows, dtype=bool)  # the first block of every split leading dimension
    for axis in leading_axes:
        first &= coords[axis] == 0
    devices: list[list[list[int]]] = [[[] for _ in col_labels] for _ in row_labels]
    for index in np.flatnonzero(first):
        devices[rows[index]][cols[index]].append(int(index))
    return dataclasses.replace(found, devices=devices)


def device_text(devices: list[int], width: int = 15) -> str:
    """`0`, `0-7`, `0,2,4,6`, `0,8,…,120`; `N devices` when nothing shorter fits."""
    runs: list[str] = []
    start = prev = devices[0]
    for d in [*devices[1:], None]:
        if d is not None and d == prev + 1:
            prev = d
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if d is not None:
            start = prev = d
    text = ",".join(runs)
    if len(text) <= width:
        return text
    steps = {b - a for a, b in itertools.pairwise(devices)}
    if len(steps) == 1:
        text = f"{devices[0]},{devices[1]},…,{devices[-1]}"
        if len(text) <= width:
            return text
    return f"{len(devices)} devices"


def text_picture(leaf: LeafPlan, sizes: dict[str, int], indent: str = "  ") -> list[str]:
    """A leaf's grid as text lines: a title, then one `| a | b |` line per row
    of blocks, each cell the devices holding that block."""
    from .._planning._plan import spec_str

    found = grid_of(leaf, sizes)
    title = f"{leaf.path}  {leaf.shape}  {spec_str(leaf.spec)}"
    if found is None:
        return [indent + title + ("  (not planned)" if leaf.spec is None else "  (scalar: replicated)")]
    rows, cols = found.shape
    split = []
    if found.rows:
        split.append(f"rows: {'/'.join(found.rows)}")
    if found.columns:
        split.append(f"columns: {'/'.join(found.columns)}")
    if not found.rows and not found.columns and not found.leading:
        split.append("replicated")
    lines = [indent + title + ("  " + ", ".join(split) if split else "")]
    cells = [[device_text(d) for d in row] for row in found.devices]
    width = max((len(c) for row in cells for c in row), default=0)
    if found.too_large or cols * (width + 3) + 1 > MAX_TEXT_WIDTH:
        lines.append(f"{indent}  {rows}×{cols} blocks, too many to draw; {found.note()}")
        return lines
    lines += [indent + "  | " + " | ".join(c.center(width) for c in row) + " |" for row in cells]
    if found.leading:
        lines.append(f"{indent}  {', '.join(found.leading)} (the grid shows its first block)")
    return lines
