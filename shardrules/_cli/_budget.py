"""A step's cost held to a budget in CI: `lint --step --max-flops-ratio X`
fails the run when each device runs more than X times its share of the
one-device step's FLOPs (SR122), `--max-peak-bytes SIZE` when a device holds
more than SIZE at once (SR123). Each finding names what costs most: SR122
the scopes whose devices compute more than their share (`StepCost.repeated`;
collectives move bytes and add no FLOPs), SR123 the parts of the peak and
what donation does or could save."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .._errors import Diagnostic, Span
from .._planning._plan import format_bytes
from .._pspec import entries
from ._lint import UsageError

_BUDGETS = (
    ("max_flops_ratio", "--max-flops-ratio"),
    ("max_peak_bytes", "--max-peak-bytes"),
    ("max_step_time", "--max-step-time"),
    ("hbm_headroom", "--hbm-headroom"),
    ("target", "--target"),
    ("max_collective_bytes", "--max-collective-bytes"),
    ("max_collective_increase", "--max-collective-increase"),
    ("baseline", "--baseline"),
)


def check_options(args: Any) -> None:
    """Each budget of lint's with what it needs: a step to compile, the
    chips (`--max-step-time`, `--hbm-headroom`), a baseline and an increase
    (`--max-collective-increase`, `--baseline`: each needs the other).
    `UsageError` naming the option (or setting) otherwise."""
    for option, flag in _BUDGETS:
        if (
            option == "target" and "target" in args.origins
        ):  # the project's chips, used where a step is costed
            continue
        if getattr(args, option) is not None and not args.step:
            raise UsageError(
                f"{_origin(args, option, flag)} is a budget for a step: give one to compile with "
                "--step MODULE:FUNCTION (or `step` in [tool.shardrules])"
            )
    for option, flag in _BUDGETS[2:4]:
        if getattr(args, option) is not None and not args.target:
            raise UsageError(
                f"{_origin(args, option, flag)} needs the chips the step will run on: --target NAME "
                "(e.g. v5p:8x8x4 or h100), or `target` in [tool.shardrules]"
            )
    if (args.max_collective_increase is None) != (args.baseline is None):
        given, needed = (
            ("max_collective_increase", "--baseline FILE (or `baseline` in [tool.shardrules]): the plan file")
            if args.baseline is None
            else (
                "baseline",
                "--max-collective-increase PCT (or `max-collective-increase` in [tool.shardrules])",
            )
        )
        flag = dict(_BUDGETS)[given]
        raise UsageError(
            f"{_origin(args, given, flag)} needs {needed}"
            + (
                " written by `shardrules dump RULES --shapes SOURCE --step MODULE:FUNCTION -o FILE` to compare with"
                if args.baseline is None
                else ": the growth of the step's collective bytes over the baseline's to allow, e.g. 10%"
            )
        )
    if args.baseline is not None and args.step:
        from ._commbudget import baseline_cost

        baseline_cost(args)  # an unreadable baseline stops the run before any step is compiled
    if isinstance(args.max_collective_bytes, str):  # the flag's: a size, checked before any compile
        from .._language._sizes import byte_size

        try:
            byte_size(args.max_collective_bytes)
        except ValueError as err:
            raise UsageError(f"--max-collective-bytes: {err}") from None


def _replicated(decisions: Sequence[Any], count: int = 3) -> list[str]:
    """The forward-pass scopes with the largest results laid out on no axis
    (what names the cost where the compiled programs could not be compared)."""
    sizes: dict[str, int] = {}
    for d in decisions:
        if d.scope.endswith("(backward)") or any(e is not None for e in entries(d.spec)):
            continue
        if len(d.shape) == 0 or math.prod(d.shape) <= 1:
            continue
        scope = d.scope or "(no scope)"
        sizes[scope] = max(sizes.get(scope, 0), math.prod(d.shape))
    ranked = sorted(sizes, key=lambda s: -sizes[s])[:count]
    return [f"`{s}`" for s in ranked]


def _flops_hint(cost: Any, decisions: Sequence[Any]) -> str:
    """SR122's hint: the computations that run repeated, and what to do."""
    from .._costs._flops import describe

    advice = (
        "lay those scopes out with activation rules (`explain --step` lists each decision; a gradient "
        "follows its forward layout), or shard the parameters and batch over more of the mesh"
    )
    if cost.repeated:
        shown = cost.repeated[:3]
        found = describe(shown, cost.devices)
        if any(not r.scope for r in shown):
            advice += " (wrap code outside every scope in `jax.named_scope(NAME)` for a rule to name it)"
        return f"computed more than their share: {'; '.join(found)}. To split them, {advice}"
    replicated = _replicated(decisions)
    if replicated:
        return f"operations laid out on no mesh axis: {', '.join(replicated)}. To split them, {advice}"
    return advice


