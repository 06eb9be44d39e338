"""`shardrules lint` and `shardrules explain`: check rule files against shapes and
a mesh description, with no devices, and print the findings or the plan."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from .._errors import Diagnostic, IncludeNotFoundError, ShardRulesError, ordered
from .._language._load import iter_rules, load
from .._language._rules import RuleSet
from .._planning import _check
from .._planning._compile import compile_plan
from .._planning._hosts import HostsError, check_hosts, host_bytes, leaf_host_bytes
from .._planning._mesh import declared_sizes
from .._planning._plan import Plan, format_bytes, plural, spec_str


class UsageError(Exception):
    """A mistake in how the command was called, or a file it cannot read (exit 2)."""


def parse_mesh(text: str) -> dict[str, int]:
    """`"fsdp=32,model=8"` → `{"fsdp": 32, "model": 8}`."""
    sizes: dict[str, int] = {}
    for part in text.split(","):
        name, eq, size = part.strip().partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name.strip()) or not size.strip().isdigit():
            raise UsageError(
                f"--mesh {text!r}: write axis sizes as NAME=SIZE,NAME=SIZE, e.g. --mesh fsdp=32,model=8"
            )
        if int(size) < 1:
            raise UsageError(f"--mesh {text!r}: axis `{name.strip()}` needs a size of at least 1")
        if name.strip() in sizes:
            raise UsageError(f"--mesh {text!r}: axis `{name.strip()}` is given twice")
        sizes[name.strip()] = int(size)
    return sizes


@dataclasses.dataclass
class Result:
    """What linting one rule file found."""

    file: str
    diagnostics: list[Diagnostic]
    sources: Mapping[str, str]
    plan: Plan | None = None
    hosts: int | None = None

    @property
    def errors(self) -> int:
        return sum(d.severity == "error" for d in self.diagnostics)


def _load(path: str) -> RuleSet | Result:
    if not Path(path).is_file():
        raise UsageError(f"{path}: no such rule file")
    try:
        return load(path)
    except IncludeNotFoundError as err:
        if err.span is None:
            raise UsageError(str(err)) from None
        return Result(path, list(err.diagnostics), getattr(err, "_sources", {}))
    except ShardRulesError as err:
        return Result(path, list(err.diagnostics), getattr(err, "_sources", {}))


def _sizes(rules: RuleSet, mesh: Mapping[str, int] | None) -> dict[str, int] | None:
    if mesh is not None:
        return dict(mesh)
    if rules.mesh is None or any(not isinstance(a.size, int) for a in rules.mesh.axes):
        return None  # `*` or no sizes: lint never guesses from the devices it runs on
    return declared_sizes(rules.mesh, None, rules.sources)


def lint_file(
    path: str,
    tree: Any | None,
    mesh: Mapping[str, int] | None,
    *,
    group: str | None = None,
    device_memory: int | None = None,
    replicated_threshold: int = _check.DEFAULT_REPLICATED_THRESHOLD,
    hosts: int | None = None,
) -> Result:
    """Every finding for one rule file: loading, every group's rules on the mesh,
    and, given `tree`, the plan of `group` (default `params`) for it. `hosts`:
    the mesh's devices are spread over this many hosts (for bytes per host)."""
    loaded = _load(path)
    if isinstance(loaded, Result):
        return loaded
    rules = loaded
    sizes = _sizes(rules, mesh)
    if hosts is not None:
        try:
            check_hosts(sizes, hosts)
        except HostsError as err:
            raise UsageError(f"{path}: {err}") from None
    found: list[Diagnostic] = []
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
                found += _check.memory_diagnostics(the_plan, device_memory)
            found += _check.rule_warnings(the_plan)
            found += _check.replication_warnings(the_plan, replicated_threshold)
    # Rule-level checks (axes, aliases) for every group, with or without shapes.
    empty: Plan | None = None
    for name in rules.group_names:
        empty = compile_plan({}, rules, sizes, name)
        found += empty.diagnostics
    if empty is not None:
        found += _check.unused_axis_warnings(empty)
    if sizes is None:
        hint = "pass --mesh AXIS=SIZE,... or give every axis a number in the mesh line (not `*`)"
        found = [dataclasses.replace(d, hint=hint) if d.code == "SR108" else d for d in found]
        found += unchecked_notes(rules, shapes=tree is not None)
    return Result(path, ordered(dict.fromkeys(found)), rules.sources, the_plan, hosts)


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


