"""The lint job behind `shardrules lint` and `shardrules explain`: load a rule
file, plan it against shapes and a mesh description with no devices, and
collect every finding (`_render` prints them)."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._errors import Diagnostic, IncludeNotFoundError, ShardRulesError, ordered
from .._language._load import iter_rules, load_partial
from .._language._rules import RuleSet
from .._planning import _check, _memory
from .._planning._choice import alternative_warnings
from .._planning._compile import compile_plan
from .._planning._hosts import HostsError, check_hosts
from .._planning._mesh import MAX_DEVICES, declared_sizes
from .._planning._plan import Plan
from .._planning._size_one import size_one_warnings
from ._guest import exited, output_to_stderr


class UsageError(Exception):
    """A mistake in how the command was called, or a file it cannot read (exit 2)."""


def read_shapes(source: str, where: str = "--shapes") -> Any:
    """The tree of shapes `source` names (`load_shapes`); what cannot be read
    is a `UsageError` naming `where` (the flag, or the setting it came from).
    A `module:function` source's output goes to standard error (`_guest`)."""
    from .._planning._shapes import ShapeSourceError, load_shapes

    try:
        with output_to_stderr():
            return load_shapes(source)
    except SystemExit as err:
        raise UsageError(f"{where}: {source} {exited(err)}; it must return a tree of shapes") from None
    except FileNotFoundError as err:
        missing = err.filename or source
        detail = "" if err.filename else f" ({err})"
        raise UsageError(f"{where}: {missing}: no such file{detail}") from None
    except (ShapeSourceError, OSError) as err:
        raise UsageError(f"{where}: {err}") from None


def write_output(text: str, output: str | None) -> None:
    """`text` to standard output (`output` None or `-`) or to the file `-o` names."""
    if output in (None, "-"):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as err:
        raise UsageError(f"-o {output}: cannot write: {err.strerror or err}") from None


def parse_mesh(text: str, where: str = "--mesh") -> dict[str, int]:
    """`"fsdp=32,model=8"` → `{"fsdp": 32, "model": 8}`; errors name `where`
    (the flag, or the config key) and the text."""
    sizes: dict[str, int] = {}
    what = f"{where} {text!r}"
    for part in text.split(","):
        name, eq, size = part.strip().partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name.strip()) or not size.strip().isdigit():
            raise UsageError(f"{what}: write axis sizes as NAME=SIZE,NAME=SIZE, e.g. --mesh fsdp=32,model=8")
        if int(size) < 1:
            raise UsageError(f"{what}: axis `{name.strip()}` needs a size of at least 1")
        if name.strip() in sizes:
            raise UsageError(f"{what}: axis `{name.strip()}` is given twice")
        sizes[name.strip()] = int(size)
    return limit_devices(sizes, what)


def limit_devices(sizes: dict[str, int], what: str) -> dict[str, int]:
    """`sizes`, unless they make more than `MAX_DEVICES` devices (`UsageError`,
    naming `what`): the bytes to move and per host hold a number per device."""
    devices = math.prod(sizes.values())
    if devices > MAX_DEVICES:
        raise UsageError(
            f"{what}: {devices} devices in all; shardrules checks meshes of at most {MAX_DEVICES}"
        )
    return sizes


@dataclasses.dataclass
class Result:
    """What linting one rule file found."""

    file: str
    diagnostics: list[Diagnostic]
    sources: Mapping[str, str]
    plan: Plan | None = None
    hosts: int | None = None
    step_cost: Any = None  # a `--step`'s `StepCost`, where it was compiled for its cost
    load_cost: Any = None  # with `--hosts` and shapes: `Plan.load_cost`, what loading costs each host

    @property
    def errors(self) -> int:
        return sum(d.severity == "error" for d in self.diagnostics)


def _load(path: str) -> tuple[RuleSet, list[Diagnostic]] | Result:
    """The rules lint can plan, with every load finding (a rule with an error
    stands aside and the rest are planned: see `load_partial`), or the Result
    of a file that cannot be read or parsed."""
    if not Path(path).is_file():
        raise UsageError(f"{path}: no such rule file")
    try:
        rules, found, sources = load_partial(path)
    except IncludeNotFoundError as err:  # the file itself
        raise UsageError(str(err)) from None
    if rules is None:
        return Result(path, found, sources)
    return rules, found


def sizes_for(rules: RuleSet, mesh: Mapping[str, int] | None) -> dict[str, int] | None:
    if mesh is not None:
        return dict(mesh)
    # an axis written `NAME?` with no size is one the mesh lacks (size 1)
    if rules.mesh is None or any(
        not isinstance(a.size, int) for a in rules.mesh.axes if not (a.optional and a.size is None)
    ):
        return None  # `*` or no sizes: lint never guesses from the devices it runs on
    sizes = declared_sizes(rules.mesh, None, rules.sources)
    return None if sizes is None else limit_devices(sizes, f"{rules.name}: the mesh line")


