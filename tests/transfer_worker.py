"""One process of the multi-process transfer test (tests/test_transfer_processes.py
starts two).

    python tests/transfer_worker.py OUT_DIR PROCESS_ID NUM_PROCESSES PORT

Joins a `jax.distributed` run on 127.0.0.1:PORT with 8 / NUM_PROCESSES CPU
devices of its own (process 0: devices 0-3, process 1: 4-7), runs the
transfers below and writes what it saw to OUT_DIR/result-PROCESS_ID.json. Not
a test module: pytest does not collect it.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

OUT, PROCESS, PROCESSES, PORT = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={8 // PROCESSES}"

import jax  # noqa: E402
import numpy as np  # noqa: E402

if PROCESSES > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        f"127.0.0.1:{PORT}", num_processes=PROCESSES, process_id=PROCESS, initialization_timeout=60
    )

from _live import live_bytes  # noqa: E402  (tests/, the script's folder)
from jax.sharding import Mesh  # noqa: E402

import shardrules as sr  # noqa: E402
from shardrules._placement import _crossing, _moving  # noqa: E402
from shardrules._planning._plan import spec_repr  # noqa: E402

TRAIN = 'mesh data, model\nrules params:\n  "w" -> (data, model)\n  "b" -> (model)\n  "e" -> replicated\n'
ROLLOUT = 'mesh model\nrules params:\n  "w" -> (_, model)\n  "b" -> replicated\n  "e" -> (model, _)\n'
OTHER = 'mesh model\nrules params:\n  "w" -> (model, _)\n  "b" -> replicated\n  "e" -> (model, _)\n'
result: dict = {"process": PROCESS, "processes": jax.process_count()}
devices = jax.devices()
rng = np.random.default_rng(0)
tree = {
    "w": rng.standard_normal((12, 8)).astype(np.float32),
    "b": np.arange(8, dtype=np.int32),
    "e": rng.standard_normal((4, 6)).astype(np.float32),
}

# Which devices' pieces this process packs (sends across) and unpacks (receives).
packed: set[int] = set()
unpacked: set[int] = set()
real_pack, real_unpack = _crossing._pack, _crossing._unpack


def pack(block, *args):
    packed.add(next(iter(block.devices())).id)
    return real_pack(block, *args)


def unpack(row, *args):
    unpacked.add(next(iter(row.devices())).id)
    return real_unpack(row, *args)


_crossing._pack, _crossing._unpack = pack, unpack


def local_values(out: dict) -> dict:
    """For each array, whether this process holds any of it, and whether what
    it holds equals the NumPy tree there."""
    seen = {}
    for key, array in out.items():
        shards = array.addressable_shards
        seen[key] = {
            "shards": len(shards),
            "equal": all(np.array_equal(np.asarray(s.data), tree[key][s.index]) for s in shards),
            "spec": spec_repr(array.sharding.spec),
            "devices": sorted(d.id for d in array.sharding.device_set),
        }
    return seen


def record(name: str, run) -> None:
    try:
        result[name] = run()
    except Exception as error:  # recorded for the test to read
        result[name] = {"error": type(error).__name__, "message": str(error), "trace": traceback.format_exc()}


train_mesh = Mesh(np.array(devices[:6]).reshape(3, 2), ("data", "model"))  # both processes
rollout_mesh = Mesh(np.array(devices[6:]), ("model",))  # process 1 only
train, rollout = sr.loads(TRAIN), sr.loads(ROLLOUT)


def trainer_to_rollout() -> dict:
    placed = sr.apply(tree, train, train_mesh)
    t = sr.transfer(train, rollout, train_mesh, rollout_mesh, shapes=placed)
    seen: list[dict[int, int]] = []
    before = live_bytes()
    _moving._observe = lambda mover, chunk: seen.append(live_bytes())
    try:
        out = t.run(placed, max_bytes_in_flight=64, verify=True, donate=True)
    finally:
        _moving._observe = None
    after = live_bytes()
    extra = max(
        (held - max(before.get(d, 0), after.get(d, 0)) for snapshot in seen for d, held in snapshot.items()),
        default=0,
    )
    return {
        "extra_in_flight": extra,
        "largest_piece": max(p.nbytes for leaf in t.leaves for p in leaf.pieces),
        "chunks": len(seen),
        "values": local_values(out),
        "packed": sorted(packed),
        "unpacked": sorted(unpacked),
        "bytes_moved": t.bytes_moved,
        "sources_deleted": all(x.is_deleted() for x in placed.values()),
    }


def rollout_to_trainer() -> dict:
    served = sr.transfer(train, rollout, train_mesh, rollout_mesh).run(sr.apply(tree, train, train_mesh))
    packed.clear()
    unpacked.clear()
    back = sr.transfer(rollout, train, rollout_mesh, train_mesh).run(served, max_bytes_in_flight="1KiB")
    return {"values": local_values(back), "packed": sorted(packed), "unpacked": sorted(unpacked)}


def overlapping() -> dict:
    wide = Mesh(np.array(devices).reshape(4, 2), ("data", "model"))
    tall = Mesh(np.array(devices[::-1]).reshape(2, 4), ("data", "model"))
    a = sr.loads(
        'mesh data, model\nrules params:\n  "w" -> (data, model)\n  default -> (model)\n  "e" -> (_, model)\n'
    )
    b = sr.loads('mesh data, model\nrules params:\n  "w" -> (model, data)\n  default -> replicated\n')
    placed = sr.apply(tree, a, wide)
    out = sr.transfer(a, b, wide, tall).run(placed, max_bytes_in_flight=32, verify=True)
    return {"values": local_values(out)}


def disagreeing() -> dict:
    target = sr.loads(OTHER if PROCESS == 1 else ROLLOUT)
    placed = sr.apply(tree, train, train_mesh)
    sr.transfer(train, target, train_mesh, rollout_mesh).run(placed)
    return {"ran": True}


record("trainer_to_rollout", trainer_to_rollout)
record("rollout_to_trainer", rollout_to_trainer)
record("overlapping", overlapping)
record("disagreeing", disagreeing)
(OUT / f"result-{PROCESS}.json").write_text(json.dumps(result))
