"""Checking that every process of a multi-process run holds the same tree.

In a multi-process run (`jax.distributed.initialize`, one process per host)
every process calls `shardrules.apply` with its own copy of the tree. Each one
only puts the shards of its own devices, so if the copies differ the global
array silently mixes them; if the plans differ (another rule file) each
process lays its leaves out its own way; if the meshes differ the next
collective hangs. Before anything moves, each process fingerprints its mesh
and its leaves (`_fingerprint`), the fingerprints are exchanged
(`_exchange`), and here they are compared and the differences named: SR112
for what differs, SR114 for a process that never joined the comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from .._errors import Diagnostic, ProcessMismatchError, ShardRulesError, error_for
from ._fingerprint import DATA, PATH, SHAPE, SPEC, describe

if TYPE_CHECKING:
    from ._exchange import Exchanged

NO_TABLE = 2  # a process's failed flag when it stopped before making its table
_MAX_LISTED = 12
# (the leaf's path, or None; the line; what differs: "tree", "layout" or "mesh")
Found = tuple[str | None, str, str]


def mismatches(
    paths: Sequence[str],
    headers: np.ndarray,
    tables: np.ndarray,
    me: int,
    same_region: Sequence[Sequence[bool]] | None = None,
    spec_text: Callable[[int, Any], str | None] | None = None,
) -> list[Found]:
    """What differs between this process's leaves and the other processes':
    (path, line, kind) for each leaf of this process that differs, and
    (None, line, "tree") for each process with leaves this one lacks.

    `same_region[i][q]`: whether process `q` must hold the same values as this
    one for leaf `i` (default: all must). `spec_text(q, words)`: the text of
    the spec that process `q` hashed to `words`, if known. Processes that
    stopped before making their table (`NO_TABLE`) are not compared with."""
    processes = len(headers)
    mine = tables[me][: len(paths)]
    compared = [q for q in range(processes) if q != me and headers[q, 1] != NO_TABLE]
    others = [
        {tuple(r[PATH]): r for r in tables[q][: int(headers[q, 0])]} if q in compared else {}
        for q in range(processes)
    ]

    def text(q: int, words: Any) -> str:
        return (spec_text(q, words) if spec_text is not None else None) or "another spec"

    lines: list[Found] = []
    for i, (path, row) in enumerate(zip(paths, mine, strict=True)):
        missing, shaped, valued = [], [], []
        specced: dict[str, list[int]] = {}
        for q in compared:
            theirs = others[q].get(tuple(row[PATH]))
            if theirs is None:
                missing.append(q)
            elif not np.array_equal(theirs[SHAPE], row[SHAPE]):
                shaped.append(f"{describe(theirs)} on process {q}")
            elif row[SPEC].any() and theirs[SPEC].any() and not np.array_equal(theirs[SPEC], row[SPEC]):
                specced.setdefault(text(q, theirs[SPEC]), []).append(q)
            elif (
                row[DATA].any()
                and theirs[DATA].any()
                and (same_region is None or same_region[i][q])
                and not np.array_equal(theirs[DATA], row[DATA])
            ):
                valued.append(q)
        label = path or "(the root)"
        if missing:
            lines.append((path, f"{label}: only on this process, not on {_processes(missing)}", "tree"))
        if shaped:
            lines.append((path, f"{label}: {describe(row)} here, {'; '.join(shaped)}", "tree"))
        if specced:
            theirs_text = "; ".join(f"{t} on {_processes(qs)}" for t, qs in specced.items())
            lines.append((path, f"{label}: {text(me, row[SPEC])} here, {theirs_text}", "layout"))
        if valued:
            lines.append((path, f"{label}: values differ from those on {_processes(valued)}", "values"))
    my_keys = {tuple(r[PATH]) for r in mine}
    for q in range(processes):
        extra = sum(1 for key in others[q] if key not in my_keys)
        if extra:
            leaves = "1 leaf" if extra == 1 else f"{extra} leaves"
            lines.append(
                (None, f"process {q} has {leaves} that this process lacks (its error names them)", "tree")
            )
    return lines


def mesh_differences(mine: Mapping[str, Any], theirs: Mapping[int, Mapping[str, Any] | None]) -> list[Found]:
    """A line for each way the meshes of the processes `theirs` (their
    descriptions from `mesh_fingerprint`, or `None` where unknown) differ from
    this process's `mine`: the axes, else their types, else the devices' order."""
    grouped: dict[tuple[str, str, str], list[int]] = {}
    for q, other in theirs.items():
        grouped.setdefault(_mesh_difference(mine, other or {}), []).append(q)
    return [
        (None, f"{label}: {here} here, {there} on {_processes(qs)}", "mesh")
        for (label, here, there), qs in grouped.items()
    ]


def _mesh_difference(mine: Mapping[str, Any], other: Mapping[str, Any]) -> tuple[str, str, str]:
    if not other:
        return "mesh", mine["axes"], "another mesh"
    if other["axes"] != mine["axes"]:
        return "mesh", mine["axes"], other["axes"]
    if other["types"] != mine["types"]:
        return "mesh axis types", f"({mine['types']})", f"({other['types']})"
    if other["devices"] != mine["devices"]:
        return "mesh devices", _ids(mine), _ids(other)
    return "mesh devices", _ids(mine), f"the same first {len(mine['devices'])}, then another order"


def _ids(described: Mapping[str, Any]) -> str:
    shown = ", ".join(map(str, described["devices"]))
    more = described["count"] - len(described["devices"])
    return f"[{shown}, … {more} more]" if more > 0 else f"[{shown}]"


def _processes(qs: Sequence[int]) -> str:
    return ("process " if len(qs) == 1 else "processes ") + ", ".join(map(str, qs))


_TITLES = {
    "mesh": "the processes do not use the same mesh",
    "tree": "the processes do not hold the same tree",
    "layout": "the processes plan different layouts",
}
_FIXES = {
    "mesh": "every process must build the same mesh: the same axis names, sizes and types over the same "
    "devices in the same order (`jax.make_mesh` with the same arguments on every process, over "
    "`jax.devices()`, never `jax.local_devices()`)",
    "layout": "every process must use the same rule file and group: a rule file that differs between "
    "hosts (another version, a local edit, a copy not yet synced) lays the same leaf out differently "
    "on each, so read it from a shared file system or ship it with the code",
}


def mismatch_error(
    found: Sequence[Found],
    me: int,
    processes: int,
    what: str,
    local: bool,
    fix: str | None = None,
) -> ShardRulesError:
    """The SR112 error listing `found` (at most 12 lines, then a count), with
    a hint for each kind of difference; `fix` replaces the hint written for
    `apply` about trees that differ."""
    lines = [line for _, line, _ in found]
    kinds = [k for k in ("mesh", "layout", "tree", "values") if any(kind == k for _, _, kind in found)]
    shown = lines[:_MAX_LISTED] + (
        [f"... and {len(lines) - _MAX_LISTED} more"] if len(lines) > _MAX_LISTED else []
    )
    tree = fix or (
        "each process must pass the same global shapes and dtypes, and replicas the same values"
        if local
        else "every process must pass the same tree with the same values: seed random "
        "generators identically on every process and read the same files; for data where each "
        "process holds only its own slice (a batch), pass process_local=True"
    )
    fixes = dict.fromkeys(_FIXES.get(k, tree) for k in kinds)
    if "values" in kinds:  # the plan and the mesh are compared whatever `verify` says
        fixes["verify='off' skips the comparison of the values (not of the plan and the mesh)"] = None
    hint = "; ".join(fixes)
    path = next((p for p, _, _ in found if p is not None), None)
    title = "mesh" if "mesh" in kinds else "layout" if kinds == ["layout"] else "tree"
    return error_for(
        [
            Diagnostic(
                "SR112",
                "error",
                f"{what}: {_TITLES[title]} (this is process {me} of {processes}):\n"
                + "\n".join("    " + line for line in shown),
                path=path,
                hint=hint,
            )
        ]
    )


def settle(
    got: Exchanged,
    paths: Sequence[str],
    what: str,
    *,
    failed: bool,
    mesh: Mapping[str, Any],
    same: Sequence[Sequence[bool]] | None = None,
    local: bool = False,
    fix: str | None = None,
    cause: str | None = None,
) -> None:
    """What every entry point concludes from an exchange, the same on every
    process: SR112 when a mesh differs (`mesh`: this process's description);
    else when a leaf's path, shape, dtype, planned spec or, where hashed, its
    values differ (`same`, `local`, `fix`: as for `mismatches` and
    `mismatch_error`); else, unless this process `failed` itself, when another
    one failed (`cause`: what usually makes it fail). Returns otherwise (a
    process that failed then raises its own error)."""
    me, processes = jax.process_index(), jax.process_count()
    others = got.other_meshes(me)
    if others:
        found = mesh_differences(mesh, {q: got.details(q).get("mesh") for q in others})
        raise mismatch_error(found, me, processes, what, local, fix)
    found = mismatches(paths, got.headers, got.tables, me, same, got.spec_text)
    if found:
        raise mismatch_error(found, me, processes, what, local, fix)
    elsewhere = failed_elsewhere(got.headers, me)
    if elsewhere and not failed:
        raise failed_elsewhere_error(elsewhere, me, processes, what, cause)


def failed_elsewhere(headers: np.ndarray, me: int) -> list[int]:
    """The processes other than `me` that report having failed."""
    return [q for q in range(len(headers)) if q != me and headers[q, 1]]


def failed_elsewhere_error(
    failed: Sequence[int], me: int, processes: int, what: str, cause: str | None = None
) -> ShardRulesError:
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


def no_device_error(
    absent: Sequence[int], holders: Sequence[int], me: int, processes: int, what: str
) -> ShardRulesError:
    """The SR112 error of every process when the mesh holds no device of the
    processes `absent` (`holders`: those whose devices it holds): the same
    words on each, made from the mesh alone, before anything moves."""
    return error_for(
        [
            Diagnostic(
                "SR112",
                "error",
                f"{what}: the mesh holds no device of {_processes(absent)}, only devices of "
                f"{_processes(holders)} (this is process {me} of {processes}); every process puts the "
                "shards of its own devices, so each must hold some of the mesh's; nothing was moved",
                hint="build the mesh over every process's devices: `jax.make_mesh(shape, names)` takes "
                "`jax.devices()` (the devices of all processes), never a part of it such as "
                "`jax.devices()[:4]` or `jax.local_devices()`; to use some hosts only, start only their "
                "processes (`jax.distributed.initialize(num_processes=...)`)",
            )
        ]
    )


def did_not_join_error(
    missing: Sequence[int],
    me: int,
    processes: int,
    what: str,
    seconds: float,
    setting: str,
    cause: str | None = None,
) -> ShardRulesError:
    """The SR114 error of a process that waited `seconds` for the processes
    `missing` to join the comparison; `setting`: how to wait longer; `cause`:
    what went wrong, when it was not only a timeout."""
    one = len(missing) == 1
    they, them, was, are = ("it", "it", "was", "is") if one else ("they", "them", "were", "are")
    logs = f"{_processes(missing)}'s own log says" if one else f"the logs of {_processes(missing)} say"
    said = f" ({cause})" if cause else ""
    return ProcessMismatchError(
        [
            Diagnostic(
                "SR114",
                "error",
                f"{what}: {_processes(missing)} did not join the comparison between the processes "
                f"within {seconds:g} s (this is process {me} of {processes}); nothing was moved{said}",
                hint=f"{logs} what became of {them}: check whether {they} crashed, ran out "
                f"of memory or {was} killed, or {are} running other code: every process must call "
                f"{what.split('(')[0]} the same number of times, in the same order "
                f"(not under `if jax.process_index() == 0:`); "
                f"if {they} {are} only slow to get there (verify='full' on a large tree, a slow file "
                f"system), give {them} longer with the environment variable {setting}",
            )
        ]
    )
