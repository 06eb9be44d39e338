"""The bundled examples run to completion from any working directory, with the mesh's
Explicit axes (the default) and with `--auto-axes`; the training examples end with
the same loss on Explicit axes, on Auto axes and on one device; and their rule files
are in the canonical layout.

Each run is the script as `python script FLAGS` runs it, but a few worker processes
share the runs (tests/_examples_runner.py: JAX starts once per worker, and the runs
go side by side); a run that needs a device count of its own (FRESH) gets a process
of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from _examples_runner import DEVICE_FLAG, Pool, clean_env

import shardrules as sr

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# Entry points: scripts directly inside an example folder that run as `__main__`.
SCRIPTS = sorted(p for p in EXAMPLES.glob("*/*.py") if 'if __name__ == "__main__":' in p.read_text())
RULE_FILES = sorted(EXAMPLES.rglob("*.shard"))
# Scripts that build a mesh take `--auto-axes`; those that train take `--one-device` too.
MESH_SCRIPTS = [p for p in SCRIPTS if "--auto-axes" in p.read_text()]
TRAINING_SCRIPTS = [p for p in SCRIPTS if "--one-device" in p.read_text()]
NO_MESH = {"from_pmap/train_pmap.py"}  # jax.pmap: no mesh, no flags
TRAINING = {
    "equinox/train.py",
    "flax_linen/train.py",
    "flax_nnx/train.py",
    "from_pmap/train_jit.py",
    "mlp/train.py",
    "multihost/launch.py",
    "optax/train.py",
    "shard_map/train.py",
    "torchax/train.py",
    "transformer/train.py",
}
# The line a training example ends with (the last line that mentions the loss).
LOSS = re.compile(r"\bloss (-?\d+\.\d+) -> (-?\d+\.\d+)$")
# The flags whose final loss must match the default run's.
SAME_LOSS_FLAGS = ("--auto-axes", "--one-device")
# Runs that need a process of their own: the multihost example's `--one-device` run
# starts JAX on 1 device (the examples share processes that started JAX on 8).
FRESH = {("multihost/launch.py", ("--one-device",))}
# Processes the example runs share (tests/_examples_runner.py): the runs are independent.
WORKERS = max(1, min(4, len(os.sched_getaffinity(0))))

Run = Callable[..., subprocess.CompletedProcess]


def _name(path: Path) -> str:
    return path.relative_to(EXAMPLES).as_posix()


def _runs_of(item: pytest.Item) -> list[tuple[Path, tuple[str, ...]]]:
    """The example runs a collected test of this module reads."""
    params = getattr(item, "callspec", None)
    name = getattr(item, "originalname", "")
    if params is None or item.path != Path(__file__):
        return []
    if name == "test_example_runs":
        return [(params.params["script"], params.params["flags"])]
    if name == "test_final_loss_is_the_same_on_every_mesh":
        script = params.params["script"]
        return [(script, ()), *((script, (flag,)) for flag in SAME_LOSS_FLAGS)]
    return []


@pytest.fixture(scope="module")
def run_example(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """`run(script, *flags)`: the script's completed process, run once per module and
    flags in a fresh directory; it sets up its own devices (no XLA_FLAGS or JAX_PLATFORMS
    given). The runs the selected tests read are started at once, shared among a few
    worker processes (see tests/_examples_runner.py), each run as `python script FLAGS`
    would run it; the result's `setup` is the environment at the script's first import
    outside the standard library (None for a run in a process of its own)."""
    wanted = dict.fromkeys(run for item in request.session.items for run in _runs_of(item))
    jobs = [(script, flags, (_name(script), flags) in FRESH) for script, flags in wanted]
    pool = Pool(tmp_path_factory.mktemp("examples"), jobs, WORKERS) if jobs else None
    done: dict[tuple[Path, tuple[str, ...]], subprocess.CompletedProcess] = {}

    def run(script: Path, *flags: str) -> subprocess.CompletedProcess:
        if (script, flags) in done:
            return done[script, flags]
        if pool is not None and (script, flags) in pool:
            done[script, flags] = pool.result(script, flags)
        else:  # a run no collected test announced: a process of its own
            done[script, flags] = subprocess.run(
                [sys.executable, str(script), *flags],
                cwd=tmp_path_factory.mktemp(script.parent.name),
                env=clean_env(),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            done[script, flags].setup = None  # type: ignore[attr-defined]
        return done[script, flags]

    try:
        yield run
    finally:
        if pool is not None:
            pool.close()


def _output(result: subprocess.CompletedProcess) -> str:
    return f"{' '.join(result.args[1:])}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def _assert_sets_up_its_devices(result: subprocess.CompletedProcess) -> None:
    """A run in a shared process (JAX already started there): the script had set up its own
    8 CPU devices by its first import outside the standard library, as a fresh process needs."""
    setup = getattr(result, "setup", None)
    if setup is not None:
        flags = (setup["XLA_FLAGS"] or "").split()
        assert DEVICE_FLAG in flags and setup["JAX_PLATFORMS"] == "cpu", (
            f"{setup} when the script first imported {setup['module']!r}\n{_output(result)}"
        )


def _losses(result: subprocess.CompletedProcess) -> tuple[float, float]:
    """(A, B) from the `loss A -> B` line a training run ends with."""
    assert result.returncode == 0, _output(result)
    assert "ShardRulesWarning" not in result.stderr, _output(result)
    _assert_sets_up_its_devices(result)
    lines = [line for line in result.stdout.splitlines() if "loss" in line]
    assert lines, _output(result)
    found = LOSS.search(lines[-1])
    assert found, f"the last line about the loss is not `loss A -> B`: {lines[-1]!r}\n{_output(result)}"
    return float(found[1]), float(found[2])


def test_examples_are_found() -> None:
    """The globs find the bundled examples, so the tests below cannot pass on none."""
    assert EXAMPLES / "mlp" / "train.py" in SCRIPTS, f"example scripts found: {SCRIPTS}"
    assert EXAMPLES / "mlp" / "mlp.shard" in RULE_FILES, f"rule files found: {RULE_FILES}"
    # Every script but the pmap one builds a mesh and takes `--auto-axes`; the ones
    # that train take `--one-device` too (a new training example must join TRAINING).
    assert {_name(p) for p in SCRIPTS} - {_name(p) for p in MESH_SCRIPTS} == NO_MESH
    assert {_name(p) for p in TRAINING_SCRIPTS} == TRAINING


MODES = [pytest.param(p, (), id=_name(p)) for p in SCRIPTS] + [
    pytest.param(p, ("--auto-axes",), id=f"{_name(p)}-auto-axes") for p in MESH_SCRIPTS
]


@pytest.mark.slow
@pytest.mark.parametrize(("script", "flags"), MODES)
def test_example_runs(script: Path, flags: tuple[str, ...], run_example: Run) -> None:
    """The script exits 0 with Explicit axes (the default) and with `--auto-axes`."""
    result = run_example(script, *flags)
    output = _output(result)
    assert result.returncode == 0, output
    assert result.stdout.strip(), output
    assert "ShardRulesWarning" not in result.stderr, output  # the examples' rules fit their trees
    _assert_sets_up_its_devices(result)
    if script.stem == "train":
        assert "loss" in result.stdout, output
    if _name(script) not in NO_MESH and any(LOSS.search(line) for line in result.stdout.splitlines()):
        assert _name(script) in TRAINING, f"{_name(script)} prints a loss: add it to TRAINING"


@pytest.mark.slow
@pytest.mark.parametrize("script", TRAINING_SCRIPTS, ids=_name)
def test_final_loss_is_the_same_on_every_mesh(script: Path, run_example: Run) -> None:
    """`loss A -> B` is the same (to float32 rounding; printed with 6 decimals) on the
    default mesh's Explicit axes, with `--auto-axes` and on one device (`--one-device`):
    the layout changes where the numbers are computed, not what they are."""
    explicit = _losses(run_example(script))
    for flag in SAME_LOSS_FLAGS:
        np.testing.assert_allclose(
            _losses(run_example(script, flag)), explicit, rtol=1e-4, err_msg=f"{_name(script)} {flag}"
        )


@pytest.mark.parametrize("rule_file", RULE_FILES, ids=_name)
def test_example_rules_are_formatted(rule_file: Path) -> None:
    """`shardrules fmt --check` would pass on every example rule file."""
    text = rule_file.read_text()
    assert sr.format_text(text, name=str(rule_file)) == text
