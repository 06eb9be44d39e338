"""`shardrules dump` (a plan as JSON) and `shardrules diff` (two plans compared):
the plans of rule files with no devices, as lint makes them, or read from dumps."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from .._errors import ShardRulesError
from .._language._load import load
from .._planning._compile import compile_plan
from .._planning._plan import Plan
from .._reports._costfile import recorded
from .._reports._dump import Table, dumps, table_of
from .._reports._dumpread import loads
from .._reports._plandiff import compare
from . import _config, _lint, _options, _render, _rulediff, _step, _stepcost, _stepplans

EXIT_OK, EXIT_DIFFERENT, EXIT_ERROR = 0, 1, 2


class PlanFailed(Exception):
    """The rules do not plan for the shapes; the findings are printed already."""


def add_options(parser: argparse.ArgumentParser, *, sides: bool = False) -> None:
    """The options that say what to plan for (each may also come from `[tool.shardrules]`)."""
    _options.target_options(parser, sides=sides)


def _mesh(value: Any, where: str) -> dict[str, int] | None:
    if value is None or isinstance(value, dict):  # a dict: from the config, checked there
        return value
    return _lint.parse_mesh(value, where)


def _shapes(args: argparse.Namespace, diff: bool = False, step: bool = False) -> Any:
    if not args.shapes:
        also = (
            " (or, with two rule files, a step whose example arguments give them: --step MODULE:FUNCTION)"
            if diff
            else " (or a step whose example arguments give them: --step MODULE:FUNCTION)"
            if step
            else ""
        )
        raise _lint.UsageError(
            f"give the shapes to plan for: --shapes SOURCE, or shapes in [tool.shardrules]{also}"
        )
    return _lint.read_shapes(args.shapes, args.origins.get("shapes", "--shapes"))


def plan_file(path: str, tree: Any, mesh: dict[str, int] | None, group: str | None) -> Plan:
    """The plan of one rule file, made as lint makes it; when the rules do not
    plan, lint's findings are printed (stderr) and `PlanFailed` is raised."""
    the_plan: Plan | None = None
    try:
        rules = load(path)
        the_plan = compile_plan(tree, rules, _lint.sizes_for(rules, mesh), group or "params")
    except ShardRulesError:
        pass
    if the_plan is not None and the_plan.ok:
        return the_plan
    result = _lint.lint_file(path, tree, mesh, group=group)  # every finding, as lint shows them
    result.diagnostics = [d for d in result.diagnostics if d.severity == "error"]
    sys.stdout.flush()
    _render.write_text([result], sys.stderr)
    raise PlanFailed


def run_dump(args: argparse.Namespace) -> int:
    _config.apply(args, _config.for_paths([args.rules]))
    if args.target and not args.cost_step and "target" not in args.origins:
        raise _lint.UsageError("--target costs a step: give one with --step MODULE:FUNCTION")
    mesh = _mesh(args.mesh, args.origins.get("mesh", "--mesh"))
    made, cost = None, None
    try:
        if args.cost_step:
            made = _made_steps(args.cost_step, {"a": mesh}, {"a": args.rules}, args.target)
        if args.shapes or not args.cost_step:
            table = table_of(plan_file(args.rules, _shapes(args, step=True), mesh, args.group))
        else:  # the step's example argument of the group is the tree
            assert made is not None  # made above, for the step
            group = args.group or "params"
            trees = _stepplans.argument_trees(args.cost_step, *made["a"])
            _stepplans.chosen(args.cost_step, trees, group)

            def plan(tree: Any) -> Table:
                return table_of(plan_file(args.rules, tree, mesh, group))

            table = _stepplans.group_table(trees[group], plan)
        if made is not None:
            cost = _costs_of(args.cost_step, made, {"a": args.rules}, args.target)["a"]
    except PlanFailed:
        return EXIT_DIFFERENT
    except _StepFailed as failed:  # the rules do not trace the step: nothing is written
        sys.stdout.flush()
        print(f"{args.rules}: --step {args.cost_step}:\n{failed.error}", file=sys.stderr)
        return EXIT_DIFFERENT
    if args.cost_step:
        folder = os.path.dirname(args.rules)  # rule lines written as the leaves' are
        table = dataclasses.replace(table, step_cost=recorded(cost, args.cost_step, folder))
    _lint.write_output(dumps(table), args.output)
    return EXIT_OK


def is_dump(path: str) -> bool:
    """A plan file (`.json`) rather than a rule file."""
    return path.endswith(".json")


def read_dump(path: str) -> Table:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read
            raise _lint.UsageError(f"{path}: not a regular file (a folder, a FIFO, a device or a socket)")
        return loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _lint.UsageError(f"{path}: no such file") from None
    except (OSError, ValueError) as err:  # ValueError: not UTF-8, a NUL in the name, SR124 and its hint
        raise _lint.UsageError(f"{path}: {err}") from None


