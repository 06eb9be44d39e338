"""Checks that the quick subset (`python -m pytest -m "not slow"`) runs every module of
the package: for each module under shardrules/, some line inside one of its functions
ran (a module without functions: some line of it ran, i.e. it was imported). Not a
test module: pytest does not collect it. Needs coverage.py (`pip install coverage`).

    python tests/_quick_coverage.py [PYTEST-ARGS...]

runs `python -m pytest -m "not slow" -p no:xdist PYTEST-ARGS` under coverage (in one
process, and in the Python processes the tests start), prints each module that
the subset does not run, and exits 1 if there is one (or if the subset fails)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "shardrules"


def function_lines(source: str) -> set[int]:
    """The first line of each statement inside a function (or method) of the module."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in node.body:
                lines.update(n.lineno for n in ast.walk(inner) if isinstance(n, ast.stmt))
    return lines


def unexercised(executed: dict[Path, set[int]]) -> list[str]:
    """The package's modules with no function line run (without functions: no line run)."""
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        ran = executed.get(path, set())
        inside = function_lines(path.read_text(encoding="utf-8"))
        if not (ran & inside if inside else ran):
            missing.append(path.relative_to(ROOT).as_posix())
    return missing


def main(args: list[str]) -> int:
    import coverage  # only this check needs it

    with tempfile.TemporaryDirectory() as folder:
        rc = Path(folder, "coveragerc")
        data = Path(folder, ".coverage")
        rc.write_text(f"[run]\nsource = {PACKAGE}\ndata_file = {data}\nparallel = true\n")
        # every Python process measures itself: pytest's and those the tests start (`python -m shardrules`)
        Path(folder, "sitecustomize.py").write_text("import coverage\ncoverage.process_startup()\n")
        path = os.pathsep.join(filter(None, [folder, str(ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path, "COVERAGE_PROCESS_START": str(rc)}
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            "not slow",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
        ]
        command += ["-q", *args]
        status = subprocess.run(command, cwd=ROOT, env=env, check=False).returncode
        cov = coverage.Coverage(data_file=str(data), config_file=str(rc))
        cov.combine(data_paths=[folder])
        measured = cov.get_data()
        executed = {Path(f).resolve(): set(measured.lines(f) or ()) for f in measured.measured_files()}
    missing = unexercised(executed)
    modules = len(list(PACKAGE.rglob("*.py")))
    for name in missing:
        print(f"not run by the quick subset: {name}")
    print(
        f"{modules - len(missing)} of {modules} modules of shardrules/ run by the quick subset; pytest exited {status}"
    )
    return 1 if missing or status else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
