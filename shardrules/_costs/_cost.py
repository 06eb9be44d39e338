"""What a layout costs per device, read off the compiled step: `StepCost`.

XLA compiles a step for the mesh it runs on (simulated CPU devices do as
well as real ones for this: the partitioned program is the same). From the
compiled step come its per-device FLOPs and bytes accessed
(`cost_analysis()`), its memory (`memory_analysis()`: arguments, outputs,
temporaries), and, from its optimised HLO (read by `_hlo`), every
collective with its result size and the scope of the operation it was made
for (the HLO's `op_name` metadata). XLA's cost analysis counts a loop's body
once; the FLOPs and bytes of its other trips are added where the HLO says
the trip count (XLA's, or the loop's counter: a `scan` over layers costs what
the same layers unrolled do), and each collective counts once per trip. The
ideal is the same step compiled for one device (a mesh of the same axis
names, each of size 1), its FLOPs divided by the devices: what a perfect
split would leave each device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .._errors import Diagnostic
from .._planning._plan import format_bytes, format_flops
from ._attribute import (
    ArrayCost,
    Owners,
    RuleCost,
    array_cost_from_json,
    by_owner,
    owned,
    products,
    rule_cost_from_json,
    rule_lines,
)
from ._estimate import TimeEstimate, estimate_from_json
from ._flops import Repeated, repeated
from ._hlo import KINDS, CollectiveCall, collective_calls, loop_extra, program
from ._largest import largest_values
from ._verdict import target_lines
from ._waste import waste


@dataclasses.dataclass(frozen=True)
class Collective:
    """One kind of collective in a compiled step.

    **Attributes:**

    - `kind`: `"all-gather"`, `"all-reduce"`, `"reduce-scatter"`,
      `"all-to-all"` or `"collective-permute"`.
    - `count`: how many the step runs in one call: a collective in a loop's
      body once per trip (where the HLO says the trip count), one that the TPU
      compiler writes in several pieces (an asynchronous one's start and
      done) once.
    - `bytes_per_device`: the size of their results on one device, summed
      over every run.
    - `scopes`: the named scopes of the operations they were made for, as
      the HLO's metadata says (`SCOPE (backward)` for the gradient's), most
      bytes first.
    """

    kind: str
    count: int
    bytes_per_device: int
    scopes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class StepCost:
    """What one call of a compiled step costs each device (see `RuleJit.cost`).

    **Attributes:**

    - `devices`: how many devices the step is partitioned over.
    - `flops_per_device`: XLA's count of floating-point operations one
      device runs, a loop's body counted once per trip (XLA counts it once).
    - `ideal_flops_per_device`: the one-device step's FLOPs divided by
      `devices` (`None` where it was not computed).
    - `ratio`: `flops_per_device / ideal_flops_per_device`: 1.0 is a perfect
      split; 2.0, each device doing twice its share.
    - `bytes_accessed_per_device`: bytes one device reads and writes (XLA's
      count, a loop's body's once per trip).
    - `peak_bytes_per_device`: arguments, outputs and temporaries held by one
      device at once, less what outputs reuse of donated arguments; on a TPU
      target, its generated code too (it lives in the chip's memory).
    - `argument_bytes_per_device`, `output_bytes_per_device`,
      `temp_bytes_per_device`, `code_bytes_per_device`: its parts.
    - `collectives`: a `Collective` per kind the step runs.
    - `target`: the `--target` it was costed for (`"v5p:8x8x4"`, `"h100"`),
      `None` for the mesh's own devices.
    - `compiler`: the platform whose compiler compiled it (`"cpu"`, `"tpu"`;
      a GPU target is compiled on simulated CPU devices).
    - `hbm_bytes_per_device`: the target chip's memory (`None` without a
      target); `fits`: whether the peak is at most that.
    - `estimate`: a `TimeEstimate` of one step on the target (compute,
      memory and communication parts, MFU), from the chip's published
      figures; `time_estimate_s`: its total. `None` without a target.
    - `notes`: what the figures leave out or may overstate, in words (no
      ideal where the one-device step does not compile; a GPU target's
      bfloat16 run as float32 by the CPU compiler).
    - `largest`: the largest values the compiled step makes, as `(scope and
      type, bytes)`, most bytes first (what its temporaries hold); not
      written by `to_json`.
    - `repeated`: the scopes whose devices compute more than their share of
      the one-device step's FLOPs of that scope, as `Repeated`s (a scope
      laid out on no mesh axis is computed whole on every device), most
      FLOPs repeated first; what a `ratio` above 1 is made of. Empty
      without the one-device step; not written by `to_json`.
    - `by_rule`: the collectives each rule line is for (`RuleCost`: per
      kind, runs and bytes per device per step, and the arrays), most bytes
      first; `"inferred"` and `"the model's code"` for those no rule laid
      out. The bytes add up to `collectives`'. Empty where the step was not
      traced for it (a `StepCost` from `cost_of` alone).
    - `by_array`: the same per array (`ArrayCost`): a parameter
      (`params/blocks/0/attn/o/kernel`), its gradient (`... (gradient)`), an
      activation (`activation SCOPE`).
    - `findings`: layouts that are correct but waste communication or
      memory, as warnings about the rule line that causes each (SR216: a
      gradient reduced on every trip of an accumulation loop; SR217: a
      parameter gathered whole and kept from the forward to the backward
      pass; SR218: an output computed whole on every device, then cut to its
      layout; SR219: an array moved to another layout and straight back);
      not written by `to_json`.
    - `calls`: each collective transfer as a `CollectiveCall` (its bytes,
      the times it runs, its replica groups, the operation it was made
      for), what `collectives` sums; not written by `to_json`, empty in a
      `StepCost` read back from JSON.
    """

    devices: int
    flops_per_device: float
    ideal_flops_per_device: float | None
    bytes_accessed_per_device: float
    peak_bytes_per_device: int
    argument_bytes_per_device: int
    output_bytes_per_device: int
    temp_bytes_per_device: int
    collectives: tuple[Collective, ...] = ()
    target: str | None = None
    compiler: str = "cpu"
    code_bytes_per_device: int = 0
    hbm_bytes_per_device: int | None = None
    estimate: TimeEstimate | None = None
    by_rule: tuple[RuleCost, ...] = ()
    by_array: tuple[ArrayCost, ...] = ()
    largest: tuple[tuple[str, int], ...] = dataclasses.field(default=(), compare=False)
    findings: tuple[Diagnostic, ...] = dataclasses.field(default=(), compare=False)
    notes: tuple[str, ...] = dataclasses.field(default=(), compare=False)
    repeated: tuple[Repeated, ...] = dataclasses.field(default=(), compare=False)
    calls: tuple[CollectiveCall, ...] = dataclasses.field(default=(), compare=False)

    @property
    def fits(self) -> bool | None:
        """Whether the peak fits the target chip's memory (`None` without a target)."""
        if self.hbm_bytes_per_device is None:
            return None
        return self.peak_bytes_per_device <= self.hbm_bytes_per_device

    @property
    def time_estimate_s(self) -> float | None:
        """The estimated seconds of one step on the target (`estimate.total_s`;
        `None` without a target): an estimate from published chip figures."""
        return None if self.estimate is None else self.estimate.total_s

    @property
    def ratio(self) -> float | None:
        if not self.ideal_flops_per_device:
            return None
        return self.flops_per_device / self.ideal_flops_per_device

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of every attribute (and `ratio`)."""
        out = dataclasses.asdict(self)
        for explanation in (
            "repeated",
            "calls",
            "largest",
            "findings",
        ):  # explanations of the figures, not figures
            del out[explanation]
        out["notes"] = list(self.notes)
        out["ratio"] = self.ratio
        out["fits"] = self.fits
        out["estimate"] = None if self.estimate is None else self.estimate.to_json()
        out["collectives"] = [dataclasses.asdict(c) | {"scopes": list(c.scopes)} for c in self.collectives]
        out["by_rule"] = [r.to_json() for r in self.by_rule]
        out["by_array"] = [a.to_json() for a in self.by_array]
        return out

    def lines(self) -> list[str]:
        """The cost as lines of text (what `str` gives): its figures, each
        kind of collective with the scopes it comes from, and the five rule
        lines whose collectives move the most bytes (`by_rule`)."""
        return [*figure_lines(self), *kind_lines(self), *rule_lines(self.by_rule)]

    def __str__(self) -> str:
        return "\n".join(self.lines())


def figure_lines(cost: StepCost) -> list[str]:
    """`cost`'s figures as lines: devices, FLOPs, bytes, memory, its target's, notes."""
    ratio = (
        f" ({cost.ratio:.2f}x the ideal {format_flops(cost.ideal_flops_per_device)})"
        if cost.ratio is not None
        else ""
    )
    out = [
        f"devices: {cost.devices}",
        f"FLOPs per device: {format_flops(cost.flops_per_device)}{ratio}",
        f"bytes accessed per device: {format_bytes(cost.bytes_accessed_per_device)}",
        f"peak memory per device: {format_bytes(cost.peak_bytes_per_device)} (arguments "
        f"{format_bytes(cost.argument_bytes_per_device)}, outputs {format_bytes(cost.output_bytes_per_device)}, "
        f"temporaries {format_bytes(cost.temp_bytes_per_device)})",
    ]
    return out + target_lines(cost) + [f"note: {note}" for note in cost.notes]


def kind_lines(cost: StepCost, scopes: bool = True) -> list[str]:
    """A line per kind of collective: its count and bytes per device, with
    (`scopes`) the first four scopes it comes from; `collectives: none`."""
    out = [] if cost.collectives else ["collectives: none"]
    for c in cost.collectives:
        shown = c.scopes if scopes else ()
        where = f"; from {', '.join(shown[:4])}{', ...' if len(shown) > 4 else ''}" if shown else ""
        out.append(f"{c.kind}: {c.count} ({format_bytes(c.bytes_per_device)} per device{where})")
    return out


def cost_from_json(data: dict[str, Any]) -> StepCost:
    """The `StepCost` a `to_json()` dict (as a plan file records it) holds."""
    later = {
        "target",
        "compiler",
        "code_bytes_per_device",
        "hbm_bytes_per_device",
        "estimate",
        "by_rule",
        "by_array",
    }
    fields = (
        {f.name for f in dataclasses.fields(StepCost)}
        - {"collectives", "repeated", "calls", "largest", "notes", "findings"}
        - later
    )
    estimate = data.get("estimate")
    return StepCost(
        **{key: data[key] for key in fields},
        target=data.get("target"),
        compiler=data.get("compiler", "cpu"),
        code_bytes_per_device=data.get("code_bytes_per_device", 0),
        hbm_bytes_per_device=data.get("hbm_bytes_per_device"),
        estimate=None if estimate is None else estimate_from_json(estimate),
        notes=tuple(data.get("notes", ())),
        by_rule=tuple(rule_cost_from_json(r) for r in data.get("by_rule", ())),
        by_array=tuple(array_cost_from_json(a) for a in data.get("by_array", ())),
        collectives=tuple(
            Collective(c["kind"], c["count"], c["bytes_per_device"], tuple(c["scopes"]))
            for c in data["collectives"]
        ),
    )


def collectives(hlo: str) -> tuple[Collective, ...]:
    """Every collective in the optimised HLO text `hlo`, by kind, each
    transfer as many times as one call of the step runs it (a loop's body's
    once per trip)."""
    return _by_kind(collective_calls(hlo))


def _by_kind(calls: Sequence[CollectiveCall]) -> tuple[Collective, ...]:
    found: dict[str, list[Any]] = {}
    for call in calls:
        entry = found.setdefault(call.kind, [0, 0, {}])
        entry[0] += call.runs
        entry[1] += call.bytes_per_device * call.runs
        for scope in call.scopes:
            entry[2][scope] = entry[2].get(scope, 0) + call.bytes_per_device * call.runs
    return tuple(
        Collective(kind, count, nbytes, tuple(sorted(scopes, key=lambda s: -scopes[s])))
        for kind in KINDS
        if kind in found
        for count, nbytes, scopes in [found[kind]]
    )


def _number(cost: Any, key: str) -> float:
    if isinstance(cost, Sequence) and not isinstance(cost, dict):
        cost = cost[0] if cost else {}
    return float((cost or {}).get(key, 0.0) or 0.0)


def cost_of(
    compiled: Any, devices: int, ideal: Any = None, *, compiler: str = "cpu", owners: Owners | None = None
) -> StepCost:
    """The `StepCost` of a compiled step partitioned over `devices`, given
    the same step compiled for one device (`None`: not known), by the
    `compiler` of that platform (a TPU's generated code counts in its peak),
    its collectives attributed to the arrays and rules `owners` names."""
    hlo = compiled.as_text() or ""
    extra_flops, extra_bytes = loop_extra(hlo)
    calls = tuple(collective_calls(hlo))
    found = owned(hlo, calls, owners) if owners is not None else []
    by_rule, by_array = by_owner(found, products(hlo, owners)) if owners is not None else ((), ())
    ideal_flops = None
    ideal_hlo = "" if ideal is None else ideal.as_text() or ""
    if ideal is not None:
        ideal_flops = _number(ideal.cost_analysis(), "flops") + loop_extra(ideal_hlo)[0]
    cost = compiled.cost_analysis()
    memory = compiled.memory_analysis()

    def stat(name: str) -> int:
        return int(getattr(memory, name, 0) or 0) if memory is not None else 0

    arguments, outputs = stat("argument_size_in_bytes"), stat("output_size_in_bytes")
    temps, aliased = stat("temp_size_in_bytes"), stat("alias_size_in_bytes")
    code = stat("generated_code_size_in_bytes") if compiler == "tpu" else 0
    return StepCost(
        devices=devices,
        flops_per_device=_number(cost, "flops") + extra_flops,
        ideal_flops_per_device=None if ideal_flops is None else ideal_flops / devices,
        bytes_accessed_per_device=_number(cost, "bytes accessed") + extra_bytes,
        peak_bytes_per_device=arguments + outputs + temps + code - aliased,
        argument_bytes_per_device=arguments,
        output_bytes_per_device=outputs,
        temp_bytes_per_device=temps,
        collectives=_by_kind(calls),
        by_rule=by_rule,
        by_array=by_array,
        compiler=compiler,
        code_bytes_per_device=code,
        largest=tuple(largest_values(hlo)),
        findings=()
        if owners is None
        else waste(program(hlo), found, owners, arguments + outputs + temps - aliased),
        repeated=() if ideal is None else tuple(repeated(hlo, ideal_hlo, devices)),
        calls=calls,
    )
