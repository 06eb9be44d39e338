"""`shardrules.transfer` on JAX's multi-controller runtime: 2 processes × 4 CPU
devices (tests/transfer_worker.py, `jax.distributed` on 127.0.0.1 with gloo).

The trainer's mesh (data=3, model=2) spans devices 0-5, of both processes;
the rollout's (model=2) is the last two devices, of process 1 only. Pieces
between the processes travel in `ppermute` rounds; each process must send
only from its own devices and receive only on them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("transfer_worker.py")
TIMEOUT = 120


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    folder = tmp_path_factory.mktemp("transfer")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    port = _free_port()
    children = []
    try:
        for process in range(2):
            log = (folder / f"stderr-{process}.txt").open("w")
            children.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), str(folder), str(process), "2", str(port)],
                    env=env,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + TIMEOUT
        for process, child in enumerate(children):
            try:
                code = child.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"process {process} still running after {TIMEOUT}s")
            if code != 0:
                tail = (folder / f"stderr-{process}.txt").read_text()[-3000:]
                pytest.fail(f"process {process} exited with {code}:\n{tail}")
    finally:
        for child in children:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
    return [json.loads((folder / f"result-{p}.json").read_text()) for p in range(2)]


def _ok(run: dict, name: str) -> dict:
    got = run[name]
    if "error" in got:
        pytest.fail(
            f"process {run['process']}: {name} raised {got['error']}: {got['message']}\n{got['trace']}"
        )
    return got


PROCESS_1_DEVICES = [2048, 2049, 2050, 2051]  # JAX numbers a second process's CPU devices from 2048


def test_trainer_to_a_rollout_on_the_other_process(runs: list[dict]) -> None:
    first, second = (_ok(run, "trainer_to_rollout") for run in runs)
    # Process 0 holds no rollout device: it only sends, from its own devices.
    assert first["packed"] == [0, 1, 2, 3] and first["unpacked"] == []
    assert all(v["shards"] == 0 for v in first["values"].values())
    # Process 1 receives on its rollout devices, and what it holds is the tree.
    assert second["packed"] == [] and second["unpacked"] == [2050, 2051]
    assert all(v["shards"] == 2 and v["equal"] for v in second["values"].values())
    assert second["values"]["w"]["spec"] == "P(None, 'model')"
    assert first["bytes_moved"] == second["bytes_moved"] > 0
    assert first["sources_deleted"] and second["sources_deleted"]
    # While each chunk was in flight, no device of either process held more than it holds before
    # or after, plus the cap (64 bytes), plus one piece as bytes at both ends (twice its size).
    # (Process 0 only sends: its devices only shrink.)
    for run in (first, second):
        assert run["chunks"] > 3
        assert run["extra_in_flight"] <= 64 + 2 * run["largest_piece"], run
    assert second["extra_in_flight"] > 0


def test_rollout_back_to_the_trainer(runs: list[dict]) -> None:
    first, second = (_ok(run, "rollout_to_trainer") for run in runs)
    assert first["packed"] == [] and first["unpacked"] == [0, 1, 2, 3]
    assert second["packed"] == [2050, 2051] and second["unpacked"] == []
    for run, shards in ((first, 4), (second, 2)):
        assert all(v["shards"] == shards and v["equal"] for v in run["values"].values())
        assert run["values"]["w"]["spec"] == "P('data', 'model')"


def test_meshes_over_every_device_in_other_orders(runs: list[dict]) -> None:
    for run in runs:
        got = _ok(run, "overlapping")
        assert all(v["shards"] == 4 and v["equal"] for v in got["values"].values())
        assert got["values"]["w"]["spec"] == "P('model', 'data')"


def test_processes_that_plan_different_layouts_stop_before_anything_moves(runs: list[dict]) -> None:
    for run, other in zip(runs, reversed(runs), strict=True):
        got = run["disagreeing"]
        assert got.get("error") == "ProcessMismatchError", got
        assert "SR112 transfer.run" in got["message"]
        assert f"on process {other['process']}" in got["message"]
