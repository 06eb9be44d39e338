"""How `shardrules lint` and `shardrules explain` print: findings as text, JSON
or GitHub annotations, one per cause (`_errors.group`: a rule wrong for 160
leaves is one finding naming a few of them, or every one with `all_leaves`),
or counts per code (`--statistics`); a plan as a table (rich on a terminal)
with totals."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TextIO

from .._errors import EXAMPLES, Diagnostic, group
from .._language import _regex
from .._language._build import pattern_problem
from .._planning._hosts import host_bytes, leaf_host_bytes
from .._planning._mesh import axis_types_text
from .._planning._plan import LeafPlan, Plan, format_bytes, plural, spec_str
from .._pspec import entries
from .._reports._picture import text_picture
from ._lint import Result


def findings(result: Result) -> list[Diagnostic]:
    """The findings of one file as printed: one per cause, in `ordered` order."""
    return group(result.diagnostics)


def write_text(results: Sequence[Result], out: TextIO, *, all_leaves: bool = False) -> None:
    """Each finding as `FILE:LINE:COL: CODE message`, its source line, the other
    leaves of its cause (a few; every one with `all_leaves`) and its hint; then
    the counts of findings."""
    grouped = [findings(r) for r in results]
    for result, found in zip(results, grouped, strict=True):
        for d in found:
            text = d.render(result.sources, examples=None if all_leaves else EXAMPLES)
            out.write((text if d.span is not None else f"{result.file}: {text}") + "\n")
        if result.hosts is not None and result.plan is not None and isinstance(result.plan.mesh, Mapping):
            out.write(f"{result.file}: {format_bytes(result.plan.bytes_per_device)} per device; ")
            out.write(host_line(result.plan, result.hosts) + "\n")
        if result.load_cost is not None:
            out.write(f"{result.file}: what load_checkpoint reads on each host:\n")
            out.write("".join(f"  {line}\n" for line in result.load_cost.table().splitlines()))
        if getattr(result.step_cost, "target", None) is not None:
            from .._costs._verdict import verdict

            out.write(f"{result.file}: {verdict(result.step_cost)}\n")
    _summary(results, grouped, out)


_SKIPPED = ("SR301", "SR302")  # notes of checks that did not run (the others only tell)


def _summary(results: Sequence[Result], grouped: Sequence[list[Diagnostic]], out: TextIO) -> None:
    errors = sum(d.severity == "error" for found in grouped for d in found)
    notes = sum(d.severity == "note" for found in grouped for d in found)
    skipped = sum(d.severity == "note" and d.code in _SKIPPED for found in grouped for d in found)
    warnings = sum(len(found) for found in grouped) - errors - notes
    see = f"see the {'note' if notes == 1 else 'notes'} above"
    unchecked = f"not every check ran: {see}" if skipped else see
    if errors or warnings:
        out.write(f"Found {plural(errors, 'error')} and {plural(warnings, 'warning')}")
        out.write(f"; {unchecked}.\n" if notes else ".\n")
    elif skipped:
        out.write(f"No errors or warnings ({plural(len(results), 'file')}), but {unchecked}.\n")
    elif notes:
        out.write(f"No errors or warnings ({plural(len(results), 'file')}); {see}.\n")
    else:
        out.write(f"All checks passed ({plural(len(results), 'file')}).\n")


def as_json(results: Sequence[Result], *, all_leaves: bool = False) -> list[dict[str, Any]]:
    """The stable JSON form: one object per finding (one per cause), with
    `count` (its leaves; 1 for a finding about none) and `paths` (`{"path",
    "shape"}` of its first leaves, as many as the text shows; every one with
    `all_leaves`)."""
    shown = None if all_leaves else 1 + EXAMPLES
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
            "count": d.count,
            "paths": [
                {"path": path, "shape": None if shape is None else list(shape)}
                for path, shape in d.paths[:shown]
            ],
        }
        for r in results
        for d in findings(r)
    ]


def statistics(results: Sequence[Result]) -> list[dict[str, Any]]:
    """Per code (in the order of the first finding of each): its severity, how
    many findings and how many leaves they are about (`--statistics`)."""
    rows: dict[str, dict[str, Any]] = {}
    for r in results:
        for d in findings(r):
            row = rows.setdefault(d.code, {"code": d.code, "severity": d.severity, "count": 0, "leaves": 0})
            row["count"] += 1
            row["leaves"] += len(d.paths)
    return list(rows.values())


def write_statistics(results: Sequence[Result], out: TextIO) -> None:
    """`COUNT  CODE  SEVERITY  (N leaves)` a line per code, most findings
    first, then the counts of findings (as `write_text` ends)."""
    rows = sorted(statistics(results), key=lambda row: -row["count"])
    width = max((len(str(row["count"])) for row in rows), default=1)
    for row in rows:
        leaves = f"  ({plural(row['leaves'], 'leaf', 'leaves')})" if row["leaves"] else ""
        out.write(
            f"{str(row['count']).rjust(width)}  {row['code']}  {row['severity'].ljust(7)}{leaves}".rstrip()
        )
        out.write("\n")
    _summary(results, [findings(r) for r in results], out)


def _escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def write_github(results: Sequence[Result], out: TextIO, *, all_leaves: bool = False) -> None:
    """GitHub Actions workflow commands: an annotation per finding (one per cause)."""
    for r in results:
        for d in findings(r):
            props = [f"file={_escape(d.span.file if d.span else r.file, True)}"]
            if d.span is not None:
                props += [
                    f"line={d.span.line}",
                    f"col={d.span.col}",
                    f"endLine={d.span.end_line}",
                    f"endColumn={d.span.end_col}",
                ]
            props.append(f"title={_escape(d.code, True)}")
            more = [line.strip() for line in d.more_leaves(None if all_leaves else EXAMPLES)]
            message = "\n".join([d.message, *more]) + (f"\nhint: {d.hint}" if d.hint else "")
            command = "notice" if d.severity == "note" else d.severity
            out.write(f"::{command} {','.join(props)}::{_escape(message)}\n")


# ------------------------------------------------------------------ explain


def path_matcher(path_filter: str | None) -> Callable[[str], bool]:
    """Whether a leaf's path is shown under `explain --path path_filter`:
    the pattern searched in the path as rule patterns are, by RE2 (linear
    time whatever the pattern); every path when there is no filter.

    **Raises:** `ValueError` with the SR002/SR017 message a rule file would
    get for the pattern."""
    if not path_filter:
        return lambda path: True
    _, problem = pattern_problem(path_filter)
    if problem is not None:
        raise ValueError(f"{problem.code} {problem.message}\n  hint: {problem.hint}")
    search = _regex.searcher(path_filter)
    return lambda path: search(_regex.path_bytes(path)) is not None


def explained(
    plan: Plan, path_filter: str | None = None, hosts: int | None = None
) -> Iterator[tuple[LeafPlan, str, int | None]]:
    """Each array leaf `path_filter` shows, with what decided it (the rule's
    location, or why none did) and, given `hosts`, the most distinct bytes one
    host holds of it (else `None`): the rows of `explain`, as text or JSON."""
    shows = path_matcher(path_filter)
    sizes = plan.mesh if isinstance(plan.mesh, Mapping) else None
    for leaf in plan.leaves:
        if not leaf.is_array or not shows(leaf.path):
            continue
        rule = leaf.rule.location if leaf.rule is not None and leaf.why in ("rule", "default") else leaf.why
        held = None
        if hosts is not None and sizes:
            held = 0
            if leaf.spec is not None and leaf.bytes_per_device:
                held = int(leaf_host_bytes(leaf.bytes_per_device, leaf.spec, sizes, hosts).max())
        yield leaf, rule, held


def explain_rows(
    plan: Plan, path_filter: str | None = None, hosts: int | None = None
) -> list[tuple[str, ...]]:
    """path, shape, dtype, rule, spec, bytes per device (and, given `hosts`,
    the distinct bytes per host), for each array leaf."""
    rows = []
    for leaf, rule, held in explained(plan, path_filter, hosts):
        row = (
            leaf.path,
            str(leaf.shape),
            str(leaf.dtype),
            rule,
            spec_str(leaf.spec),
            format_bytes(leaf.bytes_per_device),
        )
        rows.append(row if held is None else (*row, format_bytes(held)))
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
    types = axis_types_text(plan.mesh, plan.rules)
    lines = [
        f"{plural(len(arrays), 'array')}, {format_bytes(total)} in all, on {mesh_text} "
        f"({plural(devices, 'device')}{', ' + types if types else ''})",
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
            if leaf.spec is not None and leaf.shape and all(e is None for e in entries(leaf.spec))
        ),
        key=lambda leaf: -leaf.nbytes,
    )[:top]
    if replicated and devices > 1:
        lines.append("biggest replicated leaves:")
        width = max(len(leaf.path) for leaf in replicated)
        shape_width = max(len(str(leaf.shape)) for leaf in replicated)
        dtype_width = max(len(str(leaf.dtype)) for leaf in replicated)
        lines += [
            f"  {leaf.path.ljust(width)}  {str(leaf.shape).ljust(shape_width)}  "
            f"{str(leaf.dtype).ljust(dtype_width)}  {format_bytes(leaf.nbytes)}"
            for leaf in replicated
        ]
    return lines


def pictures(plan: Plan, path_filter: str | None = None, top: int = 3) -> list[str]:
    """Device grids of the `top` largest planned arrays among the leaves shown
    (`path_filter`), under a line saying how to read them; `[]` when there
    is nothing to draw."""
    sizes = dict(plan.mesh) if isinstance(plan.mesh, Mapping) else {}
    shows = path_matcher(path_filter)
    shown = [
        leaf
        for leaf in plan.leaves
        if leaf.is_array and leaf.spec is not None and leaf.shape and shows(leaf.path)
    ]
    largest = sorted(shown, key=lambda leaf: -leaf.nbytes)[:top]
    if not largest or not sizes:
        return []
    lines = [
        f"which devices hold which blocks ({plural(len(largest), 'largest array')}; devices numbered in "
        "mesh order; rows and columns split the last two dimensions):"
    ]
    for leaf in largest:
        lines += text_picture(leaf, sizes)
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
        from rich.markup import escape
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for name in header:  # long paths wrap rather than being cut short
            table.add_column(name, overflow="fold")
        for row in rows:  # text, not markup: a pattern's `[a-z]` is shown as written
            table.add_row(*(escape(cell) for cell in row))
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


def dump_json(
    results: Sequence[Result], out: TextIO = sys.stdout, *, all_leaves: bool = False, hosts: bool = False
) -> None:
    """The findings as a JSON list; with `hosts` (`--hosts`), an object:
    `findings` (that list) and `load_cost`, one `{"file", ...LoadCost.to_json()}`
    per file planned."""
    found: Any = as_json(results, all_leaves=all_leaves)
    if hosts:
        found = {
            "findings": found,
            "load_cost": [
                {"file": r.file, **r.load_cost.to_json()} for r in results if r.load_cost is not None
            ],
        }
    json.dump(found, out, indent=2)
    out.write("\n")


def dump_json_statistics(results: Sequence[Result], out: TextIO = sys.stdout) -> None:
    """`--statistics --format json`: a list of `{"code", "severity", "count", "leaves"}`."""
    json.dump(statistics(results), out, indent=2)
    out.write("\n")
