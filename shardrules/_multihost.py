"""`shardrules.apply` in a multi-process run (`jax.process_count() > 1`).

Each process puts only the shards of its own devices, with
`jax.make_array_from_callback` (every process holds the whole tree) or
`jax.make_array_from_process_local_data` (each process holds its slice of the
inputs, `process_local=True`); no tensor data travels between hosts. Before
anything moves, the processes compare fingerprints of their trees
(`shardrules._agree`) and their checks' outcome, so that all of them stop on
the same error instead of building arrays from copies that disagree.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.core import Tracer
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from . import _agree, _check, _mesh
from ._compile import compile_leaves
from ._errors import Diagnostic, error_for
from ._plan import LeafPlan, Plan
from ._rules import RuleSet


def _is_host(leaf: Any) -> bool:
    """Data this process holds itself: NumPy, or a jax.Array on its own devices."""
    if isinstance(leaf, Tracer):
        return False
    if isinstance(leaf, jax.Array):
        return leaf.is_fully_addressable
    return isinstance(leaf, (np.ndarray, np.generic))


def _axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


@functools.lru_cache(maxsize=16)
def _coords(mesh: Mesh, process: int) -> np.ndarray:
    """The mesh coordinates of the devices of `process`, one row each."""
    return np.argwhere(np.vectorize(lambda d: d.process_index == process)(mesh.devices))


def process_slices(mesh: Mesh, spec: PartitionSpec, rank: int, process: int) -> list[tuple[int, int]]:
    """For each dimension, (how many pieces the spec cuts it into, how many of
    those the devices of `process` hold)."""
    names = list(mesh.axis_names)
    coords = _coords(mesh, process)
    out = []
    for d in range(rank):
        axes = _axes(spec[d]) if d < len(spec) else ()
        sizes = [mesh.shape[a] for a in axes]
        if not axes:
            out.append((1, 1))
            continue
        index = np.ravel_multi_index(tuple(coords[:, names.index(a)] for a in axes), sizes)
        out.append((math.prod(sizes), len(set(index.tolist()))))
    return out


def global_shape(local: tuple[int, ...], spec: PartitionSpec, mesh: Mesh) -> tuple[int, ...] | None:
    """The global shape of which `local` is this process's slice under `spec`,
    or `None` if `local` does not split into the pieces this process holds."""
    out = []
    for size, (pieces, held) in zip(
        local, process_slices(mesh, spec, len(local), jax.process_index()), strict=True
    ):
        if held == 0 or size % held:
            return None
        out.append(size // held * pieces)
    return tuple(out)


def _stand_in(leaf: Any, scale: int) -> Any:
    """A stand-in with every dimension times `scale` (divisible by any axes), to
    learn which axes the rules give each dimension before the global shape is known."""
    if _is_host(leaf) and getattr(leaf, "shape", None):
        return jax.ShapeDtypeStruct(tuple(int(d) * scale for d in leaf.shape), leaf.dtype)
    return leaf


def _plan_local(
    tree: Any, ruleset: RuleSet, mesh: Mesh, group: str
) -> tuple[Plan, list[Any], list[Diagnostic]]:
    """The plan for the global arrays that the process-local leaves are slices of."""
    first, leaves = compile_leaves(
        jax.tree_util.tree_map(lambda x: _stand_in(x, mesh.size), tree), ruleset, mesh, group
    )
    leaves = jax.tree_util.tree_leaves(tree)
    shapes: list[Any] = []
    for lp, leaf in zip(first.leaves, leaves, strict=True):
        shape = None
        if lp.spec is not None and _is_host(leaf) and np.shape(leaf):
            shape = global_shape(tuple(np.shape(leaf)), lp.spec, mesh)
        shapes.append(jax.ShapeDtypeStruct(shape, leaf.dtype) if shape is not None else leaf)
    the_plan, _ = compile_leaves(jax.tree_util.tree_unflatten(first.treedef, shapes), ruleset, mesh, group)
    problems = []
    for lp, leaf, target in zip(the_plan.leaves, leaves, shapes, strict=True):
        if lp.spec is None or not _is_host(leaf) or not np.shape(leaf):
            continue
        if global_shape(tuple(np.shape(leaf)), lp.spec, mesh) != target.shape:
            problems.append(
                Diagnostic(
                    "SR104",
                    "error",
                    f"`{lp.path}`: this process's slice {tuple(np.shape(leaf))} does not split into the "
                    f"pieces {_spec_text(lp.spec)} gives this process on the mesh {dict(mesh.shape)}",
                    lp.rule.span if lp.rule is not None else None,
                    lp.path,
                    "give each process a slice whose sharded dimensions divide by the pieces it holds "
                    "(the global batch by the number of processes), and write the spec without `?`/auto",
                )
            )
    return the_plan, leaves, problems


def _spec_text(spec: PartitionSpec) -> str:
    return "P(" + ", ".join(repr(e) for e in spec) + ")"


def _regions(lp: LeafPlan, mesh: Mesh, processes: int) -> list[Any]:
    """Per process, the part of the global array its devices hold (as the
    pieces held along each dimension): processes with equal regions must
    hold equal values."""
    assert lp.shape is not None and lp.spec is not None
    sharding = NamedSharding(mesh, lp.spec)
    held: list[set[Any]] = [set() for _ in range(processes)]
    for device, index in sharding.devices_indices_map(lp.shape).items():
        held[device.process_index].add(tuple((s.start, s.stop) for s in index))
    return [frozenset(h) for h in held]


def apply(
    tree: Any,
    ruleset: RuleSet,
    mesh: Mesh,
    *,
    group: str,
    budget: int | None,
    process_local: bool,
    verify: str,
) -> Any:
    """`shardrules.apply` when there are several processes; see its docstring.
    `budget`: bytes per device, or `None` for the limit this process's devices report."""
    if process_local:
        the_plan, leaves, problems = _plan_local(tree, ruleset, mesh, group)
    else:
        the_plan, leaves = compile_leaves(tree, ruleset, mesh, group)
        problems = []
    problems = list(the_plan.errors) + problems
    if budget is None:  # the limit the devices of this process report (others' cannot be asked)
        budget = _mesh.memory_limit(mesh.local_mesh)
    if not problems:
        problems += _check.placement_diagnostics(the_plan, leaves, mesh)
        if budget is not None:
            problems += _check.memory_diagnostics(the_plan, budget)
    what = f"apply(group={group!r})"
    if verify != "off":
        _compare(the_plan, leaves, mesh, verify, bool(problems), process_local, what)
    if problems:
        raise error_for(problems, ruleset.sources)
    return _move(the_plan, leaves, mesh, ruleset, process_local)


