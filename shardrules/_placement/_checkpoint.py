"""`shardrules.load_checkpoint`: read a safetensors checkpoint straight into its
planned layout.

For each tensor, the distinct slices this process's devices hold are read
with positioned reads of their byte ranges only (`_ranged`), then handed to
`jax.make_array_from_callback`, so no whole unsharded copy is ever held and
no process reads another's pieces.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from .._planning import _mesh
from .._planning._api import RulesLike, as_rules, placement_shardings
from .._planning._plan import format_bytes
from .._planning._shapes import _SAFETENSORS_DTYPES, ShapeSourceError, index_files, read_header, shown
from ._meeting import agree_on_shapes
from ._multihost import require_every_process
from ._ranged import read_regions, region_of


def _checkpoint_files(path: Path) -> dict[str, tuple[Path, dict[str, Any], int]]:
    """Tensor name → (file, header entry, offset of the file's data region).
    An index may only name files in its own folder (see `index_files`)."""
    if path.name.endswith(".index.json"):
        files = sorted({shard for _, shard in index_files(path).values()})
    else:
        files = [path]
    out: dict[str, tuple[Path, dict[str, Any], int]] = {}
    for file in files:
        _, header, start = read_header(file)  # validated, with clear errors
        size = file.stat().st_size
        for name, info in header.items():
            offsets = info.get("data_offsets")
            if (
                not isinstance(offsets, list)
                or len(offsets) != 2
                or not all(isinstance(n, int) and not isinstance(n, bool) for n in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= size - start
            ):
                raise ShapeSourceError(
                    f"{file}: tensor {name!r} has `data_offsets` {shown(offsets)}, not two offsets "
                    f"within the file's {max(size - start, 0)} bytes of data: the file is damaged or cut short"
                )
            out[name] = (file, info, start)
    return out


def _reader(
    fd: int, base: int, shape: tuple[int, ...], dtype: np.dtype, sharding: jax.sharding.Sharding
) -> Callable[[Any], np.ndarray]:
    """The callback giving each device its slice: every distinct slice of this
    process's devices read once (partly replicated specs give several devices
    one slice), all before the array is made, and only those."""
    regions = list(
        dict.fromkeys(
            region_of(index, shape)
            for index in sharding.addressable_devices_indices_map(shape).values()
            if index is not None
        )
    )
    held = dict(zip(regions, read_regions(fd, base, shape, dtype, regions), strict=True))

    def read(index: Any) -> np.ndarray:
        return held[region_of(index, shape)]

    return read


def _check_size(file: Path, key: str, info: dict[str, Any], shape: jax.ShapeDtypeStruct) -> None:
    """Raise `ShapeSourceError` unless a tensor's bytes in the file fit its shape and dtype."""
    start, end = info["data_offsets"]
    if end - start != int(np.prod(shape.shape, dtype=np.int64)) * shape.dtype.itemsize:
        raise ShapeSourceError(
            f"{file}: tensor {key!r} has {end - start} bytes for shape {tuple(shape.shape)} {shape.dtype}; "
            "the header does not match the data: the file is damaged or was written by a broken tool"
        )


