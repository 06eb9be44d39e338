"""Runs the bundled examples for tests/test_examples.py in a few long-lived worker
processes, instead of one fresh Python process (and one start of JAX) per run.
Not a test module: pytest does not collect it (its name does not start with `test_`).

    python tests/_examples_runner.py FOLDER WORKER

`Pool` writes the runs to FOLDER/jobs.json and starts the workers; each worker
starts JAX once on 8 simulated CPU devices (what every example sets up for
itself; XLA's CPU code built with LLVM's cheap passes, as in the test session),
then takes the next run nobody has claimed (FOLDER/N.claim, made with
O_EXCL) until none is left, and writes its result to FOLDER/N.json. A run is
the script as `python script.py FLAGS` would run it: `runpy.run_path` as
`__main__`, `sys.argv` = [script, *FLAGS], the script's folder first on
`sys.path`, in a fresh working directory, with the test session's environment
less XLA_FLAGS and JAX_PLATFORMS, Python's warning filters as at start-up, and
file descriptors 1 and 2 going to the run's own files; its exit status is that
of `sys.exit` (1 and a traceback for an exception). Afterwards the worker puts
back what the run changed: the working directory, `sys.argv`, `sys.path`,
`os.environ`, the modules imported from the examples' folder (from_pmap's
`pmap_model`), JAX's configuration and its ambient mesh (`jax.set_mesh`).

Since JAX started before the script, the worker also records the environment
at the script's first import of a module outside the standard library
(`setup`), so the test can check that the script sets up its own devices
before it imports JAX, as a fresh process needs. A run marked `fresh` (one
that needs a device count of its own) is run by the worker as a subprocess.
A run still going after TIMEOUT seconds ends its worker, with every thread's
traceback in the run's stderr (`faulthandler`).
"""

from __future__ import annotations

import builtins
import contextlib
import faulthandler
import json
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

DEVICES = 8
DEVICE_FLAG = f"--xla_force_host_platform_device_count={DEVICES}"
# XLA's CPU code built with LLVM's cheap passes only, as in the test session (tests/conftest.py):
# the runs' results are the same, compiling them is quicker
CHEAP_CODE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
TIMEOUT = 120  # seconds for one run, as for one subprocess before
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def clean_env() -> dict[str, str]:
    """The test session's environment less what sets up JAX's devices: each example does that itself."""
    return {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}


# ---------------------------------------------------------------- the worker


def _write(path: Path, data: dict[str, Any]) -> None:
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(data))
    part.replace(path)  # whole or not at all: the test polls for it


