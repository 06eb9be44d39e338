"""How long a step takes on a chip, estimated from its compiled program and
the chip's published figures (a roofline, labelled an estimate everywhere).

- **compute**: each matrix multiplication's FLOPs over the chip's peak for
  its operands' dtype (the rest of the FLOPs at the rate of the dtype most
  of them use);
- **memory**: the bytes the step reads and writes over the chip's memory
  bandwidth;
- **communication**: each collective's bytes over the bandwidth of the links
  its mesh axes use, as a ring moves them: an all-gather receives
  `(n-1)/n` of its result, a reduce-scatter sends `n-1` times its result, an
  all-reduce twice `(n-1)/n`, an all-to-all `(n-1)/n`, a permute its result
  (`n` devices in each group). On a TPU the links are the slice's ICI (a
  collective over `k` mesh axes uses `k` rings, at most the chip's ports over
  two); on GPUs, NVLink within a node and the network where a group spans
  nodes.

The step takes `max(compute, memory) + communication`: compute and memory
traffic overlap, collectives are counted as not hidden behind either (XLA
overlaps some; the estimate is then high by at most the communication).
MFU is the one-device step's FLOPs per device over what the chip could do
in that time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .._planning._chips import Chip, dtype_class

_RING = {
    "all-gather": lambda n: (n - 1) / n,
    "all-to-all": lambda n: (n - 1) / n,
    "all-reduce": lambda n: 2 * (n - 1) / n,
    "reduce-scatter": lambda n: float(n - 1),
    "collective-permute": lambda n: 1.0,
}


@dataclasses.dataclass(frozen=True)
class TimeEstimate:
    """An estimate of one step's time on a chip (see `StepCost.time_estimate_s`).

    **Attributes:**

    - `compute_s`, `memory_s`, `communication_s`: its parts (seconds).
    - `links`: the communication by the links it uses, `(("ici", s), ...)`
      (`"ici"`, `"nvlink"`, `"network"`).
    - `dtype`: the class of the chip's peak most FLOPs run at (`"bf16"`,
      `"f32"`, `"fp8"`, `"int8"`), and `peak_flops` that rate per chip.
    - `model_flops_per_device`: the useful FLOPs per device MFU counts (the
      one-device step's over the devices, else the step's own).
    """

    compute_s: float
    memory_s: float
    communication_s: float
    links: tuple[tuple[str, float], ...]
    dtype: str
    peak_flops: float
    model_flops_per_device: float

    @property
    def total_s(self) -> float:
        """`max(compute, memory) + communication`."""
        return max(self.compute_s, self.memory_s) + self.communication_s

    @property
    def bound(self) -> str:
        """What the largest part is: `"compute"`, `"memory"` or `"communication"`."""
        parts = {"compute": self.compute_s, "memory": self.memory_s, "communication": self.communication_s}
        return max(parts, key=lambda k: parts[k])

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation: useful FLOPs over what the chip could do in `total_s`."""
        if self.total_s <= 0 or self.peak_flops <= 0:
            return None
        return self.model_flops_per_device / (self.total_s * self.peak_flops)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: every attribute, `total_s`, `bound` and `mfu`."""
        return {
            "compute_s": self.compute_s,
            "memory_s": self.memory_s,
            "communication_s": self.communication_s,
            "links": dict(self.links),
            "dtype": self.dtype,
            "peak_flops": self.peak_flops,
            "model_flops_per_device": self.model_flops_per_device,
            "total_s": self.total_s,
            "bound": self.bound,
            "mfu": self.mfu,
        }


def estimate_from_json(data: Mapping[str, Any]) -> TimeEstimate:
    """The `TimeEstimate` a `to_json()` dict holds."""
    return TimeEstimate(
        data["compute_s"],
        data["memory_s"],
        data["communication_s"],
        tuple(sorted(dict(data["links"]).items())),
        data["dtype"],
        data["peak_flops"],
        data["model_flops_per_device"],
    )


def _compute_seconds(chip: Chip, flops: float, by_dtype: Mapping[str, float]) -> tuple[float, str]:
    """`flops` run on `chip`: the matrix multiplications of each dtype at its
    rate, the rest at the rate of the dtype most of them use."""
    classes: dict[str, float] = {}
    for dtype, n in by_dtype.items():
        classes[dtype_class(dtype)] = classes.get(dtype_class(dtype), 0.0) + n
    main = max(classes, key=lambda k: classes[k]) if classes else "bf16"
    counted = sum(classes.values())
    scale = flops / counted if counted > flops > 0 else 1.0  # never more than the step's FLOPs
    seconds = sum(n * scale / chip.flops_rate(d) for d, n in classes.items())
    rest = max(flops - counted * scale, 0.0)
    return seconds + rest / chip.flops_rate(main), main


def link_of(chip: Chip, group: Sequence[int], node_of: Sequence[int] | None) -> str:
    """The links a collective group uses: `"ici"` on a TPU; on GPUs
    `"nvlink"` within a node, `"network"` where the group spans nodes
    (`node_of[d]`: the node of the device at position `d` of the mesh)."""
    if chip.platform == "tpu":
        return "ici"
    if node_of is None or len({node_of[d] for d in group if d < len(node_of)}) <= 1:
        return "nvlink"
    return "network"


def communication_seconds(
    chip: Chip, calls: Sequence[Any], devices: int, axes: Sequence[int], node_of: Sequence[int] | None
) -> dict[str, float]:
    """The seconds `calls` (each with `kind`, `bytes_per_device`, `runs`,
    `groups`; `axes[i]`: how many mesh axes call `i` runs over) take on
    `chip`, by link."""
    out: dict[str, float] = {}
    for call, spanned in zip(calls, axes, strict=True):
        groups = call.groups or (tuple(range(devices)),)
        n = max(len(groups[0]), 2) if call.kind != "collective-permute" else 2
        link = link_of(chip, groups[0], node_of)
        if link == "network":
            bandwidth = chip.network_bandwidth or chip.axis_bandwidth
        elif link == "ici":
            bandwidth = chip.axis_bandwidth * max(1, min(spanned, (chip.ici_ports or 2) // 2))
        else:
            bandwidth = chip.axis_bandwidth
        seconds = call.bytes_per_device * _RING[call.kind](n) / bandwidth * call.runs
        out[link] = out.get(link, 0.0) + seconds
    return out


def estimate(
    chip: Chip,
    *,
    flops: float,
    bytes_accessed: float,
    by_dtype: Mapping[str, float],
    calls: Sequence[Any],
    devices: int,
    axes: Sequence[int],
    node_of: Sequence[int] | None,
    model_flops: float | None,
) -> TimeEstimate:
    """The `TimeEstimate` of a step on `chip` (see the module's docstring)."""
    compute, dtype = _compute_seconds(chip, flops, by_dtype)
    links = communication_seconds(chip, calls, devices, axes, node_of)
    return TimeEstimate(
        compute_s=compute,
        memory_s=bytes_accessed / chip.hbm_bandwidth,
        communication_s=math.fsum(links.values()),
        links=tuple(sorted(links.items())),
        dtype=dtype,
        peak_flops=chip.flops_rate(dtype),
        model_flops_per_device=model_flops if model_flops is not None else flops,
    )
