"""Array dtypes JAX cannot hold (SR115), and what to do with such a leaf.

NumPy makes arrays of dtypes that no `jax.Array` can have: extended precision
(`float128`, `complex256`), structured records and raw bytes (`V`), Python
objects, fixed-width strings, dates, non-native byte order. `jax.device_put`
refuses them with a bare `TypeError` once data starts moving; the compiler
asks `jax_holds` once per kind of leaf and reports them, with the leaf's path
and the rule that matched it, before anything moves.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from .._errors import Diagnostic, Span
from .._interop._paths import LeafInfo, is_key_dtype

try:  # the runtime's NumPy → XLA type conversion, without a backend
    from jaxlib.xla_client import Shape as _XlaShape
except ImportError:  # pragma: no cover - a jaxlib without it: JAX's own list decides alone
    _XlaShape = None


@functools.lru_cache(maxsize=256)
def jax_holds(dtype: np.dtype) -> bool:
    """Whether a `jax.Array` can have this dtype: what `jax.device_put` checks
    before moving a NumPy array (the dtype is one of JAX's, and the runtime
    can convert it), for any JAX configuration (`float64` is held, as
    `float32` without `jax_enable_x64`)."""
    if (
        dtype == jax.dtypes.float0
    ):  # the gradient of an integer (`allow_int=True`): device_put passes it through
        return True
    if is_key_dtype(dtype):  # PRNG keys (`jax.random.key`): their data is uint32
        return True
    try:
        jax.typeof(np.zeros((), dtype))  # JAX's own list of dtypes
    except (TypeError, ValueError):
        return False
    if dtype.kind == "T" or _XlaShape is None:
        return True  # NumPy's variable-width strings are held without XLA (on CPU devices)
    try:
        _XlaShape.array_shape(dtype, ())  # JAX lists float6 before the runtime converts it
    except (jax.errors.JaxRuntimeError, TypeError, ValueError):
        return False
    return True


_KEY_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")  # jax.random's PRNG implementations


@functools.lru_cache(maxsize=64)
def named_dtype(name: str) -> np.dtype:
    """The dtype a plan file names: NumPy's and JAX's names (`bfloat16`), and
    PRNG key dtypes (`key<fry>`) by the implementations `jax.random` has.

    **Raises:** `TypeError` for a name JAX does not know."""
    if name == str(jax.dtypes.float0):  # its name reads back as a record of no bytes
        return np.dtype(jax.dtypes.float0)
    try:
        return jax.numpy.dtype(name)
    except (ValueError, SyntaxError):  # NumPy parses some names as Python: `(2,f4`
        raise TypeError(f"data type {name!r} not understood") from None
    except TypeError:
        if name.startswith("key<"):
            for impl in _KEY_IMPLS:
                try:
                    dtype = jax.eval_shape(lambda impl=impl: jax.random.key(0, impl=impl)).dtype
                except (TypeError, ValueError):  # pragma: no cover - an implementation this JAX lacks
                    continue
                if str(dtype) == name:
                    return dtype
        raise


def _why_and_fix(dtype: np.dtype) -> tuple[str, str]:
    """Why JAX has no such dtype, and what to do instead."""
    keep_out = (
        "keep it out of the tree (e.g. a static field; leaves with no shape and dtype pass through untouched)"
    )
    if dtype.names is not None:
        fields = ", ".join(f"`{name}`" for name in dtype.names)
        return (
            "structured (record) arrays have no JAX dtype",
            f"split it into one array per field ({fields}), e.g. `{{name: x[name] for name in x.dtype.names}}`; "
            f"or {keep_out}",
        )
    if dtype.kind == "V":
        return (
            "raw bytes (void) have no JAX dtype",
            f"view them as numbers, e.g. `x.view(np.uint8)`; or {keep_out}",
        )
    if dtype.kind == "O":
        return "object arrays hold Python objects, not numbers", (
            f"convert it to numbers, e.g. `np.asarray(x, np.float32)`; or {keep_out}"
        )
    if dtype.kind in "US":
        return (
            "JAX holds no fixed-width strings",
            f"{keep_out}; or turn it into numbers first (e.g. token ids)",
        )
    if dtype.kind in "Mm":
        return "dates and durations have no JAX dtype", (
            f"convert it to integer counts of its unit, e.g. `x.astype(np.int64)`; or {keep_out}"
        )
    if not dtype.isnative:
        return "JAX holds arrays in native byte order only", (
            f"convert it first: `x.astype(x.dtype.newbyteorder('='))`; or {keep_out}"
        )
    if dtype.kind == "f" and dtype.itemsize > 8:
        return "extended-precision floats have no JAX dtype; the widest is float64", (
            f"cast it first: `x.astype(np.float64)`; or {keep_out}"
        )
    if dtype.kind == "c" and dtype.itemsize > 16:
        return "extended-precision complex numbers have no JAX dtype; the widest is complex128", (
            f"cast it first: `x.astype(np.complex128)`; or {keep_out}"
        )
    return "JAX has no such dtype", f"cast it to one it has first, e.g. `x.astype(np.float32)`; or {keep_out}"


def unholdable(leaves: list[LeafInfo], span: Span | None) -> Diagnostic:
    """SR115 for array leaves of one dtype (that one rule matched, written at
    `span`): one finding naming the first, every leaf in its `paths`."""
    dtype = leaves[0].dtype
    assert dtype is not None
    why, fix = _why_and_fix(dtype)
    first = leaves[0]
    name = first.path or "(a lone array: no path)"
    cause = f"has a dtype JAX cannot hold ({dtype}): {why}"
    message = f"`{name}` (shape {first.shape}, dtype {dtype}) has a dtype JAX cannot hold: {why}"
    paths = tuple((leaf.path, leaf.shape) for leaf in leaves)
    return Diagnostic("SR115", "error", message, span, first.path, fix, paths, cause)
