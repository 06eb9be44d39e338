"""Which computations of a compiled step run repeated: FLOPs per scope read
off the optimised HLO, the step's on its mesh against the one-device step's.

XLA's cost analysis gives one count for the whole step. A FLOPs overage
(`lint --max-flops-ratio`, SR122) comes from computations that are not split
over the mesh: each device computes them whole (a replicated layout) or a
part larger than its share. Collectives add none. To name them, each
instruction of the compiled program is counted (a `dot` as `2 x` its result
times its contracted size, a convolution likewise, a reduction once per
element it reads, any other arithmetic once per element it makes; data
movement, collectives and control flow as nothing) and summed by the scope
its `op_name` metadata names (`SCOPE (backward)` for the gradient's), as the
collectives of `StepCost` are. The same sums of the one-device step, divided
by the devices, are each scope's share: a scope whose devices compute more
than their share runs repeated, and `replicated` ranks them by the FLOPs
repeated. Each computation counts as many times as one call of the step
runs it: a loop's body once per trip where the HLO says the trip count (a
`scan` over layers, once per layer), where XLA's own cost analysis counts it
once. These are estimates made the same way for both programs.

`flops(..., like_xla=True)` and `accessed` count an instruction as XLA's
cost analysis does, for what it leaves out of a loop's other trips
(`_hlo.loop_extra`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable

from ._hlo import CONTROL, Instruction, Program, elements, op_name, operands_of, program, size
from ._scopes import scope_of

_CONTRACTING = re.compile(r"lhs_contracting_dims=\{(?P<dims>[0-9,]*)\}")
_LABELS = re.compile(r"dim_labels=[^_\s]*_(?P<kernel>[^-\s]*)->")

_FREE = frozenset((
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast", "bitcast-convert", "reshape",
    "transpose", "broadcast", "copy", "slice", "dynamic-slice", "dynamic-update-slice", "concatenate", "pad",
    "iota", "gather", "scatter", "reverse", "convert", "fusion", "call", "while", "conditional", "custom-call",
    "after-all", "partition-id", "replica-id", "add-dependency", "domain", "opt-barrier",
    "optimization-barrier", "send", "recv", "infeed", "outfeed", "get-dimension-size", "all-reduce",
    "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "async-update",
    "rng-get-and-update-state",
))  # fmt: skip
"""Opcodes counted as no FLOPs (and any `-start` or `-done`): data movement,
collectives, control flow (a fusion's, call's or loop's instructions are
counted where they are written, as many times as their computation runs)."""


@dataclasses.dataclass(frozen=True)
class Repeated:
    """A scope whose devices compute more than their share of its FLOPs.

    - `scope`: the scope (`""` outside every named scope), its forward and
      backward operations together.
    - `passes`: `("forward",)`, `("backward",)` or both: whether its
      operations include the gradient's (`"backward"`: under a transpose,
      `SCOPE (backward)` in collectives' scopes) and others (`"forward"`).
    - `operations`: its most costly primitives, as the metadata names them
      (`dot_general`, `tanh`), most FLOPs first.
    - `flops_per_device`: what one device computes of it.
    - `share`: the one-device step's FLOPs of it divided by the devices.
    """

    scope: str
    passes: tuple[str, ...]
    operations: tuple[str, ...]
    flops_per_device: float
    share: float

    @property
    def times(self) -> float:
        """How many times its share a device computes."""
        return self.flops_per_device / self.share if self.share else math.inf


_NOTHING = frozenset(("parameter", "constant", "tuple", "get-tuple-element", "bitcast"))
"""Opcodes XLA's cost analysis counts no bytes for."""


def dims(shape: str) -> list[int]:
    """The dimensions of the first array of an HLO type."""
    m = re.search(r"\[(?P<dims>[0-9,]*)\]", shape)
    return [int(d) for d in m["dims"].split(",") if d] if m else []


_TRANSCENDENTAL = frozenset((
    "exponential", "exponential-minus-one", "log", "log-plus-one", "logistic", "power", "rsqrt", "sqrt",
    "cbrt", "tanh", "sine", "cosine", "tan", "atan2", "erf",
))  # fmt: skip
"""Opcodes XLA's cost analysis counts as transcendentals, not FLOPs."""