def _exit_status(code: object) -> int:
    """What `sys.exit(code)` makes the exit status of a Python process (printing a message as Python does)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _run_fresh(script: Path, flags: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    try:
        done = subprocess.run(
            [sys.executable, str(script), *flags],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else err.stdout or ""
        err_text = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else err.stderr or ""
        return {"returncode": -9, "stdout": out, "stderr": f"{err_text}\n[still running after {TIMEOUT}s]"}
    return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr, "setup": None}


def _run_here(script: Path, flags: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run `script` in this process as `python script FLAGS` would, and put back what it changed."""
    import jax

    setup: dict[str, Any] = {}
    real_import = builtins.__import__

    def watch(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if (
            not setup
            and level == 0
            and isinstance(globals, dict)
            and globals.get("__file__") == str(script)
            and name.partition(".")[0] not in sys.stdlib_module_names
        ):
            setup.update(
                module=name,
                XLA_FLAGS=os.environ.get("XLA_FLAGS"),
                JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS"),
            )
        return real_import(name, globals, locals, fromlist, level)

    config = dict(jax.config.values)
    modules = set(sys.modules)
    saved = os.getcwd(), list(sys.argv), list(sys.path), sys.stdout, sys.stderr
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = [str(script), *flags]
    sys.path.insert(0, str(script.parent))
    builtins.__import__ = watch
    try:
        with warnings.catch_warnings():  # Python's filters as at start-up; "shown once" starts afresh
            warnings.onceregistry.clear()
            try:
                runpy.run_path(str(script), run_name="__main__")
                returncode = 0
            except SystemExit as exit_:
                returncode = _exit_status(exit_.code)
            except BaseException:
                traceback.print_exc()
                returncode = 1
    finally:
        builtins.__import__ = real_import
        os.chdir(saved[0])
        sys.argv[:], sys.path[:] = saved[1], saved[2]
        sys.stdout, sys.stderr = saved[3], saved[4]
        for name in set(sys.modules) - modules:
            file = getattr(sys.modules[name], "__file__", None) or ""
            if Path(file).resolve().is_relative_to(EXAMPLES):
                del sys.modules[name]
        for name, value in config.items():
            if jax.config.values.get(name) != value:
                jax.config.update(name, value)
        if not jax.sharding.get_abstract_mesh().empty or not jax.sharding.get_mesh().empty:
            jax.set_mesh(None)
    return {"returncode": returncode, "setup": setup or None}


def _captured(folder: Path, index: int, run: Any) -> dict[str, Any]:
    """`run()` with file descriptors 1 and 2 (and so sys.stdout, sys.stderr) going to the run's files."""
    out_path, err_path = folder / f"{index}.stdout", folder / f"{index}.stderr"
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with out_path.open("wb") as out, err_path.open("wb") as err:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            faulthandler.dump_traceback_later(TIMEOUT, exit=True)  # to fd 2: the run's stderr
            try:
                result = run()
            finally:
                faulthandler.cancel_dump_traceback_later()
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        os.close(saved[0])
        os.close(saved[1])
    result.setdefault("stdout", out_path.read_text(errors="replace"))
    result.setdefault("stderr", err_path.read_text(errors="replace"))
    return result


def worker(folder: Path, number: int) -> int:
    jobs = json.loads((folder / "jobs.json").read_text())
    env = clean_env()
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {DEVICE_FLAG} {CHEAP_CODE}".strip()
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    assert jax.device_count() == DEVICES, jax.devices()
    os.environ.clear()
    os.environ.update(env)
    for index, job in enumerate(jobs):
        try:
            claim = os.open(folder / f"{index}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.write(claim, str(number).encode())
        os.close(claim)
        cwd = folder / f"{index}-{Path(job['script']).parent.name}"
        cwd.mkdir()
        run = _run_fresh if job["fresh"] else _run_here
        result = _captured(
            folder, index, lambda job=job, cwd=cwd, run=run: run(Path(job["script"]), job["flags"], cwd, env)
        )
        _write(folder / f"{index}.json", result)
    return 0


# ---------------------------------------------------------------- the test side


class Pool:
    """Workers running `jobs` ((script, flags, fresh) each) in `folder`; `result(script, flags)`
    waits for one run and gives it as the `CompletedProcess` of `python script FLAGS`, with
    `setup` added (see the module's docstring)."""

    def __init__(self, folder: Path, jobs: list[tuple[Path, tuple[str, ...], bool]], workers: int):
        self.folder = folder
        self.index = {(script, flags): i for i, (script, flags, _) in enumerate(jobs)}
        data = [
            {"script": str(script), "flags": list(flags), "fresh": fresh} for script, flags, fresh in jobs
        ]
        (folder / "jobs.json").write_text(json.dumps(data))
        self.logs: list[Path] = []
        self.workers: list[subprocess.Popen] = []
        for number in range(min(workers, len(jobs))):
            log = folder / f"worker-{number}.log"
            with log.open("w") as out:
                self.workers.append(
                    subprocess.Popen(
                        [sys.executable, __file__, str(folder), str(number)],
                        env=clean_env(),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # its own process group, killed whole in close()
                    )
                )
            self.logs.append(log)

    def __contains__(self, run: tuple[Path, tuple[str, ...]]) -> bool:
        return run in self.index

    def result(self, script: Path, flags: tuple[str, ...]) -> subprocess.CompletedProcess:
        index = self.index[script, flags]
        done, claim = self.folder / f"{index}.json", self.folder / f"{index}.claim"
        while not done.exists():
            owner = claim.read_text() if claim.exists() else ""
            lost = (owner and self.workers[int(owner)].poll() is not None) or all(
                w.poll() is not None for w in self.workers
            )
            if lost and not done.exists():
                return self._lost(index, script, flags, int(owner) if owner else None)
            time.sleep(0.05)
        data = json.loads(done.read_text())
        result = subprocess.CompletedProcess(
            [sys.executable, str(script), *flags], data["returncode"], data["stdout"], data["stderr"]
        )
        result.setup = data.get("setup")  # type: ignore[attr-defined]
        return result

    def _lost(
        self, index: int, script: Path, flags: tuple[str, ...], owner: int | None
    ) -> subprocess.CompletedProcess:
        """The run whose worker died (or that no worker is left to run), as a failed process."""

        def read(path: Path) -> str:
            return path.read_text(errors="replace") if path.exists() else ""

        where = (
            f"worker {owner} exited with {self.workers[owner].returncode} during this run; its log:\n"
            + read(self.logs[owner])[-3000:]
            if owner is not None
            else "every worker exited before this run started"
        )
        stderr = read(self.folder / f"{index}.stderr") + f"\n[{where}]"
        result = subprocess.CompletedProcess(
            [sys.executable, str(script), *flags], 1, read(self.folder / f"{index}.stdout"), stderr
        )
        result.setup = None  # type: ignore[attr-defined]
        return result

    def close(self) -> None:
        for child in self.workers:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.wait()


if __name__ == "__main__":
    sys.exit(worker(Path(sys.argv[1]), int(sys.argv[2])))
