"""A step's cost in a plan file: how `shardrules dump --step` writes it (the
`step_cost` key of version 2; version 3 adds a target's keys, `_targetfile`),
how a reader checks it, and how two recorded costs compare (`diff` of two
dumps, golden plans).

A cost reaches this module as plain data, the dict `StepCost.to_json()` gives
(plus the step's `MODULE:FUNCTION` under `step`), so that reports need
nothing of tracing. The file holds one key per line, in a fixed order, and
one line per kind of collective, for `git diff`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .._errors import PlanFileError
from .._planning._mesh import MAX_DEVICES
from ._refuse import cost_fail, exact_keys, figure, shown
from ._rulebytes import VERSION_WITH_RULES, read_rules, recorded_rules, rules_text
from ._targetfile import TARGET_KEYS, read_target, recorded_target, target_changes, target_lines, target_rows

COST_KEYS = (
    "step",
    "devices",
    "flops_per_device",
    "ideal_flops_per_device",
    "ratio",
    "bytes_accessed_per_device",
    "peak_bytes_per_device",
    "argument_bytes_per_device",
    "output_bytes_per_device",
    "temp_bytes_per_device",
    "collectives",
)
COLLECTIVE_KEYS = ("kind", "count", "bytes_per_device", "scopes")
KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_WHOLE = (
    "peak_bytes_per_device",
    "argument_bytes_per_device",
    "output_bytes_per_device",
    "temp_bytes_per_device",
)
VERSION_WITH_TARGET = 3
"""The file's version whose `step_cost` holds a target's keys (`TARGET_KEYS`)."""
RTOL = 0.02
"""How far a recorded figure may move before a golden plan calls it a change."""


def recorded(cost: Any, step: str | None = None, folder: str | None = None) -> dict[str, Any]:
    """The cost as the file holds it: `cost` is a `StepCost` (anything with a
    `to_json()`) or its dict; `step` names the step (`MODULE:FUNCTION`);
    its `by_rule` (version 4), when it has one, with each rule's file
    relative to `folder` (the rule file's folder)."""
    data = dict(cost.to_json() if hasattr(cost, "to_json") else cost)
    data["step"] = step if step is not None else data.get("step")
    out = {key: data.get(key) for key in COST_KEYS}
    out["collectives"] = [
        {key: (list(c[key]) if key == "scopes" else c[key]) for key in COLLECTIVE_KEYS}
        for c in data.get("collectives") or ()
    ]
    if data.get("target") is not None:  # costed for a target: version 3
        out |= recorded_target(data)
    by_rule = recorded_rules(data, folder)
    if by_rule is not None:  # the collectives per rule line: version 4
        out["by_rule"] = by_rule
    return out


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True, separators=(", ", ": "))


def cost_text(cost: dict[str, Any]) -> str:
    """The value of `"step_cost"` as the file writes it (indented under the header)."""
    lines = [f'    "{key}": {_value(cost[key])}' for key in COST_KEYS if key != "collectives"]
    rows = [f"      {_value(c)}" for c in cost["collectives"]]
    lines.append('    "collectives": [' + ("\n" + ",\n".join(rows) + "\n    ]" if rows else "]"))
    if "target" in cost:
        lines += target_lines(cost)
    if "by_rule" in cost:
        lines.append(rules_text(cost["by_rule"]))
    return "{\n" + ",\n".join(lines) + "\n  }"


