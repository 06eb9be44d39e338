"""shardrules on JAX's multi-controller runtime: 2 processes × 4 CPU devices.

One launch of tests/multihost_worker.py as two `jax.distributed` processes on
127.0.0.1 (gloo collectives), and one as a single process with 8 devices: the
same program (apply, process-local inputs, a few training steps, sharded init,
checkpoint loading, disagreements between the processes). The tests below
read what each process recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import jax
import numpy as np
import pytest

import shardrules as sr
from shardrules._cli._main import main as cli_main
from shardrules._placement import _agree, _exchange, _fingerprint, _meeting, _multihost
from shardrules._planning import _hosts
from shardrules._planning._compile import compile_leaves
from shardrules._tracing import _jit

WORKER = Path(__file__).with_name("multihost_worker.py")
TIMEOUT = 100  # seconds for every process together
PROCESSES = 2


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 40) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    kept = [line for line in text.splitlines() if "[Gloo]" not in line]
    return "\n".join(kept[-lines:])


# The runs started together: name -> (processes, scenario, exit status expected of each process).
RUNS = {
    "single": (1, "main", (0,)),
    "multi": (PROCESSES, "main", (0, 0)),
    # Process 1 exits at once (status 3); process 0 records what apply raises and leaves.
    "dead_peer": (PROCESSES, "dead_peer", (0, 3)),
}


def _launch(folder: Path) -> dict[str, list[dict] | str]:
    """Run every run of `RUNS` side by side; kill every process group on the
    way out, whatever happened. Each run's results, one dict per process, or
    the text of what went wrong (a test that reads the run fails with it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env.pop("SHARDRULES_JOIN_TIMEOUT", None)
    started: list[tuple[str, int, subprocess.Popen, Path]] = []
    failed: dict[str, str] = {}
    try:
        for name, (count, scenario, _) in RUNS.items():
            port = _free_port() if count > 1 else 0
            out = folder / name
            out.mkdir()
            for process in range(count):
                log = out / f"stderr-{process}.txt"
                with log.open("w") as stderr:
                    child = subprocess.Popen(
                        [sys.executable, str(WORKER), *map(str, (out, process, count, port)), scenario],
                        env=env,
                        stdout=stderr,
                        stderr=stderr,
                        start_new_session=True,  # its own process group, killed below
                    )
                started.append((name, process, child, log))
        deadline = time.monotonic() + TIMEOUT
        for name, process, child, log in started:
            try:
                code = child.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                late = f"{name} process {process} still running after {TIMEOUT}s:\n{_tail(log)}"
                failed.setdefault(name, late)
                continue
            if code != RUNS[name][2][process]:
                failed.setdefault(name, f"{name} process {process} exited with {code}:\n{_tail(log)}")
    finally:
        for _, _, child, _ in started:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
    runs: dict[str, list[dict] | str] = {}
    for name, (count, _, codes) in RUNS.items():
        if name in failed:
            runs[name] = failed[name]
            continue
        runs[name] = [
            json.loads((folder / name / f"result-{p}.json").read_text()) if codes[p] == 0 else {}
            for p in range(count)
        ]
    return runs


class Results:
    """The runs' results; reading a run that went wrong fails the test."""

    def __init__(self, runs: dict[str, list[dict] | str]):
        self.runs = runs

    def __getitem__(self, name: str) -> list[dict]:
        run = self.runs[name]
        if isinstance(run, str):
            pytest.fail(run)
        return run


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Results:
    return Results(_launch(tmp_path_factory.mktemp("multihost")))


@pytest.mark.slow
def test_two_processes_train_like_one(results):
    (single,) = results["single"]
    multi = results["multi"]
    assert [r["processes"] for r in multi] == [2, 2] and single["processes"] == 1
    assert all(r["devices"] == 8 for r in [single, *multi])
    for r in multi:
        # Each process put only the shards of its own 4 devices, and the global arrays are the same.
        assert r["q_addressable_shards"] == 4 and single["q_addressable_shards"] == 8
        assert r["q_spec"] == single["q_spec"] == "P('data', 'model')"
        assert r["params_total"] == pytest.approx(single["params_total"], rel=1e-6)
        # Only fingerprints crossed between the processes, not the 48 KiB of parameters:
        # the trees agree, so no collective, and through JAX's key-value store a record
        # of 10 words and the details a message would need (the specs' texts, the mesh).
        assert r["apply_gathered_bytes"] == 0 and r["params_bytes"] == 49280
        (details, details_bytes), (record, record_bytes) = r["apply_posted"]
        assert record == f"shardrules/agree/0/record/{r['process']}" and record_bytes == 10 * 4
        assert details == f"shardrules/agree/0/details/{r['process']}" and details_bytes < 512
        assert len(r["losses"]) == 4
        np.testing.assert_allclose(r["losses"], single["losses"], rtol=1e-5)
    assert single["apply_gathered_bytes"] == 0  # one process: nothing to compare
    assert single["losses"][-1] < single["losses"][0]


@pytest.mark.slow
def test_process_local_inputs_assemble_the_global_batch(results):
    for r in results["multi"]:
        assert r["local_rows"] == 4  # half the batch on each process
        assert r["batch_shape"] == [8, 8]  # the global batch
        assert r["batch_spec"] == "P('data', None)"
        assert r["batch_matches_whole"] is True  # the same array as from the whole batch on every process


@pytest.mark.slow
def test_process_local_rows_over_two_axes(results):
    for r in results["multi"]:
        # (data, model) cuts the rows in 8; each process's devices hold 4 of them.
        assert r["rows_shape"] == [8, 2]
        assert r["rows_first_column"] == [0.0] * 4 + [1.0] * 4  # process 0's rows, then process 1's
        # 3 rows cannot be the 4 pieces a process holds: refused on both, before anything moves.
        assert r["rows_do_not_split"]["code"] == "SR104" and r["rows_do_not_split"]["path"] == "x"


@pytest.mark.slow
def test_reshard_across_processes(results):
    (single,) = results["single"]
    assert single["reshard_matches"] is True and single["reshard_donated"] is True
    for r in results["multi"]:
        # The global arrays moved onto a 4×2 (replica, tensor) mesh of the same devices, values exact.
        assert r["reshard_spec"] == single["reshard_spec"] == "P('replica', 'tensor')"
        assert r["reshard_matches"] is True and r["reshard_donated"] is True
        assert r["reshard_total"] == pytest.approx(single["reshard_total"], rel=1e-6)
        # A target over 2 devices of each process: JAX cannot move global arrays there (SR106 on both).
        assert r["reshard_other_devices"]["code"] == "SR106"


@pytest.mark.slow
def test_sharded_init_matches_one_process(results):
    (single,) = results["single"]
    for r in results["multi"]:
        assert r["init_embed_spec"] == "P('data', 'model')"
        assert r["init_embed_local_shards"] == 4
        assert r["init_total"] == pytest.approx(single["init_total"], rel=1e-5)


@pytest.mark.slow
def test_checkpoint_each_process_reads_only_its_slices(results):
    (single,) = results["single"]
    # The file: sharded (64, 32) over data × model, by_data (16, 8) over data,
    # replicated (8,), all float32. Alone, one process reads every byte once.
    file_bytes = (64 * 32 + 16 * 8 + 8) * 4
    assert single["checkpoint_file_bytes"] == file_bytes
    assert single["checkpoint_bytes_read"] == file_bytes
    # With 2 processes, each holds one row of the data axis: half of each
    # sharded tensor (each of its 4 slices once), and the small replicated one.
    half = (64 * 32 // 2 + 16 * 8 // 2 + 8) * 4
    for r in results["multi"]:
        assert r["checkpoint_bytes_read"] == half
        fresh = [tuple(map(tuple, read["index"])) for read in r["checkpoint_reads"] if read["fresh"]]
        sharded = [read for read in r["checkpoint_reads"] if read["shape"] == [64, 32]]
        assert len(sharded) == 4 and all(read["fresh"] for read in sharded)
        by_data = [read for read in r["checkpoint_reads"] if read["shape"] == [16, 8]]
        assert len(by_data) == 4 and sum(read["fresh"] for read in by_data) == 1  # 4 devices, one read
        rows = {read["index"][0][0] for read in r["checkpoint_reads"] if read["shape"] == [64, 32]}
        assert rows == {0 if r["process"] == 0 else 32}  # only its own rows
        assert len(fresh) == len(set(fresh))
        assert r["checkpoint_total"] == r["checkpoint_expected_total"]
        assert r["checkpoint_specs"] == single["checkpoint_specs"]


@pytest.mark.slow
def test_processes_that_disagree_are_stopped_and_named(results):
    first, second = results["multi"]
    for me, other, r in ((0, 1, first), (1, 0, second)):
        values = r["mismatch_values"]
        assert values is not None, "different values on the two processes were not detected"
        # The tables differ, so they are gathered: 18 words per leaf (9 leaves).
        assert r["mismatch_gathered_bytes"] == 9 * 18 * 4
        assert values["code"] == "SR112" and values["type"] == "ProcessMismatchError"
        assert f"this is process {me} of 2" in values["message"]
        assert f"embed: values differ from those on process {other}" in values["message"]
        assert "attn/q/kernel" in values["message"] and "process_local=True" in values["message"]
        # Every element is hashed with verify="full": one changed element is found.
        one = r["mismatch_one_element_full"]
        assert one is not None and one["code"] == "SR112" and one["path"] == "mlp/up/kernel"
        assert "embed" not in one["message"]
        shapes = r["mismatch_local_shapes"]
        assert shapes is not None and shapes["code"] == "SR112"
        mine, theirs = ("(8, 8)", "(6, 8)") if me == 0 else ("(6, 8)", "(8, 8)")
        assert f"tokens: {mine} int32 here, {theirs} int32 on process {other}" in shapes["message"]
    assert first["mismatch_structure"]["code"] == "SR112"
    assert "process 1 has 1 leaf that this process lacks" in first["mismatch_structure"]["message"]
    assert "extra/scale: only on this process, not on process 0" in second["mismatch_structure"]["message"]
    assert second["mismatch_structure"]["path"] == "extra/scale"
    for me, r in enumerate(results["multi"]):
        shapes = (
            "(64, 32) float32 here, (64, 16) float32 on process 1",
            "(64, 16) float32 here, (64, 32) float32 on process 0",
        )
        assert r["checkpoint_mismatch"]["code"] == "SR112" and r["checkpoint_mismatch"]["path"] == "sharded"
        assert f"sharded: {shapes[me]}" in r["checkpoint_mismatch"]["message"]
        assert "every process must read the same checkpoint" in r["checkpoint_mismatch"]["message"]
    assert first["over_budget"]["code"] == second["over_budget"]["code"] == "SR110"
    # A deleted array on process 1 only: its own SR107 there, SR112 naming it on process 0.
    assert second["failed_on_one"]["code"] == "SR107" and second["failed_on_one"]["path"] == "norm/scale"
    assert first["failed_on_one"]["code"] == "SR112"
    assert (
        "process 1 stopped on errors that this process (process 0 of 2) did not find"
        in (first["failed_on_one"]["message"])
    )
    # verify="off" skips the check (and the skewed arrays are built), and the
    # processes are still in step after the errors.
    for r in results["multi"]:
        assert r["unchecked_embed_shape"] == [64, 32]
        assert r["after_errors_total"] == pytest.approx(r["params_total"], rel=1e-6)


@pytest.mark.slow
def test_an_error_before_the_exchange_on_one_process_stops_the_others_with_sr112(results):
    first, second = results["multi"]
    cases = {
        # case: (the error process 1 raises itself, a word of its message)
        "checkpoint_missing_on_one": ("FileNotFoundError", "missing.safetensors"),
        "checkpoint_damaged_on_one": ("ShapeSourceError", "broken.safetensors"),
        "checkpoint_plan_fails_on_one": ("GroupNotFoundError", "no_such_group"),
        "apply_tree_fails_on_one": ("TreeError", "SR109"),
        "apply_group_fails_on_one": ("GroupNotFoundError", "no_such_group"),
    }
    for case, (own, word) in cases.items():
        mine, theirs = second[case], first[case]
        assert mine is not None and mine["type"] == own and word in mine["message"], (case, mine)
        # Process 0 found nothing wrong: it hears of process 1's failure at once,
        # as SR112 naming it, instead of timing out in the collective.
        assert theirs is not None and theirs["type"] == "ProcessMismatchError", (case, theirs)
        assert theirs["code"] == "SR112"
        assert (
            "process 1 stopped on errors that this process (process 0 of 2) did not find"
            in (theirs["message"])
        )
        assert theirs["seconds"] < 10, (case, theirs["seconds"])
    assert "the checkpoint may be missing" in first["checkpoint_missing_on_one"]["message"]
    # The processes are still paired in their collectives after all of that.
    for r in results["multi"]:
        assert r["after_errors_total"] == pytest.approx(r["params_total"], rel=1e-6)


@pytest.mark.slow
def test_rule_files_that_differ_between_processes_are_stopped_with_both_specs(results):
    # "w$" -> (data, model) on process 0, (model, data) on process 1: the same tree,
    # laid out two ways. Both processes stop, each naming the leaf, both specs and the other process.
    specs = ("P('data', 'model')", "P('model', 'data')")
    for me, r in enumerate(results["multi"]):
        found = r["mismatch_rules"]
        assert found is not None, "different rule files on the two processes were not detected"
        assert found["code"] == "SR112" and found["type"] == "ProcessMismatchError" and found["path"] == "w"
        assert f"this is process {me} of 2" in found["message"]
        assert f"w: {specs[me]} here, {specs[1 - me]} on process {1 - me}" in found["message"]
        assert "the same rule file" in found["message"]  # the hint


@pytest.mark.slow
def test_meshes_that_differ_between_processes_are_stopped_and_named(results):
    # (4, 2) ("model", "data") on process 0, (2, 4) ("data", "model") on process 1.
    meshes = ("model=4 × data=2", "data=2 × model=4")
    for me, r in enumerate(results["multi"]):
        found = r["mismatch_mesh"]
        assert found is not None, "different meshes on the two processes were not detected"
        assert found["code"] == "SR112" and found["type"] == "ProcessMismatchError"
        assert f"this is process {me} of 2" in found["message"]
        assert f"mesh: {meshes[me]} here, {meshes[1 - me]} on process {1 - me}" in found["message"]
        assert "jax.make_mesh" in found["message"]  # the hint


# Every entry point that places data, with a rule file (or a mesh) that differs
# between the processes: (case, what the message names, the first words of its line).
DIFFERENT_PLANS = {
    "off_rules": ("apply(group='params')", "w: "),  # verify="off": the plan is compared all the same
    "init_rules": ("init(group='params')", "w: "),
    "checkpoint_rules": ("load_checkpoint(", "sharded: "),
    "orbax_rules": ("load_orbax(", "w: "),
    "reshard_rules": ("reshard(group='params')", "w: "),
    "jit_rules": ("jit(", "in/0/w: "),
    "shard_map_rules": ("shard_map(", "in/0/w: "),
}
DIFFERENT_MESHES = [
    "off_mesh", "init_mesh", "checkpoint_mesh", "orbax_mesh", "reshard_mesh", "jit_mesh", "shard_map_mesh",
]  # fmt: skip
# A plan that fails on process 1 only: (case, process 1's own error).
FAILS_ON_ONE = {
    "init_fails_on_one": "GroupNotFoundError",
    "init_wrap_fails_on_one": "IncludeNotFoundError",  # its rule file is missing: when init() wraps
    "orbax_fails_on_one": "GroupNotFoundError",
    "reshard_fails_on_one": "TypeError",  # donate="yes"
    "jit_fails_on_one": "GroupNotFoundError",
}


@pytest.mark.slow
def test_every_entry_point_compares_plans_on_every_process(results):
    specs = ("P('data', 'model')", "P('model', 'data')")
    for me, r in enumerate(results["multi"]):
        for case, (what, leaf) in DIFFERENT_PLANS.items():
            found = r[case]
            assert found is not None, f"{case}: rule files that differ were not detected"
            assert found["type"] == "ProcessMismatchError" and found["code"] == "SR112", (case, found)
            assert found["message"].startswith(f"SR112 {what}"), (case, found["message"])
            assert "the processes plan different layouts" in found["message"], case
            line = f"{leaf}{specs[me]} here, {specs[1 - me]} on process {1 - me}"
            assert line in found["message"], (case, found["message"])
            assert found["seconds"] < 10, (case, found["seconds"])  # at once, not after a timeout
        # sr.jit also compares its outputs' layouts and its activation rules.
        assert f"out/w: {specs[me]} here" in r["jit_rules"]["message"]
        activations = r["jit_activations"]
        assert activations is not None and activations["code"] == "SR112", activations
        assert "rules activations: 1 rule #" in activations["message"]


@pytest.mark.slow
def test_every_entry_point_compares_meshes_on_every_process(results):
    meshes = ("model=4 × data=2", "data=2 × model=4")
    for me, r in enumerate(results["multi"]):
        for case in DIFFERENT_MESHES:
            found = r[case]
            assert found is not None, f"{case}: meshes that differ were not detected"
            assert found["type"] == "ProcessMismatchError" and found["code"] == "SR112", (case, found)
            assert f"mesh: {meshes[me]} here, {meshes[1 - me]} on process {1 - me}" in found["message"], case
            assert found["seconds"] < 10, (case, found["seconds"])


@pytest.mark.slow
def test_a_plan_that_fails_on_one_process_stops_every_process(results):
    first, second = results["multi"]
    for case, own in FAILS_ON_ONE.items():
        mine, theirs = second[case], first[case]
        assert mine is not None and mine["type"] == own, (case, mine)
        assert theirs is not None and theirs["code"] == "SR112", (case, theirs)
        assert (
            "process 1 stopped on errors that this process (process 0 of 2) did not find" in theirs["message"]
        )
        assert mine["seconds"] < 10 and theirs["seconds"] < 10, (case, mine["seconds"], theirs["seconds"])
    # After all that, the processes are still in step: the same calls with the same rules go through.
    for r in results["multi"]:
        assert r["init_after_total"] == pytest.approx(results["multi"][0]["init_after_total"])
        assert r["jit_after_total"] == 2 * sum(range(64))


NO_DEVICE = {
    "apply": "apply(group='params')",
    "apply_local": "apply(group='params')",  # process_local=True
    "apply_off": "apply(group='params')",  # verify="off"
    "init": "init(group='params')",
    "checkpoint": "load_checkpoint(",
    "orbax": "load_orbax(",
    "reshard": "reshard(group='params')",
    "jit": "jit(",
    "shard_map": "shard_map(",
}


@pytest.mark.slow
def test_a_mesh_without_devices_of_a_process_stops_every_process_alike(results):
    # A mesh over jax.devices()[:4]: all of process 0's devices, none of process 1's.
    # Process 1 could not put its shards (JAX raises there) while process 0 would
    # return its arrays: every entry point stops both, with the same error, at once.
    first, second = results["multi"]
    for case, what in NO_DEVICE.items():
        mine, theirs = first[f"no_device_{case}"], second[f"no_device_{case}"]
        for me, found in enumerate((mine, theirs)):
            assert found is not None, f"{case}: process {me} went on with a mesh that leaves out process 1"
            assert found["type"] == "ProcessMismatchError" and found["code"] == "SR112", (case, me, found)
            assert found["message"].startswith(f"SR112 {what}"), (case, found["message"])
            assert "the mesh holds no device of process 1, only devices of process 0" in found["message"]
            assert f"(this is process {me} of 2)" in found["message"]
            assert "nothing was moved" in found["message"] and "jax.devices()" in found["message"]  # the fix
            assert found["seconds"] < 10, (case, me, found["seconds"])
        # The same words on both processes, but for which process says them.
        assert mine["message"].replace("process 0 of 2", "process 1 of 2") == theirs["message"], case
    for r in results["multi"]:
        assert r["no_device_moves"] == []  # no data moved on either process
        assert r["no_device_after_total"] == 2016.0  # and they go on together
    # A mesh only process 1 builds that way: its own error there, SR112 naming it on process 0.
    mine, theirs = second["no_device_on_one"], first["no_device_on_one"]
    assert mine["code"] == "SR112" and "the mesh holds no device of process 1" in mine["message"]
    assert theirs["code"] == "SR112", theirs
    assert "process 1 stopped on errors that this process (process 0 of 2) did not find" in theirs["message"]
    assert mine["seconds"] < 10 and theirs["seconds"] < 10


@pytest.mark.slow
def test_a_bad_argument_on_one_process_still_joins_the_comparison(results):
    first, second = results["multi"]
    own = second["verify_bogus_on_one"]
    assert own is not None and own["type"] == "ValueError" and "verify='bogus'" in own["message"]
    theirs = first["verify_bogus_on_one"]
    assert theirs is not None and theirs["code"] == "SR112", theirs
    assert "process 1 stopped on errors that this process (process 0 of 2) did not find" in theirs["message"]
    assert theirs["seconds"] < 10


@pytest.mark.slow
def test_a_process_that_died_is_named_before_jax_gives_up(results):
    (survivor, _) = results["dead_peer"]
    found = survivor["dead_peer"]
    assert found is not None, "apply went on without the process that exited"
    assert found["type"] == "ProcessMismatchError" and found["code"] == "SR114", found
    assert "process 1 did not join" in found["message"] and "this is process 0 of 2" in found["message"]
    assert "within 3 s" in found["message"] and "SHARDRULES_JOIN_TIMEOUT" in found["message"]
    assert "crashed" in found["message"]  # the hint: read its log
    # SHARDRULES_JOIN_TIMEOUT=3: well before gloo's 30 s and JAX's 100 s heartbeat.
    assert 2.5 < found["seconds"] < 10, found["seconds"]


@pytest.mark.slow
def test_large_device_leaves_are_compared_by_a_sample_taken_on_the_devices(results):
    for me, r in enumerate(results["multi"]):
        # NumPy on process 0, a sharded jax.Array on process 1, the same values: they agree.
        assert r["device_leaf_agrees"] == pytest.approx(r["device_leaf_expected"], rel=1e-6)
        differs = r["device_leaf_differs"]
        assert differs is not None and differs["code"] == "SR112"
        assert f"embed: values differ from those on process {1 - me}" in differs["message"]


# ------------------------------------------------- the comparison, in one process


def _table(rows: list[np.ndarray], longest: int) -> np.ndarray:
    table = np.zeros((longest, rows[0].size), np.uint32)
    table[: len(rows)] = np.stack(rows)
    return table


def test_mismatches_names_paths_shapes_and_processes():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = a.copy()
    b[2, 3] = -1
    mine = [
        _fingerprint.fingerprint("w", a.shape, a.dtype, _fingerprint.data_hash(a, "sample")),
        _fingerprint.fingerprint("v", (4,), np.float32, None),
        _fingerprint.fingerprint("only/here", (2,), np.int32, None),
    ]
    theirs = [
        _fingerprint.fingerprint("w", b.shape, b.dtype, _fingerprint.data_hash(b, "sample")),
        _fingerprint.fingerprint("v", (5,), np.float16, None),
        _fingerprint.fingerprint("only/there", (2,), np.int32, None),
        _fingerprint.fingerprint("also/there", (2,), np.int32, None),
    ]
    headers = np.array([[3, 0], [4, 0]], np.uint32)
    tables = np.stack([_table(mine, 4), _table(theirs, 4)])
    found = _agree.mismatches(["w", "v", "only/here"], headers, tables, 0)
    assert found == [
        ("w", "w: values differ from those on process 1", "values"),
        ("v", "v: (4,) float32 here, (5,) float16 on process 1", "tree"),
        ("only/here", "only/here: only on this process, not on process 1", "tree"),
        (None, "process 1 has 2 leaves that this process lacks (its error names them)", "tree"),
    ]
    error = _agree.mismatch_error(found, 0, 2, "apply(group='params')", local=False)
    assert error.code == "SR112" and error.path == "w"
    assert "the processes do not hold the same tree" in str(error)
    # verify='off' drops only the values from the comparison: the hint says so where values differ.
    assert "verify='off' skips the comparison of the values (not of the plan and the mesh)" in error.hint
    shapes_only = _agree.mismatch_error(found[1:], 0, 2, "apply(group='params')", local=False)
    assert "verify='off'" not in shapes_only.hint
    # Processes holding different slices (process-local data) compare shapes only.
    assert (
        _agree.mismatches(["w"], np.array([[1, 0], [1, 0]], np.uint32), tables[:, :1], 0, [[True, False]])
        == []
    )
    # A process that stopped before making its table is not compared with: it is
    # only reported as having failed.
    stopped = np.array([[3, 0], [0, _agree.NO_TABLE]], np.uint32)
    empty = np.stack([_table(mine, 3), np.zeros((3, mine[0].size), np.uint32)])
    assert _agree.mismatches(["w", "v", "only/here"], stopped, empty, 0) == []
    assert _agree.failed_elsewhere(stopped, 0) == [1] and _agree.failed_elsewhere(stopped, 1) == []
    error = _agree.failed_elsewhere_error([1], 0, 2, "load_checkpoint('m.safetensors')", cause="read it")
    assert type(error).__name__ == "ProcessMismatchError" and error.code == "SR112"
    assert "process 1 stopped on errors" in str(error) and "read it" in str(error)


def test_sample_hash_reads_a_sample_and_full_reads_everything():
    big = np.zeros(_fingerprint.SAMPLE_BYTES // 4 * 3, np.float32)  # 3 MiB
    changed = big.copy()
    changed[5000] = 1.0  # bytes 20000-20003: between the first two sampled runs (0-4 KiB, 48-52 KiB)
    assert _fingerprint.data_hash(big, "sample") == _fingerprint.data_hash(changed, "sample")
    assert _fingerprint.data_hash(big, "full") != _fingerprint.data_hash(changed, "full")
    changed[-1] = 1.0  # the last bytes are always sampled
    assert _fingerprint.data_hash(big, "sample") != _fingerprint.data_hash(changed, "sample")
    strided = np.arange(4 << 20, dtype=np.float32).reshape(2048, 2048)[:, ::2]
    assert _fingerprint.data_hash(strided, "sample") != _fingerprint.data_hash(strided + 1, "sample")
    small = np.ones((4, 4), np.float32)
    assert _fingerprint.data_hash(small, "sample") == _fingerprint.data_hash(small.copy(), "sample")
    wider = small.astype(np.float64)
    assert _fingerprint.data_hash(small, "sample") != _fingerprint.data_hash(wider, "sample")


def test_sample_hash_of_a_device_array_copies_only_the_sample(monkeypatch, mesh42):
    values = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB
    P = jax.sharding.PartitionSpec
    arrays = [
        jax.device_put(values, jax.sharding.NamedSharding(mesh42, spec))
        for spec in (P("data", "model"), P(None, "model"), P())  # split, partly and fully replicated
    ]
    explicit = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    arrays.append(jax.device_put(values, jax.sharding.NamedSharding(explicit, P("data", "model"))))
    arrays.append(jax.device_put(values, jax.devices()[3]))  # one device
    want = _fingerprint.data_hash(values, "sample")
    assert _fingerprint.data_hash(np.asfortranarray(values), "sample") == want  # a strided copy: the same
    copied: list[int] = []  # bytes copied from the devices to the host
    hashed: list[int] = []  # bytes the hasher reads
    array_type = type(arrays[0])
    real_array = array_type.__array__

    def counting_array(self, *args, **kwargs):
        copied.append(self.nbytes)
        return real_array(self, *args, **kwargs)

    class CountingHash:
        def __init__(self, *args, **kwargs):
            self.inner = hashlib.blake2b(*args, **kwargs)

        def update(self, data):
            hashed.append(memoryview(data).nbytes)
            self.inner.update(data)

        def digest(self):
            return self.inner.digest()

    monkeypatch.setattr(array_type, "__array__", counting_array)
    monkeypatch.setattr(_fingerprint, "hashlib", types.SimpleNamespace(blake2b=CountingHash))
    sample = 65 * 4096  # 64 evenly spaced runs of 4 KiB and the last 4 KiB
    for x in arrays:
        copied.clear()
        hashed.clear()
        # The same hash as for the same values in NumPy (another process may pass those).
        assert _fingerprint.data_hash(x, "sample") == want
        # One gather on the devices: only the sampled elements are copied to the host.
        assert sum(copied) <= sample, f"{sum(copied)} bytes copied to the host for a 4 MiB array"
        assert sum(hashed) <= sample + 100
    changed = values.copy()
    changed[-1, -1] += 1  # the last bytes are always sampled
    other = jax.device_put(changed, arrays[0].sharding)
    assert _fingerprint.data_hash(other, "sample") != want
    assert _fingerprint.data_hash(other, "sample") == _fingerprint.data_hash(changed, "sample")


def test_regions_are_computed_once_per_shape_and_spec(monkeypatch, mesh42):
    rules = sr.loads('rules inputs:\n  "a|b|c" -> (data, _)\n  "d" -> (_, model)\n')
    tree = {k: np.ones((8, 4), np.float32) for k in "abcd"}
    the_plan, leaves = compile_leaves(tree, rules, mesh42, "inputs")
    calls: list[tuple[int, ...]] = []
    real = jax.sharding.NamedSharding.devices_indices_map

    def counting(self, shape):
        calls.append(tuple(shape))
        return real(self, shape)

    monkeypatch.setattr(jax.sharding.NamedSharding, "devices_indices_map", counting)
    rows, same, specs = _multihost._fingerprints(the_plan, leaves, mesh42, "sample", False, True)
    assert len(rows) == 4 and same == [[True]] * 4
    assert sorted(specs.values()) == ["P('data', None)", "P(None, 'model')"]
    assert len(calls) == 2  # (8, 4) under (data, _) for a, b, c; under (_, model) for d


def test_one_process_meets_no_one(monkeypatch, mesh42):
    # With one process, no entry point exchanges anything, and sr.jit does not call its hook.
    def no_exchange(*args, **kwargs):
        raise AssertionError("an exchange with one process")

    hooked: list[str] = []
    monkeypatch.setattr(_exchange, "exchange", no_exchange)
    monkeypatch.setattr(_jit, "_agreement", lambda what, planned: hooked.append(what))
    rules = sr.loads('mesh data, model\nrules params:\n  "w$" -> (data, model)\n')
    w = {"w": np.ones((8, 8), np.float32)}
    for verify in ("sample", "off"):
        sr.apply(w, rules, mesh42, verify=verify)
    made = sr.init(lambda: {"w": jax.numpy.ones((8, 8))}, rules, mesh42)()
    sr.reshard(made, rules, mesh42)
    sr.jit(lambda p: p, rules, mesh42, in_groups="params", out_groups="params")(made)
    assert hooked == []


def test_the_first_call_of_a_step_meets_the_other_processes(monkeypatch, mesh42):
    # With several processes, sr.jit's first call of each signature hands its
    # layouts to the meeting; later calls with that signature do not.
    met: list[tuple[str, jax.sharding.Mesh, list]] = []

    def meeting(what, planned):
        met.append((what, *planned()))

    rules = sr.loads(
        'mesh data, model\nrules params:\n  "w$" -> (data, model)\nrules activations:\n  "h" -> (data, _)\n'
    )

    def scoped(p):
        with jax.named_scope("h"):
            return jax.tree.map(lambda x: x + 1, p)

    step = sr.jit(scoped, rules, mesh42, in_groups="params", out_groups="params")
    made = sr.apply({"w": np.ones((8, 8), np.float32)}, rules, mesh42)
    taller = sr.apply({"w": np.ones((16, 8), np.float32)}, rules, mesh42)
    monkeypatch.setattr(_jit, "_agreement", meeting)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    step(made)
    step(made)
    step(taller)
    assert len(met) == 2 and all(what.startswith("jit(") for what, _, _ in met)
    _, mesh, layouts = met[0]
    assert mesh is mesh42
    P = jax.sharding.PartitionSpec
    assert layouts[:2] == [
        ("in/0/w", None, None, P("data", "model")),
        ("out/w", None, None, P("data", "model")),
    ]
    assert layouts[2][0] == "rules activations" and layouts[2][3].startswith("1 rule #")


def test_layout_rows_compare_what_a_spec_means():
    P = jax.sharding.PartitionSpec
    rows, texts = _meeting.layout_rows(
        [
            ("a", None, None, P("data")),
            ("b", None, None, P("data", None)),  # the same layout, written longer
            ("c", (8, 8), np.float32, P("data")),
            ("d", (8, 8), np.float32, P("data", None)),
            ("e", None, None, P("model")),
            ("f", None, None, "3 rules #abcd"),
            ("g", None, None, None),
        ]
    )
    spec = [tuple(row[_fingerprint.SPEC]) for row in rows]
    assert spec[0] == spec[1] and spec[2] == spec[3] and spec[0] != spec[4]
    assert spec[5] != (0, 0) and spec[6] == (0, 0)  # zeros: not compared
    assert "3 rules #abcd" in texts.values() and "P('model',)" in texts.values()  # what messages show


def test_verify_modes_and_one_process(mesh42):
    assert _fingerprint.check_mode("sample") == "sample"
    assert _fingerprint.check_mode(False) == "off"
    assert _fingerprint.check_mode(True) == "sample"
    rules = sr.loads('mesh data, model\nrules inputs:\n  "x" -> (data, _)\n')
    with pytest.raises(ValueError, match="'sample', 'full', 'off'"):
        sr.apply({"x": np.ones((8, 2))}, rules, mesh42, group="inputs", verify="fast")
    with pytest.raises(ValueError, match=r"verify=1: .*True for 'sample', False for 'off'"):
        sr.apply({"x": np.ones((8, 2))}, rules, mesh42, group="inputs", verify=1)
    on = sr.apply({"x": np.ones((8, 2))}, rules, mesh42, group="inputs", verify=True)["x"]
    assert str(on.sharding.spec) == "P('data', None)"
    # One process holds the whole batch: process-local data is the global array.
    x = np.arange(16.0).reshape(8, 2)
    local = sr.apply({"x": x}, rules, mesh42, group="inputs", process_local=True)["x"]
    assert local.shape == (8, 2) and str(local.sharding.spec) == "P('data', None)"
    np.testing.assert_array_equal(np.asarray(local), x)


def test_specs_and_meshes_that_differ_are_named():
    P = jax.sharding.PartitionSpec
    # What a spec means is hashed, not how it is written.
    assert _fingerprint.spec_words(P("data"), 2) == _fingerprint.spec_words(P(("data",), None), 2)
    assert _fingerprint.spec_words(P("data", "model"), 2) != _fingerprint.spec_words(P("model", "data"), 2)
    mine = [_fingerprint.fingerprint("w", (8, 8), np.float32, None, P("data", "model"))]
    theirs = [_fingerprint.fingerprint("w", (8, 8), np.float32, None, P("model", "data"))]
    tables = np.stack([_table(mine, 1), _table(theirs, 1)])
    texts = {0: "P('data', 'model')", 1: "P('model', 'data')"}
    headers = np.array([[1, 0], [1, 0]], np.uint32)
    found = _agree.mismatches(["w"], headers, tables, 0, spec_text=lambda q, words: texts[q])
    assert found == [("w", "w: P('data', 'model') here, P('model', 'data') on process 1", "layout")]
    error = _agree.mismatch_error(found, 0, 2, "apply(group='params')", local=False)
    assert error.code == "SR112" and "the processes plan different layouts" in str(error)
    assert "same rule file" in error.hint and "seed random" not in error.hint
    # Without the other process's text (no key-value store), the line still says what differs.
    (line,) = _agree.mismatches(["w"], headers, tables, 0)
    assert line[1] == "w: another spec here, another spec on process 1"
    # Meshes: the axes, else their types, else the order of the devices.
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    flipped = jax.make_mesh((4, 2), ("model", "data"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    explicit = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    reordered = jax.sharding.Mesh(np.array(jax.devices()[::-1]).reshape(2, 4), ("data", "model"))
    reordered = jax.sharding.Mesh(reordered.devices, ("data", "model"), axis_types=mesh.axis_types)
    words, here = _fingerprint.mesh_fingerprint(mesh)
    others = {q: _fingerprint.mesh_fingerprint(m) for q, m in enumerate([flipped, explicit, reordered], 1)}
    assert all(not np.array_equal(w, words) for w, _ in others.values())
    assert np.array_equal(_fingerprint.mesh_fingerprint(mesh)[0], words)
    lines = [line for _, line, _ in _agree.mesh_differences(here, {q: d for q, (_, d) in others.items()})]
    assert lines == [
        "mesh: data=2 × model=4 here, model=4 × data=2 on process 1",
        "mesh axis types: (Auto, Auto) here, (Explicit, Explicit) on process 2",
        "mesh devices: [0, 1, 2, 3, 4, 5, 6, 7] here, [7, 6, 5, 4, 3, 2, 1, 0] on process 3",
    ]
    error = _agree.mismatch_error(_agree.mesh_differences(here, {1: None}), 0, 2, "apply", local=False)
    text = str(error)
    assert "the processes do not use the same mesh" in text and "another mesh on process 1" in text
    assert "jax.make_mesh" in error.hint


class FakeStore:
    """JAX's key-value store as a dict, with a clock of its own (`now`): a key
    that is not there moves the clock on by the timeout and times out."""

    def __init__(self):
        self.values: dict[str, bytes] = {}
        self.waits: list[tuple[str, int]] = []
        self.now = 0.0

    def key_value_set_bytes(self, key, value, allow_overwrite=False):
        self.values[key] = bytes(value)

    def blocking_key_value_get_bytes(self, key, timeout_in_ms):
        if key in self.values:
            return self.values[key]
        self.waits.append((key, timeout_in_ms))
        self.now += timeout_in_ms / 1000
        raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")

    def key_value_delete(self, key):
        self.values.pop(key, None)

    def key_value_increment(self, key, increment):
        count = int(self.values.get(key, b"0")) + increment
        self.values[key] = str(count).encode()
        return count


def test_processes_that_do_not_post_are_named_sr114(monkeypatch):
    store = FakeStore()
    record = np.arange(10, dtype=np.uint32)
    store.values["shardrules/agree/0/record/1"] = (record + 1).tobytes()
    store.values["shardrules/agree/0/details/1"] = b'{"specs": {"1,2": "P(\'data\')"}}'
    monkeypatch.setattr(_exchange, "time", types.SimpleNamespace(monotonic=lambda: store.now))
    with pytest.raises(sr.ProcessMismatchError) as caught:
        _exchange._join(store, 0, 4, record, {}, "apply(group='params')", 2.0)
    error = caught.value
    assert error.code == "SR114" and "processes 2, 3 did not join" in str(error)
    assert "within 2 s (this is process 0 of 4)" in str(error) and "SHARDRULES_JOIN_TIMEOUT" in error.hint
    # One wait of the whole timeout for process 2, then none for process 3: 2 s in all.
    (first, waited), (second, then) = store.waits
    assert first.endswith("record/2") and waited == 2000 and second.endswith("record/3") and then == 1
    # This process posted its record and details under round 0; the next call is round 1.
    assert np.array_equal(np.frombuffer(store.values["shardrules/agree/0/record/0"], np.uint32), record)
    for q in (2, 3):
        store.values[f"shardrules/agree/1/record/{q}"] = record.tobytes()
        store.values[f"shardrules/agree/1/details/{q}"] = b"{}"
    store.values["shardrules/agree/1/record/1"] = record.tobytes()
    store.values["shardrules/agree/1/details/1"] = b'{"specs": {"1,2": "P(\'data\')"}}'
    records, read = _exchange._join(store, 0, 4, record, {"specs": {}}, "apply", 2.0)
    assert records.shape == (4, 10) and (records == record).all()
    assert read(1)["specs"] == {"1,2": "P('data')"} and read(0) == {"specs": {}}
    # Round 1 complete: every process is past round 0, so this process's keys of it are gone.
    assert not any(k.startswith("shardrules/agree/0/") and k.endswith("/0") for k in store.values)
    # Another distributed client (jax.distributed initialised again): counting starts over.
    other = FakeStore()
    with pytest.raises(sr.ProcessMismatchError):
        _exchange._join(other, 1, 2, record, {}, "apply", 0.01)
    assert "shardrules/agree/0/record/1" in other.values


def test_exchange_gathers_tables_only_when_they_differ(monkeypatch):
    store = FakeStore()
    monkeypatch.setattr(_exchange, "_client", lambda: store)
    monkeypatch.setattr(jax, "process_index", lambda: 0)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    gathered: list[np.ndarray] = []
    rows = [_fingerprint.fingerprint("w", (8,), np.float32, (1, 2))]
    other_rows = [_fingerprint.fingerprint("w", (8,), np.float32, (3, 4))]

    def post_other(n: int, rows: list[np.ndarray], mesh: np.ndarray) -> None:
        # What process 1 posts in round n, as _exchange does.
        table = np.stack(rows)
        record = np.zeros(10, np.uint32)
        record[0:2] = len(table), 0
        record[2:6] = np.frombuffer(hashlib.blake2b(table.tobytes(), digest_size=16).digest(), np.uint32)
        record[6:10] = mesh
        store.values[f"shardrules/agree/{n}/record/1"] = record.tobytes()
        store.values[f"shardrules/agree/{n}/details/1"] = b"{}"

    def allgather(x):
        gathered.append(x)
        return np.stack([x, _table(other_rows, len(x))])

    monkeypatch.setattr(_exchange, "_allgather", allgather)
    mesh = np.array([1, 2, 3, 4], np.uint32)
    post_other(0, rows, mesh)
    got = _exchange.exchange(rows, False, what="apply", mesh=mesh)
    assert gathered == [] and np.array_equal(got.tables[1], got.tables[0])  # the same: nothing gathered
    post_other(1, other_rows, mesh)
    got = _exchange.exchange(rows, False, what="apply", mesh=mesh)
    assert len(gathered) == 1 and np.array_equal(got.tables[1][0], other_rows[0])
    post_other(2, other_rows, mesh + 1)
    got = _exchange.exchange(rows, False, what="apply", mesh=mesh)
    assert len(gathered) == 1 and got.other_meshes(0) == [1]  # meshes differ: no tables gathered


def test_the_join_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("SHARDRULES_JOIN_TIMEOUT", raising=False)
    assert _exchange.join_timeout() == 60
    monkeypatch.setenv("SHARDRULES_JOIN_TIMEOUT", "2.5")
    assert _exchange.join_timeout() == 2.5
    for bad in ("soon", "0", "-1", "inf"):
        monkeypatch.setenv("SHARDRULES_JOIN_TIMEOUT", bad)
        with pytest.raises(ValueError, match=f"SHARDRULES_JOIN_TIMEOUT='{bad}': give the seconds"):
            _exchange.join_timeout()
        assert _exchange.join_timeout(strict=False) == 60


def test_a_process_that_fails_alone_raises_its_own_error_even_if_no_one_joins(monkeypatch):
    store = FakeStore()
    monkeypatch.setattr(_exchange, "_client", lambda: store)
    monkeypatch.setattr(jax, "process_index", lambda: 0)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setenv("SHARDRULES_JOIN_TIMEOUT", "0.01")
    with pytest.raises(KeyError, match="its own"), _multihost.joining_on_error(True, what="apply"):
        raise KeyError("its own")
    # It joined as failed, with no table.
    record = np.frombuffer(store.values["shardrules/agree/0/record/0"], np.uint32)
    assert list(record[0:2]) == [0, _agree.NO_TABLE]


# ------------------------------------------------- bytes per host, without devices


def test_host_pieces_follow_the_device_order():
    P = jax.sharding.PartitionSpec
    across = {"data": 2, "model": 4}  # hosts hold devices 0-3 and 4-7: one `data` row each
    assert list(_hosts.leaf_host_bytes(10, P("data", None), across, 2)) == [10, 10]  # its own shard, once
    assert list(_hosts.leaf_host_bytes(10, P("model", None), across, 2)) == [40, 40]  # all 4 `model` shards
    assert list(_hosts.leaf_host_bytes(10, P(("data", "model")), across, 2)) == [40, 40]
    assert list(_hosts.leaf_host_bytes(10, P(None), across, 2)) == [10, 10]
    within = {"model": 4, "data": 2}  # now host 0 has model 0-1 × data 0-1
    assert list(_hosts.leaf_host_bytes(10, P("data", None), within, 2)) == [20, 20]
    assert list(_hosts.leaf_host_bytes(10, P("model", "data"), within, 2)) == [40, 40]
    assert list(_hosts.leaf_host_bytes(10, P("model", None), within, 4)) == [10, 10, 10, 10]


def test_hosts_that_do_not_fit_the_mesh_are_refused(tmp_path, capsys):
    assert _hosts.check_hosts({"data": 16, "model": 8}, 16) == 8
    with pytest.raises(_hosts.HostsError, match="128 devices, which do not split evenly over 3 hosts"):
        _hosts.check_hosts({"data": 16, "model": 8}, 3)
    with pytest.raises(_hosts.HostsError, match="needs mesh sizes"):
        _hosts.check_hosts(None, 2)
    rules = tmp_path / "r.shard"
    rules.write_text('mesh data, model\nrules params:\n  "w" -> (data, model)\n')
    shapes = tmp_path / "s.json"
    shapes.write_text('{"w": [[64, 64], "float32"]}')
    args = ["explain", str(rules), "--shapes", str(shapes), "--mesh", "data=16,model=8"]
    assert cli_main([*args, "--hosts", "3"]) == 2
    assert "do not split evenly over 3 hosts" in capsys.readouterr().err
    assert cli_main([*args, "--hosts", "16"]) == 0
    out = capsys.readouterr().out
    # (64, 64) float32 over 128 devices: 128 B each; a host's 8 devices hold 8 different `model` shards.
    assert "per host" in out.splitlines()[0]
    assert out.splitlines()[1].split()[-4:] == ["128", "B", "1.0", "KiB"]
    assert "bytes per host (16 hosts × 8 devices): 1.0 KiB on its devices, 1.0 KiB distinct" in out
    assert (
        cli_main(["lint", str(rules), "--shapes", str(shapes), "--mesh", "data=16,model=8", "--hosts", "16"])
        == 0
    )
    assert "128 B per device; bytes per host (16 hosts × 8 devices)" in capsys.readouterr().out


@pytest.mark.slow
def test_checkpoint_each_process_reads_only_its_byte_ranges(results):
    """The bytes each process reads from the file (counted in the reader, and
    by the kernel: /proc/self/io `rchar`) are those of its own devices'
    slices, half of the sharded tensors, and what `Plan.load_cost` predicts."""
    (single,) = results["single"]
    data = single["ranged"]["file_data_bytes"]
    assert data == (1024 * 1024 + 256 * 1024 + 64) * 4
    assert single["ranged"]["bytes"] == data  # alone: every byte once
    assert single["ranged"]["predicted"] == {
        "reads": single["ranged"]["reads"],
        "bytes": data,
        "devices": list(range(8)),
    }
    half = (1024 * 1024 + 256 * 1024) * 4 // 2 + 64 * 4
    for r in results["multi"]:
        got = r["ranged"]
        assert got["values_equal"]
        assert got["my_devices"] == got["predicted"]["devices"]  # the host model: consecutive devices
        assert got["bytes"] == half  # its own rows, and the replicated norm
        assert (got["reads"], got["bytes"]) == (got["predicted"]["reads"], got["predicted"]["bytes"])
        # what the kernel saw: the reads above, and a little of the key-value store's traffic
        assert half <= got["rchar"] < half + 64 * 1024, got["rchar"]
        assert got["rchar"] < 0.6 * data
