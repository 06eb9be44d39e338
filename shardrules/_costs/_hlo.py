"""Reading the optimised HLO text of a compiled step (`compiled.as_text()`).

One parser serves `StepCost` and `_flops`. `program` splits the text into
computations and instructions, and knows how many times one call of the
step runs each computation (`Program.runs`): a `while` loop's body once per
trip (a `scan` over layers, once per layer; once where neither XLA's trip
count nor the loop's counter says), a fusion's or call's computation as
often as the instructions that call it run. XLA's own cost
analysis counts each computation once per call site; `loop_extra` is the
difference.

Collectives are read as transfers (`collective_calls`): each once, with the
size of its result on one device, its replica groups and the times it runs.
The TPU compiler writes one collective several times: an asynchronous one
as a fusion that starts it (its root a `custom-call` to
`AsyncCollectiveStart`), fusions that overlap work with it, and one that
ends it (`AsyncCollectiveDone`), each holding a copy of the same collective
(the same `channel_id`); only the start counts. It also fuses a reduce-scatter
as an `all-reduce` whose result is sliced (a fusion whose root is
`dynamic-slice`s of it): that counts as a `reduce-scatter` of the slices'
size. An async pair (`all-gather-start`/`-done`) counts once, at its start,
with the size of its output; a collective in a computation that an
`async-start` calls, as often as that computation runs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any

from ._groups import nested_groups, parse_groups
from ._opnames import scope_of

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_LINE = re.compile(
    r"^\s*(?P<root>ROOT\s+)?%(?P<name>[^\s=]+)\s*=\s*(?P<shape>\([^=]*?\)|\S+)\s+(?P<op>[a-z][\w\-]*)\((?P<args>.*)$"
)
_SIGNATURE = re.compile(r"^\s*%?(?P<name>[\w.\-]+)\s*\((?P<params>.*)\)\s*->")
_PARAMETER = re.compile(r"(?P<name>[\w.\-]+):\s*(?P<shape>[a-z]+[0-9]*\[[0-9,]*\])")
_ARRAY = re.compile(r"(?P<dtype>[a-z]+[0-9]*[a-z0-9]*)\[(?P<dims>[0-9,]*)\]")
_COMMENT = re.compile(r"/\*.*?\*/")
_OPERAND = re.compile(r"%(?P<name>[^\s,)}]+)")
_OP_NAME = re.compile(r'op_name="(?P<name>[^"]*)"')
_CALLED = re.compile(
    r"\b(?P<how>body|condition|calls|to_apply|branch_computations|true_computation|false_computation)="
    r"(?P<names>\{[^}]*\}|%[\w.\-]+)"
)
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(?P<n>\d+)"\}')
_TARGET = re.compile(r'custom_call_target="(?P<target>[^"]*)"')
_GROUPS = re.compile(
    r"replica_groups=(?P<groups>\{[{}0-9,\s]*\}|\[[0-9,]*\]<=\[[0-9,]*\](?:T\([0-9,]*\))?|mesh\[[^\]]*\](?:,\s*device_ids=\((?:\[[0-9,]*\](?:T\([0-9,]*\))?|[0-9,\s]*)\))?\s*\{[^}]*\})"
)
_PAIRS = re.compile(r"source_target_pairs=(?P<pairs>\{[{}0-9,\s]*\})")
_BITS = {"pred": 8, "s4": 4, "u4": 4, "s2": 2, "u2": 2, "e2m1fn": 4}
CONTROL = frozenset(("while", "call", "conditional"))
"""Opcodes whose cost is that of the computations they call."""


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One instruction: its computation, name, result type, opcode, the text
    after its `(`, whether it is its computation's root, and its operands'
    types (as the text defines them before it)."""

    computation: str
    name: str
    shape: str
    op: str
    args: str
    root: bool
    operands: tuple[str, ...]


