"""One process of the multi-process test (tests/test_multihost.py starts it).

    python tests/multihost_worker.py OUT_DIR PROCESS_ID NUM_PROCESSES PORT [SCENARIO]

With NUM_PROCESSES=1 it runs the same program alone on 8 devices (the
reference); otherwise it joins a `jax.distributed` run on 127.0.0.1:PORT with
4 CPU devices of its own. Either way the mesh is data=2 × model=4 and the
results go to OUT_DIR/result-PROCESS_ID.json. SCENARIO `dead_peer` runs
something else: process 1 exits at once, and process 0 records what `apply`
raises. Not a test module: pytest does not collect it (its name does not start
with `test_`).
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from pathlib import Path

OUT, PROCESS, PROCESSES, PORT = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
SCENARIO = sys.argv[5] if len(sys.argv) > 5 else "main"
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={8 // PROCESSES}"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

if PROCESSES > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        f"127.0.0.1:{PORT}", num_processes=PROCESSES, process_id=PROCESS, initialization_timeout=60
    )

import shardrules as sr  # noqa: E402

RULES = """\
mesh data, model

alias batch = data
alias rows  = (data, model)

rules params:
  "embed"                -> (data, model)
  "attn/(q|k|v)/kernel$" -> (data, model)
  "attn/o/kernel$"       -> (model, data)
  "mlp/up/kernel$"       -> (data, model)
  "mlp/down/kernel$"     -> (model, data)
  "head/kernel$"         -> (data, model)
  "scale$"               -> replicated

rules inputs:
  "tokens|targets" -> (batch, _)

rules rows:
  "^x$" -> (rows, _)

rules checkpoint:
  "sharded"    -> (data, model)
  "by_data"    -> (data, _)
  "replicated" -> replicated
