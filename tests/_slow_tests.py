"""Writes tests/slow_tests.txt, the tests marked `slow` (left out of the quick subset,
`python -m pytest -m "not slow"`), from the durations of a measured run of the whole
suite in one process. Not a test module: pytest does not collect it.

    python -m pytest -n 0 -p no:cacheprovider --durations=0 -vv > durations.txt
    python tests/_slow_tests.py durations.txt [SECONDS [WHERE]]

A test is slow when its setup, call and teardown together took SECONDS (0.2 by
default) or more; in a test file whose every test is that slow, the fastest one
stays in the quick subset, so that every test file keeps a test there
(tests/test_quick_subset.py checks it); so do the tests in KEEP, each the quickest
test that runs a module of the package which no other test of the subset runs. WHERE (the machine, its load, the versions)
goes into the list's header. Each line of the list is `SECONDS TEST-ID`.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

LIST = Path(__file__).with_name("slow_tests.txt")
# Kept in the quick subset whatever they measure: the quickest test that runs a module of the
# package no test of the quick subset runs otherwise (`python tests/_quick_coverage.py` names such
# a module).
KEEP = {
    "tests/test_lint.py::test_lint_runs_as_a_console_command": "shardrules/__main__.py",
    "tests/test_step_cost.py::test_a_model_holding_its_own_mesh_gets_the_ideal_before_partitioning[scan]": (
        "shardrules/_costs/_unpartitioned.py"
    ),
    "tests/test_transfer_run.py::test_every_dtype_survives_the_crossing_between_processes[bool]": (
        "shardrules/_placement/_crossing.py"
    ),
}
DURATION = re.compile(r"^(?P<seconds>\d+\.\d+)s (?:setup|call|teardown)\s+(?P<test>tests/\S.*?)\s*$")
HEADER = """\
# The tests marked `slow` (tests/conftest.py), left out of the quick subset `python -m pytest -m "not slow"`:
# each took {threshold} s or more (setup, call and teardown) in a run of the whole suite in one process
# ({measured}). Written by `python tests/_slow_tests.py DURATIONS`; see that file. Each line: SECONDS TEST-ID.
"""


def durations(report: str) -> dict[str, float]:
    """Seconds per test id (setup, call and teardown added) in a `--durations=0 -vv` report."""
    seconds: dict[str, float] = defaultdict(float)
    for line in report.splitlines():
        found = DURATION.match(line)
        if found:
            seconds[found["test"]] += float(found["seconds"])
    return dict(seconds)


def slow(seconds: dict[str, float], threshold: float) -> dict[str, float]:
    """The tests that took `threshold` or more, less those in KEEP and the fastest of each
    file whose every test did."""
    by_file: dict[str, list[str]] = defaultdict(list)
    for test in seconds:
        by_file[test.split("::")[0]].append(test)
    out = {}
    for tests in by_file.values():
        over = [t for t in tests if seconds[t] >= threshold and t not in KEEP]
        if len(over) == len(tests):
            over.remove(min(over, key=lambda t: seconds[t]))
        out.update((t, seconds[t]) for t in over)
    return out


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 3:
        print(__doc__, file=sys.stderr)
        return 2
    threshold = float(argv[1]) if len(argv) >= 2 else 0.2
    seconds = durations(Path(argv[0]).read_text(encoding="utf-8"))
    if not seconds:
        print(f"no test durations in {argv[0]}: run pytest with --durations=0 -vv", file=sys.stderr)
        return 1
    chosen = slow(seconds, threshold)
    measured = argv[2] if len(argv) == 3 else "machine not stated"
    lines = [f"{chosen[t]:.2f} {t}" for t in sorted(chosen)]
    LIST.write_text(
        HEADER.format(threshold=threshold, measured=measured) + "\n".join(lines) + "\n", encoding="utf-8"
    )
    print(
        f"{len(chosen)} of {len(seconds)} tests slow ({sum(chosen.values()):.0f} s of {sum(seconds.values()):.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