def _compare(
    the_plan: Plan, leaves: Sequence[Any], mesh: Mesh, mode: str, failed: bool, local: bool, what: str
) -> None:
    """Exchange fingerprints with the other processes; raise SR112 if they differ."""
    me, processes = jax.process_index(), jax.process_count()
    rows, same = [], []
    for lp, leaf in zip(the_plan.leaves, leaves, strict=True):
        data = None
        if lp.shape is not None and _is_host(leaf) and not failed:
            data = _agree.data_hash(leaf, mode)
        rows.append(_agree.fingerprint(lp.path, lp.shape, lp.dtype, data))
        if local and lp.spec is not None and lp.shape is not None and not failed:
            regions = _regions(lp, mesh, processes)
            same.append([regions[q] == regions[me] for q in range(processes)])
        else:
            same.append([True] * processes)
    headers, tables = _agree.exchange(rows, failed)
    found = _agree.mismatches([lp.path for lp in the_plan.leaves], headers, tables, me, same)
    if found:
        raise _agree.mismatch_error(found, me, processes, what, local)
    elsewhere = [q for q in range(processes) if headers[q, 1] and q != me]
    if elsewhere and not failed:
        raise _agree.failed_elsewhere_error(elsewhere, me, processes, what)


def _move(the_plan: Plan, leaves: Sequence[Any], mesh: Mesh, ruleset: RuleSet, local: bool) -> Any:
    out = list(leaves)
    resharded: list[int] = []
    for i, lp in enumerate(the_plan.leaves):
        if lp.spec is None:
            continue
        leaf = leaves[i]
        sharding = ruleset._plan_cache.named_sharding(mesh, lp.spec)
        if isinstance(leaf, Tracer):
            out[i] = _mesh.pin(leaf, sharding)
        elif not _is_host(leaf):
            resharded.append(i)  # already a global array: JAX moves it
        elif local:
            out[i] = jax.make_array_from_process_local_data(sharding, np.asarray(leaf), lp.shape)
        else:
            host = np.asarray(leaf)
            assert lp.shape is not None
            out[i] = jax.make_array_from_callback(
                lp.shape, sharding, lambda index, host=host: np.asarray(host[index])
            )
    if resharded:
        moved = jax.device_put(
            [leaves[i] for i in resharded],
            [ruleset._plan_cache.named_sharding(mesh, the_plan.leaves[i].spec) for i in resharded],
        )
        for i, array in zip(resharded, moved, strict=True):
            out[i] = array
    return jax.tree_util.tree_unflatten(the_plan.treedef, out)


def agree_on_shapes(shapes: Mapping[str, jax.ShapeDtypeStruct], what: str) -> None:
    """In a multi-process run, raise SR112 unless every process has the same
    names, shapes and dtypes (a checkpoint's header: no tensor data is read)."""
    if jax.process_count() == 1:
        return
    me, processes = jax.process_index(), jax.process_count()
    names = list(shapes)
    rows = [_agree.fingerprint(n, tuple(shapes[n].shape), shapes[n].dtype, None) for n in names]
    headers, tables = _agree.exchange(rows, failed=False)
    found = _agree.mismatches(names, headers, tables, me)
    if found:
        raise _agree.mismatch_error(
            found,
            me,
            processes,
            what,
            local=False,
            fix="every process must read the same checkpoint: a copy that differs on some host "
            "(stale, partly written, another version) gives other tensors; read it from a shared "
            "file system, or compare the copies' checksums",
        )
