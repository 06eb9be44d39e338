"""Checking that every process of a multi-process run holds the same tree.

In a multi-process run (`jax.distributed.initialize`, one process per host)
every process calls `shardrules.apply` with its own copy of the tree. Each one
only puts the shards of its own devices, so if the copies differ the global
array silently mixes them. Before anything moves, each process fingerprints
its leaves (path, shape, dtype, and a hash of the bytes: a sample of them, or
all of them) and the fingerprints, a few words per leaf, are gathered from
every process and compared. The tensors themselves never travel.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .._errors import Diagnostic, error_for

VERIFY_MODES = ("sample", "full", "off")
SAMPLE_BYTES = 1 << 20  # leaves up to this size are hashed whole in "sample" mode
_CHUNKS, _CHUNK = 64, 4096  # else: this many evenly spaced runs of this many bytes, and the last run
NO_TABLE = 2  # a process's failed flag when it stopped before making its table
_MAX_DIMS = 8
_WORDS = 8 + _MAX_DIMS  # uint32 words per leaf in the exchanged table
_NOT_ARRAY = 0xFFFFFFFF
_MAX_LISTED = 12

# Dtypes named in messages; others are "another dtype".
_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "int4",
    "uint4",
]


def check_mode(verify: Any) -> str:
    """`verify` as one of `VERIFY_MODES` (`True` is `"sample"`, `False` is
    `"off"`), or a `ValueError` that lists them."""
    if verify is True or verify is False:
        return "sample" if verify else "off"
    if not isinstance(verify, str) or verify not in VERIFY_MODES:
        raise ValueError(
            f"verify={verify!r}: use one of {', '.join(repr(m) for m in VERIFY_MODES)} "
            "(or True for 'sample', False for 'off')"
        )
    return verify


def _words(digest: bytes) -> tuple[int, int]:
    return int.from_bytes(digest[:4], "little"), int.from_bytes(digest[4:8], "little")


def sample_indices(size: int, itemsize: int) -> np.ndarray:
    """The flat element indices hashed in `"sample"` mode for an array of `size`
    elements: 64 evenly spaced runs of 4 KiB and the last 4 KiB (whole elements)."""
    run = max(1, _CHUNK // itemsize)
    step = size // _CHUNKS
    starts = [i * step for i in range(_CHUNKS)] + [max(0, size - run)]
    return np.concatenate([np.arange(s, min(s + run, size), dtype=np.int64) for s in starts])


def data_hash(x: Any, mode: str) -> tuple[int, int]:
    """Two words hashing the elements of `x` (a NumPy array, or a `jax.Array`
    on this process's devices): all of them in `"full"` mode or for arrays up to
    `SAMPLE_BYTES`; else those of `sample_indices`, 260 KiB whatever the size (a
    difference in one element elsewhere goes unseen: use `"full"` for that).

    The same elements give the same words whether they are in NumPy, a strided
    view or a sharded `jax.Array`. A large `jax.Array` is sampled on its devices:
    only the sampled elements are copied to the host."""
    shape, dtype = tuple(int(d) for d in x.shape), np.dtype(x.dtype)
    h = hashlib.blake2b(repr((shape, dtype.str)).encode(), digest_size=8)
    size = math.prod(shape)
    if mode == "full" or size * dtype.itemsize <= SAMPLE_BYTES:
        h.update(np.ascontiguousarray(np.asarray(x)).reshape(-1).view(np.uint8).data)
    else:
        picks = sample_indices(size, dtype.itemsize)
        if isinstance(x, jax.Array):
            sample = _device_sample(x, picks)
        elif isinstance(x, np.ndarray) and x.flags.c_contiguous:
            sample = x.reshape(-1)[picks]
        else:  # a strided view: take the sampled elements rather than copy it whole
            sample = np.asarray(x)[np.unravel_index(picks, shape)]
        h.update(np.ascontiguousarray(sample).view(np.uint8).data)
    words = _words(h.digest())
    return words if words != (0, 0) else (0, 1)  # (0, 0) means "not compared"


@jax.jit
def _gather(x: Any, coords: tuple[Any, ...]) -> Any:
    # One gather over the whole array: XLA gathers on each device from its own
    # shard and sums the (masked) parts, so no shard is copied whole; compiled
    # once per shape and sharding (the number of sampled elements is fixed).
    sharding = jax.typeof(x).sharding
    replicated = (
        NamedSharding(sharding.mesh, PartitionSpec()) if isinstance(sharding, NamedSharding) else None
    )
    return x.at[coords].get(out_sharding=replicated)


def _device_sample(x: jax.Array, picks: np.ndarray) -> np.ndarray:
    """The elements of `x` at flat indices `picks`, gathered on its devices:
    only they reach the host."""
    coords = tuple(c.astype(np.int32) for c in np.unravel_index(picks, x.shape))
    return np.asarray(_gather(x, coords))


def fingerprint(
    path: str, shape: tuple[int, ...] | None, dtype: Any, data: tuple[int, int] | None
) -> np.ndarray:
    """One row of the exchanged table: path hash, dtype, rank, dims, a hash of
    shape and dtype, and the data hash (zeros: not compared)."""
    row = np.zeros(_WORDS, np.uint32)
    row[0:2] = _words(hashlib.blake2b(path.encode(), digest_size=8).digest())
    if shape is None:
        row[3] = _NOT_ARRAY
    else:
        name = np.dtype(dtype).name
        row[2] = _DTYPES.index(name) + 1 if name in _DTYPES else 0
        row[3] = len(shape)
        dims = [min(int(d), 0xFFFFFFFE) for d in shape[:_MAX_DIMS]]
        row[4 : 4 + len(dims)] = dims
    whole = hashlib.blake2b(repr((shape, str(dtype))).encode(), digest_size=8).digest()
    row[4 + _MAX_DIMS : 6 + _MAX_DIMS] = _words(whole)
    if data is not None:
        row[6 + _MAX_DIMS : 8 + _MAX_DIMS] = data
    return row


def _allgather(x: np.ndarray) -> np.ndarray:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x))


def exchange(rows: Sequence[np.ndarray] | None, failed: bool) -> tuple[np.ndarray, np.ndarray]:
    """Gather every process's table. Returns (headers, tables): headers[q] is
    (leaf count, failed flag) of process q, tables[q] its rows padded with
    zeros to the longest table. Two small collectives; every process must call
    this the same number of times, so a process that failed before it could
    make its table still calls it, with `rows=None` and `failed=True` (its flag
    is then `NO_TABLE`, and `mismatches` does not compare with it)."""
    flag = NO_TABLE if rows is None else int(failed)
    assert rows is not None or failed, "a process without a table joins the exchange as failed"
    rows = rows or []
    header = np.array([len(rows), flag], np.uint32)
    headers = _allgather(header)
    longest = max(1, int(headers[:, 0].max()))
    table = np.zeros((longest, _WORDS), np.uint32)
    if rows:
        table[: len(rows)] = np.stack(rows)
    return headers, _allgather(table)


def _describe(row: np.ndarray) -> str:
    if row[3] == _NOT_ARRAY:
        return "not an array"
    rank = int(row[3])
    dims = [int(d) for d in row[4 : 4 + min(rank, _MAX_DIMS)]]
    shape = (
        "("
        + ", ".join(map(str, dims))
        + (", …" if rank > _MAX_DIMS else "")
        + ("," if rank == 1 else "")
        + ")"
    )
    dtype = _DTYPES[row[2] - 1] if row[2] else "another dtype"
    return f"{shape} {dtype}"


def mismatches(
    paths: Sequence[str],
    headers: np.ndarray,
    tables: np.ndarray,
    me: int,
    same_region: Sequence[Sequence[bool]] | None = None,
) -> list[tuple[str | None, str]]:
    """What differs between this process's leaves and the other processes':
    (path, line) for each leaf of this process that differs, and (None, line)
    for each process with leaves this one lacks.

    `same_region[i][q]`: whether process `q` must hold the same values as this
    one for leaf `i` (default: all must). Processes that stopped before making their
    table (`NO_TABLE`) are not compared with."""
    processes = len(headers)
    mine = tables[me][: len(paths)]
    compared = [q for q in range(processes) if q != me and headers[q, 1] != NO_TABLE]
    others = [
        {tuple(r[0:2]): r for r in tables[q][: int(headers[q, 0])]} if q in compared else {}
        for q in range(processes)
    ]
    lines = []
    for i, (path, row) in enumerate(zip(paths, mine, strict=True)):
        missing, shaped, valued = [], [], []
        for q in compared:
            theirs = others[q].get(tuple(row[0:2]))
            if theirs is None:
                missing.append(q)
            elif not np.array_equal(
                theirs[4 + _MAX_DIMS : 6 + _MAX_DIMS], row[4 + _MAX_DIMS : 6 + _MAX_DIMS]
            ):
                shaped.append(f"{_describe(theirs)} on process {q}")
            elif (
                row[6 + _MAX_DIMS :].any()
                and theirs[6 + _MAX_DIMS :].any()
                and (same_region is None or same_region[i][q])
                and not np.array_equal(theirs[6 + _MAX_DIMS :], row[6 + _MAX_DIMS :])
            ):
                valued.append(q)
        label = path or "(the root)"
        if missing:
            lines.append((path, f"{label}: only on this process, not on {_processes(missing)}"))
        if shaped:
            lines.append((path, f"{label}: {_describe(row)} here, {'; '.join(shaped)}"))
        if valued:
            lines.append((path, f"{label}: values differ from those on {_processes(valued)}"))
    my_keys = {tuple(r[0:2]) for r in mine}
    for q in range(processes):
        extra = sum(1 for key in others[q] if key not in my_keys)
        if extra:
            leaves = "1 leaf" if extra == 1 else f"{extra} leaves"
            lines.append((None, f"process {q} has {leaves} that this process lacks (its error names them)"))
    return lines


def _processes(qs: Sequence[int]) -> str:
    return ("process " if len(qs) == 1 else "processes ") + ", ".join(map(str, qs))


def mismatch_error(
    found: Sequence[tuple[str | None, str]],
    me: int,
    processes: int,
    what: str,
    local: bool,
    fix: str | None = None,
) -> Exception:
    """The SR112 error listing `found` (at most 12 lines, then a count);
    `fix` replaces the hint written for `apply`."""
    lines = [line for _, line in found]
    shown = lines[:_MAX_LISTED] + (
        [f"... and {len(lines) - _MAX_LISTED} more"] if len(lines) > _MAX_LISTED else []
    )
    hint = (
        fix
        or (
            "each process must pass the same global shapes and dtypes, and replicas the same values"
            if local
            else "every process must pass the same tree with the same values: seed random "
            "generators identically on every process and read the same files; for data where each "
            "process holds only its own slice (a batch), pass process_local=True"
        )
        + "; verify='off' skips this check"
    )
    path = next((p for p, _ in found if p is not None), None)
    return error_for(
        [
            Diagnostic(
                "SR112",
                "error",
                f"{what}: the processes do not hold the same tree (this is process {me} of {processes}):\n"
                + "\n".join("    " + line for line in shown),
                path=path,
                hint=hint,
            )
        ]
    )


def failed_elsewhere(headers: np.ndarray, me: int) -> list[int]:
    """The processes other than `me` that report having failed."""
    return [q for q in range(len(headers)) if q != me and headers[q, 1]]


def failed_elsewhere_error(
    failed: Sequence[int], me: int, processes: int, what: str, cause: str | None = None
) -> Exception:
    """The SR112 error of a process that found no problem while `failed` did;
    `cause` says what usually makes one process fail alone."""
    return error_for(
        [
            Diagnostic(
                "SR112",
                "error",
                f"{what}: {_processes(failed)} stopped on errors that this process (process {me} of "
                f"{processes}) did not find; nothing was moved",
                hint="read the error printed by "
                + _processes(failed)
                + "; "
                + (
                    cause
                    or "the processes disagree about the tree or the mesh, so make them pass the same ones"
                ),
            )
        ]
    )
