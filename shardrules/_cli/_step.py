"""`--step MODULE:FUNCTION` for `shardrules lint` and `explain`: trace a train
step on Explicit mesh axes (no data moves, nothing runs) and list how the
layout of each contraction, and of each result JAX could not lay out alone,
was chosen, and every scope output with the rule it takes; lint reports the
forward-pass layouts no activation rule gives (SR208), those that drop a mesh
axis their operands carried (SR210), and activation rules that match no scope
output (SR211).

`FUNCTION(rules, mesh)` returns `(step, args)`: a `shardrules.jit` step built
with those rules (and, usually, that mesh) and a tuple of example arguments,
arrays or `jax.ShapeDtypeStruct`s. The mesh has the sizes of `--mesh` or the
file's `mesh` line, the axis types the line states (`Explicit` where it states
none, as `jax.make_mesh` makes them) and simulated CPU devices, unless
`JAX_PLATFORMS` names another platform.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import Diagnostic, ShardRulesError
from .._language._rules import RuleSet
from .._planning._plan import spec_str
from .._planning._shapes import ShapeSourceError, import_callable
from .._pspec import entries
from .._quiet import quiet
from . import _budget, _commbudget
from ._guest import exited, output_to_stderr
from ._lint import UsageError

_EXAMPLE = "train:check_step"


def _ensure_devices(count: int) -> list[Any]:
    """`count` devices: simulated CPU ones when JAX has not started yet (and
    no platform is asked for in `JAX_PLATFORMS`)."""
    import jax

    from .._tracing._compat import backends_started

    if not backends_started():
        if not os.environ.get("JAX_PLATFORMS"):
            jax.config.update("jax_platforms", "cpu")
        if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
            jax.config.update("jax_num_cpu_devices", max(count, 1))
    devices = jax.devices()
    if len(devices) < count:
        raise UsageError(
            f"--step: the mesh needs {count} devices and JAX has {len(devices)} "
            f"({devices[0].platform}); set XLA_FLAGS=--xla_force_host_platform_device_count={count} "
            "with JAX_PLATFORMS=cpu, or lint for a smaller --mesh"
        )
    return devices[:count]


def step_mesh(rules: RuleSet, sizes: Mapping[str, int], target: str | None = None) -> Any:
    """The mesh a step is traced on: `sizes`, the types the `mesh` line states
    (Explicit where it states none), simulated CPU devices, or the devices of
    the TPU topology `target` names (no CPU devices are needed for it)."""
    import jax
    from jax.sharding import AxisType

    declared = dict(zip(rules.mesh.names, rules.mesh.axis_types, strict=True)) if rules.mesh else {}
    types = tuple(AxisType.Auto if declared.get(name) == "auto" else AxisType.Explicit for name in sizes)
    if AxisType.Explicit not in types:
        raise UsageError(
            "--step: the mesh line declares every axis `auto`, so XLA lays out every value and there is "
            "nothing for the rules to decide; state `explicit` axes to check a step for JAX's default meshes"
        )
    if target is not None:
        mesh = _target_mesh(target, sizes, types)
        if mesh is not None:
            return mesh
    devices = _ensure_devices(math.prod(sizes.values()))
    return jax.make_mesh(tuple(sizes.values()), tuple(sizes), axis_types=types, devices=devices)


def _target_mesh(target: str, sizes: Mapping[str, int], types: tuple[Any, ...]) -> Any:
    """The mesh of `sizes` on the TPU topology `target` names; `None` for a
    GPU target (simulated CPU devices). A target that cannot be compiled
    for is a usage error."""
    from .._costs._targets import MeshSizes, parse_target, target_mesh
    from .._errors import TargetError

    try:
        chosen = parse_target(target)
        if chosen.compiler != "tpu":
            return None
        _ensure_devices(1)  # JAX on the CPU: the device a TPU target's ideal is compiled on
        return target_mesh(chosen, MeshSizes(sizes, types))
    except TargetError as err:
        raise UsageError(f"--target: SR126 {err.diagnostics[0].message}; {err.hint}") from None


def trace(
    spec: str, rules: RuleSet, sizes: Mapping[str, int] | None, target: str | None = None
) -> tuple[Any, tuple[Any, ...], Any]:
    """The step `spec` names, for `rules` on a mesh of `sizes`, its example
    arguments, and one trace of it: its `Traced` (decisions, scope outputs,
    activation rules matching none).

    What the step's code writes to standard output while it is imported,
    called and traced goes to standard error (`_guest`).

    **Raises:** `UsageError` for a step that cannot be imported, called or
    traced, or that exits; `ShardRulesError` from the rules (SR117, SR103, ...)."""
    step, args = make_step(spec, rules, sizes, target)
    return step, args, trace_step(spec, step, args)


def make_step(
    spec: str, rules: RuleSet, sizes: Mapping[str, int] | None, target: str | None = None
) -> tuple[Any, tuple[Any, ...]]:
    """The step `spec` names, for `rules` on a mesh of `sizes`, and its example
    arguments, not traced yet (`trace`'s first half; its standard output sent
    to standard error)."""
    from .._search._probe import StepError, checked

    with output_to_stderr():
        try:
            factory = import_callable(spec, _EXAMPLE)
        except ShapeSourceError as err:
            raise UsageError(f"--step {err}") from None
        if sizes is None:
            raise UsageError(
                "--step needs the mesh's sizes: pass --mesh AXIS=SIZE,... or give every axis a number in the "
                "mesh line"
            )
        mesh = step_mesh(rules, sizes, target)
        try:
            result = factory(rules, mesh)
        except ShardRulesError:
            raise
        except SystemExit as err:
            raise UsageError(
                f"--step {spec}: calling it with (rules, mesh) {exited(err)}; it must return the step and "
                "its example arguments"
            ) from None
        except Exception as err:
            raise UsageError(
                f"--step {spec}: calling it with (rules, mesh) raised {type(err).__name__}: {err}"
            ) from None
    try:
        return checked(result, f"--step {spec}")
    except StepError as err:
        raise UsageError(str(err)) from None


def trace_step(spec: str, step: Any, args: tuple[Any, ...]) -> Any:
    """One trace of `step` (made by `make_step`) with `args`: its `Traced`."""
    try:
        with output_to_stderr(), quiet():  # what the trace warns about comes back as findings
            return step.traced(*args)
    except ShardRulesError:
        raise
    except SystemExit as err:
        raise UsageError(
            f"--step {spec}: the step {exited(err)} while it was traced; a step must return its "
            "outputs: nothing it runs may call sys.exit"
        ) from None
    except Exception as err:
        raise UsageError(f"--step {spec}: tracing the step raised {type(err).__name__}: {err}") from None


def _entries(spec: Any) -> str:
    return ", ".join(
        "_" if e is None else e if isinstance(e, str) else "(" + ", ".join(e) + ")" for e in entries(spec)
    )


_HINTED = re.compile(r'`"(?P<pattern>[^`]*)\$" -> \((?P<spec>[^`]*)\)`')


def _one_rule_per_layer_where_they_differ(found: list[Diagnostic]) -> list[Diagnostic]:
    """`found` with each hinted rule whose pattern covers every layer
    (`layers/\\d+/down$`) written for its own layer (`layers/0/down$`)
    where the layers' layouts differ: one rule cannot give them all."""
    said: dict[str, set[str]] = {}
    for d in found:
        for m in _HINTED.finditer(d.hint or ""):
            said.setdefault(m["pattern"], set()).add(m["spec"])
    differ = {pattern for pattern, specs in said.items() if len(specs) > 1 and r"\d+" in pattern}
    if not differ:
        return found
    out = []
    for d in found:
        for m in _HINTED.finditer(d.hint or ""):
            if m["pattern"] in differ and d.paths:
                scope = d.paths[0][0].removesuffix(" (backward)")
                exact = _exact(m["pattern"], scope)
                d = dataclasses.replace(d, hint=d.hint.replace(f'`"{m["pattern"]}$"', f'`"{exact}$"'))
        out.append(d)
    return out


