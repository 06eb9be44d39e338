"""What a step's cost says about its target, in words: which compiler's
figures they are, whether the peak fits the chip, and the estimated step
time with its parts (`StepCost.lines`, `explain --step --cost`)."""

from __future__ import annotations

from typing import Any

from .._planning._chips import CHIPS
from .._planning._units import format_bytes, format_seconds


def chip_of(target: str) -> Any:
    """The `Chip` a target name (as `StepCost.target` holds it) is of."""
    return CHIPS[target.split(":", 1)[0]]


def compiled_by(cost: Any) -> str:
    """`"the TPU compiler for v5p:8x8x4 (TPU v5p)"`, or for a GPU target the
    note that its figures are the CPU compiler's."""
    chip = chip_of(cost.target)
    if cost.compiler == "tpu":
        return f"compiled by the TPU compiler for {cost.target} ({cost.devices} {chip.name} chips)"
    return (
        f"{cost.devices} x {chip.name}: compiled on simulated CPU devices (JAX cannot compile for a GPU "
        "without one): FLOPs, memory and collectives are XLA's CPU compiler's, the time is the chip's"
    )


def fit_text(cost: Any, headroom: float = 0.0) -> str:
    """`"fits: 8.8 MiB of 95.0 GiB (0.0%)"` or `"does not fit: ... over by ..."`,
    with `headroom` (a fraction) of the chip's memory kept free."""
    usable = int(cost.hbm_bytes_per_device * (1 - headroom))
    share = cost.peak_bytes_per_device / cost.hbm_bytes_per_device
    kept = f", {headroom:.0%} kept free" if headroom else ""
    if cost.peak_bytes_per_device <= usable:
        return (
            f"fits: peak {format_bytes(cost.peak_bytes_per_device)} of {format_bytes(cost.hbm_bytes_per_device)} "
            f"per chip ({share:.1%}{kept})"
        )
    return (
        f"does not fit: peak {format_bytes(cost.peak_bytes_per_device)} per chip, over "
        f"{format_bytes(usable)}{kept} by {format_bytes(cost.peak_bytes_per_device - usable)}"
    )


def estimate_text(estimate: Any, total: bool = True) -> str:
    """`"12.3 ms (estimate, compute-bound): max(compute 10.0 ms at bf16 peak,
    memory 3.0 ms) + communication 2.3 ms (ici 2.3 ms); MFU 45%"` (without
    `total`, from `compute-bound:` on)."""
    links = ", ".join(f"{link} {format_seconds(s)}" for link, s in estimate.links if s > 0)
    mfu = f"; MFU {estimate.mfu:.0%}" if estimate.mfu is not None else ""
    said = (
        f"{format_seconds(estimate.total_s)} (estimate, {estimate.bound}-bound)"
        if total
        else f"{estimate.bound}-bound"
    )
    return (
        f"{said}: max(compute "
        f"{format_seconds(estimate.compute_s)} at {estimate.dtype} peak, memory {format_seconds(estimate.memory_s)}) "
        f"+ communication {format_seconds(estimate.communication_s)}{f' ({links})' if links else ''}{mfu}"
    )


def target_lines(cost: Any) -> list[str]:
    """The lines `StepCost.lines` adds for a target (none without one)."""
    if cost.target is None:
        return []
    out = [f"target: {cost.target}, {compiled_by(cost)}"]
    if cost.code_bytes_per_device:
        out.append(f"generated code per device: {format_bytes(cost.code_bytes_per_device)} (in the peak)")
    if cost.hbm_bytes_per_device is not None:
        out.append(fit_text(cost))
    if cost.estimate is not None:
        out.append(f"step time: {estimate_text(cost.estimate)}")
    return out


def verdict(cost: Any) -> str:
    """One line for `lint`: the step on its target, whether it fits and its
    estimated time (`"the step on v5p:8x8x4 (the TPU compiler's figures):
    fits: peak 65.0 MiB of 95.0 GiB per chip (0.1%); 846.4 µs per step
    (estimate, communication-bound), MFU 12%"`)."""
    whose = (
        "the TPU compiler's figures"
        if cost.compiler == "tpu"
        else "the CPU compiler's figures, the chip's time"
    )
    said = [f"the step on {cost.target} ({whose})"]
    if cost.hbm_bytes_per_device is not None:
        said.append(fit_text(cost))
    if cost.estimate is not None:
        e = cost.estimate
        mfu = f", MFU {e.mfu:.0%}" if e.mfu is not None else ""
        said.append(f"{format_seconds(e.total_s)} per step (estimate, {e.bound}-bound){mfu}")
    return ": ".join(said[:2]) + "".join(f"; {part}" for part in said[2:])