def load_checkpoint(
    path: str | os.PathLike[str],
    rules: RulesLike,
    mesh: Mesh | None = None,
    *,
    group: str = "params",
    rename: Callable[[str], str | None] | None = None,
    progress: bool | None = None,
) -> dict[str, jax.Array]:
    """Load a `.safetensors` checkpoint straight into its planned shardings.

    Each array is built with `jax.make_array_from_callback`: the distinct
    slices this process's devices hold are read with positioned reads of
    their byte ranges in the file (one per contiguous run; where a layout
    splits an inner dimension into many small runs, rows of the slices'
    bounding box in blocks of at most 16 MiB), so no process reads, or ever
    holds, a whole tensor it does not need. `Plan.load_cost` counts the same
    reads per host. Dtypes are kept as stored (bfloat16 and float8 included).

    **Arguments:**

    - `path`: a `.safetensors` file, or a sharded checkpoint's
      `model.safetensors.index.json`. The index may only name files in its
      own folder (or in the folder the index links to, as in the Hugging Face
      cache): an absolute name, or one that leads elsewhere through `..` or a
      symbolic link, is a `ValueError` naming the entry, before anything is read.
    - `rules`, `mesh`, `group`: as for `shardrules.apply`; tensors are matched
      by their name in the checkpoint (`model.layers.0.mlp.up_proj.weight`).
    - `rename`: maps a checkpoint name to the key to use in the result (and to
      match rules against), or to `None` to skip the tensor.
    - `progress`: print a progress line to stderr as tensors load; by default
      only when stderr is a terminal and the checkpoint is over 1 GiB.

    **Returns:** a flat dict of key → sharded `jax.Array`.

    **Raises:** the errors of `shardrules.shardings` (every tensor is planned
    before anything is read), `ValueError` for a malformed checkpoint,
    `FileNotFoundError`, `TypeError` for a mesh without devices. In a
    multi-process run, `ProcessMismatchError` (SR112) when the processes'
    tensors, planned specs or meshes differ, or when another process stopped
    on an error of its own (that process raises its own error; every process
    joins the comparison either way, so none waits for another).

    ```python
    params = shardrules.load_checkpoint("llama/model.safetensors.index.json", rules, mesh)
    ```
    """
    what = f"load_checkpoint({str(path)!r})"
    shapes: dict[str, jax.ShapeDtypeStruct] | None = None
    try:  # all that this process does on its own, before the processes compare their checkpoints
        ruleset = as_rules(rules)
        resolved = _mesh.resolve(mesh, ruleset, concrete=True, what="load_checkpoint")
        assert isinstance(resolved, Mesh)
        require_every_process(resolved, what)  # before any file is opened
        tensors: dict[str, tuple[Path, dict[str, Any], int]] = {}
        for name, entry in _checkpoint_files(Path(path)).items():
            key = rename(name) if rename is not None else name
            if key is not None:
                tensors[key] = entry
        shapes = {
            key: jax.ShapeDtypeStruct(
                tuple(info["shape"]), jax.numpy.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
            )
            for key, (_, info, _) in tensors.items()
        }
        for key, (file, info, _) in tensors.items():
            _check_size(file, key, info, shapes[key])
        # plan everything before reading
        targets = placement_shardings(shapes, ruleset, resolved, group=group)
    except Exception:
        # The other processes wait for this one in the exchange: join it as failed, so that they
        # raise SR112 naming this process at once, then raise this process's own error.
        agree_on_shapes(shapes, what, failed=True)
        raise
    agree_on_shapes(shapes, what, shardings=targets, mesh=resolved)  # the same tensors, plan and mesh
    total = sum(s.size * s.dtype.itemsize for s in shapes.values())
    if progress is None:
        progress = total > 2**30 and sys.stderr.isatty()
    done = 0
    out: dict[str, jax.Array] = {}
    files: dict[Path, int] = {}
    try:
        for n, (key, (file, info, base)) in enumerate(tensors.items(), 1):
            shape, dtype = tuple(shapes[key].shape), shapes[key].dtype
            start, end = info["data_offsets"]
            if file not in files:
                files[file] = os.open(file, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            read = _reader(files[file], base + start, shape, np.dtype(dtype), targets[key])
            out[key] = jax.make_array_from_callback(shape, targets[key], read)
            del read  # the slices read: held by the array now, or freed
            done += end - start
            if progress:
                sys.stderr.write(
                    f"\rloading {n}/{len(tensors)} tensors, {format_bytes(done)} of {format_bytes(total)}"
                    + ("\n" if n == len(tensors) else "")
                )
                sys.stderr.flush()
    finally:
        for fd in files.values():
            os.close(fd)
    return out