def _exact(pattern: str, scope: str) -> str:
    """`pattern` (made by `scope_pattern` from `scope` or a scope around it,
    maybe with an output's number after it) with each `\\d+` written as the
    index it stands for in `scope`."""
    parts, layers = pattern.split("/"), scope.split("/")
    return "/".join(
        re.escape(layers[i]) if part == r"\d+" and i < len(layers) else part for i, part in enumerate(parts)
    )


def findings(decisions: Sequence[Any], rules: RuleSet, reach: Any = None) -> list[Diagnostic]:
    """SR208 for each forward-pass layout JAX could not decide and no rule
    gives (the rule it hints at named after the scope's parameter, where
    `reach` gives one), SR210 for each that drops a mesh axis its operands
    carried (the gradient's follow the forward pass and are not listed)."""
    from .._tracing._explicit import scope_pattern

    spans = dict(rules.group_span_items)
    span = spans.get("activations")
    out = []
    for d in decisions:
        if d.dropped and not d.scope.endswith("(backward)"):  # SR210: an axis the operands carried, lost
            from .._tracing._explicit import dropped_diagnostic

            hint = d.hint.replace(" (or pass strict=False to infer it)", "") or "see `explain --step`"
            found = dropped_diagnostic(d.primitive, d.scope, d.source, d.operands, d.spec, d.dropped, hint)
            out.append(dataclasses.replace(found, span=span, paths=((d.scope, d.shape),)))
        if d.by not in ("inferred", "auto_axes") or d.scope.endswith("(backward)"):
            continue
        operands = ", ".join(f"{shape} {spec_str(s)}" for shape, s in d.operands) or "none"
        how = (
            f"inferred as {spec_str(d.spec)}"
            if d.by == "inferred"
            else f"computed under `jax.sharding.auto_axes` as {spec_str(d.spec)}"
        )
        where = f"in scope `{d.scope}`" if d.scope else "outside every named scope"
        if d.hint:  # the rule for the scope output the result is laid out like, in its dimensions
            hint = d.hint.replace(" (or pass strict=False to infer it)", "")
            hint = f"to write it in the file, {hint}" if hint.startswith("add ") else hint
        elif d.scope:
            rule = f'`"{scope_pattern(d.scope)}$" -> ({_entries(d.spec)})`'
            hint = f"to write it in the file, add {rule} under `rules activations:`"
        else:
            hint = (
                "wrap that operation alone in `jax.named_scope(NAME)` and add "
                f'`"NAME$" -> ({_entries(d.spec)})` under `rules activations:`'
            )
        if (alias := reach.alias_of(d.scope) if reach is not None and d.scope else None) is not None:
            hint = hint.replace(f'`"{scope_pattern(d.scope)}$"', f'`"{scope_pattern(alias)}$"')
        out.append(
            Diagnostic(
                "SR208",
                "warning",
                f"no activation rule gives the layout of `{d.primitive}` {where} on Explicit axes: "
                f"{how} (operands: {operands})",
                span,
                d.scope or None,
                hint,
                paths=((d.scope, d.shape),),
                cause=f"`{d.primitive}` {how} (operands: {operands})",
            )
        )
    return _one_rule_per_layer_where_they_differ(out)


