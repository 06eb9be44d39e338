"""`diff --step` and `dump --step`: the cost of one step under each side's
rules and mesh, traced on simulated devices (or the TPU topology a
`--target` names) and compiled there or for the target, and the table of the
two costs side by side."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .._language._rules import RuleSet
from .._planning._plan import format_bytes
from ._lint import UsageError
from ._step import _cost, _ensure_devices, trace_step


def start(sides: Mapping[str, tuple[RuleSet, Mapping[str, int] | None]], target: str | None = None) -> None:
    """JAX started once, with enough simulated devices for every side's mesh
    (none for a TPU target: its devices are the topology's)."""
    counts = [math.prod(sizes.values()) for _, sizes in sides.values() if sizes]
    if counts and not (target and _is_tpu(target)):
        _ensure_devices(max(counts))  # JAX starts once: with enough devices for both sides


def cost_of(spec: str, step: Any, args: tuple[Any, ...], target: str | None = None) -> Any:
    """The `StepCost` of a step `_step.make_step` made: traced, then compiled on
    its mesh or for the chips `target` names."""
    trace_step(spec, step, args)
    return _cost(spec, step, args, target)


def _is_tpu(target: str) -> bool:
    from .._costs._targets import parse_target
    from .._errors import TargetError

    try:
        return parse_target(target).compiler == "tpu"
    except TargetError as err:
        raise UsageError(f"--target: SR126 {err.diagnostics[0].message}; {err.hint}") from None


def cost_rows(costs: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """`diff --step`'s table: each measure of the two sides' costs, and B over A."""
    from .._planning._plan import format_flops

    a, b = costs["a"], costs["b"]

    def collective_bytes(cost: Any) -> int:
        return sum(c.bytes_per_device for c in cost.collectives)

    def ratio(x: float | None, y: float | None) -> str:
        return f"{y / x:.2f}x" if x and y is not None else "-"

    measures = [
        ("devices", str(a.devices), str(b.devices), ratio(a.devices, b.devices)),
        ("FLOPs per device", format_flops(a.flops_per_device), format_flops(b.flops_per_device),
         ratio(a.flops_per_device, b.flops_per_device)),
        ("against the ideal", "-" if a.ratio is None else f"{a.ratio:.2f}x",
         "-" if b.ratio is None else f"{b.ratio:.2f}x",
         ratio(a.ratio, b.ratio)),
        ("peak memory per device", format_bytes(a.peak_bytes_per_device), format_bytes(b.peak_bytes_per_device),
         ratio(a.peak_bytes_per_device, b.peak_bytes_per_device)),
        ("collectives per device", format_bytes(collective_bytes(a)), format_bytes(collective_bytes(b)),
         ratio(collective_bytes(a), collective_bytes(b))),
    ]  # fmt: skip
    if a.target is not None or b.target is not None:
        measures += target_rows(a, b, ratio)
    return measures


def target_rows(a: Any, b: Any, ratio: Any) -> list[tuple[str, ...]]:
    """The rows of `cost_rows` for a target: each side's (`-` for a side
    without one), the compiler, whether the peak fits the chip's memory, the
    estimated step time and MFU."""
    from .._planning._units import format_seconds as seconds_text

    def fits(cost: Any) -> str:
        if cost.fits is None:
            return "-"
        share = cost.peak_bytes_per_device / cost.hbm_bytes_per_device
        return f"{'yes' if cost.fits else 'no'} ({share:.1%} of {format_bytes(cost.hbm_bytes_per_device)})"

    def time(cost: Any) -> str:
        return "-" if cost.estimate is None else seconds_text(cost.estimate.total_s)

    def mfu(cost: Any) -> float | None:
        return None if cost.estimate is None else cost.estimate.mfu

    same = a.target == b.target
    return [
        ("target", a.target or "-", b.target or "-", "same" if same else "differs"),
        ("compiler", a.compiler if a.target else "-", b.compiler if b.target else "-", "-"),
        ("fits the chip's memory", fits(a), fits(b), "-"),
        ("step time (estimate)", time(a), time(b), ratio(a.time_estimate_s, b.time_estimate_s)),
        ("MFU (estimate)", "-" if mfu(a) is None else f"{mfu(a):.1%}", "-" if mfu(b) is None else f"{mfu(b):.1%}",
         ratio(mfu(a), mfu(b))),
    ]  # fmt: skip


def target_note(costs: Mapping[str, Any]) -> str | None:
    """What to keep in mind when the two costs are not for the same target:
    only one side has one, or each its own (`None` when they agree)."""
    a, b = costs["a"].target, costs["b"].target
    if a == b:
        return None
    if a is None or b is None:
        side, name = ("B", b) if a is None else ("A", a)
        return (
            f"only {side} is costed for a target ({name}); the other on simulated CPU devices: their "
            "FLOPs, memory and collectives may come from different compilers, and only one has a time estimate"
        )
    return (
        f"A is costed for {a} and B for {b}: each side's figures are its own target's (its compiler, "
        "its chip's memory and speed)"
    )


COST_HEADER = ("step cost", "A", "B", "B / A")
