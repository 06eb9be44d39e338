"""How `reshard` moves a checked tree, and what `donate=True` may delete.

Without `donate`, every array moves in one batched `jax.device_put` and no
input is touched. With it, the leaves move one at a time and the inputs are
deleted as their copies come into being, so that the extra memory is about
one leaf. Deleting is where data can be lost, so an input is deleted only when

- its copy exists (computed: `block_until_ready`) and shares no buffer with it
  (`jax.device_put` reuses the buffer of a piece that stays on its device);
- no array that is returned as it is (already in its planned sharding) and no
  input still to be moved uses any of its buffers. Arrays share buffers when
  one was made from the other without a copy (`jax.device_put` onto an
  equivalent sharding, the same array twice in a tree): such inputs are one
  *group*, found by comparing their shards' buffer addresses
  (`unsafe_buffer_pointer`, per device), and a group's inputs are deleted
  together once every input of the group that moves has its copy, and never
  if one of them is returned as it is. Where a backend does not give buffer
  addresses, nothing is deleted.

If a move fails part-way (an out-of-memory error on a later leaf, an
interrupt), the error is raised as it is, with `error.tree`: the whole tree,
each leaf either its moved copy (where its input was deleted) or its input,
untouched. Nothing is lost either way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from .._interop._penzai import arrays_of
from .._planning._plan import Plan


def move(
    the_plan: Plan,
    leaves: list[Any],
    mesh: jax.sharding.Mesh,
    donate: bool,
    finish: Callable[[list[Any]], Any],
) -> Any:
    """`finish` of the leaves with each planned leaf in its sharding on `mesh`
    (the checks are done); a penzai variable's array is moved, and a new
    variable takes the old one's place. With `donate`, the inputs are deleted
    as described above."""
    leaves, rewrap = arrays_of(leaves)
    rebuild = rewrap if rewrap is not None else list
    cache = the_plan.rules._plan_cache
    targets: dict[int, jax.sharding.NamedSharding] = {}
    for i, lp in enumerate(the_plan.leaves):
        if lp.spec is not None:
            new = functools.partial(jax.sharding.NamedSharding, mesh, lp.spec)
            targets[i] = cache.memo((mesh, lp.spec), new)
    moving = [i for i, target in targets.items() if leaves[i].sharding != target]
    out = list(leaves)
    if not donate:
        moved = jax.device_put([leaves[i] for i in moving], [targets[i] for i in moving])
        for i, array in zip(moving, moved, strict=True):
            out[i] = unshared(array, leaves[i])
        return finish(rebuild(out))
    pointers = {i: _pointers(leaves[i]) for i in targets}
    group = _groups(pointers)
    # The groups none of whose inputs may be deleted: one is returned as it is,
    # or its buffers are unknown.
    kept = {group[i] for i in targets if i not in set(moving) or pointers[i] is None}
    waiting: dict[int, list[int]] = {}
    for i in moving:
        waiting.setdefault(group[i], []).append(i)
    deleted: set[int] = set()
    try:
        for i in moving:
            out[i] = _move_one(leaves[i], targets[i], pointers[i])
            members = waiting[group[i]]
            if group[i] in kept or members[-1] != i:
                continue  # returned as it is, or another input of its group has yet to move
            for j in members:
                if not leaves[j].is_deleted():
                    leaves[j].delete()
                deleted.add(j)
    except BaseException as error:
        partial = [out[j] if j in deleted else leaves[j] for j in range(len(leaves))]
        # the same error (its own cause kept), or one carrying it
        raise _carrying(error, lambda: finish(rebuild(partial)), len(deleted), len(moving))  # noqa: B904
    return finish(rebuild(out))


def _move_one(source: jax.Array, target: jax.sharding.NamedSharding, mine: set[Any] | None) -> jax.Array:
    """A copy of `source` in `target`, computed, sharing no buffer with it."""
    return unshared(jax.device_put(source, target), source, mine).block_until_ready()


def _carrying(
    error: BaseException,
    tree: Callable[[], Any],
    deleted: int,
    moving: int,
    what: str = "shardrules.reshard(donate=True)",
    finish: str = "reshard it again to finish",
) -> BaseException:
    """The error that stopped the moves, handing the caller the whole tree
    (`error.tree`) and saying so in a note."""
    try:
        whole = tree()
    except Exception:  # the tree cannot be rebuilt: the error as it is
        return error
    try:
        error.tree = whole  # type: ignore[attr-defined]
    except Exception:  # an exception type that takes no attributes: carried by a RuntimeError
        carrier = RuntimeError(f"{type(error).__name__}: {error}")
        carrier.tree = whole  # type: ignore[attr-defined]
        carrier.__cause__ = error
        error = carrier
    error.add_note(
        f"{what} stopped after {deleted} of {moving} arrays had moved and "
        "their inputs were deleted: the error's `tree` attribute holds the whole tree, each leaf "
        f"its moved copy where its input was deleted, else its input, untouched; {finish}"
    )
    return error


def _groups(pointers: dict[int, set[Any] | None]) -> dict[int, int]:
    """Each leaf's group: leaves that share a buffer (transitively) share one."""
    parent = {i: i for i in pointers}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[Any, int] = {}
    for i, mine in pointers.items():
        for buffer in mine or ():
            j = owner.setdefault(buffer, i)
            parent[root(i)] = root(j)
    return {i: root(i) for i in pointers}


def _pointers(array: jax.Array) -> set[Any] | None:
    """The (device, address) of each buffer of `array` on this process's
    devices, or `None` where the backend does not tell."""
    try:
        return {(s.device.id, s.data.unsafe_buffer_pointer()) for s in array.addressable_shards}
    except Exception:  # a backend without buffer pointers
        return None


def unshared(copy: jax.Array, source: jax.Array, mine: set[Any] | None = None) -> jax.Array:
    """`copy` with buffers of its own. `jax.device_put` reuses a source's
    buffer for a piece that stays on its device (and neither donates nor
    honours `may_alias=False` there), so deleting the source (or, later, the
    copy) would delete that piece of the other too: those pieces are copied
    on their device. `mine`: `source`'s buffers, if known already."""
    mine = mine if mine is not None else _pointers(source)
    shards = copy.addressable_shards
    if mine is not None and not any((s.device.id, s.data.unsafe_buffer_pointer()) in mine for s in shards):
        return copy
    parts = [
        jax.device_put(s.data, s.device, may_alias=False)
        if mine is None or (s.device.id, s.data.unsafe_buffer_pointer()) in mine
        else s.data
        for s in shards
    ]
    return jax.make_array_from_single_device_arrays(copy.shape, copy.sharding, parts)