# ------------------------------------------------------------------ output


def write_text(results: Sequence[Result], out: TextIO) -> None:
    for result in results:
        for d in result.diagnostics:
            text = d.render(result.sources)
            out.write((text if d.span is not None else f"{result.file}: {text}") + "\n")
        if result.hosts is not None and result.plan is not None and isinstance(result.plan.mesh, Mapping):
            out.write(f"{result.file}: {format_bytes(result.plan.bytes_per_device)} per device; ")
            out.write(host_line(result.plan, result.hosts) + "\n")
    errors = sum(r.errors for r in results)
    notes = sum(d.severity == "note" for r in results for d in r.diagnostics)
    warnings = sum(len(r.diagnostics) for r in results) - errors - notes
    unchecked = f"not every check ran: see the {'note' if notes == 1 else 'notes'} above"
    if errors or warnings:
        out.write(f"Found {plural(errors, 'error')} and {plural(warnings, 'warning')}")
        out.write(f"; {unchecked}.\n" if notes else ".\n")
    elif notes:
        out.write(f"No errors or warnings ({plural(len(results), 'file')}), but {unchecked}.\n")
    else:
        out.write(f"All checks passed ({plural(len(results), 'file')}).\n")


def as_json(results: Sequence[Result]) -> list[dict[str, Any]]:
    """The stable JSON form: one object per finding."""
    return [
        {
            "code": d.code,
            "severity": d.severity,
            "file": d.span.file if d.span is not None else r.file,
            "line": d.span.line if d.span is not None else None,
            "col": d.span.col if d.span is not None else None,
            "end_line": d.span.end_line if d.span is not None else None,
            "end_col": d.span.end_col if d.span is not None else None,
            "message": d.message,
            "hint": d.hint,
            "path": d.path,
        }
        for r in results
        for d in r.diagnostics
    ]


def _escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def write_github(results: Sequence[Result], out: TextIO) -> None:
    """GitHub Actions workflow commands: an annotation per finding."""
    for r in results:
        for d in r.diagnostics:
            props = [f"file={_escape(d.span.file if d.span else r.file, True)}"]
            if d.span is not None:
                props += [
                    f"line={d.span.line}",
                    f"col={d.span.col}",
                    f"endLine={d.span.end_line}",
                    f"endColumn={d.span.end_col}",
                ]
            props.append(f"title={_escape(d.code, True)}")
            message = d.message + (f"\nhint: {d.hint}" if d.hint else "")
            command = "notice" if d.severity == "note" else d.severity
            out.write(f"::{command} {','.join(props)}::{_escape(message)}\n")


# ------------------------------------------------------------------ explain


def explain_rows(
    plan: Plan, path_filter: str | None = None, hosts: int | None = None
) -> list[tuple[str, ...]]:
    """path, shape, dtype, rule, spec, bytes per device (and, given `hosts`,
    the distinct bytes per host), for each array leaf."""
    search = re.compile(path_filter).search if path_filter else None
    sizes = plan.mesh if isinstance(plan.mesh, Mapping) else None
    rows = []
    for leaf in plan.leaves:
        if not leaf.is_array or (search is not None and search(leaf.path) is None):
            continue
        rule = leaf.rule.location if leaf.rule is not None and leaf.why in ("rule", "default") else leaf.why
        rows.append(
            (
                leaf.path,
                str(leaf.shape),
                str(leaf.dtype),
                rule,
                spec_str(leaf.spec),
                format_bytes(leaf.bytes_per_device),
            )
        )
        if hosts is not None and sizes:
            held = 0
            if leaf.spec is not None and leaf.bytes_per_device:
                held = int(leaf_host_bytes(leaf.bytes_per_device, leaf.spec, sizes, hosts).max())
            rows[-1] += (format_bytes(held),)
    return rows


HEADER = ("path", "shape", "dtype", "rule", "spec", "per device")
HOST_HEADER = (*HEADER, "per host")