def flops(i: Instruction, *, like_xla: bool = False) -> float:
    """The FLOPs of one instruction, once. `like_xla`: as XLA's cost
    analysis counts them, a conversion once per element and a
    transcendental (`tanh`, `exponential`) as none."""
    if like_xla and (i.op == "convert" or i.op in _TRANSCENDENTAL):
        return float(elements(i.shape)) if i.op == "convert" else 0.0
    if i.op in _FREE or i.op.endswith(("-start", "-done")):
        return 0.0
    out = elements(i.shape)
    if i.op == "dot":
        m = _CONTRACTING.search(i.args)
        lhs = dims(i.operands[0]) if i.operands else []
        contracted = (
            math.prod(lhs[int(d)] for d in m["dims"].split(",") if d and int(d) < len(lhs)) if m else 1
        )
        return 2.0 * out * contracted
    if i.op == "convolution":
        return 2.0 * out * _window(i)
    if i.op in ("reduce", "reduce-window") and i.operands:
        return float(sum(elements(s) for s in i.operands[: max(len(i.operands) // 2, 1)]))
    return float(out)


_DILATE = re.compile(r"lhs_dilate=(?P<dilate>[0-9x]+)")


def _window(i: Instruction) -> float:
    """The multiply-adds of one output element of a convolution: its input
    features (of its group) times the input elements its window covers. A
    window over an input dilated by `lhs_dilate` covers `ceil(size / dilate)`
    real elements per dimension: the TPU compiler writes a batched matmul as
    a convolution whose window as long as the batch covers one element."""
    labels, kernel = _LABELS.search(i.args), dims(i.operands[1]) if len(i.operands) > 1 else []
    spec = labels["kernel"] if labels else ""
    if len(spec) != len(kernel) or "o" not in spec or "i" not in spec:
        return 1.0
    dilated = _DILATE.search(i.args)
    dilate = [int(d) for d in dilated["dilate"].split("x")] if dilated else []
    covered = 1.0
    for axis, label in enumerate(spec):
        if label.isdigit():
            d = dilate[int(label)] if int(label) < len(dilate) else 1
            covered *= math.ceil(kernel[axis] / d)
    return kernel[spec.index("i")] * covered


def _touched(i: Instruction, body: list[Instruction]) -> int:
    """Bytes of a fusion's operand or result that its computation `body`
    touches: a parameter read only by `dynamic-slice`s, their slices; one
    only updated in place (`dynamic-update-slice`'s first operand), none;
    a `dynamic-update-slice` result, its update; else the whole array."""
    if i.op == "dynamic-update-slice":
        return size(i.operands[1]) if len(i.operands) > 1 else size(i.shape)
    if i.op != "parameter":
        return size(i.shape)
    users = [(j, operands_of(j.args).index(i.name)) for j in body if i.name in operands_of(j.args)]
    if users and all(j.op == "dynamic-slice" and k == 0 for j, k in users):
        return sum(size(j.shape) for j, _ in users)
    if users and all(j.op == "dynamic-update-slice" and k == 0 for j, k in users):
        return 0
    return size(i.shape)


def accessed(p: Program, i: Instruction) -> int:
    """Bytes an instruction reads and writes as XLA's cost analysis counts
    them: its operands and its result, of a slice or an in-place update
    only the part moved, a fusion as one instruction (by what its
    computation touches of each operand and result)."""
    if i.op in _NOTHING or i.op in CONTROL:
        return 0
    if i.op == "dynamic-slice":  # the slice read and written, and the indices
        return 2 * size(i.shape) + sum(size(s) for s in i.operands[1:])
    if i.op == "dynamic-update-slice":  # the update read and written in place
        return sum(size(s) for s in i.operands[1:]) + size(i.operands[1] if len(i.operands) > 1 else "")
    called = re.search(r"\bcalls=%(?P<name>[\w.\-]+)", i.args) if i.op == "fusion" else None
    body = p.computations.get(called["name"], []) if called else []
    if not body:
        return sum(size(s) for s in i.operands) + size(i.shape)
    params = {int(m[1]): j for j in body if j.op == "parameter" and (m := re.match(r"(\d+)\)", j.args))}
    root = next((j for j in reversed(body) if j.root), body[-1])
    ends = [root] if root.op != "tuple" else [j for n in operands_of(root.args) for j in body if j.name == n]
    reads = sum(_touched(params[k], body) if k in params else size(s) for k, s in enumerate(i.operands))
    return reads + sum(_touched(j, body) if j.op != "parameter" else size(j.shape) for j in ends)


def by_scope(hlo: str) -> dict[str, dict[str, float]]:
    """Each scope's FLOPs in the compiled program `hlo` (optimised HLO text),
    by primitive: `{scope: {primitive: flops}}`. A loop's body and condition
    count once per trip where the HLO says the trip count (a `scan` over
    layers: once per layer), as the program runs them; XLA's own cost
    analysis counts them once."""
    p = program(hlo)
    out: dict[str, dict[str, float]] = {}
    for i in p.instructions:
        count = flops(i)
        if not count:
            continue
        name = op_name(i)
        primitive = name.rsplit("/", 1)[-1].rstrip(")") if name else i.op
        scopes = scope_of(name) if name else [""]
        for scope in scopes:
            per = out.setdefault(scope, {})
            per[primitive] = per.get(primitive, 0.0) + count / len(scopes) * p.runs(i.computation)
    return out


def _merged(per_scope: dict[str, dict[str, float]]) -> dict[str, tuple[set[str], dict[str, float]]]:
    """`by_scope`'s sums with each scope's backward operations added to its
    forward ones: `{scope: (passes, {primitive: flops})}`."""
    out: dict[str, tuple[set[str], dict[str, float]]] = {}
    for scope, per in per_scope.items():
        backward = scope.endswith(" (backward)")
        name = scope.removesuffix(" (backward)")
        passes, merged = out.setdefault(name, (set(), {}))
        passes.add("backward" if backward else "forward")
        for primitive, flops in per.items():
            merged[primitive] = merged.get(primitive, 0.0) + flops
    return out


def repeated(sharded: str, single: str, devices: int) -> list[Repeated]:
    """The scopes of the step compiled for `devices` devices (`sharded`, its
    optimised HLO) that compute more than their share of the same step
    compiled for one device (`single`), the most FLOPs repeated first."""
    mine, whole = _merged(by_scope(sharded)), _merged(by_scope(single))
    found = []
    for scope, (passes, per) in mine.items():
        flops = sum(per.values())
        share = sum(whole.get(scope, (set(), {}))[1].values()) / devices
        if flops <= share * 1.01:  # XLA's choices differ a little between the programs
            continue
        operations = tuple(sorted(per, key=lambda p: -per[p])[:3])
        ordered = tuple(p for p in ("forward", "backward") if p in passes)
        found.append(Repeated(scope, ordered, operations, flops, share))
    return sorted(found, key=lambda r: -(r.flops_per_device - r.share))


def describe(found: Iterable[Repeated], devices: int) -> list[str]:
    """Each repeated scope as a phrase for a message: `` `layer_0/up` (with
    its gradient: dot_general, tanh): computed whole on each of the 8
    devices, 3.35 MFLOP per device against 419.07 kFLOP ``."""
    from .._planning._plan import format_flops

    said = {("forward", "backward"): "with its gradient: ", ("backward",): "its gradient: "}
    out = []
    for r in found:
        name = f"`{r.scope}`" if r.scope else "outside every named scope"
        what = said.get(r.passes, "") + ", ".join(r.operations)
        if not r.share:
            how = "not in the one-device step"
        elif r.times >= devices * 0.99:
            how = f"computed whole on each of the {devices} devices"
        else:
            how = f"{r.times:.1f}x its share on each device"
        out.append(
            f"{name} ({what}): {how}, {format_flops(r.flops_per_device)} per device against "
            f"{format_flops(r.share)}"
        )
    return out
