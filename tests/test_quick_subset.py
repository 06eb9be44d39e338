"""The quick subset, `python -m pytest -m "not slow"`, keeps tests of every test file.

tests/conftest.py marks `slow` the tests tests/slow_tests.txt lists (measured by
tests/_slow_tests.py) and records, per test file collected, how many of its tests
the quick subset keeps. That every module of the package runs in the quick subset
is checked by `python tests/_quick_coverage.py` (line coverage of the subset)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import QUICK, SKIPPED_FILES, STALE, slow_tests

TESTS = Path(__file__).resolve().parent


def _collected_every_test_file(config: pytest.Config) -> dict[str, tuple[int, int]]:
    counts = config.stash[QUICK]
    files = {f"tests/{p.name}" for p in TESTS.glob("test_*.py")} - SKIPPED_FILES
    if not files <= counts.keys():
        pytest.skip(
            f"checks a run over the whole tests folder; this one collected {len(counts)} of {len(files)} files"
        )
    return counts


def test_every_test_file_keeps_tests_in_the_quick_subset(pytestconfig: pytest.Config) -> None:
    """No test file has all its tests marked slow (nor none collected), but one that
    skips whole as it is collected (its optional library missing), as in the whole suite."""
    counts = _collected_every_test_file(pytestconfig)
    empty = sorted(name for name, (_, quick) in counts.items() if quick == 0)
    assert not empty, f"test files with no test in the quick subset (-m 'not slow'): {empty}"


def test_the_slow_list_names_only_tests_that_exist(pytestconfig: pytest.Config) -> None:
    """Every entry of tests/slow_tests.txt in a file collected names a collected test:
    a renamed test is not left out of the quick subset, nor in it, by accident."""
    stale = pytestconfig.stash[STALE]
    assert not stale, f"tests/slow_tests.txt names tests that are not collected: {stale}"


def test_the_slow_list_marks_the_tests_it_names(request: pytest.FixtureRequest) -> None:
    """The marking is real: a listed test collected in this run carries the `slow` marker."""
    listed = slow_tests()
    assert listed, "tests/slow_tests.txt lists no test"
    marked = [item for item in request.session.items if item.nodeid in listed]
    assert all(item.get_closest_marker("slow") for item in marked)
    assert request.node.get_closest_marker("slow") is None  # this check itself is in the quick subset
