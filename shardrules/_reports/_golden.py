"""`assert_plan_matches`: a plan compared with a checked-in dump (a golden file),
for tests. Imports no test framework: a mismatch is an `AssertionError`, which
pytest (or unittest) reports with the message."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from .._planning._plan import Plan
from ._dump import table_of
from ._dumpread import loads
from ._plandiff import compare

UPDATE_VARIABLE = "SHARDRULES_UPDATE_GOLDEN"
SHOWN_LINES = 40  # lines of the file's diff shown in the message


def _updating(update: bool | None) -> bool:
    if update is not None:
        return update
    return os.environ.get(UPDATE_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


def assert_plan_matches(plan: Plan, path: str | os.PathLike[str], *, update: bool | None = None) -> None:
    """Check that `plan` is the plan a golden file holds (a `shardrules dump`).

    **Arguments:**

    - `plan`: the plan to check, e.g. `sr.plan(jax.eval_shape(init), rules, mesh)`.
    - `path`: the golden file, checked in next to the test.
    - `update`: write `plan` to `path` instead of comparing (and pass). By
      default, when the environment variable `SHARDRULES_UPDATE_GOLDEN` is set
      (to anything but `0`, `false` or `no`).

    **Raises:** `AssertionError` when the file is missing, or holds another plan:
    the message is the plan diff (`shardrules diff`'s text) and the first lines
    of the file's diff, and says how to refresh the file. The plan's own error,
    if it has one.

    ```python
    sr.assert_plan_matches(sr.plan(shapes, rules, mesh), "tests/data/golden/llama.json")
    ```
    """
    text = plan.to_json()
    golden = Path(path)
    if _updating(update):
        golden.parent.mkdir(parents=True, exist_ok=True)
        if not golden.is_file() or golden.read_text(encoding="utf-8") != text:
            golden.write_text(text, encoding="utf-8")
        return
    refresh = f"to write it from this plan, run the test with {UPDATE_VARIABLE}=1"
    if not golden.is_file():
        raise AssertionError(f"no golden plan file {golden}; {refresh}")
    expected = golden.read_text(encoding="utf-8")
    if expected == text:
        return
    lines = list(
        difflib.unified_diff(
            expected.splitlines(), text.splitlines(), f"{golden} (golden)", "plan", lineterm="", n=0
        )
    )
    more = len(lines) - SHOWN_LINES
    shown = "\n".join(lines[:SHOWN_LINES]) + (f"\n... and {more} more lines" if more > 0 else "")
    try:
        summary = compare(loads(expected), table_of(plan)).text(("golden", "plan"))
    except ValueError as err:  # not a plan file
        summary = f"{golden}: {err}"
    raise AssertionError(
        f"the plan differs from {golden}; {refresh} if the change is meant\n{summary}\n{shown}"
    )