def _memory_hint(cost: Any, donated: Sequence[int]) -> str:
    """SR123's hint: what would cut the peak, donation as it stands."""
    shard = "shard the largest arguments over more of the mesh (FSDP)"
    remat = "rematerialise activations (`jax.checkpoint`) to cut the temporaries"
    if not donated:
        return (
            f"{shard}, donate the parameters and optimizer state (`donate=` in sr.jit) so outputs reuse "
            f"their buffers, or {remat}"
        )
    reused = (
        cost.argument_bytes_per_device
        + cost.output_bytes_per_device
        + cost.temp_bytes_per_device
        - cost.peak_bytes_per_device
    )
    given = f"donate={tuple(donated)}"
    if reused <= 0:
        return (
            f"{given} is given but no output reuses a donated buffer: an output reuses one only where it "
            "has the donated argument's shape, dtype and layout (lay the new parameters out in "
            f"`out_groups` as `in_groups` lays the old); otherwise {shard}, or {remat}"
        )
    return (
        f"{given} already saves {format_bytes(reused)} (outputs reuse donated buffers); {shard}, or {remat}"
    )


def _origin(args: Any, option: str, flag: str) -> str:
    return (getattr(args, "origins", {}) or {}).get(option, flag)


def findings(
    cost: Any,
    decisions: Sequence[Any],
    max_ratio: float | None,
    max_peak: Any,
    span: Span | None,
    args: Any,
    donated: Sequence[int] = (),
) -> list[Diagnostic]:
    """SR122 / SR123 for a step over its budget (`max_peak`: bytes, or a
    size such as `"4GiB"`; `donated`: the positions the step donates)."""
    from .._language._sizes import byte_size
    from .._planning._plan import format_flops

    found = []
    ratio = cost.ratio
    if max_ratio is not None and ratio is not None and ratio > max_ratio:
        found.append(
            Diagnostic(
                "SR122",
                "error",
                f"the step runs {ratio:.2f}x the ideal FLOPs per device (at most {max_ratio:g} allowed by "
                f"{_origin(args, 'max_flops_ratio', '--max-flops-ratio')}): "
                f"{format_flops(cost.flops_per_device)} per device against {format_flops(cost.ideal_flops_per_device)}, "
                f"the one-device step's over {cost.devices} devices",
                span,
                None,
                _flops_hint(cost, decisions),
            )
        )
    if max_peak is not None:
        try:
            limit = max_peak if isinstance(max_peak, int) else byte_size(str(max_peak))
        except ValueError as err:
            raise UsageError(f"{_origin(args, 'max_peak_bytes', '--max-peak-bytes')}: {err}") from None
        if cost.peak_bytes_per_device > limit:
            found.append(
                Diagnostic(
                    "SR123",
                    "error",
                    f"the step holds {format_bytes(cost.peak_bytes_per_device)} per device at its peak (at most "
                    f"{format_bytes(limit)} allowed by {_origin(args, 'max_peak_bytes', '--max-peak-bytes')}): "
                    f"arguments {format_bytes(cost.argument_bytes_per_device)}, outputs "
                    f"{format_bytes(cost.output_bytes_per_device)}, temporaries {format_bytes(cost.temp_bytes_per_device)}",
                    span,
                    None,
                    _memory_hint(cost, donated),
                )
            )
    return found


def _listed(items: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"`{name}` {format_bytes(size)}" for name, size in items)


