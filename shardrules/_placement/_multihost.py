"""`shardrules.apply` in a multi-process run (`jax.process_count() > 1`).

Each process puts only the shards of its own devices, with
`jax.make_array_from_callback` (every process holds the whole tree) or
`jax.make_array_from_process_local_data` (each process holds its slice of the
inputs, `process_local=True`); no tensor data travels between hosts. Before
anything moves, the processes compare fingerprints of their trees
(`shardrules._placement._agree`), their meshes and their checks' outcome, so
that all of them stop on the same error instead of building arrays from copies
or plans that disagree. A process that fails before the comparison still takes
part in it (`joining_on_error`), so the others stop at once and every
process's collectives stay paired; one that never comes is named (SR114).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.core import Tracer
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._errors import Diagnostic, ShardRulesError, error_for
from .._interop._penzai import arrays_of
from .._language._rules import RuleSet
from .._planning import _inputs, _memory, _mesh
from .._planning._compile import compile_leaves
from .._planning._concrete import is_concrete, unconstrained_diagnostics
from .._planning._plan import LeafPlan, Plan, spec_repr
from .._pspec import described
from .._pspec import entry as spec_entry
from . import _agree, _exchange, _fingerprint


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
        axes = _axes(spec_entry(spec, d))
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
        if is_concrete(lp.spec) and lp.spec is not None and _is_host(leaf) and np.shape(leaf):
            shape = global_shape(tuple(np.shape(leaf)), lp.spec, mesh)
        shapes.append(jax.ShapeDtypeStruct(shape, leaf.dtype) if shape is not None else leaf)
    the_plan, _ = compile_leaves(jax.tree_util.tree_unflatten(first.treedef, shapes), ruleset, mesh, group)
    problems = []
    for lp, leaf, target in zip(the_plan.leaves, leaves, shapes, strict=True):
        if lp.spec is None or not is_concrete(lp.spec) or not _is_host(leaf) or not np.shape(leaf):
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
    return described(spec)


def _regions(lp: LeafPlan, mesh: Mesh, processes: int, cache: dict[Any, list[Any]]) -> list[Any]:
    """Per process, the part of the global array its devices hold (as the
    pieces held along each dimension): processes with equal regions must
    hold equal values. `cache` keeps them by shape and spec within one call,
    since many leaves share both."""
    assert lp.shape is not None and lp.spec is not None
    key = (lp.shape, lp.spec)
    if key not in cache:
        cache[key] = _held(lp.shape, NamedSharding(mesh, lp.spec), processes)
    return cache[key]


def _held(shape: tuple[int, ...], sharding: NamedSharding, processes: int) -> list[Any]:
    held: list[set[Any]] = [set() for _ in range(processes)]
    for device, index in sharding.devices_indices_map(shape).items():
        held[device.process_index].add(tuple((s.start, s.stop) for s in index))
    return [frozenset(h) for h in held]


def require_every_process(mesh: Mesh, what: str) -> None:
    """In a multi-process run, SR112 unless the mesh holds devices of every
    process: one with none of them could not put its shards (JAX raises there,
    while the others would go on). Decided from the mesh alone, so every
    process that has this mesh raises the same error; call it inside
    `joining_on_error`, before anything moves (a process whose mesh differs
    still meets the others, which then name it)."""
    processes = jax.process_count()
    if processes == 1:
        return
    held = {int(d.process_index) for d in mesh.devices.flat}
    absent = [q for q in range(processes) if q not in held]
    if absent:
        raise _agree.no_device_error(absent, sorted(held), jax.process_index(), processes, what)


@contextlib.contextmanager
def joining_on_error(exchanging: bool, what: str) -> Iterator[None]:
    """Around what a process does on its own before the processes exchange
    their tables: if it raises, the process still joins the exchange (as one
    that failed, with no table), so that the others stop at once with SR112
    naming it instead of waiting for it, then its own error goes on (also if
    some other process did not join). The exchange itself must come after the block."""
    try:
        yield
    except Exception:
        if exchanging and jax.process_count() > 1:
            with contextlib.suppress(ShardRulesError):
                _exchange.exchange(None, failed=True, what=what)
        raise


@dataclasses.dataclass
class Prepared:
    """What `prepare` found on this process, before the exchange."""

    plan: Plan
    leaves: list[Any]
    problems: list[Diagnostic]
    rows: list[np.ndarray]  # with data hashes unless verify="off"
    same: list[list[bool]]
    what: str
    local: bool
    specs: dict[str, str]  # the text of each spec hash in `rows`
    mesh: tuple[np.ndarray, dict[str, Any]]  # the mesh's digest and description


def prepare(
    tree: Any,
    ruleset: RuleSet,
    mesh: Mesh,
    *,
    group: str,
    budget: int | None,
    process_local: bool,
    verify: str,
) -> Prepared:
    """`shardrules.apply`'s planning and checks on this process, and its leaves'
    fingerprints; nothing is exchanged and nothing moves. Run it inside
    `joining_on_error`, then call `agree`.
    `budget`: bytes per device, or `None` for the limit this process's devices report."""
    if process_local:
        the_plan, leaves, problems = _plan_local(tree, ruleset, mesh, group)
    else:
        the_plan, leaves = compile_leaves(tree, ruleset, mesh, group)
        problems = []
    problems = list(the_plan.errors) + problems or unconstrained_diagnostics(the_plan)  # SR120
    if budget is None:  # the limit the devices of this process report (others' cannot be asked)
        budget = _mesh.memory_limit(mesh)  # its devices on this process: a mesh may hold none of them
    arrays = arrays_of(leaves)[0]  # a penzai variable's array
    if not problems:
        problems += _inputs.placement_diagnostics(the_plan, arrays, mesh)
        if budget is not None:
            problems += _memory.memory_diagnostics(the_plan, budget)
    rows, same, specs = _fingerprints(the_plan, arrays, mesh, verify, bool(problems), process_local)
    what = f"apply(group={group!r})"
    the_mesh = _fingerprint.mesh_fingerprint(mesh)
    return Prepared(the_plan, leaves, problems, rows, same, what, process_local, specs, the_mesh)


