"""The processes' plans and meshes compared before an entry point places data.

In a multi-process run every entry point that places data (`apply`, `init`,
`load_checkpoint`, `load_orbax`, `reshard`, and `sr.jit`'s first call with each
argument signature) first makes every process post a fingerprint of its plan
(each leaf's path, shape, dtype and planned spec) and of its mesh (axis names,
sizes and types, device ids in mesh order), and compares them (`_exchange`,
`_agree`): SR112 on every process when they differ, before any data moves or
any collective runs. `verify` (of `apply`) only adds or drops the hashes of the
data; the plan and the mesh are always compared.

A process that fails before it has a plan (a rule file it cannot read, a
group it lacks, a checkpoint missing on its host) still comes to the meeting,
as one that failed (`_multihost.joining_on_error`): it raises its own error,
the others SR112 naming it, and neither waits for the other. `apply` and
`reshard` fingerprint their leaves themselves (`_multihost`); this module holds
what `init`, `load_checkpoint`, `load_orbax` and `sr.jit` use. With one process
nothing is exchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from .._errors import ShardRulesError
from .._planning._plan import Plan, spec_repr
from . import _agree, _exchange
from ._fingerprint import SPEC, fingerprint, mesh_fingerprint, spec_key, spec_words
from ._multihost import joining_on_error, require_every_process

# One leaf of a plan as the processes compare it: its path, shape (None: not
# known, as for a step's outputs), dtype, and planned spec (None: not placed;
# a string: something else that must be the same everywhere, compared as it is
# written, such as a digest of the activation rules).
Layout = tuple[str, tuple[int, ...] | None, Any, PartitionSpec | str | None]

CHECKPOINT_FIX = (
    "every process must read the same checkpoint: a copy that differs on some host (stale, partly "
    "written, another version) gives other tensors; read it from a shared file system, or compare the "
    "copies' checksums"
)


def plan_layouts(the_plan: Plan) -> list[Layout]:
    """Each leaf of `the_plan` as the processes compare it."""
    return [(lp.path, lp.shape, lp.dtype, lp.spec) for lp in the_plan.leaves]


def layout_rows(layouts: Sequence[Layout]) -> tuple[list[np.ndarray], dict[str, str]]:
    """The exchanged table of `layouts` (no data hashed), and the text of each
    spec hashed in it (what a message about a difference shows)."""
    rows: list[np.ndarray] = []
    texts: dict[str, str] = {}
    for path, shape, dtype, spec in layouts:
        row = fingerprint(path, shape, dtype, None)
        if isinstance(spec, str):
            digest = hashlib.blake2b(spec.encode(), digest_size=8).digest()
            words = (int.from_bytes(digest[:4], "little"), int.from_bytes(digest[4:], "little") | 1)
            text = spec
        elif spec is not None:
            words = spec_words(spec, len(shape) if shape is not None else None)
            text = spec_repr(spec)
        else:
            rows.append(row)
            continue
        row[SPEC] = words
        texts.setdefault(spec_key(row[SPEC]), text)
        rows.append(row)
    return rows, texts


def agree_on_layouts(
    what: str,
    mesh: Mesh,
    layouts: Sequence[Layout],
    *,
    fix: str | None = None,
    cause: str | None = None,
) -> None:
    """In a multi-process run, raise SR112 on every process unless all of
    them use the same mesh and plan the same `layouts` (SR114 for a process
    that does not come; SR112 naming one that came as failed). Call it after
    everything this process does on its own, which runs in
    `joining_on_error(True, what)`. `fix`: the hint for leaves that differ in
    path, shape or dtype; `cause`: what makes a process fail alone."""
    if jax.process_count() == 1:
        return
    rows, texts = layout_rows(layouts)
    words, described = mesh_fingerprint(mesh)
    got = _exchange.exchange(rows, False, what=what, details={"specs": texts, "mesh": described}, mesh=words)
    paths = [path for path, _, _, _ in layouts]
    _agree.settle(got, paths, what, failed=False, mesh=described, fix=fix, cause=cause)


def agree_on_step(what: str, planned: Callable[[], tuple[Mesh, list[Layout]]]) -> None:
    """`sr.jit`'s hook, before a step first runs with an argument signature
    in a multi-process run: `planned()` plans the step (its in and out
    shardings, its activation rules) on this process, joining the exchange as
    failed if it raises; then every process compares the layouts and meshes."""
    with joining_on_error(True, what=what):
        _exchange.join_timeout()  # a bad SHARDRULES_JOIN_TIMEOUT is this process's own error
        mesh, layouts = planned()
        require_every_process(mesh, what)
    agree_on_layouts(
        what,
        mesh,
        layouts,
        cause="its plan of the step failed there: a rule file or group that differs between the "
        "hosts, or arguments of other shapes; every process must call the step with the same rules",
    )


def agree_on_shapes(
    shapes: Mapping[str, jax.ShapeDtypeStruct] | None,
    what: str,
    *,
    failed: bool = False,
    shardings: Mapping[str, jax.sharding.NamedSharding] | None = None,
    mesh: Mesh | None = None,
) -> None:
    """`load_checkpoint`'s meeting: in a multi-process run, raise SR112 unless
    every process has the same tensors (names, shapes, dtypes: the headers,
    no data is read), plans the same `shardings` for them and uses the same
    `mesh`.

    Every process must call it, also one that failed before it (`failed=True`,
    with the shapes it read, or `None` if it read none): then this returns
    after the exchange, unless the shapes differ, and the caller raises its own
    error, while the processes that did not fail raise SR112 naming it. A
    process that did not join is SR114 (except for one that failed: its own
    error matters more)."""
    if jax.process_count() == 1:
        return
    names = list(shapes) if shapes is not None else []
    rows: list[np.ndarray] | None = None
    texts: dict[str, str] = {}
    if shapes is not None:
        planned = shardings if shardings is not None and not failed else {}
        layouts = [
            (n, tuple(shapes[n].shape), shapes[n].dtype, planned[n].spec if n in planned else None)
            for n in names
        ]
        rows, texts = layout_rows(layouts)
    bad = None
    if not failed:
        try:  # a bad SHARDRULES_JOIN_TIMEOUT is this process's own error, raised after joining
            _exchange.join_timeout()
        except ValueError as error:
            bad = error
    words, described = mesh_fingerprint(mesh) if mesh is not None and not failed else (None, {})
    try:
        got = _exchange.exchange(
            rows,
            failed or bad is not None,
            what=what,
            details={"specs": texts, "mesh": described},
            mesh=words,
        )
    except ShardRulesError:
        if failed:
            return
        raise
    if bad is not None:
        raise bad
    if rows is None:  # nothing of this process to compare: it raises its own error
        return
    _agree.settle(
        got,
        names,
        what,
        failed=failed,
        mesh=described,
        fix=CHECKPOINT_FIX,
        cause="the checkpoint may be missing, unreadable or malformed there, or its rules differ: "
        "every process must read the same checkpoint with the same rules",
    )