def read_cost(value: Any, version: int | None = None) -> dict[str, Any]:
    """`"step_cost"` of a file of `version` (2, 3 with a target's keys, 4
    with `by_rule` and a target's keys or none; `None`: as its keys say)
    read strictly: its keys, their types and ranges (each figure at most
    `MAX_FIGURE`), a ratio its FLOPs make, the collectives one per kind in
    the writer's order, a target's figures that agree (`_targetfile`), rule
    lines whose bytes add up to the collectives' (`_rulebytes`).
    `PlanFileError` (SR124) for anything else."""
    where = '"step_cost"'
    keyed = value if isinstance(value, dict) else {}
    if version is None:
        version = (
            VERSION_WITH_RULES if "by_rule" in keyed else VERSION_WITH_TARGET if "target" in keyed else 2
        )
    if version < VERSION_WITH_RULES and "by_rule" in keyed:
        raise cost_fail(
            f'{where} has "by_rule", a key of version {VERSION_WITH_RULES} (the collectives per rule line), '
            f"but the file says version {version}"
        )
    if version < VERSION_WITH_TARGET:
        later = next((key for key in TARGET_KEYS if key in keyed), None)
        if later is not None:
            raise cost_fail(
                f'{where} has "{later}", a key of version {VERSION_WITH_TARGET} (a cost for a --target), '
                f"but the file says version {version}"
            )
    targeted = version == VERSION_WITH_TARGET or (version >= VERSION_WITH_RULES and "target" in keyed)
    keys = COST_KEYS + TARGET_KEYS if targeted else COST_KEYS
    data = exact_keys(value, (*keys, "by_rule") if version >= VERSION_WITH_RULES else keys, where)
    if data["step"] is not None and (not isinstance(data["step"], str) or not data["step"]):
        raise cost_fail(f'{where}: "step" is null or the step\'s MODULE:FUNCTION, not {shown(data["step"])}')
    devices = figure(data["devices"], f'{where}: "devices"', whole=True, least=1)
    if devices > MAX_DEVICES:
        raise cost_fail(f'{where}: "devices" is from 1 to {MAX_DEVICES}, not {devices}')
    flops = figure(data["flops_per_device"], f'{where}: "flops_per_device"')
    ideal = figure(data["ideal_flops_per_device"], f'{where}: "ideal_flops_per_device"', null=True)
    ratio = figure(data["ratio"], f'{where}: "ratio"', null=True)
    expected = float(flops) / float(ideal) if ideal else None  # both at most 10^30: no overflow
    if expected is None and ratio is not None:
        raise cost_fail(
            f'{where}: "ratio" is null when "ideal_flops_per_device" is null or 0, not {shown(ratio)}'
        )
    if expected is not None and (ratio is None or not math.isclose(ratio, expected, rel_tol=1e-9)):
        raise cost_fail(f'{where}: "ratio" is {shown(ratio)}, but its FLOPs make {expected!r}')
    figure(data["bytes_accessed_per_device"], f'{where}: "bytes_accessed_per_device"')
    for key in _WHOLE:
        figure(data[key], f'{where}: "{key}"', whole=True)
    if not isinstance(data["collectives"], list):
        raise cost_fail(f'{where}: "collectives" is a list of objects, not {shown(data["collectives"])}')
    order = -1
    for i, c in enumerate(data["collectives"]):
        c = exact_keys(c, COLLECTIVE_KEYS, f"{where}: collective {i}")
        kind = c["kind"]
        if not isinstance(kind, str) or kind not in KINDS:
            raise cost_fail(
                f"{where}: collective {i} has the kind {shown(kind)}; kinds are {', '.join(KINDS)}"
            )
        if KINDS.index(kind) <= order:
            raise cost_fail(
                f"{where}: {kind} is listed twice or out of order (the order is {', '.join(KINDS)})"
            )
        order = KINDS.index(kind)
        figure(c["count"], f"{where}: the count of {kind}", whole=True, least=1)
        figure(c["bytes_per_device"], f"{where}: the bytes of {kind}", whole=True)
        if not isinstance(c["scopes"], list) or not all(isinstance(x, str) for x in c["scopes"]):
            raise cost_fail(f"{where}: the scopes of {kind} are a list of names, not {shown(c['scopes'])}")
    if targeted:
        read_target(data, where)
    if version >= VERSION_WITH_RULES:
        total = sum(c["bytes_per_device"] for c in data["collectives"])
        read_rules(data["by_rule"], where, KINDS, total)
    return data