def _fingerprints(
    the_plan: Plan, leaves: Sequence[Any], mesh: Mesh, mode: str, failed: bool, local: bool
) -> tuple[list[np.ndarray], list[list[bool]], dict[str, str]]:
    """This process's table, per leaf which processes must hold the same
    values, and the text of each spec hashed in the table. With `mode`
    "off" (or when this process `failed`) no data is hashed: the rows say
    path, shape, dtype and spec."""
    me, processes = jax.process_index(), jax.process_count()
    rows, same = [], []
    specs: dict[str, str] = {}
    cache: dict[Any, list[Any]] = {}
    hashing = mode != "off" and not failed
    for lp, leaf in zip(the_plan.leaves, leaves, strict=True):
        data = None
        if lp.shape is not None and _is_host(leaf) and hashing:
            data = _fingerprint.data_hash(leaf, mode)
        row = _fingerprint.fingerprint(lp.path, lp.shape, lp.dtype, data, lp.spec)
        rows.append(row)
        if row[_fingerprint.SPEC].any():
            specs.setdefault(_fingerprint.spec_key(row[_fingerprint.SPEC]), spec_repr(lp.spec))
        if local and lp.spec is not None and lp.shape is not None and hashing:
            regions = _regions(lp, mesh, processes, cache)
            same.append([regions[q] == regions[me] for q in range(processes)])
        else:
            same.append([True] * processes)
    return rows, same, specs


def agree(prepared: Prepared, ruleset: RuleSet) -> None:
    """Exchange fingerprints with the other processes (whatever `verify`
    says: it only decides whether the data is hashed), then raise SR114 if
    one did not join, SR112 if their meshes, plans or trees differ or
    another process failed, or this process's own problems."""
    mesh_words, mesh_described = prepared.mesh
    got = _exchange.exchange(
        prepared.rows,
        bool(prepared.problems),
        what=prepared.what,
        details={"specs": prepared.specs, "mesh": mesh_described},
        mesh=mesh_words,
    )
    _agree.settle(
        got,
        [lp.path for lp in prepared.plan.leaves],
        prepared.what,
        failed=bool(prepared.problems),
        mesh=mesh_described,
        same=prepared.same,
        local=prepared.local,
    )
    if prepared.problems:
        raise error_for(prepared.problems, ruleset.sources)


def from_host(local: bool) -> Callable[[Any, LeafPlan, NamedSharding], Any]:
    """For `_apply.place`: the global array made from a leaf this process holds
    itself, with only the shards of its own devices (from its whole copy, or
    from its slice when `local`), or `None` for leaves JAX moves (global arrays)."""

    def make(leaf: Any, lp: LeafPlan, sharding: NamedSharding) -> Any:
        if not _is_host(leaf):
            return None  # already a global array: JAX moves it
        if local:
            return jax.make_array_from_process_local_data(sharding, np.asarray(leaf), lp.shape)
        host = np.asarray(leaf)
        assert lp.shape is not None
        return jax.make_array_from_callback(lp.shape, sharding, lambda index: np.asarray(host[index]))

    return make