def totals(plan: Plan, top: int = 5, hosts: int | None = None) -> list[str]:
    """The summary under the table: bytes per device (and per host, given
    `hosts`), replication, biggest replicated leaves."""
    sizes = plan.mesh if isinstance(plan.mesh, Mapping) else None
    devices = math.prod(sizes.values()) if sizes else 1
    arrays = [leaf for leaf in plan.leaves if leaf.is_array]
    held = sum(leaf.bytes_per_device for leaf in arrays)
    total = plan.total_bytes
    mesh_text = ", ".join(f"{k}={v}" for k, v in sizes.items()) if sizes else "no mesh sizes"
    unplanned = [leaf for leaf in arrays if leaf.spec is None]
    lines = [
        f"{plural(len(arrays), 'array')}, {format_bytes(total)} in all, on {mesh_text} "
        f"({plural(devices, 'device')})",
        *(
            [
                f"{plural(len(unplanned), 'array')} could not be planned (see the findings) and "
                "count 0 bytes per device below"
            ]
            if unplanned
            else []
        ),
        # Shards divide evenly, so every device holds the same bytes: max == min.
        f"bytes per device: {format_bytes(held)} max, {format_bytes(held)} min",
        *([host_line(plan, hosts)] if hosts is not None and sizes else []),
    ]
    lines += _replication_line(arrays, held, devices)
    replicated = sorted(
        (
            leaf
            for leaf in arrays
            if leaf.spec is not None and leaf.shape and all(e is None for e in leaf.spec)
        ),
        key=lambda leaf: -leaf.nbytes,
    )[:top]
    if replicated and devices > 1:
        lines.append("biggest replicated leaves:")
        width = max(len(leaf.path) for leaf in replicated)
        lines += [
            f"  {leaf.path.ljust(width)}  {leaf.shape}  {leaf.dtype}  {format_bytes(leaf.nbytes)}"
            for leaf in replicated
        ]
    return lines


def _replication_line(arrays: Sequence[Any], held: int, devices: int) -> list[str]:
    """The replication factor of the arrays that could be planned: a leaf that
    could not be has no bytes on the devices, and counting its size would make
    the factor look smaller than it is."""
    planned = sum(leaf.nbytes for leaf in arrays if leaf.spec is not None)
    unplanned = sum(leaf.spec is None for leaf in arrays)
    if not planned:
        if unplanned:
            return ["replication factor: unknown (no array could be planned)"]
        return []
    of = f"the {plural(len(arrays) - unplanned, 'planned array')}" if unplanned else "the arrays"
    left_out = f"; the {unplanned} not planned are left out" if unplanned else ""
    return [
        f"replication factor: {held * devices / planned:.2f} (bytes on all devices / bytes of {of}{left_out})"
    ]


def host_line(plan: Plan, hosts: int) -> str:
    """`bytes per host (H hosts × D devices): X on its devices, Y distinct`."""
    sizes = plan.mesh if isinstance(plan.mesh, Mapping) else {}
    on_devices, distinct = host_bytes(plan, sizes, hosts)
    per_host = math.prod(sizes.values()) // hosts
    return (
        f"bytes per host ({plural(hosts, 'host')} × {plural(per_host, 'device')}): "
        f"{format_bytes(on_devices)} on its devices, {format_bytes(distinct)} distinct"
    )


def write_table(
    rows: Sequence[tuple[str, ...]], out: TextIO, rich: bool, header: Sequence[str] = HEADER
) -> None:
    if rich:
        from rich.console import Console
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for name in header:  # long paths wrap rather than being cut short
            table.add_column(name, overflow="fold")
        for row in rows:
            table.add_row(*row)
        Console(file=out).print(table)
        return
    everything = [tuple(header), *rows]
    widths = [max(len(r[i]) for r in everything) for i in range(len(header))]
    for row in everything:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def use_rich(out: TextIO) -> bool:
    """rich tables on a terminal, when rich is installed."""
    if not (hasattr(out, "isatty") and out.isatty()):
        return False
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def dump_json(results: Sequence[Result], out: TextIO = sys.stdout) -> None:
    json.dump(as_json(results), out, indent=2)
    out.write("\n")