def checked(cost: Any, step: str | None = None, folder: str | None = None) -> dict[str, Any]:
    """`recorded(cost, step, folder)`, checked as a reader checks a file: what a
    caller hands `assert_plan_matches`. `TypeError`/`ValueError` saying what
    is wrong, never a file no reader would take."""
    try:
        data = recorded(cost, step, folder)
    except (TypeError, ValueError, KeyError, AttributeError) as err:
        raise TypeError(
            f"cost= takes a step's StepCost (step.cost(*args)) or its to_json() dict, not {type(cost).__name__}"
            f" ({type(err).__name__}: {err})"
        ) from None
    try:
        return read_cost(data)
    except PlanFileError as err:
        message = err.diagnostics[0].message.removeprefix("not a shardrules plan file: ")
        raise ValueError(f"cost= is not a step's cost: {message}") from None


def figures(cost: dict[str, Any]) -> dict[str, float | None]:
    """The figures a golden plan holds a step to: FLOPs, the ratio, peak and
    accessed bytes, and each kind of collective's count and bytes."""
    out: dict[str, float | None] = {
        "FLOPs per device": cost["flops_per_device"],
        "FLOPs against the ideal": cost["ratio"],
        "peak bytes per device": cost["peak_bytes_per_device"],
        "bytes accessed per device": cost["bytes_accessed_per_device"],
    }
    for c in cost["collectives"]:
        out[f"{c['kind']} count"] = c["count"]
        out[f"{c['kind']} bytes per device"] = c["bytes_per_device"]
    return out


def cost_changes(old: dict[str, Any], new: dict[str, Any], rtol: float = RTOL) -> list[str]:
    """What moved by more than `rtol` (relative) from `old` to `new`, one
    line each; for a target, another target, the peak fitting its chip or
    not, and the estimated step time (`_targetfile.target_changes`)."""
    a, b = figures(old), figures(new)
    out = target_changes(old, new, rtol)
    if old["devices"] != new["devices"]:
        out.append(f"devices: {old['devices']} -> {new['devices']}")
    for name in dict.fromkeys([*a, *b]):
        x, y = a.get(name, 0), b.get(name, 0)
        if x is None or y is None:
            if x is not y:
                out.append(f"{name}: {_figure(x)} -> {_figure(y)}")
        elif not math.isclose(x, y, rel_tol=rtol):
            change = f" ({y / x:.2f}x)" if x else ""
            out.append(f"{name}: {_figure(x)} -> {_figure(y)}{change}")
    return out


def _figure(value: float | None) -> str:
    if value is None:
        return "none"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def cost_rows(cost: dict[str, Any]) -> tuple[list[tuple[str, str]], list[tuple[str, str, str, str]]]:
    """The cost as a report shows it: (measure, value) rows (a target's
    among them), and a (kind, count, bytes per device, scopes) row per kind
    of collective."""
    from .._planning._plan import format_bytes, format_flops

    ratio = (
        f" ({cost['ratio']:.2f}x the ideal {format_flops(cost['ideal_flops_per_device'])})"
        if cost["ratio"]
        else ""
    )
    measures = [
        ("step", cost["step"] or "-"),
        ("devices", str(cost["devices"])),
        ("FLOPs per device", format_flops(cost["flops_per_device"]) + ratio),
        ("bytes accessed per device", format_bytes(int(cost["bytes_accessed_per_device"]))),
        ("peak memory per device", format_bytes(cost["peak_bytes_per_device"])),
        ("  arguments", format_bytes(cost["argument_bytes_per_device"])),
        ("  outputs", format_bytes(cost["output_bytes_per_device"])),
        ("  temporaries", format_bytes(cost["temp_bytes_per_device"])),
        *target_rows(cost),
    ]
    collectives = [
        (c["kind"], str(c["count"]), format_bytes(c["bytes_per_device"]), ", ".join(c["scopes"]) or "-")
        for c in cost["collectives"]
    ]
    return measures, collectives
