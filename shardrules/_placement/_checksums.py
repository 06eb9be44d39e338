"""What `verify=True` compares: two 32-bit sums of a piece's bits, one plain
and one weighted by each word's position, so that a changed word and two
words swapped both change them. Computed on the device that holds the piece
(at its source, and where it arrived), so only eight bytes per piece leave it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def words(x: jax.Array) -> jax.Array:
    """`x`'s bits as unsigned 32-bit words (flattened)."""
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        x = jnp.stack([x.real, x.imag])
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32).ravel()
    size = x.dtype.itemsize
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[size]
    bits = lax.bitcast_convert_type(x, unsigned)
    return bits.astype(jnp.uint32).ravel()


def sums(part: jax.Array) -> jax.Array:
    """Two 32-bit sums of an array's bits: plain and weighted by position (so
    a changed word, and two words swapped, both show)."""
    w = words(part)
    weights = lax.iota(jnp.uint32, w.size) * jnp.uint32(2) + jnp.uint32(1)
    return jnp.stack([jnp.sum(w, dtype=jnp.uint32), jnp.sum(w * weights, dtype=jnp.uint32)])