HEADER = ("scope", "operation", "operands", "result", "decided by")
SCOPE_HEADER = ("scope output", "shapes", "dtype", "rule")


def scope_rows(scopes: Sequence[Any]) -> list[tuple[str, ...]]:
    """One row of `explain --step`'s table of scope outputs per output: the
    names activation rules are matched against (a parameter name after
    it in parentheses), and the rule each takes."""
    out = []
    for s in scopes:
        shapes = ", ".join(str(shape) for shape in s.shapes)
        rule = "-" if s.rule is None else f'{s.rule.span} "{s.rule.pattern}"'
        name = s.name if s.alias is None else f"{s.name} ({s.alias})"
        out.append((name, shapes, s.dtype, rule))
    return out


def rows(decisions: Sequence[Any]) -> list[tuple[str, ...]]:
    """One row of `explain --step`'s table per decision."""
    out = []
    for d in decisions:
        operands = ", ".join(f"{shape} {spec_str(s)}" for shape, s in d.operands)
        by = f"rule {d.rule}" if d.by == "rule" else d.by
        out.append((d.scope or "(no scope)", d.primitive, operands, f"{d.shape} {spec_str(d.spec)}", by))
    return out


def _cost(spec: str, step: Any, args: tuple[Any, ...], target: str | None = None, ideal: bool = True) -> Any:
    """`step.cost(*args, target=target, ideal=ideal)` (what the step writes to
    standard output sent to standard error), a failure to compile said as a
    usage error, and a target that cannot be compiled for too."""
    from .._errors import TargetError

    try:
        with output_to_stderr():
            return step.cost(*args, target=target, ideal=ideal)
    except TargetError as err:
        raise UsageError(f"--target: SR126 {err.diagnostics[0].message}; {err.hint}") from None
    except ShardRulesError:
        raise
    except SystemExit as err:
        raise UsageError(
            f"--step {spec}: the step {exited(err)} while it was compiled for its cost; a step "
            "must return its outputs: nothing it runs may call sys.exit"
        ) from None
    except Exception as err:
        raise UsageError(
            f"--step {spec}: compiling the step for its cost raised {type(err).__name__}: {err}"
        ) from None