def _side_mesh(base: dict[str, int] | None, value: str | None, option: str) -> dict[str, int] | None:
    """`--mesh-a`/`--mesh-b`: sizes that change axes of the base mesh (`--mesh`,
    the settings' `mesh`, else the file's `mesh` line) when it has every axis
    they name, e.g. `fsdp=16`; else the whole mesh."""
    if value is None:
        return base
    sizes = _lint.parse_mesh(value, option)
    if base is not None and sizes is not None and set(sizes) <= set(base):
        return _lint.limit_devices({**base, **sizes}, f"{option} {value!r} over the base mesh")
    return sizes


def _file_sizes(path: str) -> dict[str, int] | None:
    """The sizes of a rule file's `mesh` line, when it gives them all."""
    if is_dump(path):
        return None
    try:
        decl = load(path).mesh
    except ShardRulesError:
        return None  # planning the file reports it
    if decl is None or not all(isinstance(axis.size, int) for axis in decl.axes):
        return None
    return {axis.name: int(axis.size) for axis in decl.axes}  # type: ignore[arg-type]


def _note_unused(args: argparse.Namespace) -> None:
    """Say which options given on the command line a dump ignores."""
    dumps = {side: is_dump(getattr(args, side)) for side in ("a", "b")}
    unused = [
        f"--mesh-{side} ({side.upper()} is a dump; it keeps its own mesh)"
        for side in ("a", "b")
        if dumps[side] and getattr(args, f"mesh_{side}") is not None
    ]
    if all(dumps.values()):
        origins = getattr(args, "origins", {})
        unused += [
            f"--{name} (both sides are dumps)"
            for name in ("mesh", "shapes", "group")
            if getattr(args, name) is not None and name not in origins
        ]
    for what in unused:
        print(f"shardrules diff: note: {what} is not used", file=sys.stderr)


