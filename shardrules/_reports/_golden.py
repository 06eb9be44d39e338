"""`assert_plan_matches`: a plan compared with a checked-in dump (a golden file),
for tests. Imports no test framework: a mismatch is an `AssertionError`, which
pytest (or unittest) reports with the message."""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from pathlib import Path
from typing import Any

from .._planning._plan import Plan
from ._costfile import RTOL, checked, cost_changes
from ._dump import dumps, table_of
from ._dumpread import loads
from ._plandiff import compare
from ._rulebytes import has_rules, moved_lines

UPDATE_VARIABLE = "SHARDRULES_UPDATE_GOLDEN"
SHOWN_LINES = 40  # lines of the file's diff shown in the message


def _updating(update: bool | None) -> bool:
    if update is not None:
        return update
    return os.environ.get(UPDATE_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


def assert_plan_matches(
    plan: Plan,
    path: str | os.PathLike[str],
    *,
    cost: Any = None,
    rtol: float = RTOL,
    update: bool | None = None,
) -> None:
    """Check that `plan` is the plan a golden file holds (a `shardrules dump`),
    and, with `cost`, that the step costs what the file records.

    **Arguments:**

    - `plan`: the plan to check, e.g. `sr.plan(jax.eval_shape(init), rules, mesh)`.
    - `path`: the golden file, checked in next to the test.
    - `cost`: a step's `StepCost` (`step.cost(*args)`) under these rules:
      the file records it (as `shardrules dump --step` does), and a later
      run fails when its FLOPs, their ratio to the ideal, peak or accessed
      bytes, or a kind of collective's count or bytes moved by more than
      `rtol`, or a kind of collective came or went. A cost for a target
      (`step.cost(*args, target="v5p:8x8x4")`) is recorded with it (version
      3 of the file), and fails as well when the target is another (or came
      or went), when the peak fits the chip's memory and did not (or the
      other way), or when the estimated step time moved by more than
      `rtol`. A cost with its collectives per rule line (`by_rule`) is
      recorded with them (version 4), so that a failure names the rule
      lines whose collectives moved. A file that records a cost needs one.
    - `rtol`: how far (relative) each recorded figure may move, default 2%:
      what another XLA release may shift without any change of layout.
    - `update`: write `plan` (and `cost`) to `path` instead of comparing
      (and pass). By default, when the environment variable
      `SHARDRULES_UPDATE_GOLDEN` is set (to anything but `0`, `false` or `no`).

    **Raises:** `TypeError`/`ValueError` for a `cost` that is not a step's
    cost, or an `rtol` that is not a number of at least 0. `AssertionError`
    when the file is missing, or holds another plan or cost: the message is the plan diff (`shardrules diff`'s text), what the
    cost changed (where the collectives moved, the rule lines whose bytes
    moved, golden -> plan, most first), and the first lines of the file's diff, and says how to
    refresh the file. The plan's own error, if it has one.

    ```python
    sr.assert_plan_matches(sr.plan(shapes, rules, mesh), "tests/data/golden/llama.json")
    sr.assert_plan_matches(plan, "tests/data/golden/llama-step.json", cost=step.cost(params, batch))
    ```
    """
    if isinstance(rtol, bool) or not isinstance(rtol, (int, float)) or not 0 <= rtol < math.inf:
        raise ValueError(f"rtol= is a relative tolerance, a number of at least 0 (0.02 is 2%), not {rtol!r}")
    plan.raise_for_errors()
    table = table_of(plan)
    if cost is not None:  # checked as a reader would check it: never a file no reader takes
        table = dataclasses.replace(table, step_cost=checked(cost, folder=os.path.dirname(plan.rules.name)))
    text = dumps(table)
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
    summary = ""
    try:
        held = loads(expected)
    except ValueError as err:  # not a plan file
        held, summary = None, f"{golden}: {err}"
    costs: list[str] = []
    if held is not None:
        summary = compare(held, table).text(("golden", "plan"))
        if held.step_cost is not None and cost is None:
            raise AssertionError(
                f"{golden} records a step's cost: pass it, "
                "sr.assert_plan_matches(plan, path, cost=step.cost(*args)), or refresh the file without one "
                f"({refresh})"
            )
        if held.step_cost is None and cost is not None:
            raise AssertionError(
                f"{golden} records no step cost, and cost= was given: {refresh} to record it, or leave "
                f"cost= out to compare the layouts alone\n{summary}"
            )
        if held.step_cost is not None and table.step_cost is not None:
            costs = cost_changes(held.step_cost, table.step_cost, rtol)
            plain = dataclasses.replace(held, step_cost=None), dataclasses.replace(table, step_cost=None)
            if not costs and dumps(plain[0]) == dumps(plain[1]):
                return  # the same plan, each figure of the cost within rtol
    lines = list(
        difflib.unified_diff(
            expected.splitlines(), text.splitlines(), f"{golden} (golden)", "plan", lineterm="", n=0
        )
    )
    more = len(lines) - SHOWN_LINES
    shown = "\n".join(lines[:SHOWN_LINES]) + (f"\n... and {more} more lines" if more > 0 else "")
    changed = "".join(f"\n  {line}" for line in costs)
    cost_text = f"\nthe step's cost changed by more than {rtol:.0%}:{changed}" if costs else ""
    if held is not None and held.step_cost is not None and table.step_cost is not None:
        cost_text += rule_moves(held.step_cost, table.step_cost, costs, golden, refresh)
    raise AssertionError(
        f"the plan differs from {golden}; {refresh} if the change is meant\n{summary}{cost_text}\n{shown}"
    )


def rule_moves(
    old: dict[str, Any], new: dict[str, Any], changes: list[str], golden: Path, refresh: str
) -> str:
    """Where the collectives moved (a kind's count or bytes among `changes`):
    the rule lines whose collective bytes moved, golden -> plan, most first,
    from the `by_rule` each cost records; or why that is not known."""
    if not any(line.startswith(_KINDS) for line in changes):
        return ""
    if not has_rules(old):
        return (
            f"\n{golden} does not record the collectives per rule line (a file written before `by_rule`, "
            f"version 4), so which rule line moved them is not known; {refresh} (or `shardrules dump --step`) "
            "to record them"
        )
    if not has_rules(new):
        return "\ncost= records no collectives per rule line (a StepCost from step.cost(*args) does)"
    lines = moved_lines(old.get("by_rule") or [], new.get("by_rule") or [], count=8)
    shown = "".join(f"\n  {line}" for line in lines) or "\n  none: each rule line's bytes are as recorded"
    return f"\ncollective bytes per device per step by rule line, golden -> plan, most changed first:{shown}"


_KINDS = ("all-gather ", "all-reduce ", "reduce-scatter ", "all-to-all ", "collective-permute ")
