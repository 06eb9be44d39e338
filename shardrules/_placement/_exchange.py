"""How the processes' fingerprints travel, and who did not come.

`exchange` is where the processes of a multi-process `apply` or
`load_checkpoint` meet. Each process posts a record to JAX's distributed
key-value store (the coordination service behind `jax.distributed.initialize`):
its leaf count, whether it failed, a digest of its table of fingerprints and
one of its mesh, 40 bytes; and beside it, its details (its specs' texts and
its mesh described), which another process reads only to write a message
about a difference. Then it reads every other process's record, waiting at
most `SHARDRULES_JOIN_TIMEOUT` seconds in all (60 by default, below the 100 s
after which JAX's own heartbeat check stops every process when one has died).
A record still missing then names a process that did not join: it died, or
runs other code (SR114). Each process waits on its own clock, for keys it can
name, so no process can hang here.

The tables themselves travel only when their digests differ: in one
collective (`process_allgather`), which every process joins or none does,
since all of them see the same records. When every process holds the same
tree, only the records cross.

Keys are `shardrules/agree/ROUND/record/PROCESS` (and `.../details/PROCESS`),
where ROUND counts this process's exchanges since `jax.distributed.initialize`
(kept in the store, `shardrules/agree/rounds/PROCESS`, not in this module):
every process makes the same calls in the same order, so their counts agree. A
process deletes its keys of a round once it has read every record of the next
one (by then every process is past the round). Without a distributed client
(a multi-process runtime that `jax.distributed` did not start), the records
are gathered in a collective too, no timeout applies, and the details are not
available to messages.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from . import _agree
from ._fingerprint import WORDS, spec_key

ENV = "SHARDRULES_JOIN_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
_PREFIX = "shardrules/agree"
_RECORD = 10  # uint32 words: leaf count, failed flag, table digest (4), mesh digest (4)
_TABLE, _MESH = slice(2, 6), slice(6, 10)
_MAX_MS = 2**31 - 1  # the longest wait JAX's client takes, in milliseconds (24 days)


def join_timeout(strict: bool = True) -> float:
    """The seconds to wait for the other processes: `SHARDRULES_JOIN_TIMEOUT`,
    read now, or 60. A value that is not a number above 0 is a `ValueError`
    (with `strict=False`, the default instead)."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if seconds > 0 and math.isfinite(seconds):
        return seconds
    if not strict:
        return DEFAULT_TIMEOUT
    raise ValueError(
        f"{ENV}={text!r}: give the seconds to wait for the other processes to join, a number "
        f"above 0 (default {DEFAULT_TIMEOUT:g})"
    )


def _client() -> Any:
    """JAX's key-value store client (`jax.distributed.initialize`'s), or `None`
    where this JAX keeps it elsewhere: the records are then all-gathered."""
    try:
        from jax._src import distributed
    except ImportError:
        return None
    return getattr(getattr(distributed, "global_state", None), "client", None)


def _allgather(x: np.ndarray) -> np.ndarray:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x))


@dataclasses.dataclass
class Exchanged:
    """What the processes told each other.

    - `headers[q]`: (leaf count, failed flag) of process q (`NO_TABLE`: it
      stopped before making its table).
    - `tables[q]`: its rows, padded with zeros to the longest table.
    - `meshes[q]`: its mesh digest (zeros: none given).
    - `details(q)`: its details (`{"specs": ..., "mesh": ...}`), read when a
      message needs them; `{}` if they cannot be had."""

    headers: np.ndarray
    tables: np.ndarray
    meshes: np.ndarray
    details: Callable[[int], dict[str, Any]]

    def other_meshes(self, me: int) -> list[int]:
        """The processes whose mesh differs from that of process `me`."""
        mine = self.meshes[me]
        if not mine.any():
            return []
        return [q for q, m in enumerate(self.meshes) if q != me and m.any() and not np.array_equal(m, mine)]

    def spec_text(self, q: int, words: Any) -> str | None:
        """The text of the spec that process `q` hashed to `words`."""
        return self.details(q).get("specs", {}).get(spec_key(words))