@dataclasses.dataclass(eq=False)
class Program:
    """A compiled program's instructions, in order, and who calls what.

    `callers`: for each computation, `(calling instruction, times each call
    runs it)`: a loop's trip count for its body and condition, else 1."""

    instructions: tuple[Instruction, ...]
    callers: dict[str, tuple[tuple[Instruction, int], ...]]
    entry: str = ""
    _memo: dict[tuple[str, bool], int] = dataclasses.field(default_factory=dict, repr=False)
    # what the readers of a program work out once per instruction (`_flow.computes`)
    facts: dict[tuple[str, ...], Any] = dataclasses.field(default_factory=dict, repr=False)

    @functools.cached_property
    def computations(self) -> dict[str, list[Instruction]]:
        out: dict[str, list[Instruction]] = {}
        for i in self.instructions:
            out.setdefault(i.computation, []).append(i)
        return out

    @functools.cached_property
    def named(self) -> dict[tuple[str, str], Instruction]:
        """Each instruction by `(computation, name)`."""
        return {(i.computation, i.name): i for i in self.instructions}

    @functools.cached_property
    def users(self) -> dict[tuple[str, str], list[tuple[Instruction, int]]]:
        """For each `(computation, name)`, the instructions using it and at
        which operand position."""
        out: dict[tuple[str, str], list[tuple[Instruction, int]]] = {}
        for i in self.instructions:
            for position, name in enumerate(operands_of(i.args)):
                out.setdefault((i.computation, name), []).append((i, position))
        return out

    def runs(self, computation: str, *, trips: bool = True, seen: frozenset[str] = frozenset()) -> int:
        """How many times one call of the step runs `computation`: the sum,
        over the instructions that call it, of the times their own
        computation runs times the times each call runs it; a computation
        nothing calls (the entry) runs once. Without `trips`, each loop's
        body counts once, as XLA's cost analysis counts it."""
        key = (computation, trips)
        if key not in self._memo:
            calls = [(c, n) for c, n in self.callers.get(computation, ()) if c.computation not in seen]
            seen = seen | {computation}  # HLO calls no cycle
            times = [self.runs(c.computation, trips=trips, seen=seen) * (n if trips else 1) for c, n in calls]
            self._memo[key] = sum(times) if calls else 1
        return self._memo[key]

    def called_by_fusion(self, computation: str) -> bool:
        """Whether a fusion (or a reduction's `to_apply`) calls `computation`
        (XLA's cost analysis counts the instruction calling it)."""
        return any(c.op not in CONTROL for c, _ in self.callers.get(computation, ()))


def operands_of(args: str) -> list[str]:
    """The names of an instruction's operands (the text after its `(`)."""
    depth, end = 1, len(args)
    for i, ch in enumerate(args):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            end = i
            break
    return [m["name"] for m in _OPERAND.finditer(args[:end])]


@functools.lru_cache(maxsize=8)
def program(hlo: str) -> Program:
    """The instructions of the optimised HLO text `hlo`, each with its
    operands' types, and the callers of each computation."""
    shapes: dict[str, str] = {}  # names repeat across computations: the latest definition
    found: list[Instruction] = []
    computation = entry = ""
    for line in hlo.splitlines():
        line = _COMMENT.sub("", line)  # XLA numbers long tuples' elements: `/*index=5*/f32[4]`
        signature = line.removeprefix("ENTRY ")
        header = _SIGNATURE.match(signature)
        if header is not None and "=" not in signature.split("(", 1)[0]:  # a computation's signature
            for m in _PARAMETER.finditer(header["params"]):
                shapes[m["name"]] = m["shape"]
            computation = header["name"]
            entry = computation if line.startswith("ENTRY") else entry
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        operands = tuple(shapes.get(name, "") for name in operands_of(m["args"]))
        i = Instruction(computation, m["name"], m["shape"], m["op"], m["args"], bool(m["root"]), operands)
        shapes[i.name] = i.shape
        found.append(i)
    named = {(i.computation, i.name): i for i in found}
    roots = {i.computation: i for i in found if i.root}
    callers: dict[str, list[tuple[Instruction, int]]] = {}
    for i in (i for i in found if i.op not in ("async-update", "async-done")):  # their start calls it
        trips = _trip_count(i, named, roots) if i.op == "while" else None
        for called in _CALLED.finditer(i.args):
            times = (trips or 1) if called["how"] in ("body", "condition") else 1
            for callee in _OPERAND.finditer(called["names"]):
                callers.setdefault(callee["name"], []).append((i, times))
    return Program(tuple(found), {k: tuple(v) for k, v in callers.items()}, entry)