"""
VOCAB, D, FF, SEQ, BATCH, STEPS, LR = 64, 32, 64, 8, 8, 4, 0.1
result: dict = {"process": PROCESS, "processes": jax.process_count(), "devices": jax.device_count()}


def init_params(rng: np.random.Generator) -> dict:
    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    return {
        "embed": normal(VOCAB, D),
        "attn": {n: {"kernel": normal(D, D)} for n in ("q", "k", "v", "o")},
        "norm": {"scale": np.ones(D, np.float32)},
        "mlp": {"up": {"kernel": normal(D, FF)}, "down": {"kernel": normal(FF, D)}},
        "head": {"kernel": normal(D, VOCAB)},
    }


def forward(p, tokens):
    x = p["embed"][tokens]
    q, k, v = (x @ p["attn"][n]["kernel"] for n in ("q", "k", "v"))
    scores = jnp.einsum("bqd,bkd->bqk", q, k) / np.sqrt(D)
    scores = jnp.where(jnp.tril(jnp.ones((SEQ, SEQ), bool)), scores, -1e9)
    x = x + jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(scores), v) @ p["attn"]["o"]["kernel"]
    h = x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * p["norm"]["scale"]
    x = x + jax.nn.gelu(h @ p["mlp"]["up"]["kernel"]) @ p["mlp"]["down"]["kernel"]
    return x @ p["head"]["kernel"]


def train_step(params, batch):
    def loss_fn(p):
        logp = jax.nn.log_softmax(forward(p, batch["tokens"]))
        return -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - LR * g, params, grads), loss


def total(tree) -> float:
    """The sum of every leaf, computed on the global arrays (a collective)."""
    return float(jax.jit(lambda t: sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(t)))(tree))


def expect_error(name: str, fn) -> None:
    """Run `fn`, which should raise a shardrules error; record its code and text."""
    try:
        fn()
    except sr.ShardRulesError as err:
        result[name] = {"code": err.code, "type": type(err).__name__, "message": str(err), "path": err.path}
    else:
        result[name] = None


def expect_any_error(name: str, fn) -> None:
    """Run `fn`, which should raise; record the exception's type, code (if any),
    text and how long it took to come."""
    started = time.perf_counter()
    try:
        fn()
    except Exception as err:
        result[name] = {
            "type": type(err).__name__,
            "code": getattr(err, "code", None),
            "message": str(err),
            "seconds": time.perf_counter() - started,
        }
    else:
        result[name] = None


def write_checkpoint(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        raw = array.tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def _rchar() -> int:
    """Bytes this process has read through system calls (`read`, `pread`...): /proc/self/io."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def ranged_reads(mesh, multihost_utils) -> None:
    """A 5 MiB checkpoint loaded with `(data, _)` and `(data, model)` layouts:
    the reads this process issues (counted in the reader, and by the kernel in
    /proc/self/io) against what `Plan.load_cost` predicts for its host."""
    from shardrules._placement import _ranged

    rng = np.random.default_rng(1)
    ckpt = {
        "rows": rng.standard_normal((1024, 1024)).astype(np.float32),  # (data, _): one range per process
        "grid": rng.standard_normal((256, 1024)).astype(np.float32),  # (data, model): 4 slices each
        "norm": rng.standard_normal(64).astype(np.float32),  # replicated: both read it
    }
    path = OUT / "ranged.safetensors"
    if PROCESS == 0:
        write_checkpoint(path, ckpt)
    if PROCESSES > 1:
        multihost_utils.sync_global_devices("ranged checkpoint written")
    rules = sr.loads(
        'rules params:\n  "rows" -> (data, _)\n  "grid" -> (data, model)\n  "norm" -> replicated\n'
    )
    counted = {"reads": 0, "bytes": 0}
    real = _ranged.read_at

    def counting(fd, view, offset):
        counted["reads"] += 1
        counted["bytes"] += len(view)
        real(fd, view, offset)

    _ranged.read_at = counting
    try:
        before = _rchar()
        loaded = sr.load_checkpoint(path, rules, mesh)
        after = _rchar()
    finally:
        _ranged.read_at = real
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in ckpt.items()}
    cost = sr.plan(shapes, rules, mesh).load_cost(hosts=PROCESSES)
    row = cost.hosts[PROCESS]
    result["ranged"] = {
        "file_data_bytes": sum(a.nbytes for a in ckpt.values()),
        "reads": counted["reads"],
        "bytes": counted["bytes"],
        "rchar": after - before,
        "predicted": {"reads": row.reads, "bytes": row.bytes_read, "devices": list(row.devices)},
        "my_devices": sorted(
            i for i, d in enumerate(mesh.devices.flat) if d.process_index == jax.process_index()
        ),
        "values_equal": all(
            np.array_equal(np.asarray(shard.data), ckpt[key][shard.index])
            for key, array in loaded.items()
            for shard in array.addressable_shards
        ),
    }


posted: list[list] = []  # [key, bytes] of each value this process posts to JAX's key-value store


