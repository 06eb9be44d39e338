"""Train a small MLP on 2 processes × 4 simulated CPU devices, as on 2 hosts.

`python examples/multihost/launch.py` starts this same file twice as workers
(`--process-id 0` and `1`) that join one `jax.distributed` run on 127.0.0.1.
Each worker sees 4 devices of its own and 8 in all; the mesh `data=2, model=4`
spans both. The rules in `multihost.shard` lay out the parameters (every
process passes the same copy; each puts only its own shards) and the batch
(each process loads only its own rows: `process_local=True`).

On a real cluster, run the worker part once per host with the coordinator's
address instead (see docs/multihost.md).

The mesh has JAX's default Explicit axes; `--auto-axes` builds it with Auto
axes (the launcher passes the flag on to the workers). `--one-device` runs the
same program as one process on one device (every mesh axis of size 1, the
batch loaded whole), as a reference.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RULES = Path(__file__).with_name("multihost.shard")
PROCESSES, DEVICES_PER_PROCESS = 2, 4
D_IN, D_HIDDEN, D_OUT, BATCH, STEPS, LEARNING_RATE = 16, 64, 4, 64, 20, 0.2


def worker(process_id: int, port: int | None, auto_axes: bool = False) -> int:
    """Process `process_id` of the run; with no `port`, the whole run in this process, on one device."""
    one_device = port is None
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = (
        f"--xla_force_host_platform_device_count={1 if one_device else DEVICES_PER_PROCESS}"
    )
    import jax
    import jax.numpy as jnp
    import numpy as np

    import shardrules as sr

    if not one_device:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives across processes
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=PROCESSES, process_id=process_id)
    rules = sr.load(RULES)
    types = (jax.sharding.AxisType.Auto,) * 2 if auto_axes else None
    if one_device:
        mesh = jax.make_mesh((1, 1), ("data", "model"), types, devices=jax.devices()[:1])
    else:
        mesh = jax.make_mesh((2, 4), ("data", "model"), types)

    # The same seed on every process: the same parameters (checked before they move).
    rng = np.random.default_rng(0)
    target = rng.standard_normal((D_IN, D_OUT)).astype(np.float32)
    params = {
        "up": {
            "kernel": rng.standard_normal((D_IN, D_HIDDEN)).astype(np.float32) / 4,
            "bias": np.zeros(D_HIDDEN, np.float32),
        },
        "down": {"kernel": rng.standard_normal((D_HIDDEN, D_OUT)).astype(np.float32) / 8},
    }
    params = sr.apply(params, rules, mesh)

    # Each process loads its own rows: a different seed per process, half the batch each
    # (on one device, this process loads every process's rows).
    local = np.concatenate(
        [
            np.random.default_rng(100 + i).standard_normal((BATCH // PROCESSES, D_IN)).astype(np.float32)
            for i in (range(PROCESSES) if one_device else [process_id])
        ]
    )
    batch = sr.apply(
        {"x": local, "y": np.tanh(local @ target)}, rules, mesh, group="inputs", process_local=True
    )

    def loss_fn(p, b):
        hidden = jax.nn.gelu(b["x"] @ p["up"]["kernel"] + p["up"]["bias"])
        return jnp.mean((hidden @ p["down"]["kernel"] - b["y"]) ** 2)

    def train_step(p, b):
        loss, grads = jax.value_and_grad(loss_fn)(p, b)
        return jax.tree.map(lambda w, g: w - LEARNING_RATE * g, p, grads), loss

    step = sr.jit(train_step, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None))
    losses = []
    for _ in range(STEPS):
        params, loss = step(params, batch)
        losses.append(float(loss))  # a replicated scalar: every process has it

    up = params["up"]["kernel"]
    print(
        f"process {process_id}: {jax.local_device_count()} of {jax.device_count()} devices; "
        f"local batch {local.shape} -> global {batch['x'].shape} {batch['x'].sharding.spec}; "
        f"up/kernel {up.shape} {up.sharding.spec}, {len(up.addressable_shards)} local shards of "
        f"{up.addressable_shards[0].data.shape}",
        flush=True,
    )
    if process_id == 0:
        for i in (0, STEPS // 2, STEPS - 1):
            print(f"step {i:3d}  loss {losses[i]:.4f}")
        print(f"loss {losses[0]:.6f} -> {losses[-1]:.6f}", flush=True)
    if not one_device:
        jax.distributed.shutdown()
    return 0 if losses[-1] < losses[0] else 1


def launch(timeout: float = 90, auto_axes: bool = False) -> int:
    """Start the workers, wait for them, and kill them all if one fails or hangs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    with contextlib.ExitStack() as stack:
        # Output to files, not pipes: a full pipe could stall one worker and so both.
        logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in range(PROCESSES)]
        children = [
            subprocess.Popen(
                [sys.executable, __file__, "--process-id", str(i), "--port", str(port)]
                + (["--auto-axes"] if auto_axes else []),
                env=env,
                stdout=logs[i],
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a process group of its own, to kill it whole
            )
            for i in range(PROCESSES)
        ]
        stack.callback(_kill, children)  # runs first on the way out, whatever happened
        deadline, status = time.monotonic() + timeout, 0
        for i, child in enumerate(children):
            try:
                child.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"process {i} did not finish in {timeout:.0f}s", file=sys.stderr)
                return 1
            logs[i].seek(0)
            output = "\n".join(line for line in logs[i].read().splitlines() if "[Gloo]" not in line)
            if child.returncode:
                print(f"process {i} exited with {child.returncode}:\n{output[-3000:]}", file=sys.stderr)
                status = 1
            else:
                print(output, flush=True)
        return status


def _kill(children: list[subprocess.Popen]) -> None:
    for child in children:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--process-id", type=int, help="run as this worker (the launcher passes it)")
    parser.add_argument("--port", type=int, help="the coordinator's port on 127.0.0.1")
    parser.add_argument("--auto-axes", action="store_true", help="build the mesh with Auto axes")
    parser.add_argument("--one-device", action="store_true", help="one process, every mesh axis of size 1")
    args = parser.parse_args(argv)
    if args.one_device:
        return worker(0, None, args.auto_axes)
    if args.process_id is None:
        return launch(auto_axes=args.auto_axes)
    return worker(args.process_id, args.port, args.auto_axes)


if __name__ == "__main__":
    sys.exit(main())