def run_diff(args: argparse.Namespace) -> int:
    rule_files = [p for p in (args.b, args.a) if not is_dump(p)]
    _config.apply(args, _config.for_paths(rule_files[:1]))  # B's settings: the working copy's
    _note_unused(args)
    mesh = _mesh(args.mesh, args.origins.get("mesh", "--mesh"))
    meshes = {
        side: _side_mesh(
            mesh if mesh is not None or value is None else _file_sizes(getattr(args, side)),
            value,
            f"--mesh-{side}",
        )
        for side, value in (("a", args.mesh_a), ("b", args.mesh_b))
    }
    paths = {"a": args.a, "b": args.b}
    if "step" in args.origins and any(is_dump(p) for p in paths.values()):
        args.step = None  # `step` in [tool.shardrules] is for rule files: dumps bring their own costs
    if getattr(args, "target", None) and not getattr(args, "step", None) and "target" not in args.origins:
        raise _lint.UsageError("--target costs a step: give one with --step MODULE:FUNCTION")
    step: str | None = getattr(args, "step", None)
    from_step = step is not None and not args.shapes  # the step's example arguments give the trees
    try:
        made = None if step is None else _made_steps(step, meshes, paths, args.target)  # refuses dumps
        pairs = (
            _step_tables(step, made, meshes, paths, args)
            if step and made and from_step
            else _tables(args, meshes)
        )
        costs = _costs_of(step, made, paths, args.target) if step and made else _recorded_costs(pairs[0])
    except PlanFailed:
        return EXIT_ERROR
    except _StepFailed as failed:
        sys.stdout.flush()
        print(f"{failed.path}: --step {step}:\n{failed.error}", file=sys.stderr)
        return EXIT_ERROR
    diffs = [compare(tables["a"], tables["b"]) for tables in pairs]
    by_rule = None if costs is None else _rulediff.changes(costs)
    for note in () if costs is None else (_stepcost.target_note(costs), _rulediff.missing_note(costs)):
        if note is not None:
            print(f"shardrules diff: note: {note}", file=sys.stderr)
    if args.format == "json":
        found = _groups_json(diffs) if from_step else diffs[0].as_json()
        if costs is not None:
            found["step_cost"] = {side: cost.to_json() for side, cost in costs.items()}
            found["step_cost_by_rule"] = None if by_rule is None else [_rulediff.to_json(m) for m in by_rule]
        json.dump(found, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n\n".join(diff.text() for diff in diffs) + "\n")
        rich = _render.use_rich(sys.stdout)
        if costs is not None:
            sys.stdout.write("\n")
            _render.write_table(_stepcost.cost_rows(costs), sys.stdout, rich, _stepcost.COST_HEADER)
        if by_rule:
            sys.stdout.write("\n")
            _render.write_table(_rulediff.rows(by_rule), sys.stdout, rich, _rulediff.HEADER)
    return EXIT_OK if all(diff.equal for diff in diffs) else EXIT_DIFFERENT


class _StepFailed(Exception):
    """The step does not trace or compile under one side's rules (a `ShardRulesError`)."""

    def __init__(self, path: str, error: ShardRulesError) -> None:
        super().__init__(path)
        self.path, self.error = path, error


def _tables(args: argparse.Namespace, meshes: dict[str, dict[str, int] | None]) -> list[dict[str, Table]]:
    """The one pair of tables of `--shapes` (dumps: their own): A's and B's."""
    both_dumps = is_dump(args.a) and is_dump(args.b)
    tree = None if both_dumps else _shapes(args, diff=True)
    tables = {}
    for side in ("a", "b"):
        path = getattr(args, side)
        tables[side] = (
            read_dump(path) if is_dump(path) else table_of(plan_file(path, tree, meshes[side], args.group))
        )
    return [tables]


def _step_tables(
    step: str,
    made: dict[str, tuple[Any, tuple[Any, ...]]],
    meshes: dict[str, dict[str, int] | None],
    paths: dict[str, str],
    args: argparse.Namespace,
) -> list[dict[str, Table]]:
    """A pair of tables per group the step's `in_groups` name (`--group`: that
    one), each side's planned for its own example arguments."""
    trees = {side: _stepplans.argument_trees(step, *made[side]) for side in ("a", "b")}

    def plan(side: str, tree: Any, group: str) -> Table:
        return table_of(plan_file(paths[side], tree, meshes[side], group))

    return _stepplans.pairs(step, trees, args.group, plan)


def _groups_json(diffs: list[Any]) -> dict[str, Any]:
    """`diff --step --format json` with no `--shapes`: one diff per group."""
    return {"equal": all(d.equal for d in diffs), "groups": [d.as_json() for d in diffs]}


def _costs_of(
    step: str, made: dict[str, tuple[Any, tuple[Any, ...]]], paths: dict[str, str], target: str | None
) -> dict[str, Any]:
    """Each side's step (`_made_steps`) traced and compiled: its `StepCost`."""
    found = {}
    for side, (made_step, step_args) in made.items():
        try:
            found[side] = _stepcost.cost_of(step, made_step, step_args, target)
        except ShardRulesError as err:  # the rules do not trace the step
            raise _StepFailed(paths[side], err) from None
    return found


def _recorded_costs(tables: dict[str, Table]) -> dict[str, Any] | None:
    """The costs two dumps written with `dump --step` record (as `StepCost`s),
    when both do; a note on standard error when only one does."""
    from .._costs._cost import cost_from_json

    recorded_by = {side: table.step_cost for side, table in tables.items()}
    if all(cost is None for cost in recorded_by.values()):
        return None
    if any(cost is None for cost in recorded_by.values()):
        which = next(side.upper() for side, cost in recorded_by.items() if cost is not None)
        print(
            f"shardrules diff: note: only {which} records a step cost (dump --step); compare costs "
            "with two such dumps, or with --step MODULE:FUNCTION and two rule files",
            file=sys.stderr,
        )
        return None
    return {side: cost_from_json(cost) for side, cost in recorded_by.items() if cost is not None}


def _made_steps(
    spec: str, meshes: dict[str, dict[str, int] | None], paths: dict[str, str], target: str | None = None
) -> dict[str, tuple[Any, tuple[Any, ...]]]:
    """The step `spec` names and its example arguments under each side's rules
    and mesh (rule files, not dumps): both of `diff --step`'s, or `dump
    --step`'s one; traced later, for the chips `target` names when given."""
    found = {}
    for side, path in paths.items():
        if is_dump(path):
            raise _lint.UsageError(
                f"--step compiles the step under each side's rules: {path} is a dump, not a rule file"
            )
        try:
            rules = load(path)
        except ShardRulesError as err:
            raise _lint.UsageError(f"{path}: {err}") from None
        found[side] = (rules, meshes[side] if meshes[side] is not None else _file_sizes(path))
    _stepcost.start(found, target)
    made = {}
    for side, (rules, sizes) in found.items():
        try:
            made[side] = _step.make_step(spec, rules, sizes, target)
        except ShardRulesError as err:  # the rules refuse the step's own arguments or mesh
            raise _StepFailed(paths[side], err) from None
    return made


def _step_costs(
    spec: str, meshes: dict[str, dict[str, int] | None], paths: dict[str, str], target: str | None = None
) -> dict[str, Any]:
    """The cost of the step `spec` names under each side's rules and mesh."""
    made = _made_steps(spec, meshes, paths, target)
    return _costs_of(spec, made, paths, target)
