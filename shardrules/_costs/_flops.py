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
runs it: a loop's body once per trip where XLA knows the trip count (a
`scan` over layers, once per layer), where XLA's own cost analysis counts it
once. These are estimates made the same way for both programs.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable

_LINE = re.compile(
    r"^\s*(?:ROOT\s+)?%(?P<name>[^\s=]+)\s*=\s*(?P<shape>\([^=]*?\)|\S+)\s+(?P<op>[a-z][\w\-]*)\((?P<args>.*)$"
)
_PARAMETERS = re.compile(r"^\s*%?[\w.\-]+\s*\((?P<params>.*)\)\s*->")
_PARAMETER = re.compile(r"(?P<name>[\w.\-]+):\s*(?P<shape>[a-z]+[0-9]*\[[0-9,]*\])")
_ARRAY = re.compile(r"[a-z]+[0-9]*\[(?P<dims>[0-9,]*)\]")
_OPERAND = re.compile(r"%(?P<name>[^\s,)]+)")
_OP_NAME = re.compile(r'op_name="(?P<name>[^"]*)"')
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


def _dims(shape: str) -> list[int]:
    m = _ARRAY.search(shape)
    return [int(d) for d in m["dims"].split(",") if d] if m else []


def _elements(shape: str) -> int:
    """The elements of an HLO type (`f32[16,64]{1,0}`, or a tuple of them)."""
    return sum(math.prod(int(d) for d in m["dims"].split(",") if d) for m in _ARRAY.finditer(shape))


def _operands(args: str) -> list[str]:
    """The names of an instruction's operands (the text after its `(`)."""
    depth, end = 1, len(args)
    for i, ch in enumerate(args):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            end = i
            break
    return [m["name"] for m in _OPERAND.finditer(args[:end])]


def _flops(op: str, shape: str, args: str, shapes: dict[str, str]) -> float:
    """The FLOPs of one instruction (`shapes`: each name's type, so far)."""
    if op in _FREE or op.endswith(("-start", "-done")):
        return 0.0
    out = _elements(shape)
    operands = [shapes.get(name, "") for name in _operands(args)]
    if op == "dot":
        m = _CONTRACTING.search(args)
        lhs = _dims(operands[0]) if operands else []
        contracted = (
            math.prod(lhs[int(d)] for d in m["dims"].split(",") if d and int(d) < len(lhs)) if m else 1
        )
        return 2.0 * out * contracted
    if op == "convolution":
        labels, kernel = _LABELS.search(args), _dims(operands[1]) if len(operands) > 1 else []
        if labels and len(labels["kernel"]) == len(kernel) and "o" in labels["kernel"]:
            # each output element: a kernel window over its input features (of its group)
            return 2.0 * out * math.prod(kernel) / max(kernel[labels["kernel"].index("o")], 1)
        return 2.0 * out
    if op in ("reduce", "reduce-window") and operands:
        return float(sum(_elements(s) for s in operands[: max(len(operands) // 2, 1)]))
    return float(out)


_COMPUTATION = re.compile(r"^\s*%?(?P<name>[\w.\-]+)\s*\(")
_CALLED = re.compile(
    r"\b(?P<how>body|condition|calls|branch_computations|true_computation|false_computation)=(?P<names>\{[^}]*\}|%[\w.\-]+)"
)
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(?P<n>\d+)"\}')


def by_scope(hlo: str) -> dict[str, dict[str, float]]:
    """Each scope's FLOPs in the compiled program `hlo` (optimised HLO text),
    by primitive: `{scope: {primitive: flops}}`. A loop's body and condition
    count once per trip where XLA knows the trip count (a `scan` over
    layers: once per layer), as the program runs them; XLA's own cost
    analysis counts them once."""
    from ._cost import scope_of  # `_cost` reads the collectives' scopes the same way, and imports this

    shapes: dict[str, str] = {}
    found: list[tuple[str, str, str, float]] = []  # (computation, scope, primitive, flops)
    callers: dict[str, list[tuple[str, int]]] = {}  # computation -> (caller, times per call)
    computation = ""
    for line in hlo.splitlines():
        signature = line.removeprefix("ENTRY ")
        header = _PARAMETERS.match(signature)
        if header is not None and "=" not in signature.split("(", 1)[0]:  # a computation's signature
            for m in _PARAMETER.finditer(header["params"]):  # names repeat across computations
                shapes[m["name"]] = m["shape"]
            named = _COMPUTATION.match(signature)
            computation = named["name"] if named else ""
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        shapes[m["name"]] = m["shape"]
        trips = _TRIPS.search(line) if m["op"] == "while" else None
        for called in _CALLED.finditer(m["args"]):
            times = int(trips["n"]) if trips and called["how"] in ("body", "condition") else 1
            for callee in _OPERAND.finditer(called["names"]):
                callers.setdefault(callee["name"], []).append((computation, times))
        flops = _flops(m["op"], m["shape"], m["args"], shapes)
        if not flops:
            continue
        name = _OP_NAME.search(line)
        op_name = name["name"] if name else ""
        primitive = op_name.rsplit("/", 1)[-1].rstrip(")") if op_name else m["op"]
        scopes = scope_of(op_name) if op_name else [""]
        found += [(computation, scope, primitive, flops / len(scopes)) for scope in scopes]
    runs = _runs(callers)
    out: dict[str, dict[str, float]] = {}
    for computation, scope, primitive, flops in found:
        per = out.setdefault(scope, {})
        per[primitive] = per.get(primitive, 0.0) + flops * runs(computation)
    return out


def _runs(callers: dict[str, list[tuple[str, int]]]) -> Callable[[str], int]:
    """How many times one call of the step runs each computation: the sum,
    over the instructions that call it, of the times their own computation
    runs times the times each call runs it (a loop's trip count); a
    computation nothing calls (the entry) runs once."""
    memo: dict[str, int] = {}

    def runs(computation: str, seen: frozenset[str] = frozenset()) -> int:
        if computation not in memo:
            calls = [(c, n) for c, n in callers.get(computation, ()) if c not in seen]  # HLO calls no cycle
            seen = seen | {computation}
            memo[computation] = sum(runs(c, seen) * n for c, n in calls) if calls else 1
        return memo[computation]

    return runs


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