def exchange(
    rows: Sequence[np.ndarray] | None,
    failed: bool,
    *,
    what: str,
    details: dict[str, Any] | None = None,
    mesh: np.ndarray | None = None,
) -> Exchanged:
    """Post this process's record and read every other process's (SR114 if
    one does not come in time), then gather the tables if their digests
    differ. Every process must call this the same number of times, so a
    process that failed before it could make its table still calls it, with
    `rows=None` and `failed=True` (its flag is then `NO_TABLE`, and
    `mismatches` does not compare with it). If the meshes differ, the tables
    are not gathered (the caller reports the meshes). `what` names the call
    in messages; `details` and `mesh` (4 words) come from `_fingerprint`."""
    assert rows is not None or failed, "a process without a table joins the exchange as failed"
    me, processes = jax.process_index(), jax.process_count()
    table = np.stack(rows) if rows else np.zeros((0, WORDS), np.uint32)
    record = np.zeros(_RECORD, np.uint32)
    record[0:2] = len(table), _agree.NO_TABLE if rows is None else int(failed)
    if rows is not None:
        record[_TABLE] = np.frombuffer(hashlib.blake2b(table.tobytes(), digest_size=16).digest(), np.uint32)
    if mesh is not None:
        record[_MESH] = mesh
    client = _client()
    mine = dict(details or {})
    if client is None:
        records, read = _allgather(record), lambda q: mine if q == me else {}
    else:
        records, read = _join(client, me, processes, record, mine, what, join_timeout(strict=False))
    headers = records[:, 0:2]
    longest = max(1, int(headers[:, 0].max()))
    tables = np.zeros((processes, longest, WORDS), np.uint32)
    got = Exchanged(headers, tables, records[:, _MESH], read)
    if any(got.other_meshes(q) for q in range(processes)):
        return got  # no process gathers the tables: the meshes are what it reports
    holders = [q for q in range(processes) if headers[q, 1] != _agree.NO_TABLE]
    if len({records[q, _TABLE].tobytes() for q in holders}) > 1:
        padded = np.zeros((longest, WORDS), np.uint32)
        padded[: len(table)] = table
        got.tables = _allgather(padded)
    elif rows is not None:  # every table is the same as this one
        for q in holders:
            tables[q, : len(table)] = table
    return got


def _join(
    client: Any,
    me: int,
    processes: int,
    record: np.ndarray,
    details: dict[str, Any],
    what: str,
    timeout: float,
) -> tuple[np.ndarray, Callable[[int], dict[str, Any]]]:
    """Post `record` and `details` under this round's keys and read the
    other processes' records, at most `timeout` seconds in all; raise SR114
    naming the processes whose record did not come. Returns the records
    (one row per process) and a function reading a process's details."""
    # This process's count of exchanges lives in the store itself, so a new
    # `jax.distributed.initialize` (a new store) starts again from round 0.
    round_ = client.key_value_increment(f"{_PREFIX}/rounds/{me}", 1) - 1
    prefix = f"{_PREFIX}/{round_}"
    posted = [f"{prefix}/details/{me}", f"{prefix}/record/{me}"]
    previous = (
        [f"{_PREFIX}/{round_ - 1}/details/{me}", f"{_PREFIX}/{round_ - 1}/record/{me}"] if round_ else []
    )
    # The details first: once a record can be read, so can its details.
    client.key_value_set_bytes(posted[0], json.dumps(details).encode(), allow_overwrite=True)
    client.key_value_set_bytes(posted[1], record.tobytes(), allow_overwrite=True)
    records = np.zeros((processes, _RECORD), np.uint32)
    records[me] = record
    missing: list[int] = []
    cause = None
    deadline = time.monotonic() + timeout
    for q in range(processes):
        if q == me:
            continue
        left_ms = min(_MAX_MS, max(1, int((deadline - time.monotonic()) * 1000)))
        try:
            raw = client.blocking_key_value_get_bytes(f"{prefix}/record/{q}", left_ms)
        except Exception as error:  # a timeout, or the coordination service gone
            missing.append(q)
            said = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            if "DEADLINE_EXCEEDED" not in said and cause is None:
                cause = f"JAX's coordination service said: {said}"
            continue
        if len(raw) != _RECORD * 4:  # posted by another version of shardrules
            missing.append(q)
            cause = cause or f"process {q} posted a record of {len(raw)} bytes: another shardrules version?"
            continue
        records[q] = np.frombuffer(raw, np.uint32)
    if missing:
        setting = f"{ENV}=SECONDS (default {DEFAULT_TIMEOUT:g})"
        raise _agree.did_not_join_error(missing, me, processes, what, timeout, setting, cause)
    # Every process has posted this round, so every process is done with the previous one.
    for key in previous:
        with contextlib.suppress(Exception):  # already gone: nothing to clean up
            client.key_value_delete(key)
    cache: dict[int, dict[str, Any]] = {me: details}

    def read(q: int) -> dict[str, Any]:
        if q not in cache:
            try:
                raw = client.blocking_key_value_get_bytes(
                    f"{prefix}/details/{q}", min(_MAX_MS, int(timeout * 1000))
                )
                cache[q] = json.loads(raw)
            except Exception:  # deleted or unreadable: the message says less
                cache[q] = {}
        return cache[q]

    return records, read
