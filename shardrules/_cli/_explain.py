"""`explain`'s output: the plan leaf by leaf with totals and device pictures,
and with `--step` the step's scope outputs, layout decisions and cost; as
text, or as one JSON object (`--format json`) for scripts and CI."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from .._planning._plan import Plan
from .._reports import _byrule
from .._reports._dump import spec_entries
from . import _lint, _render, _step


def _listed(spec: Any) -> list[Any] | None:
    entries = spec_entries(spec)
    return None if entries is None else [list(e) if isinstance(e, tuple) else e for e in entries]


def _html(result: _lint.Result, args: argparse.Namespace, step_cost: Any) -> None:
    """Write `--html`'s page: the plan of `--shapes`, or without them the plan
    of the step's own argument of the group (`_step.argument_plan`), with the
    step's cost. Where there is no plan to show, the page is not written and
    the command says why: after the rules' errors (exit status 1, as they
    give), or as a usage error (status 2)."""
    if not args.html:
        return
    plan = result.plan if result.plan is not None else getattr(args, "step_plan", None)
    if plan is None:
        if result.errors:
            print(
                f"shardrules explain: --html {args.html}: not written: the rules have errors", file=sys.stderr
            )
            return
        group = args.group or "params"
        raise _lint.UsageError(
            f"--html {args.html}: no plan to write: give the shapes to plan for (--shapes SOURCE), or a "
            f"step whose in_groups give exactly one of its example arguments the group `{group}`"
        )
    from .._reports._html import page

    try:
        cost = None if step_cost is None else step_cost.to_json() | {"step": args.step}
        Path(args.html).write_text(page(plan, cost=cost), encoding="utf-8")
    except OSError as err:
        raise _lint.UsageError(f"--html {args.html}: cannot write: {err}") from None


def _write_cost(cost: Any, by: str, out: TextIO) -> None:
    """`step cost:`: its figures and each kind of collective's totals, then a
    table of the collectives by rule line, each with the arrays that move the
    most (`by` `rule`), or by array (`array`); `scope`, or a cost with no
    collectives attributed: each kind with the scopes it comes from."""
    from .._costs._cost import figure_lines, kind_lines

    attributed = by != "scope" and bool(cost.by_rule)
    lines = [*figure_lines(cost), *kind_lines(cost, scopes=not attributed)]
    out.write("step cost:\n" + "".join(f"  {line}\n" for line in lines))
    if not attributed:
        return
    data = cost.to_json()
    if by == "rule":
        out.write(
            "\ncollectives by rule line, per device per step (COUNT / BYTES of each kind), most bytes first; "
            f"under each, the {_byrule.ARRAYS_SHOWN} arrays that move the most:\n"
        )
        rows, header = _byrule.rule_table(data), _byrule.RULE_HEADER
    else:
        out.write(
            "\ncollectives by array, per device per step (COUNT / BYTES of each kind), most bytes first:\n"
        )
        rows, header = _byrule.array_table(data), _byrule.ARRAY_HEADER
    _render.write_table(rows, out, _render.use_rich(out), (*header, *_byrule.kinds(data)))


_REACH_HINT = (
    "to reach one, wrap that operation alone in `with jax.named_scope(NAME):` (a scope's output is "
    'the result that leaves it: around more code, the last one) and add `"NAME$" -> (...)` under '
    "`rules activations:`"
)


def reach_lines(reach: Any, scopes: Any) -> list[str]:
    """What `explain --step` says of the names rules cannot use: the
    auto-named scopes among `scopes` (the scope outputs) that have no
    parameter name, and why; the operations outside every named scope, by
    kind, with their source lines and how to reach them. None where there is
    nothing to say."""
    if reach is None:
        return []
    from .._planning._units import shown_location

    out: list[str] = []
    seen = {s.name for s in scopes or ()}
    refused = [(scope, why) for scope, why in reach.refused.items() if scope in seen]
    if refused:
        out.append(
            "auto-named scopes with no parameter name (activation rules reach them by scope name only):"
        )
        out += [f"  {scope}: {why}" for scope, why in refused]
    if reach.unreached:
        if out:
            out.append("")
        out.append("operations outside every named scope, which no activation rule reaches:")
        width = max(len(u.kind) for u in reach.unreached)
        for u in reach.unreached:
            lines = ", ".join(shown_location(x) for x in u.sources if x) or "(no source line)"
            out.append(f"  {u.kind.ljust(width)}  {u.count}  {lines}")
        out.append(f"  {_REACH_HINT}")
    return out


def write_text(result: _lint.Result, args: argparse.Namespace, out: TextIO) -> None:
    """The tables (scope outputs, decisions), the cost, the plan, its totals
    and pictures on `out`; findings on standard error."""
    tables = []
    if args.scopes:
        tables.append((_step.scope_rows(args.scopes), _step.SCOPE_HEADER))
    if args.decisions:
        tables.append((_step.rows(args.decisions), _step.HEADER))
    step_cost: Any = getattr(args, "step_cost", None)  # set by the step's trace, when asked for
    reach = reach_lines(getattr(args, "reach", None), args.scopes)
    for i, (rows, header) in enumerate(tables):
        _render.write_table(rows, out, _render.use_rich(out), header)
        if result.plan is not None or i < len(tables) - 1 or step_cost is not None or reach:
            out.write("\n")
    if reach:
        out.write("\n".join(reach) + "\n")
        if result.plan is not None or step_cost is not None:
            out.write("\n")
    if step_cost is not None:
        _write_cost(step_cost, getattr(args, "by", None) or "rule", out)
        if result.plan is not None:
            out.write("\n")
    if result.plan is not None:
        rows = _render.explain_rows(result.plan, args.path, args.hosts)
        header = _render.HOST_HEADER if args.hosts is not None else _render.HEADER
        _render.write_table(rows, out, _render.use_rich(out), header)
        out.write("\n" + "\n".join(_render.totals(result.plan, hosts=args.hosts)) + "\n")
        if result.load_cost is not None:
            out.write("\nwhat load_checkpoint reads on each host:\n" + result.load_cost.table() + "\n")
        pictures = _render.pictures(result.plan, args.path, args.pictures)
        if pictures:
            out.write("\n" + "\n".join(pictures) + "\n")
    if result.diagnostics:
        out.flush()
        _render.write_text([result], sys.stderr)
    _html(result, args, step_cost)


def _leaves(plan: Plan, path_filter: str | None, hosts: int | None) -> list[dict[str, Any]]:
    out = []
    for leaf, rule, held in _render.explained(plan, path_filter, hosts):
        row: dict[str, Any] = {
            "path": leaf.path,
            "shape": list(leaf.shape or ()),
            "dtype": str(leaf.dtype),
            "spec": _listed(leaf.spec),
            "rule": rule,
            "bytes_per_device": leaf.bytes_per_device,
        }
        if held is not None:
            row["bytes_per_host"] = held
        out.append(row)
    return out


def _decision(d: Any) -> dict[str, Any]:
    return {
        "scope": d.scope,
        "primitive": d.primitive,
        "operands": [{"shape": list(shape), "spec": _listed(spec)} for shape, spec in d.operands],
        "shape": list(d.shape),
        "spec": _listed(d.spec),
        "by": d.by,
        "rule": d.rule,
        "dropped": [list(x) for x in d.dropped],
        "source": d.source,
    }


def _scope(s: Any) -> dict[str, Any]:
    return {
        "name": s.name,
        "shapes": [list(shape) for shape in s.shapes],
        "dtype": s.dtype,
        "rule": s.rule.location if s.rule is not None else None,
        "alias": s.alias,
    }


def _reach(reach: Any, scopes: Any) -> dict[str, Any] | None:
    if reach is None:
        return None
    seen = {s.name for s in scopes or ()}
    return {
        "aliases": {k: v for k, v in reach.aliases.items() if k in seen},
        "refused": {k: v for k, v in reach.refused.items() if k in seen},
        "unreached": [
            {"kind": u.kind, "primitives": list(u.primitives), "count": u.count, "sources": list(u.sources)}
            for u in reach.unreached
        ],
    }


def _mesh(plan: Any, args: argparse.Namespace) -> dict[str, int] | None:
    """The axis sizes of the plan, or, for a step traced with no shapes, those it was traced on."""
    if plan is not None:
        return dict(plan.mesh) if isinstance(plan.mesh, Mapping) else None
    sizes = getattr(args, "step_sizes", None)
    return None if sizes is None else dict(sizes)


def write_json(result: _lint.Result, args: argparse.Namespace, out: TextIO) -> None:
    """One JSON object on `out`: `file`, `group` (`null` with no shapes planned,
    unless `--group` names one), `mesh` (sizes: the plan's, or the step's), `leaves`
    (the arrays `--path` shows: path, shape, dtype, spec, rule, bytes per
    device, and per host with `--hosts`), `totals`, `findings` (as `lint
    --format json` gives them), `load_cost` (with `--hosts`: `LoadCost.to_json()`,
    else `null`), and with `--step` its `scopes` (each with its parameter
    name, `alias`), `decisions`, `reach` (the parameter names of its
    auto-named scopes, those refused one and why, the operations outside
    every named scope by kind) and `step_cost` (`StepCost.to_json()`, its `by_rule` and `by_array`
    lists whatever `--by` says; `null` where not asked for)."""
    plan = result.plan
    step_cost: Any = getattr(args, "step_cost", None)
    found: dict[str, Any] = {
        "file": result.file,
        "group": plan.group if plan is not None else args.group,
        "mesh": _mesh(plan, args),
        "leaves": _leaves(plan, args.path, args.hosts) if plan is not None else [],
        "totals": None
        if plan is None
        else {
            "arrays": sum(1 for leaf in plan.leaves if leaf.is_array),
            "bytes_per_device": plan.bytes_per_device,
            "total_bytes": plan.total_bytes,
        },
        "findings": _render.as_json([result]),
        "scopes": None if args.scopes is None else [_scope(s) for s in args.scopes],
        "decisions": None if args.decisions is None else [_decision(d) for d in args.decisions],
        "reach": _reach(getattr(args, "reach", None), args.scopes),
        "step_cost": None if step_cost is None else step_cost.to_json(),
        "load_cost": None if result.load_cost is None else result.load_cost.to_json(),
    }
    json.dump(found, out, indent=2)
    out.write("\n")
    _html(result, args, step_cost)
