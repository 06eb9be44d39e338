"""`RuleJit.cost`: a step compiled for its mesh, and for one device (the
ideal), read as a `StepCost`."""

from __future__ import annotations

from typing import Any

from .._quiet import quiet
from .._tracing._compare import on_one_device, one_device_mesh, shapes_only
from ._cost import StepCost, cost_of


def step_cost(step: Any, args: tuple[Any, ...], *, ideal: bool = True) -> StepCost:
    """What one call of `step` (a `RuleJit`) with arguments like `args`
    costs each device: compiled for the mesh it runs on, and, with `ideal`,
    for one device of it."""
    entry = step._entry(args, stacklevel=4)
    with quiet():  # told once already, when the step was traced for its mesh
        compiled = step.lower(*shapes_only(args)).compile()
        one_device = None
        if ideal:
            one = one_device_mesh(entry.mesh)
            one_device = on_one_device(step._like(one).lower, shapes_only(args), one).compile()
    return cost_of(compiled, int(entry.mesh.devices.size), one_device)
