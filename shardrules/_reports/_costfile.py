"""A step's cost in a plan file: how `shardrules dump --step` writes it (the
`step_cost` key of version 2), how a reader checks it, and how two recorded
costs compare (`diff` of two dumps, golden plans).

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
from ._refuse import fail, shown

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
RTOL = 0.02
"""How far a recorded figure may move before a golden plan calls it a change."""


def recorded(cost: Any, step: str | None = None) -> dict[str, Any]:
    """The cost as the file holds it: `cost` is a `StepCost` (anything with a
    `to_json()`) or its dict; `step` names the step (`MODULE:FUNCTION`)."""
    data = dict(cost.to_json() if hasattr(cost, "to_json") else cost)
    data["step"] = step if step is not None else data.get("step")
    out = {key: data.get(key) for key in COST_KEYS}
    out["collectives"] = [
        {key: (list(c[key]) if key == "scopes" else c[key]) for key in COLLECTIVE_KEYS}
        for c in data.get("collectives") or ()
    ]
    return out


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True, separators=(", ", ": "))


def cost_text(cost: dict[str, Any]) -> str:
    """The value of `"step_cost"` as the file writes it (indented under the header)."""
    lines = [f'    "{key}": {_value(cost[key])}' for key in COST_KEYS if key != "collectives"]
    rows = [f"      {_value(c)}" for c in cost["collectives"]]
    lines.append('    "collectives": [' + ("\n" + ",\n".join(rows) + "\n    ]" if rows else "]"))
    return "{\n" + ",\n".join(lines) + "\n  }"


_HINT = "write the file again with `shardrules dump --step` instead of editing it by hand"


def _fail(what: str) -> PlanFileError:
    return fail(what, hint=_HINT)


MAX_FIGURE = 10**30
"""The largest figure a file may record (FLOPs, bytes, counts): far beyond any
step (a zettabyte), and small enough to compute with as a float."""


def _number(value: Any, where: str, *, whole: bool = False, null: bool = False, least: int = 0) -> Any:
    if value is None and null:
        return None
    kinds = int if whole else (int, float)
    if (
        isinstance(value, bool)
        or not isinstance(value, kinds)
        or value != value  # NaN
        or not least <= value <= MAX_FIGURE
    ):
        kind = "a whole number" if whole else "a number"
        raise _fail(
            f"{where} is {kind} from {least} to 10^30{' or null' if null else ''}, not {shown(value)}"
        )
    return value


def _exact_keys(value: Any, keys: tuple[str, ...], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(f"{where} is an object with the keys {', '.join(keys)}, not {shown(value)}")
    extra = [k for k in value if k not in keys]
    missing = [k for k in keys if k not in value]
    if extra:
        raise _fail(
            f"{where} has the key {shown(extra[0])}, which the format does not have (it has {', '.join(keys)})"
        )
    if missing:
        raise _fail(f"{where} lacks the key {missing[0]!r}")
    return value


def read_cost(value: Any) -> dict[str, Any]:
    """`"step_cost"` read strictly: its keys, their types and ranges (each
    figure at most `MAX_FIGURE`), a ratio its FLOPs make, the collectives one
    per kind in the writer's order. `PlanFileError` (SR124) for anything else."""
    where = '"step_cost"'
    data = _exact_keys(value, COST_KEYS, where)
    if data["step"] is not None and (not isinstance(data["step"], str) or not data["step"]):
        raise _fail(f'{where}: "step" is null or the step\'s MODULE:FUNCTION, not {shown(data["step"])}')
    devices = _number(data["devices"], f'{where}: "devices"', whole=True, least=1)
    if devices > MAX_DEVICES:
        raise _fail(f'{where}: "devices" is from 1 to {MAX_DEVICES}, not {devices}')
    flops = _number(data["flops_per_device"], f'{where}: "flops_per_device"')
    ideal = _number(data["ideal_flops_per_device"], f'{where}: "ideal_flops_per_device"', null=True)
    ratio = _number(data["ratio"], f'{where}: "ratio"', null=True)
    expected = float(flops) / float(ideal) if ideal else None  # both at most 10^30: no overflow
    if expected is None and ratio is not None:
        raise _fail(
            f'{where}: "ratio" is null when "ideal_flops_per_device" is null or 0, not {shown(ratio)}'
        )
    if expected is not None and (ratio is None or not math.isclose(ratio, expected, rel_tol=1e-9)):
        raise _fail(f'{where}: "ratio" is {shown(ratio)}, but its FLOPs make {expected!r}')
    _number(data["bytes_accessed_per_device"], f'{where}: "bytes_accessed_per_device"')
    for key in _WHOLE:
        _number(data[key], f'{where}: "{key}"', whole=True)
    if not isinstance(data["collectives"], list):
        raise _fail(f'{where}: "collectives" is a list of objects, not {shown(data["collectives"])}')
    order = -1
    for i, c in enumerate(data["collectives"]):
        c = _exact_keys(c, COLLECTIVE_KEYS, f"{where}: collective {i}")
        kind = c["kind"]
        if not isinstance(kind, str) or kind not in KINDS:
            raise _fail(f"{where}: collective {i} has the kind {shown(kind)}; kinds are {', '.join(KINDS)}")
        if KINDS.index(kind) <= order:
            raise _fail(f"{where}: {kind} is listed twice or out of order (the order is {', '.join(KINDS)})")
        order = KINDS.index(kind)
        _number(c["count"], f"{where}: the count of {kind}", whole=True, least=1)
        _number(c["bytes_per_device"], f"{where}: the bytes of {kind}", whole=True)
        if not isinstance(c["scopes"], list) or not all(isinstance(x, str) for x in c["scopes"]):
            raise _fail(f"{where}: the scopes of {kind} are a list of names, not {shown(c['scopes'])}")
    return data


def checked(cost: Any, step: str | None = None) -> dict[str, Any]:
    """`recorded(cost, step)`, checked as a reader checks a file: what a
    caller hands `assert_plan_matches`. `TypeError`/`ValueError` saying what
    is wrong, never a file no reader would take."""
    try:
        data = recorded(cost, step)
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
    """What moved by more than `rtol` (relative) from `old` to `new`, one line each."""
    a, b = figures(old), figures(new)
    out = []
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
    """The cost as a report shows it: (measure, value) rows, and a (kind,
    count, bytes per device, scopes) row per kind of collective."""
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
    ]
    collectives = [
        (c["kind"], str(c["count"]), format_bytes(c["bytes_per_device"]), ", ".join(c["scopes"]) or "-")
        for c in cost["collectives"]
    ]
    return measures, collectives