def add_findings(result: Any, spec: str, mesh: Mapping[str, int] | None, args: Any) -> None:
    """Trace the step `spec` for the rule file `result` is about and add its
    findings to `result` (its decisions to `args.decisions`)."""
    from .._errors import ordered
    from .._language._load import load
    from ._lint import sizes_for

    try:
        rules = load(result.file)
    except ShardRulesError:  # lint reports why
        return
    args.step_sizes = sizes_for(rules, mesh)  # the axis sizes the step is traced on
    try:
        step, step_args, traced = trace(spec, rules, args.step_sizes, getattr(args, "target", None))
    except ShardRulesError as err:
        # the step's error replaces lint's warning about the same place (SR207 is both)
        raised = {(d.code, d.span) for d in err.diagnostics}
        kept = [d for d in result.diagnostics if d.severity == "error" or (d.code, d.span) not in raised]
        result.diagnostics = ordered(dict.fromkeys([*kept, *rules.kept(err.diagnostics)]))
        return
    args.decisions, args.scopes, args.reach = traced.decisions, traced.scopes, traced.reach
    if getattr(args, "html", None) and result.plan is None:  # no --shapes: plan the step's own argument
        args.step_plan = argument_plan(step, step_args, rules, args.step_sizes, args.group or "params")
    found = [*findings(traced.decisions, rules, traced.reach), *traced.unmatched]
    max_ratio, max_peak = getattr(args, "max_flops_ratio", None), getattr(args, "max_peak_bytes", None)
    target = getattr(args, "target", None)
    budgets = (
        max_ratio,
        max_peak,
        target,
        *(getattr(args, f"max_collective_{b}", None) for b in ("bytes", "increase")),
    )
    if getattr(args, "cost", False) or any(b is not None for b in budgets):
        # lint compiles the one-device step only for what needs it: the FLOPs ratio, the MFU of a target
        ideal = getattr(args, "command", "") != "lint" or max_ratio is not None or target is not None
        args.step_cost = result.step_cost = _cost(spec, step, step_args, target, ideal)
        span = dict(rules.group_span_items).get("activations")
        found += _budget.findings(
            args.step_cost, traced.decisions, max_ratio, max_peak, span, args, step.donate
        )
        found += _budget.target_findings(args.step_cost, step, step_args, span, args)
        found += _commbudget.findings(args.step_cost, rules, span, args)
        found += args.step_cost.findings  # layouts that waste communication or memory (SR216-SR219)
    result.diagnostics = ordered(dict.fromkeys([*result.diagnostics, *rules.kept(found)]))


def argument_plan(
    step: Any, step_args: Sequence[Any], rules: RuleSet, sizes: Mapping[str, int] | None, group: str
) -> Any:
    """The plan of the one example argument of the step that its `in_groups`
    gives `group` (the parameters, for `params`), as `shardrules.plan` makes
    it on the mesh the step is traced on; `None` when no argument, or more
    than one, has that group."""
    from .._planning._api import plan

    groups = step.in_groups
    if groups is None:
        return None
    groups = (groups,) * len(step_args) if isinstance(groups, str) else tuple(groups)
    picked = [arg for arg, g in zip(step_args, groups, strict=False) if g == group]
    if len(picked) != 1:
        return None
    return plan(picked[0], rules, dict(sizes) if sizes is not None else None, group=group)
