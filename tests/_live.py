"""The bytes alive on each device, for the tests that measure what a
transfer holds while its pieces are in flight (tests/test_transfer_run.py,
tests/transfer_worker.py). Not a test module."""

from __future__ import annotations

import jax


def live_bytes() -> dict[int, int]:
    """The bytes of the buffers alive on each of this process's devices (a
    buffer that several arrays share, such as an array and its shards'
    `.data`, once)."""
    out: dict[int, int] = {}
    seen: set[tuple[int, int]] = set()
    for x in jax.live_arrays():
        if x.is_deleted():
            continue
        for s in x.addressable_shards:
            key = (s.device.id, s.data.unsafe_buffer_pointer())
            if key not in seen:
                seen.add(key)
                out[s.device.id] = out.get(s.device.id, 0) + s.data.nbytes
    return out
