"""The bytes each device receives between two layouts (`shardrules diff`'s
"to move"), checked against the index slices JAX gives each device
(`NamedSharding.devices_indices_map`) on the 8 simulated devices, with meshes
of other shapes, other axis names and other device counts."""

from __future__ import annotations

import math

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardrules._reports._transfer import to_receive

SHAPES = [(2,), (4,), (8,), (4, 2), (2, 4), (2, 2, 2)]


def _axes(entry: object) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)  # type: ignore[arg-type]


@st.composite
def _layout(draw: st.DrawFn, names: tuple[str, ...], rank: int) -> tuple[tuple[int, ...], P]:
    mesh_shape = draw(st.sampled_from(SHAPES))
    names = names[: len(mesh_shape)]
    free = list(names)
    entries: list[object] = []
    for _ in range(rank):
        axes = draw(st.lists(st.sampled_from(free), unique=True, max_size=2)) if free else []
        free = [a for a in free if a not in axes]
        entries.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return mesh_shape, P(*entries)


def _mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    """A mesh over the first devices, in `jax.devices()` order: the device at
    position i of `mesh.devices.flat` is device i, whatever the shape."""
    count = math.prod(shape)
    return Mesh(np.array(jax.devices()[:count]).reshape(shape), names[: len(shape)])


@st.composite
def _case(draw: st.DrawFn) -> tuple[Mesh, P, Mesh, P, tuple[int, ...]]:
    rank = draw(st.integers(1, 3))
    old_names = ("a", "b", "c")
    new_names = draw(st.sampled_from([("a", "b", "c"), ("b", "a", "c"), ("x", "y", "z")]))
    old_shape, old_spec = draw(_layout(old_names, rank))
    new_shape, new_spec = draw(_layout(new_names, rank))
    old_mesh, new_mesh = _mesh(old_shape, old_names), _mesh(new_shape, new_names)
    shape = []
    for o, n in zip(list(old_spec) + [None] * rank, list(new_spec) + [None] * rank, strict=False):
        blocks_old = math.prod(old_mesh.shape[a] for a in _axes(o))
        blocks_new = math.prod(new_mesh.shape[a] for a in _axes(n))
        shape.append(math.lcm(blocks_old, blocks_new) * draw(st.integers(1, 3)))
    return old_mesh, old_spec, new_mesh, new_spec, tuple(shape[:rank])


def _interval(s: slice, length: int) -> tuple[int, int]:
    return (s.start or 0, length if s.stop is None else s.stop)


@settings(max_examples=300, deadline=None)
@given(_case(), st.sampled_from([1, 2, 4]))
def test_received_bytes_agree_with_jax(case: tuple[Mesh, P, Mesh, P, tuple[int, ...]], itemsize: int) -> None:
    """Device i receives the elements of its new slice that its old slice (the
    device at position i of the old mesh) lacks: all of it where the old mesh
    has fewer devices."""
    old_mesh, old_spec, new_mesh, new_spec, shape = case
    old_map = NamedSharding(old_mesh, old_spec).devices_indices_map(shape)
    new_map = NamedSharding(new_mesh, new_spec).devices_indices_map(shape)
    expected = []
    for device in new_mesh.devices.flat:
        new = [_interval(s, n) for s, n in zip(new_map[device], shape, strict=True)]
        need = math.prod(hi - lo for lo, hi in new)
        if device in old_map:
            old = [_interval(s, n) for s, n in zip(old_map[device], shape, strict=True)]
            held = math.prod(
                max(0, min(h1, h2) - max(l1, l2)) for (l1, h1), (l2, h2) in zip(old, new, strict=True)
            )
        else:
            held = 0
        expected.append((need - held) * itemsize)
    shard_bytes = (
        math.prod(shape)
        * itemsize
        // math.prod(math.prod(new_mesh.shape[a] for a in _axes(e)) for e in new_spec)
    )
    got = to_receive(
        shard_bytes,
        tuple(old_spec),
        tuple(old_mesh.shape.items()),
        tuple(new_spec),
        tuple(new_mesh.shape.items()),
        len(shape),
    )
    assert got.tolist() == expected


def test_same_layout_moves_nothing_and_a_transpose_moves_most() -> None:
    sizes = (("fsdp", 4), ("model", 2))
    same = to_receive(1024, ("fsdp", "model"), sizes, ("fsdp", "model"), sizes, 2)
    assert same.tolist() == [0] * 8
    turned = to_receive(1024, ("fsdp", "model"), sizes, ("model", "fsdp"), sizes, 2)
    # device (f, m) keeps half of its new block when fsdp quarter f lies in model half m
    assert turned.tolist() == [512, 1024, 512, 1024, 1024, 512, 1024, 512]


def test_a_larger_mesh_sends_everything_to_the_new_devices() -> None:
    got = to_receive(256, ("d",), (("d", 4),), ("d",), (("d", 8),), 1)
    # device i held quarter i (1/4 of the array); it now needs eighth i
    assert got.tolist() == [0, 256, 256, 256, 256, 256, 256, 256]