def _fit_hint(cost: Any, step: Any, step_args: Sequence[Any]) -> str:
    """SR127's hint: the largest arguments, values and collectives, and what to do."""
    from .._costs._largest import largest_arguments

    parts = []
    arguments = largest_arguments(step, step_args)
    if arguments:
        parts.append(f"largest arguments per chip: {_listed(arguments)}")
    if cost.largest:
        parts.append(f"largest values the step makes: {_listed(cost.largest)}")
    moved = sorted(cost.collectives, key=lambda c: -c.bytes_per_device)[:3]
    if moved:
        parts.append(
            "collectives: "
            + ", ".join(f"{c.kind} {format_bytes(c.bytes_per_device)} per device" for c in moved)
        )
    return "; ".join([*parts, "to fit, " + _memory_hint(cost, step.donate)])


def target_findings(
    cost: Any, step: Any, step_args: Sequence[Any], span: Span | None, args: Any
) -> list[Diagnostic]:
    """SR127 for a step whose peak does not fit its target chip's memory
    (less `--hbm-headroom`), SR128 for one whose estimated step time is over
    `--max-step-time`."""
    from .._costs._verdict import chip_of, estimate_text
    from .._planning._units import format_seconds

    if cost.target is None:
        return []
    found = []
    headroom = getattr(args, "hbm_headroom", None) or 0.0
    chip = chip_of(cost.target)
    usable = int(cost.hbm_bytes_per_device * (1 - headroom))
    if cost.peak_bytes_per_device > usable:
        kept = (
            f" ({format_bytes(usable)} with {headroom:.0%} kept free by "
            f"{_origin(args, 'hbm_headroom', '--hbm-headroom')})"
            if headroom
            else ""
        )
        found.append(
            Diagnostic(
                "SR127",
                "error",
                f"the step does not fit {cost.target}: it holds {format_bytes(cost.peak_bytes_per_device)} per "
                f"chip at its peak and the chip ({chip.name}) has {format_bytes(cost.hbm_bytes_per_device)}{kept}, "
                f"{format_bytes(cost.peak_bytes_per_device - usable)} over: arguments "
                f"{format_bytes(cost.argument_bytes_per_device)}, outputs {format_bytes(cost.output_bytes_per_device)}, "
                f"temporaries {format_bytes(cost.temp_bytes_per_device)}, generated code "
                f"{format_bytes(cost.code_bytes_per_device)} ({'TPU' if cost.compiler == 'tpu' else 'CPU'} compiler)",
                span,
                None,
                _fit_hint(cost, step, step_args),
            )
        )
    limit = getattr(args, "max_step_time", None)
    if limit is not None and cost.estimate is not None and cost.estimate.total_s > limit:
        estimate = cost.estimate
        found.append(
            Diagnostic(
                "SR128",
                "error",
                f"the step takes an estimated {format_seconds(estimate.total_s)} on {cost.target} (at most "
                f"{format_seconds(limit)} allowed by {_origin(args, 'max_step_time', '--max-step-time')}): "
                f"{estimate_text(estimate, total=False)}",
                span,
                None,
                _time_hint(cost),
            )
        )
    return found


def _time_hint(cost: Any) -> str:
    """SR128's hint: what the largest part of the estimate is made of."""
    estimate = cost.estimate
    if estimate.bound == "communication":
        moved = sorted(cost.collectives, key=lambda c: -c.bytes_per_device)[:3]
        where = "; ".join(
            f"{c.kind} {format_bytes(c.bytes_per_device)} per device"
            + (f" (from {', '.join(c.scopes[:2])})" if c.scopes else "")
            for c in moved
        )
        return (
            f"communication is the largest part: {where}. Lay the arrays those collectives move out so "
            "that fewer bytes cross the mesh (`explain --step --cost` shows every collective), or use "
            "fewer devices on the axes they run over"
        )
    if estimate.bound == "memory":
        return (
            f"memory traffic is the largest part ({format_bytes(cost.bytes_accessed_per_device)} read and "
            "written per chip): shard the largest arrays over more of the mesh, or use a lower-precision dtype"
        )
    ratio = f" ({cost.ratio:.2f}x the ideal FLOPs)" if cost.ratio is not None else ""
    return (
        f"compute is the largest part{ratio}: split the computations each chip repeats over more of the mesh "
        "(`lint --max-flops-ratio`), use a larger topology, or run the matrix multiplications in bf16"
    )
