"""`RuleJit.cost`: a step compiled for its mesh, or for the chips a target
names, and for one device of it (the ideal), read as a `StepCost`.

With a TPU target the step is traced and compiled again on the topology's
devices (the same axis names, sizes and types), by the TPU compiler: its
FLOPs, memory and collectives are that compiler's. With a GPU target it is
compiled for the mesh it has (simulated CPU devices) and costed with the
chip's figures. Either way the target's chip gives the memory the peak must
fit in and the figures of the time estimate.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._quiet import quiet
from .._tracing._compare import on_one_device, one_device_mesh, shapes_only
from ._cost import StepCost, cost_of
from ._estimate import estimate
from ._hlo import axes_of, matmul_flops_by_dtype
from ._targets import Target, parse_target, target_mesh


def _compile(lowered: Any, tpu: bool) -> Any:
    """`lowered.compile()`; for a TPU, a program over the chip's memory is
    compiled all the same (the TPU compiler refuses one by default, saying
    only by how much), so that its figures say where the memory goes."""
    try:
        return lowered.compile()
    except Exception as err:
        if not (tpu and "RESOURCE_EXHAUSTED" in str(err)):
            raise
        return lowered.compile(compiler_options={"xla_tpu_no_crash_on_oom": True})


def _compiled(step: Any, mesh: Any, args: tuple[Any, ...], ideal: bool, *, own: bool) -> tuple[Any, Any]:
    """`step` (a `RuleJit`) compiled on `mesh` (`own`: the mesh it runs on)
    for arguments shaped like `args`, and (with `ideal`) on one device of it."""
    shapes = shapes_only(args)
    tpu = mesh.devices.flat[0].platform == "tpu"
    with quiet():  # told once already, when the step was traced for its mesh
        on_mesh = step if own else step._like(mesh)
        compiled = _compile(on_mesh.lower(*shapes), tpu)
        one_device = None
        if ideal:
            one = one_device_mesh(mesh)
            one_device = _compile(on_one_device(step._like(one).lower, shapes, one), tpu)
    return compiled, one_device


def step_cost(
    step: Any, args: tuple[Any, ...], *, ideal: bool = True, target: str | Target | None = None
) -> StepCost:
    """What one call of `step` (a `RuleJit`) with arguments like `args`
    costs each device: compiled for the mesh it runs on, or for `target`
    (a TPU topology or a GPU model), and, with `ideal`, for one device of it.

    **Raises:** `TargetError` (SR126) for a target that cannot be compiled for."""
    entry = step._entry(args, stacklevel=4)
    if target is None:
        compiled, one_device = _compiled(step, entry.mesh, args, ideal, own=True)
        return cost_of(compiled, int(entry.mesh.devices.size), one_device)
    chosen = target if isinstance(target, Target) else parse_target(target)
    mesh = target_mesh(chosen, entry.mesh)
    compiled, one_device = _compiled(step, mesh, args, ideal, own=mesh is entry.mesh)
    cost = cost_of(compiled, int(mesh.devices.size), one_device, compiler=chosen.compiler)
    return on_target(cost, chosen, mesh, compiled.as_text() or "")


def on_target(cost: StepCost, target: Target, mesh: Any, hlo: str) -> StepCost:
    """`cost` with what `target`'s chip says of it: its memory, and the
    estimated step time (`hlo`: the compiled step's text, for its matrix
    multiplications' dtypes)."""
    chip = target.chip
    shape = tuple(mesh.devices.shape)
    axes = [len(axes_of(call.groups, shape)) for call in cost.calls]
    node_of = [d.id // chip.node_size for d in mesh.devices.flat] if chip.node_size else None
    model = cost.ideal_flops_per_device
    return dataclasses.replace(
        cost,
        target=target.name,
        hbm_bytes_per_device=chip.hbm_bytes,
        estimate=estimate(
            chip,
            flops=cost.flops_per_device,
            bytes_accessed=cost.bytes_accessed_per_device,
            by_dtype=matmul_flops_by_dtype(hlo),
            calls=cost.calls,
            devices=cost.devices,
            axes=axes,
            node_of=node_of,
            model_flops=model,
        ),
    )
