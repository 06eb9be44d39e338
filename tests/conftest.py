"""Every test runs with 8 simulated CPU devices (set before JAX starts).

Hypothesis runs the `ci` profile (100 examples a property, derandomized);
`HYPOTHESIS_PROFILE=deep` runs 2,000 a property, from fresh random seeds.

XLA builds the CPU code with LLVM's cheap passes only, and a program compiled twice
in one run is loaded from a compilation cache the run starts empty (below).

With pytest-xdist installed (the `test` extra installs it), a run given no `-n`
shares its test files among one worker process per CPU (at most 4), each test
file whole in one worker (`--dist loadfile`), so that a module's fixtures are
still built once; `-n 0` (or `-p no:xdist`) runs in this one process.

The tests listed in tests/slow_tests.txt (measured: see tests/_slow_tests.py) are
marked `slow`; `-m "not slow"` runs the quick subset, which
tests/test_quick_subset.py checks keeps tests of every test file."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("KERAS_BACKEND", "jax")  # keras-hub models in tests/test_real_models.py run on JAX
# 8 simulated CPU devices; and XLA's CPU code built with LLVM's cheap passes only, since no test
# measures how fast the compiled code runs and compiling is most of the suite's time (the HLO
# passes, which decide shardings and collectives, are the same). A flag already given is kept.
for _flag in (
    "--xla_force_host_platform_device_count=8",
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
):
    if _flag.split("=")[0] + "=" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True)
settings.register_profile("deep", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

assert jax.device_count() == 8, f"tests need 8 simulated CPU devices, got {jax.devices()}"

# One compilation cache for the run, in a folder of its own that starts empty and is removed at
# exit: a program compiled once in this process (the same step costed by several tests, an
# example's step that the command line compiles again) is loaded from it, not compiled again.
# A cache folder given in JAX_COMPILATION_CACHE_DIR is used instead (and kept).
if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    _cache = tempfile.mkdtemp(prefix="shardrules-tests-xla-cache-")
    atexit.register(shutil.rmtree, _cache, True)
    jax.config.update("jax_compilation_cache_dir", _cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

WORKERS = min(4, len(os.sched_getaffinity(0)))  # processes a run shares its test files among


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """With pytest-xdist installed and no `-n` given (nor `--pdb`, `--collect-only`,
    nor inside a worker): `-n WORKERS --dist loadfile`, before xdist reads those options."""
    if not config.pluginmanager.hasplugin("xdist") or "PYTEST_XDIST_WORKER" in os.environ:
        return
    if config.option.numprocesses is not None or config.option.usepdb or config.option.collectonly:
        return
    if WORKERS > 1:
        config.option.numprocesses = WORKERS
        if config.option.dist == "no":
            config.option.dist = "loadfile"


SLOW_TESTS = Path(__file__).with_name("slow_tests.txt")
# what collection found: per test file, how many tests it has and how many of them are not
# marked slow; and the entries of tests/slow_tests.txt, in a file collected, naming no test
QUICK = pytest.StashKey[dict[str, tuple[int, int]]]()
STALE = pytest.StashKey[list[str]]()
SKIPPED_FILES: set[str] = set()  # test files skipped whole while collected (a missing optional library)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped and report.nodeid.startswith("tests/test_") and "::" not in report.nodeid:
        SKIPPED_FILES.add(report.nodeid)


def slow_tests() -> set[str]:
    """The test ids tests/slow_tests.txt lists (each line `SECONDS TEST-ID`; `#` starts a comment)."""
    lines = (line.strip() for line in SLOW_TESTS.read_text(encoding="utf-8").splitlines())
    return {line.split(maxsplit=1)[1] for line in lines if line and not line.startswith("#")}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks `slow` the tests tests/slow_tests.txt lists, before `-m` and `-k` select; and
    records what the quick subset (`-m "not slow"`) keeps of each test file collected."""
    slow = slow_tests()
    counts: dict[str, tuple[int, int]] = {}
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)
        total, quick = counts.get(item.nodeid.split("::")[0], (0, 0))
        counts[item.nodeid.split("::")[0]] = (total + 1, quick + (item.get_closest_marker("slow") is None))
    config.stash[QUICK] = counts
    ids = {item.nodeid for item in items}
    config.stash[STALE] = sorted(t for t in slow if t.split("::")[0] in counts and t not in ids)


@pytest.fixture
def mesh222() -> jax.sharding.Mesh:
    """A 2×2×2 mesh named data, fsdp, model (Auto axes)."""
    return jax.make_mesh((2, 2, 2), ("data", "fsdp", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 3)


@pytest.fixture
def mesh42() -> jax.sharding.Mesh:
    """A 4×2 mesh named data, model (Auto axes)."""
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
