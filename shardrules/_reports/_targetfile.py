"""A step's cost on a target in a plan file: what version 3 adds to
`step_cost` (`shardrules dump --step --target NAME`). After the collectives,
one key per line: the target's name, the compiler whose figures the cost
holds, the generated code and the chip's memory per device, whether the peak
fits that memory, and the estimated step time, an object of one key per line
(its parts, total, MFU, the dtype its peak is for, what bounds it, the links'
seconds, the peak FLOPs and useful FLOPs its MFU is made of). Here it is
written, read strictly, compared between two costs and shown in reports.

A recorded target's chip is checked against the chip table
(`_planning/_chips.py`, which costing uses too), and a TPU topology's form
(`v5e:2x4`) against a pattern of its own (reports do not import `_costs`).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .._planning._chips import CHIPS
from .._planning._units import format_bytes, format_seconds
from ._refuse import cost_fail, exact_keys, figure, shown

TARGET_KEYS = ("target", "compiler", "code_bytes_per_device", "hbm_bytes_per_device", "fits", "estimate")
ESTIMATE_KEYS = (
    "compute_s",
    "memory_s",
    "communication_s",
    "total_s",
    "mfu",
    "dtype",
    "bound",
    "links",
    "peak_flops",
    "model_flops_per_device",
)
TPU_CHIPS = tuple(key for key, chip in CHIPS.items() if chip.platform == "tpu")
GPU_CHIPS = tuple(key for key, chip in CHIPS.items() if chip.platform == "gpu")
DTYPES = ("bf16", "f32", "fp8", "int8")
LINKS = {"tpu": ("ici",), "cpu": ("network", "nvlink")}
"""The links a compiler's collectives are timed on: a TPU slice's ICI; a GPU
target (compiled on CPU devices) its NVLink, or the network between nodes."""
BOUNDS = ("compute", "memory", "communication")
_TOPOLOGY = re.compile(r"(?P<chip>v[0-9]+[a-z]*):(?P<shape>[0-9]+(?:x[0-9]+){1,2})")


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True, separators=(", ", ": "))


def recorded_target(data: dict[str, Any]) -> dict[str, Any]:
    """The keys version 3 adds, from a `StepCost.to_json()` dict (or a
    file's `step_cost`), in the file's order; the links sorted by name."""
    out = {key: data.get(key) for key in TARGET_KEYS[:-1]}
    estimate = data.get("estimate")
    if isinstance(estimate, dict):
        links = estimate.get("links")
        estimate = {key: estimate.get(key) for key in ESTIMATE_KEYS}
        estimate["links"] = dict(sorted(links.items())) if isinstance(links, dict) else links
    out["estimate"] = estimate
    return out


def target_lines(cost: dict[str, Any]) -> list[str]:
    """The lines of `"step_cost"` version 3 adds, one key per line (the estimate's too)."""
    lines = [f'    "{key}": {_value(cost[key])}' for key in TARGET_KEYS[:-1]]
    inner = ",\n".join(f'      "{key}": {_value(cost["estimate"][key])}' for key in ESTIMATE_KEYS)
    return [*lines, '    "estimate": {\n' + inner + "\n    }"]


def read_target(data: dict[str, Any], where: str) -> None:
    """Check the keys version 3 adds to `data` (a `"step_cost"` whose other
    keys are checked): a known target, its compiler, the chip's memory and
    whether the peak fits it, an estimate whose figures agree with each
    other. `PlanFileError` (SR124) for anything else."""
    name = data["target"]
    chip, shape = _chip_of(name, where)
    compiler = data["compiler"]
    expected = "tpu" if chip in TPU_CHIPS else "cpu"
    if compiler != expected:
        why = (
            "a TPU topology: the TPU compiler compiles for it"
            if expected == "tpu"
            else "a GPU: XLA's CPU compiler compiles for it on simulated devices"
        )
        raise cost_fail(f'{where}: "compiler" is "{expected}" for {name} ({why}), not {shown(compiler)}')
    code = figure(data["code_bytes_per_device"], f'{where}: "code_bytes_per_device"', whole=True)
    if compiler == "cpu" and code:
        raise cost_fail(f'{where}: "code_bytes_per_device" is 0 for the CPU compiler, not {code}')
    memory = figure(data["hbm_bytes_per_device"], f'{where}: "hbm_bytes_per_device"', whole=True, least=1)
    fits = data["fits"]
    peak = data["peak_bytes_per_device"]
    if not isinstance(fits, bool) or fits != (peak <= memory):
        raise cost_fail(
            f'{where}: "fits" is {_value(peak <= memory)}: the peak ({peak}) is '
            f"{'at most' if peak <= memory else 'over'} the chip's memory ({memory}), not {shown(fits)}"
        )
    if shape and math.prod(shape) != data["devices"]:
        raise cost_fail(
            f'{where}: the target {name} has {math.prod(shape)} chips, but "devices" is {data["devices"]}'
        )
    _read_estimate(data["estimate"], compiler, f'{where}: "estimate"')


def _chip_of(name: Any, where: str) -> tuple[str, tuple[int, ...]]:
    """The chip key and topology shape (`()` for a GPU) of a recorded target name."""
    known = ", ".join([f"{chip}:SHAPE" for chip in TPU_CHIPS] + list(GPU_CHIPS))
    if isinstance(name, str) and name in GPU_CHIPS:
        return name, ()
    m = _TOPOLOGY.fullmatch(name) if isinstance(name, str) else None
    if m is None or m["chip"] not in TPU_CHIPS:
        raise cost_fail(f'{where}: "target" is a TPU topology or a GPU ({known}), not {shown(name)}')
    shape = tuple(int(n) for n in m["shape"].split("x"))
    if min(shape) < 1:
        raise cost_fail(f"{where}: the topology {name} has a dimension of 0 chips")
    return m["chip"], shape


def _read_estimate(value: Any, compiler: str, where: str) -> None:
    estimate = exact_keys(value, ESTIMATE_KEYS, where)
    parts = {bound: figure(estimate[f"{bound}_s"], f'{where}: "{bound}_s"') for bound in BOUNDS}
    total = figure(estimate["total_s"], f'{where}: "total_s"')
    made = max(parts["compute"], parts["memory"]) + parts["communication"]
    if not math.isclose(total, made, rel_tol=1e-9):
        raise cost_fail(
            f'{where}: "total_s" is {total!r}, but max(compute_s, memory_s) + communication_s is {made!r}'
        )
    if estimate["dtype"] not in DTYPES:
        raise cost_fail(f'{where}: "dtype" is one of {", ".join(DTYPES)}, not {shown(estimate["dtype"])}')
    bound = max(parts, key=lambda k: parts[k])
    if estimate["bound"] != bound:
        raise cost_fail(f'{where}: "bound" is "{bound}", the largest part, not {shown(estimate["bound"])}')
    links = estimate["links"]
    names = LINKS[compiler]
    if (
        not isinstance(links, dict)
        or any(link not in names for link in links)
        or list(links) != sorted(links)
    ):
        raise cost_fail(
            f'{where}: "links" is an object of seconds by link ({", ".join(names)} for this compiler), '
            f"in that order, not {shown(links)}"
        )
    seconds = [figure(s, f"{where}: the seconds of {link}") for link, s in links.items()]
    if not math.isclose(math.fsum(seconds), parts["communication"], rel_tol=1e-9):
        raise cost_fail(
            f'{where}: "communication_s" is {parts["communication"]!r}, but its links sum to {math.fsum(seconds)!r}'
        )
    peak = figure(estimate["peak_flops"], f'{where}: "peak_flops"')
    if not peak:
        raise cost_fail(f'{where}: "peak_flops" is the chip\'s FLOPs per second, more than 0')
    useful = figure(estimate["model_flops_per_device"], f'{where}: "model_flops_per_device"')
    mfu = figure(estimate["mfu"], f'{where}: "mfu"', null=True)
    expected = useful / (total * peak) if total > 0 else None
    if (mfu is None) != (expected is None) or (
        mfu is not None and expected is not None and not math.isclose(mfu, expected, rel_tol=1e-9)
    ):
        raise cost_fail(
            f'{where}: "mfu" is {shown(mfu)}, but model_flops_per_device / (total_s * peak_flops) is {expected!r}'
        )


def _yes(fits: bool) -> str:
    return "yes" if fits else "no"


def target_changes(old: dict[str, Any], new: dict[str, Any], rtol: float) -> list[str]:
    """What a golden plan calls a change of target: another target (or one
    that came or went), the peak fitting the chip or not, the estimated step
    time moved by more than `rtol` (relative)."""
    a, b = old.get("target"), new.get("target")
    out = [f"target: {a or 'none'} -> {b or 'none'}"] if a != b else []
    if a is None or b is None:
        return out
    if old["fits"] != new["fits"]:
        out.append(f"fits the chip's memory: {_yes(old['fits'])} -> {_yes(new['fits'])}")
    x, y = old["estimate"]["total_s"], new["estimate"]["total_s"]
    if not math.isclose(x, y, rel_tol=rtol):
        change = f" ({y / x:.2f}x)" if x else ""
        out.append(f"estimated step time: {format_seconds(x)} -> {format_seconds(y)}{change}")
    return out


def fit_words(peak: int, memory: int) -> str:
    """`yes: peak 8.8 MiB of 80.0 GiB (0.0%)` or `no: peak ..., over by ...`."""
    if peak <= memory:
        return f"yes: peak {format_bytes(peak)} of {format_bytes(memory)} ({peak / memory:.1%})"
    return f"no: peak {format_bytes(peak)} of {format_bytes(memory)}, over by {format_bytes(peak - memory)}"


def target_rows(cost: dict[str, Any]) -> list[tuple[str, str]]:
    """The (measure, value) rows a report shows for a target (none without one)."""
    if cost.get("target") is None:
        return []
    estimate = cost["estimate"]
    compiler = (
        "the TPU compiler"
        if cost["compiler"] == "tpu"
        else "XLA's CPU compiler, on simulated devices (FLOPs, memory and collectives); the time is the chip's"
    )
    links = ", ".join(f"{link} {format_seconds(s)}" for link, s in estimate["links"].items() if s > 0)
    rows = [("target", cost["target"]), ("compiled by", compiler)]
    if cost["code_bytes_per_device"]:
        rows.append(
            ("generated code per device", f"{format_bytes(cost['code_bytes_per_device'])} (in the peak)")
        )
    rows += [
        ("fits the chip's memory", fit_words(cost["peak_bytes_per_device"], cost["hbm_bytes_per_device"])),
        ("step time (estimate)", f"{format_seconds(estimate['total_s'])}, {estimate['bound']}-bound"),
        ("  compute", f"{format_seconds(estimate['compute_s'])} at {estimate['dtype']} peak"),
        ("  memory", format_seconds(estimate["memory_s"])),
        ("  communication", format_seconds(estimate["communication_s"]) + (f" ({links})" if links else "")),
        ("MFU (estimate)", "-" if estimate["mfu"] is None else f"{estimate['mfu']:.1%}"),
    ]
    return rows