def _trip_count(
    loop: Instruction, named: dict[tuple[str, str], Instruction], roots: dict[str, Instruction]
) -> int | None:
    """How many trips a `while` makes: the `known_trip_count` XLA writes in
    its `backend_config`, or, where it writes none (the TPU compiler), read
    off a counter: the condition compares an element of the loop's state
    with a constant, the loop starts it at a constant and the body adds a
    constant to it. `None` where neither says."""
    if (known := _TRIPS.search(loop.args)) is not None:
        return int(known["n"])
    called = {m["how"]: m["names"].lstrip("%") for m in _CALLED.finditer(loop.args)}

    def find(computation: str, name: str) -> Instruction | None:  # through copies, and annotations
        i = named.get((computation, name))
        while i is not None and _passes_through(i) and (names := operands_of(i.args)):
            i = named.get((computation, names[0]))
        return i

    def read(i: Instruction | None, op: str, pattern: str) -> int | None:
        m = re.search(pattern, i.args) if i is not None and i.op == op else None
        return int(m[1]) if m else None

    constant = functools.partial(read, op="constant", pattern=r"^\s*(-?\d+)\)")
    element = functools.partial(read, op="get-tuple-element", pattern=r"\bindex=(\d+)")  # of the state

    test, step = roots.get(called.get("condition", "")), roots.get(called.get("body", ""))
    how = re.search(r"direction=(\w+)", test.args) if test is not None and test.op == "compare" else None
    if how is None or test is None or step is None or step.op != "tuple":
        return None
    (left, right), direction = (find(test.computation, n) for n in operands_of(test.args)[:2]), how[1]
    if element(left) is None:  # `bound > counter`
        left, right, direction = (
            right,
            left,
            {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE"}.get(direction, ""),
        )
    k, bound = element(left), constant(right)
    start = find(loop.computation, (operands_of(loop.args) or [""])[0])
    if k is None or bound is None or start is None or start.op != "tuple":
        return None
    first = constant(find(loop.computation, operands_of(start.args)[k]))
    update = find(step.computation, operands_of(step.args)[k])
    parts = (
        [find(step.computation, n) for n in operands_of(update.args)] if update and update.op == "add" else []
    )
    by = [constant(x) for x in parts if element(x) != k]
    if first is None or len(by) != 1 or not by[0] or not any(element(x) == k for x in parts):
        return None
    span, stride = bound - first, by[0]
    trips = {"LT": -(-span // stride), "LE": span // stride + 1}.get(direction.replace("G", "L"), 0)
    return trips if trips >= 1 else None


def _passes_through(i: Instruction) -> bool:
    """An instruction that hands its operand on unchanged, for reading a loop
    counter: a copy, a bitcast, a conversion, or (in a program before XLA's
    passes) the annotation of a sharding."""
    return i.op in ("copy", "bitcast", "convert") or (
        i.op == "custom-call" and 'custom_call_target="Sharding"' in i.args
    )


def size(shape: str) -> int:
    """Bytes of an HLO type (`f32[16,64]{1,0}`, or a tuple of them)."""
    total = 0
    for m in _ARRAY.finditer(shape):
        dtype = m["dtype"]
        bits = _BITS.get(dtype) or _BITS.get(dtype.lstrip("f0123456789"))
        if bits is None:
            digits = re.match(r"^[a-z]+(?P<n>[0-9]*)", dtype)
            bits = int(digits["n"]) if digits and digits["n"] else 8
        total += math.prod(int(d) for d in m["dims"].split(",") if d) * bits // 8
    return total


def elements(shape: str) -> int:
    """The elements of an HLO type (`f32[16,64]{1,0}`, or a tuple of them)."""
    return sum(math.prod(int(d) for d in m["dims"].split(",") if d) for m in _ARRAY.finditer(shape))


def op_name(i: Instruction) -> str:
    """The `op_name` of an instruction's metadata, `""` if none."""
    m = _OP_NAME.search(i.args)
    return m["name"] if m else ""


@dataclasses.dataclass(frozen=True)
class CollectiveCall:
    """One collective transfer of a compiled step.

    - `kind`: `"all-gather"`, `"all-reduce"`, `"reduce-scatter"`,
      `"all-to-all"` or `"collective-permute"`.
    - `bytes_per_device`: the size of its result on one device, one run.
    - `runs`: how many times one call of the step runs it (a loop's body's
      collective, once per trip).
    - `groups`: its replica groups, device ids in the program's numbering
      (the mesh's devices in order), however the HLO writes them; a
      collective-permute's `(source, target)` pairs; `None` where the HLO
      names none: all devices.
    - `op_name`: the operation it was made for (the HLO's metadata), `""`.
    - `scopes`: the named scopes of that operation (see `_opnames.scope_of`).
    - `computation`, `instruction`: where the HLO text writes it.
    """

    kind: str
    bytes_per_device: int
    runs: int
    groups: tuple[tuple[int, ...], ...] | None
    op_name: str = ""
    scopes: tuple[str, ...] = ()
    computation: str = ""
    instruction: str = ""


def _transfer(p: Program, i: Instruction, kind: str) -> tuple[str, int] | None:
    """What collective transfer `i` is (its kind and result bytes), `None`
    for a copy of one counted elsewhere (see the module's docstring)."""
    body = p.computations.get(i.computation, [])
    root = next((j for j in reversed(body) if j.root), None)
    target = _TARGET.search(root.args) if root is not None and root.op == "custom-call" else None
    async_part = target is not None and target["target"].startswith("AsyncCollective")
    if "async_collective_fusion_config" in i.args or async_part:  # the TPU's async collective fusions
        started = async_part and target is not None and target["target"] == "AsyncCollectiveStart"
        return (kind, size(i.shape)) if started else None
    if kind == "all-reduce" and root is not None and p.called_by_fusion(i.computation):
        ends = [root] if root.op != "tuple" else [j for j in body if j.name in operands_of(root.args)]
        if ends and all(j.op == "dynamic-slice" for j in ends):  # an all-reduce sliced: a reduce-scatter
            return "reduce-scatter", size(root.shape)
    if i.op.endswith("-start") and i.shape.startswith("(") and kind != "all-reduce":
        arrays = [m[0] for m in _ARRAY.finditer(i.shape) if m["dims"]]  # (operands, outputs, contexts)
        return kind, sum(size(a) for a in arrays[len(arrays) // 2 :])
    return kind, size(i.shape)


def collective_calls(hlo: str) -> list[CollectiveCall]:
    """Every collective transfer in the optimised HLO text `hlo`, once each,
    in the order the text writes them (see the module's docstring)."""

    p = program(hlo)
    out = []
    for i in p.instructions:
        kind = i.op.removesuffix("-start")
        if kind not in KINDS:
            continue
        what = _transfer(p, i, kind)
        if what is None:
            continue
        pairs, groups = (
            _PAIRS.search(i.args) if kind == "collective-permute" else None,
            _GROUPS.search(i.args),
        )
        ids = nested_groups(pairs["pairs"]) if pairs else parse_groups(groups["groups"]) if groups else None
        name = op_name(i)
        scopes = tuple(s for s in scope_of(name) if s) if name else ()
        runs = p.runs(i.computation)
        out.append(CollectiveCall(what[0], what[1], runs, ids, name, scopes, i.computation, i.name))
    return out


def loop_extra(hlo: str) -> tuple[float, float]:
    """The FLOPs and bytes accessed that XLA's cost analysis leaves out of
    `hlo` (optimised HLO text) by counting each computation once per call
    site: each computation's FLOPs (as `_flops` counts them, conversions
    and transcendentals as XLA does, so that the sum is XLA's) and bytes
    accessed (its own instructions', where no fusion calls it), times the
    runs it is missing."""
    from ._flops import accessed, flops  # `_flops` reads the program through this module

    p = program(hlo)
    extra_flops = extra_bytes = 0.0
    for computation, body in p.computations.items():
        missing = p.runs(computation) - p.runs(computation, trips=False)
        if missing <= 0:
            continue
        extra_flops += missing * sum(flops(i, like_xla=True) for i in body)
        if not p.called_by_fusion(computation):
            extra_bytes += missing * sum(accessed(p, i) for i in body)
    return extra_flops, extra_bytes


def matmul_flops_by_dtype(hlo: str) -> dict[str, float]:
    """The FLOPs of the `dot`s and `convolution`s of `hlo` (fused ones too),
    as many times as they run, by their operands' element type (`bf16`,
    `f8e4m3fn`, as the HLO spells it)."""
    from ._flops import flops

    p = program(hlo)
    out: dict[str, float] = {}
    for i in p.instructions:
        if i.op in ("dot", "convolution"):
            key = m["dtype"] if (m := _ARRAY.search(i.operands[0] if i.operands else i.shape)) else ""
            out[key] = out.get(key, 0.0) + flops(i) * p.runs(i.computation)
    return out