def lint_file(
    path: str,
    tree: Any | None,
    mesh: Mapping[str, int] | None,
    *,
    group: str | None = None,
    device_memory: int | None = None,
    replicated_threshold: int = _check.DEFAULT_REPLICATED_THRESHOLD,
    hosts: int | None = None,
    replicated_tolerance: float = _check.DEFAULT_REPLICATED_TOLERANCE,
) -> Result:
    """Every finding for one rule file: loading, every group's rules on the mesh,
    and, given `tree`, the plan of `group` (default `params`) for it. `hosts`:
    the mesh's devices are spread over this many hosts (for bytes per host,
    and with `tree`, what loading a checkpoint costs each host: SR220).
    `replicated_tolerance`: the largest share of the plan's bytes that may be
    fully replicated in a group whose rules shard something (SR116)."""
    loaded = _load(path)
    if isinstance(loaded, Result):
        return loaded
    rules, load_found = loaded
    sizes = sizes_for(rules, mesh)
    if hosts is not None:
        try:
            check_hosts(sizes, hosts)
        except HostsError as err:
            raise UsageError(f"{path}: {err}") from None
    found: list[Diagnostic] = list(load_found)  # every stage in one run: load errors, then the plan
    the_plan: Plan | None = None
    if tree is None and group is not None:
        try:
            rules.group(group)
        except ShardRulesError as err:
            found += err.diagnostics
    if tree is not None:
        try:
            the_plan = compile_plan(tree, rules, sizes, group or "params")
        except ShardRulesError as err:  # SR018 (no such group), SR109 (not a tree)
            found += err.diagnostics
        else:
            found += the_plan.diagnostics
            if device_memory is not None:
                found += _memory.memory_diagnostics(the_plan, device_memory)
            found += _check.rule_warnings(the_plan)
            found += _check.replication_warnings(the_plan, replicated_threshold)
            found += _check.tolerance_diagnostics(the_plan, replicated_tolerance, replicated_threshold)
    load_cost = None
    if hosts is not None and the_plan is not None and sizes:
        load_cost = the_plan.load_cost(hosts)  # what load_checkpoint reads on each host
        found += load_cost.findings  # SR220
    # Rule-level checks (axes, aliases) for every group, with or without shapes.
    empty: Plan | None = None
    for name in rules.group_names:
        empty = compile_plan({}, rules, sizes, name)
        found += empty.diagnostics
    if empty is not None and not any(d.severity == "error" for d in load_found):
        # (a rule or alias with an error stands aside, so the axes it names would look unused)
        found += _check.unused_axis_warnings(empty)
    found += _check.axis_type_warnings(rules)
    found += alternative_warnings(rules, sizes)
    found += size_one_warnings(rules, sizes, rules.group_names, the_plan)  # SR215: the plan's leaves counted
    if sizes is None:
        hint = "pass --mesh AXIS=SIZE,... or give every axis a number in the mesh line (not `*`)"
        found = [dataclasses.replace(d, hint=hint) if d.code == "SR108" else d for d in found]
        found += unchecked_notes(rules, shapes=tree is not None)
    kept = ordered(dict.fromkeys(rules.kept(found)))
    return Result(path, kept, rules.sources, the_plan, hosts, load_cost=load_cost)


def unchecked_notes(rules: RuleSet, *, shapes: bool) -> list[Diagnostic]:
    """SR301 (note): what lint could not check for want of axis sizes, and how
    to give them. Nothing, when no rule shards anything.

    **Arguments:**

    - `rules`: the loaded rule file.
    - `shapes`: whether a tree is being planned (then `?` and `auto` rules that
      match a leaf are reported as SR108 instead).

    **Returns:** a list of at most one note.

    ```python
    unchecked_notes(sr.loads("mesh x\\nrules p:\\n  default -> (x)\\n"), shapes=False)
    ```
    """
    specs = [rule.spec for group in rules.group_names for rule in iter_rules(rules, group)]
    if not any(spec.axes or spec.kind == "logical" for spec in specs):
        return []
    what = [] if rules.mesh is not None else ["axis names"]
    what.append("divisibility")
    if not shapes:
        what += ["`?`"] * any(g.optional for s in specs for e in s.entries for g in e.groups)
        what += ["`auto(...)`"] * any(spec.kind == "auto" for spec in specs)
    listed = ", ".join(what[:-1]) + " and " + what[-1] if len(what) > 1 else what[0]
    if rules.mesh is None:
        why, flag = "the file has no `mesh` line", "--mesh AXIS=SIZE,... naming every axis"
    else:
        sized = [a.size for a in rules.mesh.axes if a.size is not None]
        why = (
            "the `mesh` line sizes an axis `*`"
            if "*" in sized
            else "the `mesh` line gives no sizes"
            if not sized
            else "the `mesh` line does not size every axis"
        )
        flag = "--mesh " + ",".join(f"{n}=SIZE" for n in rules.mesh.names)
    where = (
        "add a `mesh` line with sizes" if rules.mesh is None else "give every axis a number in the mesh line"
    )
    also = "" if shapes else " (and --shapes SOURCE to check a tree)"
    return [
        Diagnostic(
            "SR301",
            "note",
            f"axis sizes unknown: {listed} not checked (no --mesh, and {why})",
            rules.mesh.span if rules.mesh is not None else None,
            hint=f"to check them, pass the sizes of the mesh to lint for, {flag}{also}, or {where}",
        )
    ]