class CountingClient:
    """JAX's distributed client, counting what this process posts."""

    def __init__(self, inner):
        self.inner = inner

    def key_value_set_bytes(self, key, value, *args, **kwargs):
        posted.append([key, len(value)])
        return self.inner.key_value_set_bytes(key, value, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def main() -> None:
    from jax.experimental import multihost_utils

    if PROCESSES > 1:  # one wrapper for the whole run: shardrules counts its exchanges per client
        from jax._src import distributed

        from shardrules._placement import _exchange

        client = CountingClient(distributed.global_state.client)
        _exchange._client = lambda: client

    started = time.perf_counter()
    (OUT / "rules.shard").write_text(RULES) if PROCESS == 0 else None
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    if PROCESSES > 1:
        multihost_utils.sync_global_devices("rule file written")
    rules = sr.load(OUT / "rules.shard")

    # Parameters: every process holds the same host copy and puts its own shards.
    # Count what crosses between processes meanwhile (in collectives, and through
    # JAX's key-value store): JAX's own equality check for host data
    # (jax.device_put) would gather every leaf whole.
    gathered: list[int] = []
    real_gather = multihost_utils.process_allgather

    def counting_gather(tree, *args, **kwargs):
        gathered.extend(int(np.asarray(x).nbytes) for x in jax.tree.leaves(tree))
        return real_gather(tree, *args, **kwargs)

    host_params = init_params(np.random.default_rng(0))
    multihost_utils.process_allgather = counting_gather
    posted.clear()
    try:
        params = sr.apply(host_params, rules, mesh)
    finally:
        multihost_utils.process_allgather = real_gather
    result["apply_gathered_bytes"] = sum(gathered)
    result["apply_posted"] = list(posted)
    result["params_bytes"] = sum(x.nbytes for x in jax.tree.leaves(host_params))
    q = params["attn"]["q"]["kernel"]
    result["q_spec"] = str(q.sharding.spec)
    result["q_addressable_shards"] = len(q.addressable_shards)
    result["params_total"] = total(params)

    # Inputs: each process holds only its rows of the global batch.
    start = np.random.default_rng(1).integers(0, VOCAB, (BATCH, 1))
    seq = (start + np.arange(SEQ + 1)) % VOCAB
    full = {"tokens": seq[:, :-1].astype(np.int32), "targets": seq[:, 1:].astype(np.int32)}
    rows = slice(PROCESS * BATCH // PROCESSES, (PROCESS + 1) * BATCH // PROCESSES)
    mine = {k: v[rows] for k, v in full.items()}
    batch = sr.apply(mine, rules, mesh, group="inputs", process_local=True)
    whole = sr.apply(full, rules, mesh, group="inputs")
    result["local_rows"] = mine["tokens"].shape[0]
    result["batch_shape"] = list(batch["tokens"].shape)
    result["batch_spec"] = str(batch["tokens"].sharding.spec)
    same = jax.jit(
        lambda a, b: jnp.array_equal(a["tokens"], b["tokens"]) & jnp.array_equal(a["targets"], b["targets"])
    )
    result["batch_matches_whole"] = bool(same(batch, whole))

    # Rows over both axes: each process's 4 devices hold 4 of the 8 pieces.
    x = sr.apply(
        {"x": np.full((8 // PROCESSES, 2), PROCESS, np.float32)},
        rules,
        mesh,
        group="rows",
        process_local=True,
    )["x"]
    result["rows_shape"] = list(x.shape)
    result["rows_first_column"] = (
        [float(v) for v in np.asarray(multihost_utils.process_allgather(x, tiled=True))[:, 0]]
        if PROCESSES > 1
        else []
    )
    expect_error(
        "rows_do_not_split",
        lambda: sr.apply({"x": np.zeros((3, 2), np.float32)}, rules, mesh, group="rows", process_local=True),
    )

    # A few training steps with shardings from the rules.
    step = sr.jit(train_step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    losses = []
    for _ in range(STEPS):
        params, loss = step(params, batch)
        losses.append(float(loss))
    result["losses"] = losses

    # Reshard the trained parameters onto another mesh over the same 8 devices
    # (other shape, other axis names): JAX moves the pieces across processes.
    rollout = sr.loads(
        'mesh replica, tensor\nrules params:\n  "embed|kernel$" -> (replica, tensor)\n  "scale$" -> replicated\n'
    )
    rollout_mesh = jax.make_mesh((4, 2), ("replica", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    trained = jax.tree.map(jnp.copy, params)
    moved = sr.reshard(trained, rollout, rollout_mesh, donate=True)
    result["reshard_total"] = total(moved)
    result["reshard_matches"] = bool(
        jax.jit(
            lambda a, b: jnp.all(
                jnp.stack(
                    [
                        jnp.array_equal(x, y)
                        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
                    ]
                )
            )
        )(params, jax.device_put(moved, jax.tree.map(lambda x: x.sharding, params)))
    )
    result["reshard_spec"] = str(moved["attn"]["q"]["kernel"].sharding.spec)
    result["reshard_donated"] = all(x.is_deleted() for x in jax.tree.leaves(trained))
    if PROCESSES > 1:  # onto 2 devices of each process: refused on both, before anything moves
        some = [d for q in range(PROCESSES) for d in [e for e in jax.devices() if e.process_index == q][:2]]
        half = jax.make_mesh(
            (2, 2), ("replica", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=some
        )
        expect_error("reshard_other_devices", lambda: sr.reshard(params, rollout, half))

    # Sharded initialisation: each process computes only its own shards.
    def make(key):
        k1, k2 = jax.random.split(key)
        return {
            "embed": jax.random.normal(k1, (VOCAB, D)),
            "norm": {"scale": jnp.ones(D)},
            "head": {"kernel": jax.random.normal(k2, (D, VOCAB))},
        }

    made = sr.init(make, rules, mesh)(jax.random.key(0))
    result["init_total"] = total(made)
    result["init_embed_spec"] = str(made["embed"].sharding.spec)
    result["init_embed_local_shards"] = len(made["embed"].addressable_shards)

    # Checkpoint loading: count the bytes each process reads.
    ckpt = {
        "sharded": np.arange(64 * 32, dtype=np.float32).reshape(64, 32),
        "by_data": np.arange(16 * 8, dtype=np.float32).reshape(16, 8) * 2,
        "replicated": np.arange(8, dtype=np.float32) - 3,
    }
    if PROCESS == 0:
        write_checkpoint(OUT / "model.safetensors", ckpt)
        stale = dict(ckpt, sharded=ckpt["sharded"][:, :16].copy())  # another version of the file
        write_checkpoint(OUT / "stale.safetensors", stale)
    if PROCESSES > 1:
        multihost_utils.sync_global_devices("checkpoint written")
    # The callback shardrules passes is called once per local device; a slice it
    # really reads is a new array, one it has read already comes back as the same object.
    reads: list[dict] = []
    kept: list[np.ndarray] = []  # alive, so that ids are not reused
    real = jax.make_array_from_callback

    def counting(shape, sharding, callback, *args, **kwargs):
        def read(index):
            data = callback(index)
            fresh = not any(data is k for k in kept)
            kept.append(data)
            reads.append(
                {
                    "shape": list(shape),
                    "index": [[s.start, s.stop] for s in index],
                    "bytes": int(np.asarray(data).nbytes),
                    "fresh": fresh,
                }
            )
            return data

        return real(shape, sharding, read, *args, **kwargs)

    jax.make_array_from_callback = counting
    try:
        loaded = sr.load_checkpoint(OUT / "model.safetensors", rules, mesh, group="checkpoint")
    finally:
        jax.make_array_from_callback = real
    result["checkpoint_reads"] = reads
    result["checkpoint_bytes_read"] = sum(r["bytes"] for r in reads if r["fresh"])
    result["checkpoint_file_bytes"] = sum(a.nbytes for a in ckpt.values())
    result["checkpoint_total"] = total(loaded)
    result["checkpoint_expected_total"] = float(sum(a.sum() for a in ckpt.values()))
    result["checkpoint_specs"] = {k: str(v.sharding.spec) for k, v in loaded.items()}
    ranged_reads(mesh, multihost_utils)

    # Disagreements between processes are found before anything moves.
    if PROCESSES > 1:
        skewed = init_params(np.random.default_rng(PROCESS))  # a different seed on each process
        gathered.clear()
        multihost_utils.process_allgather = counting_gather
        try:
            expect_error("mismatch_values", lambda: sr.apply(skewed, rules, mesh))
        finally:
            multihost_utils.process_allgather = real_gather
        result["mismatch_gathered_bytes"] = sum(gathered)
        one_off = init_params(np.random.default_rng(0))
        one_off["mlp"]["up"]["kernel"][0, 0] += PROCESS  # one element, on process 1 only
        expect_error("mismatch_one_element_full", lambda: sr.apply(one_off, rules, mesh, verify="full"))
        extra = dict(host_params, extra={"scale": np.ones(D, np.float32)}) if PROCESS == 1 else host_params
        expect_error("mismatch_structure", lambda: sr.apply(extra, rules, mesh))
        short = {k: v[: 4 - PROCESS] for k, v in full.items()}  # 4 rows here, 3 there
        expect_error(
            "mismatch_local_shapes", lambda: sr.apply(short, rules, mesh, group="inputs", process_local=True)
        )
        # Process 1 reads another version of the checkpoint: stopped before anything is read.
        name = "stale.safetensors" if PROCESS == 1 else "model.safetensors"
        expect_error(
            "checkpoint_mismatch", lambda: sr.load_checkpoint(OUT / name, rules, mesh, group="checkpoint")
        )
        # A problem every process has: each raises it (and none waits for the others).
        expect_error("over_budget", lambda: sr.apply(host_params, rules, mesh, device_memory="1KiB"))
        # A problem only one process has: it raises its own error, the other one SR112 (neither hangs).
        gone = jnp.ones(D)
        if PROCESS == 1:
            gone.delete()
        expect_error("failed_on_one", lambda: sr.apply(dict(host_params, norm={"scale": gone}), rules, mesh))
        # Errors raised on one process before the exchange: it raises its own, the others SR112 at once.
        missing = "missing.safetensors" if PROCESS == 1 else "model.safetensors"
        expect_any_error(
            "checkpoint_missing_on_one",
            lambda: sr.load_checkpoint(OUT / missing, rules, mesh, group="checkpoint"),
        )
        if PROCESS == 1:
            (OUT / "broken.safetensors").write_bytes(struct.pack("<Q", 9) + b"{not json")
        damaged = "broken.safetensors" if PROCESS == 1 else "model.safetensors"
        expect_any_error(
            "checkpoint_damaged_on_one",
            lambda: sr.load_checkpoint(OUT / damaged, rules, mesh, group="checkpoint"),
        )
        group = "no_such_group" if PROCESS == 1 else "checkpoint"
        expect_any_error(
            "checkpoint_plan_fails_on_one",
            lambda: sr.load_checkpoint(OUT / "model.safetensors", rules, mesh, group=group),
        )
        unflattenable = {**host_params, 0: np.ones(2)} if PROCESS == 1 else host_params  # str and int keys
        expect_any_error("apply_tree_fails_on_one", lambda: sr.apply(unflattenable, rules, mesh))
        group = "no_such_group" if PROCESS == 1 else "params"
        expect_any_error("apply_group_fails_on_one", lambda: sr.apply(host_params, rules, mesh, group=group))
        # Large leaves on the devices are sampled there: the same values whether a process
        # passes NumPy or a jax.Array agree, different ones are found.
        big = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024)  # 2 MiB
        here = jax.device_put(big, jax.sharding.NamedSharding(mesh.local_mesh, jax.P(None, "model")))
        result["device_leaf_agrees"] = float(
            total(sr.apply({"embed": here if PROCESS == 1 else big}, rules, mesh))
        )
        result["device_leaf_expected"] = float(big.sum())
        expect_error("device_leaf_differs", lambda: sr.apply({"embed": here + PROCESS}, rules, mesh))
        # Another rule file on each process: the same tree, planned differently.
        flipped = "(data, model)" if PROCESS == 0 else "(model, data)"
        other_rules = sr.loads(f'mesh data, model\nrules params:\n  "w$" -> {flipped}\n')
        w = {"w": np.arange(64, dtype=np.float32).reshape(8, 8)}
        expect_error("mismatch_rules", lambda: sr.apply(w, other_rules, mesh))
        # Another mesh on each process: the same axes, laid out over the devices differently.
        auto = (jax.sharding.AxisType.Auto,) * 2
        other_mesh = (
            jax.make_mesh((4, 2), ("model", "data"), axis_types=auto)
            if PROCESS == 0
            else jax.make_mesh((2, 4), ("data", "model"), axis_types=auto)
        )
        same_rules = sr.loads('mesh data, model\nrules params:\n  "w$" -> (data, model)\n')
        expect_error("mismatch_mesh", lambda: sr.apply(w, same_rules, other_mesh))
        # An argument only one process gets wrong: it raises its own error, the other SR112 at once.
        verify = "bogus" if PROCESS == 1 else "sample"
        expect_any_error("verify_bogus_on_one", lambda: sr.apply(host_params, rules, mesh, verify=verify))
        unchecked = sr.apply(skewed, rules, mesh, verify="off")  # the check is what stops it
        result["unchecked_embed_shape"] = list(unchecked["embed"].shape)
        every_entry_point_meets(mesh, other_mesh, same_rules, other_rules, w)
        mesh_without_a_process(mesh, same_rules, w)
        # After all that, the processes still agree and go on together.
        result["after_errors_total"] = total(sr.apply(host_params, rules, mesh))
    result["seconds"] = time.perf_counter() - started


def every_entry_point_meets(mesh, other_mesh, same_rules, other_rules, w) -> None:
    """Each entry point that places data, with a rule file or a mesh that
    differs between the processes, or a plan that fails on process 1 only:
    every process must stop, with SR112 (or its own error), at once."""
    flipped = "(data, model)" if PROCESS == 0 else "(model, data)"
    ckpt_rules = sr.loads(
        f'mesh data, model\nrules params:\n  "sharded" -> {flipped}\n  default -> replicated\n'
    )
    missing_group = "no_such_group" if PROCESS == 1 else "params"

    # apply with verify="off": the values are not compared, the plan and the mesh are.
    expect_any_error("off_rules", lambda: sr.apply(w, other_rules, mesh, verify="off"))
    expect_any_error("off_mesh", lambda: sr.apply(w, same_rules, other_mesh, verify="off"))

    # init: the plan of the initialiser's output and the mesh.
    def make(key):
        return {"w": jax.random.normal(key, (8, 8))}

    key = jax.random.key(0)
    expect_any_error("init_rules", lambda: sr.init(make, other_rules, mesh)(key))
    expect_any_error("init_mesh", lambda: sr.init(make, same_rules, other_mesh)(key))
    expect_any_error("init_fails_on_one", lambda: sr.init(make, same_rules, mesh, group=missing_group)(key))
    unreadable = OUT / "missing.shard" if PROCESS == 1 else same_rules  # fails when wrapped, on process 1
    expect_any_error("init_wrap_fails_on_one", lambda: sr.init(make, unreadable, mesh)(key))
    result["init_after_total"] = total(sr.init(make, same_rules, mesh)(key))

    # load_checkpoint: the same file, planned by rule files that differ; another mesh.
    file = OUT / "model.safetensors"
    expect_any_error("checkpoint_rules", lambda: sr.load_checkpoint(file, ckpt_rules, mesh))
    same_ckpt = sr.loads(
        'mesh data, model\nrules params:\n  "sharded" -> (data, model)\n  default -> replicated\n'
    )
    expect_any_error("checkpoint_mesh", lambda: sr.load_checkpoint(file, same_ckpt, other_mesh))

    # load_orbax: stopped before Orbax reads anything (the path need not exist).
    target = {"w": jax.ShapeDtypeStruct((8, 8), np.float32)}
    ckpt = OUT / "no-orbax-checkpoint"
    expect_any_error("orbax_rules", lambda: sr.load_orbax(ckpt, other_rules, mesh, target=target))
    expect_any_error("orbax_mesh", lambda: sr.load_orbax(ckpt, same_rules, other_mesh, target=target))
    expect_any_error(
        "orbax_fails_on_one",
        lambda: sr.load_orbax(ckpt, same_rules, mesh, group=missing_group, target=target),
    )

    # reshard: its plan on the target mesh; an argument only one process gets wrong.
    placed = sr.apply(w, same_rules, mesh)
    expect_any_error("reshard_rules", lambda: sr.reshard(placed, other_rules, mesh))
    expect_any_error("reshard_mesh", lambda: sr.reshard(placed, same_rules, other_mesh))
    donate = "yes" if PROCESS == 1 else False
    expect_any_error("reshard_fails_on_one", lambda: sr.reshard(placed, same_rules, mesh, donate=donate))

    # sr.jit's first call: in and out shardings, activation rules, mesh.
    def double(p):
        with jax.named_scope("h"):
            return jax.tree.map(lambda x: x * 2, p)

    def step(rules_, mesh_, **kwargs):
        return sr.jit(double, rules_, mesh_, in_groups=("params",), out_groups="params", **kwargs)

    expect_any_error("jit_rules", lambda: step(other_rules, mesh)(placed))
    expect_any_error("jit_mesh", lambda: step(same_rules, other_mesh)(placed))
    expect_any_error(
        "jit_fails_on_one",
        lambda: sr.jit(double, same_rules, mesh, in_groups=(missing_group,), out_groups="params")(placed),
    )
    spec = "(data, _)" if PROCESS == 0 else "(model, _)"
    with_acts = sr.loads(
        f'mesh data, model\nrules params:\n  "w$" -> (data, model)\nrules activations:\n  "h" -> {spec}\n'
    )
    expect_any_error("jit_activations", lambda: step(with_acts, mesh)(placed))
    result["jit_after_total"] = total(step(same_rules, mesh)(placed))

    # sr.shard_map's first call, before it moves its inputs: in and out specs, mesh.
    def mapped(rules_, mesh_):
        return sr.shard_map(lambda p: p, rules_, mesh_, in_groups=("params",), out_groups="params")

    expect_any_error("shard_map_rules", lambda: mapped(other_rules, mesh)(placed))
    expect_any_error("shard_map_mesh", lambda: mapped(same_rules, other_mesh)(placed))


def mesh_without_a_process(mesh, rules, w) -> None:
    """Each entry point that places data, on a mesh over `jax.devices()[:4]`:
    every device of process 0 and none of process 1. Every process must stop
    with the same error, before anything moves; then, a mesh that only
    process 1 builds that way: it stops with that error, process 0 with SR112
    naming it."""
    auto = (jax.sharding.AxisType.Auto,) * 2
    first = jax.make_mesh((2, 2), ("data", "model"), axis_types=auto, devices=jax.devices()[:4])
    placed = sr.apply(w, rules, mesh)
    ckpt_rules = sr.loads(
        'mesh data, model\nrules params:\n  "sharded" -> (data, model)\n  default -> replicated\n'
    )

    def double(p):
        return jax.tree.map(lambda x: x * 2, p)

    cases = {
        "apply": lambda: sr.apply(w, rules, first),
        "apply_local": lambda: sr.apply(w, rules, first, process_local=True),
        "apply_off": lambda: sr.apply(w, rules, first, verify="off"),
        "init": lambda: sr.init(lambda key: {"w": jax.random.normal(key, (8, 8))}, rules, first)(
            jax.random.key(0)
        ),
        "checkpoint": lambda: sr.load_checkpoint(OUT / "model.safetensors", ckpt_rules, first),
        "orbax": lambda: sr.load_orbax(
            OUT / "no-orbax-checkpoint", rules, first, target={"w": jax.ShapeDtypeStruct((8, 8), np.float32)}
        ),
        "reshard": lambda: sr.reshard(placed, rules, first),
        "jit": lambda: sr.jit(double, rules, first, in_groups=("params",), out_groups="params")(placed),
        "shard_map": lambda: sr.shard_map(
            lambda p: p, rules, first, in_groups=("params",), out_groups="params"
        )(placed),
    }
    # Count what would move data while these run: nothing may.
    moves: list[str] = []
    names = ("device_put", "make_array_from_callback", "make_array_from_process_local_data")
    real = {name: getattr(jax, name) for name in names}

    def counting(name):
        def call(*args, **kwargs):
            moves.append(name)
            return real[name](*args, **kwargs)

        return call

    for name in names:
        setattr(jax, name, counting(name))
    try:
        for case, fn in cases.items():
            expect_any_error(f"no_device_{case}", fn)
    finally:
        for name in names:
            setattr(jax, name, real[name])
    result["no_device_moves"] = moves
    # Only process 1 builds its mesh that way: it stops on its own error, process 0 with SR112.
    on_one = first if PROCESS == 1 else mesh
    expect_any_error("no_device_on_one", lambda: sr.apply(w, rules, on_one))
    result["no_device_after_total"] = total(sr.apply(w, rules, mesh))


def dead_peer() -> None:
    """Process 1 exits before `apply`; process 0 calls it, with a short wait
    for the others, and records the error. Neither says goodbye to JAX's
    distributed service (process 1 cannot; process 0 would wait for it)."""
    if PROCESS == 1:
        os._exit(3)
    os.environ["SHARDRULES_JOIN_TIMEOUT"] = "3"
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    rules = sr.loads('mesh data, model\nrules params:\n  "w$" -> (data, model)\n')
    expect_any_error("dead_peer", lambda: sr.apply({"w": np.ones((8, 8), np.float32)}, rules, mesh))
    (OUT / f"result-{PROCESS}.json").write_text(json.dumps(result, indent=1))
    os._exit(0)


if __name__ == "__main__":
    if SCENARIO == "dead_peer":
        dead_peer()
    main()
    (OUT / f"result-{PROCESS}.json").write_text(json.dumps(result, indent=1))
    if PROCESSES > 1:
        jax.distributed.shutdown()
