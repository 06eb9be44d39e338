"""A step's cost on its own (simulated CPU) mesh read with a TPU chip's
figures: what a search ranks candidates by before it compiles the few best
for the TPU itself (a TPU compile of a large step takes minutes; this, seconds).

XLA's CPU compiler partitions the step as the TPU compiler would (the same
SPMD partitioner, the same layouts); the two differ in the collectives they
choose (the CPU all-reduces gradients the TPU reduce-scatters), in fusion and
so in temporaries. The estimate is for ranking layouts against each other,
not a TPU's figures: `StepCost.notes` says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._quiet import quiet
from .._tracing._compare import shapes_only
from ._cost import StepCost, cost_of
from ._step import _Compiled, _for_its_figures, on_target
from ._targets import Target

NOTE = (
    "screened: compiled by XLA's CPU compiler on simulated devices and timed with the chip's figures, "
    "to rank layouts before the TPU compiler compiles the best of them"
)


def screened(step: Any, args: tuple[Any, ...], target: Target | None) -> StepCost:
    """What `step` (a `RuleJit` on a mesh of CPU devices) costs each device
    with arguments like `args`, estimated on `target`'s chip (none: the
    figures alone): compiled on its own mesh for the figures only (no
    machine code optimised: the FLOPs, bytes, peak and collectives are those
    `step.cost` reads), without its one-device ideal or its collectives'
    owners. For a GPU target, what `step.cost(target=)` says without those;
    for a TPU target, a CPU compile's figures (`NOTE`)."""
    shapes = shapes_only(args)
    with quiet():
        mesh = step._entry(shapes, stacklevel=4).mesh
        lowered = step.lower(*shapes)
        compiled = _for_its_figures(lowered)
    cost = cost_of(compiled, int(mesh.devices.size), None, compiler="cpu")
    if target is None:
        return cost
    out = on_target(cost, target, mesh, _Compiled(compiled, lowered), compiler="cpu")
    return dataclasses.replace(out, notes=(*out.notes, NOTE)) if target.compiler == "tpu" else out
