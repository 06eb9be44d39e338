"""What each process says about its tree in a multi-process run: fingerprints.

Before `shardrules.apply` moves anything in a multi-process run, every process
describes its leaves in a table of fixed-size rows (`WORDS` uint32 words per
leaf: path, dtype, shape, a hash of the data, a hash of the planned spec), its
mesh in a few words (axis names, sizes and types, and the devices in mesh
order), and the other processes compare them (`_agree`) once they have been
exchanged (`_exchange`). The tensors themselves never travel. A hash of the
data covers every byte of a leaf up to `SAMPLE_BYTES`, and a sample of a larger
one (or every byte, with `verify="full"`).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._interop._paths import is_key_dtype
from .._pspec import entries as spec_entries
from .._pspec import tags

VERIFY_MODES = ("sample", "full", "off")
SAMPLE_BYTES = 1 << 20  # leaves up to this size are hashed whole in "sample" mode
_CHUNKS, _CHUNK = 64, 4096  # else: this many evenly spaced runs of this many bytes, and the last run
MAX_DIMS = 8
# A row: path hash, dtype, rank, dims (the first MAX_DIMS), hash of shape and
# dtype, data hash, spec hash; a hash of zeros means "not compared".
PATH, DTYPE, RANK, DIMS = slice(0, 2), 2, 3, slice(4, 4 + MAX_DIMS)
SHAPE, DATA, SPEC = (slice(4 + MAX_DIMS + 2 * i, 6 + MAX_DIMS + 2 * i) for i in range(3))
WORDS = 10 + MAX_DIMS  # uint32 words per leaf in the exchanged table
_NOT_ARRAY = 0xFFFFFFFF
_SHOWN_DEVICES = 16  # device ids a mesh's description lists

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
    if is_key_dtype(x.dtype):  # a PRNG key array: hash its key data
        x = jax.random.key_data(x)
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
    path: str,
    shape: tuple[int, ...] | None,
    dtype: Any,
    data: tuple[int, int] | None,
    spec: PartitionSpec | None = None,
) -> np.ndarray:
    """One row of the exchanged table: path hash, dtype, rank, dims, a hash of
    shape and dtype, the data hash and the spec hash (zeros: not compared)."""
    row = np.zeros(WORDS, np.uint32)
    row[PATH] = _words(hashlib.blake2b(path.encode(), digest_size=8).digest())
    if shape is None:
        row[RANK] = _NOT_ARRAY
    else:
        name = str(dtype) if is_key_dtype(dtype) else np.dtype(dtype).name
        row[DTYPE] = _DTYPES.index(name) + 1 if name in _DTYPES else 0
        row[RANK] = len(shape)
        dims = [min(int(d), 0xFFFFFFFE) for d in shape[:MAX_DIMS]]
        row[DIMS.start : DIMS.start + len(dims)] = dims
    whole = hashlib.blake2b(repr((shape, str(dtype))).encode(), digest_size=8).digest()
    row[SHAPE] = _words(whole)
    if data is not None:
        row[DATA] = data
    if spec is not None and shape is not None:
        row[SPEC] = spec_words(spec, len(shape))
    return row


def spec_words(spec: PartitionSpec, rank: int | None) -> tuple[int, int]:
    """Two words hashing what `spec` means for an array of `rank` dimensions
    (`None`: not known): `P('data')` and `P('data', None)` (or
    `P(('data',), None)`) hash the same."""
    entries = [tuple(e) if isinstance(e, tuple) else (() if e is None else (e,)) for e in spec_entries(spec)]
    if rank is None:  # the same without its trailing unsharded dimensions
        while entries and not entries[-1]:
            entries.pop()
    else:
        entries += [()] * (rank - len(entries))
    extra = tuple(sorted(map(str, axes)) for axes in tags(spec))
    words = _words(hashlib.blake2b(repr((entries, extra)).encode(), digest_size=8).digest())
    return words if words != (0, 0) else (0, 1)


def spec_key(words: Any) -> str:
    """The key of a spec hash in a process's table of spec texts."""
    return f"{int(words[0])},{int(words[1])}"


def describe(row: np.ndarray) -> str:
    """A row's shape and dtype, as messages show them: `(64, 32) float32`."""
    if row[RANK] == _NOT_ARRAY:
        return "not an array"
    rank = int(row[RANK])
    dims = [int(d) for d in row[DIMS.start : DIMS.start + min(rank, MAX_DIMS)]]
    shape = (
        "("
        + ", ".join(map(str, dims))
        + (", …" if rank > MAX_DIMS else "")
        + ("," if rank == 1 else "")
        + ")"
    )
    dtype = _DTYPES[row[DTYPE] - 1] if row[DTYPE] else "another dtype"
    return f"{shape} {dtype}"


def mesh_fingerprint(mesh: Mesh) -> tuple[np.ndarray, dict[str, Any]]:
    """Four words hashing the mesh (axis names, sizes and types, and the ids
    of its devices in mesh order), and its description for messages: the
    axes (`data=2 × model=4`), their types, the first device ids and their count."""
    names = [str(n) for n in mesh.axis_names]
    sizes = [int(s) for s in mesh.devices.shape]
    types = [getattr(t, "name", str(t)) for t in getattr(mesh, "axis_types", ())]
    ids = [int(d.id) for d in mesh.devices.flat]
    digest = hashlib.blake2b(repr((names, sizes, types, ids)).encode(), digest_size=16).digest()
    words = np.frombuffer(digest, np.uint32).copy()
    described = {
        "axes": " × ".join(f"{n}={s}" for n, s in zip(names, sizes, strict=True)),
        "types": ", ".join(types),
        "devices": ids[:_SHOWN_DEVICES],
        "count": len(ids),
    }
    return words, described
