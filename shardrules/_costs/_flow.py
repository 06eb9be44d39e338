"""Where a value of a compiled step comes from and where it goes, in its HLO.

Attributing a collective to the array it moves needs two walks over the
optimised HLO's data flow (`_hlo.program`):

- `source`: back from a value to the step's argument it is made from
  (`Argument`, the entry computation's parameter number), through what only
  moves, casts or slices data: copies, bitcasts, reshapes, transposes,
  slices, converts, other collectives, element-wise operations (the largest
  operand: a weight scaled by a constant is still the weight) and fusions of
  those; through loops (a loop body's parameter is the loop's operand, a
  tuple's element the one its `get-tuple-element` takes), fusions and calls
  (a computation's parameter is the caller's operand). It stops at an
  operation that computes a new array from others (`Made`: a contraction, a
  reduction, a gather or scatter, or a fusion holding one).
- `destinations`: forward from a value to the step's outputs it becomes (the
  entry's root tuple's positions), through the same operations (an
  accumulator updated on each trip of a loop included) and out of loops and
  fusions; it stops where the value enters a new computation.

Both walk a bounded number of instructions: a value found nowhere within it
is said to come from nowhere (the attribution then falls back on the scope).
"""

from __future__ import annotations

import dataclasses
import re

from ._hlo import Instruction, Program, elements, operands_of

COMPUTES = frozenset(
    (
        "dot",
        "convolution",
        "reduce",
        "reduce-window",
        "select-and-scatter",
        "scatter",
        "gather",
        "sort",
        "fft",
        "cholesky",
        "triangular-solve",
        "rng",
        "rng-bit-generator",
        "custom-call",
        "reduce-precision",
        "iota",
        "constant",
        "partition-id",
        "replica-id",
        "after-all",
        "infeed",
        "outfeed",
        "send",
        "recv",
    )
)
"""Opcodes that make a new array rather than move, cast or combine element-wise."""

_INDEX = re.compile(r"\bindex=(\d+)")
_PARAMETER = re.compile(r"^\s*(\d+)\)")
_CALLS = re.compile(r"\bcalls=(%[\w.\-]+)")
_BUDGET = 4000


@dataclasses.dataclass(frozen=True)
class Argument:
    """The step's argument a value is made from: the entry's parameter `number`."""

    number: int
    instruction: Instruction


@dataclasses.dataclass(frozen=True)
class Made:
    """The instruction that made a value from others (a contraction, ...)."""

    instruction: Instruction


def _fused(p: Program, i: Instruction) -> list[Instruction]:
    """The instructions of the computation a fusion (or call) `i` runs, those
    of the fusions nested in it too."""
    out: list[Instruction] = []
    todo = [m[1].lstrip("%") for m in _CALLS.finditer(i.args)]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for j in p.computations.get(name, ()):
            out.append(j)
            todo += [m[1].lstrip("%") for m in _CALLS.finditer(j.args)]
    return out


def computes(p: Program, i: Instruction) -> bool:
    """Whether `i` makes a new array (see `COMPUTES`): its opcode is one of
    those, or it is a fusion holding one. The TPU's asynchronous collective
    fusions (a `custom-call` to `AsyncCollective...` at their root) only move."""
    if i.op == "custom-call":
        return "AsyncCollective" not in i.args
    if i.op != "fusion":
        return i.op in COMPUTES
    key = ("computes", i.computation, i.name)
    known = p.facts.get(key)
    if known is None:
        known = p.facts[key] = _fusion_computes(p, i)
    return known


def _fusion_computes(p: Program, i: Instruction) -> bool:
    """`computes` for a fusion."""
    inner = _fused(p, i)
    moving = any(j.op == "custom-call" and "AsyncCollective" in j.args for j in inner)
    return any(j.op in COMPUTES and j.op not in ("constant", "iota", "custom-call") for j in inner) or (
        not moving and any(j.op == "custom-call" for j in inner)
    )


def _largest(i: Instruction) -> str | None:
    """The operand of `i` with the most elements (the first of those)."""
    names = operands_of(i.args)
    if not names:
        return None
    sizes = [
        elements(i.operands[k]) if k < len(i.operands) and i.operands[k] else 0 for k in range(len(names))
    ]
    return names[max(range(len(names)), key=lambda k: (sizes[k], -k))]


def source(
    p: Program, computation: str, name: str, passed: list[Instruction] | None = None
) -> Argument | Made | None:
    """Where the value `name` of `computation` comes from (see the module's
    docstring), `None` where the walk ends nowhere; the instructions walked
    through are appended to `passed`."""
    stack: list[int] = []
    for _ in range(_BUDGET):
        i = p.named.get((computation, name))
        if i is None:
            return None
        if passed is not None:
            passed.append(i)
        if i.op == "parameter":
            number = int(m[1]) if (m := _PARAMETER.match(i.args)) else 0
            if computation == p.entry:
                return Argument(number, i) if not stack else None
            callers = p.callers.get(computation, ())
            if not callers:
                return None
            caller = callers[0][0]
            operands = operands_of(caller.args)
            if caller.op == "while":
                position = 0
            elif caller.op == "conditional":
                position = number + 1
            else:
                position = number
            if position >= len(operands):
                return None
            computation, name = caller.computation, operands[position]
            continue
        if i.op == "get-tuple-element":
            stack.append(int(m[1]) if (m := _INDEX.search(i.args)) else 0)
            name = operands_of(i.args)[0]
            continue
        if i.op == "tuple":
            operands = operands_of(i.args)
            if not stack or stack[-1] >= len(operands):
                return None
            name = operands[stack.pop()]
            continue
        if i.op == "while":  # its result: what the body's last trip returns
            body = next((m[1].lstrip("%") for m in re.finditer(r"\bbody=(%[\w.\-]+)", i.args)), "")
            root = next((j for j in p.computations.get(body, ()) if j.root), None)
            if root is None:
                return None
            computation, name = body, root.name
            continue
        if computes(p, i):
            return Made(i)
        following = _largest(i)
        if following is None:
            return Made(i)
        name = following
    return None


def destinations(p: Program, computation: str, name: str, index: int | None = None) -> list[int]:
    """The positions of the step's outputs the value `name` of `computation`
    (its element `index`, for a tuple) becomes, nearest first (see the
    module's docstring); `[]` where it becomes none."""
    found: list[int] = []
    # each value to visit with the tuple elements still to select (the last, first)
    todo: list[tuple[str, str, tuple[int, ...]]] = [(computation, name, () if index is None else (index,))]
    seen: set[tuple[str, str, tuple[int, ...]]] = set()
    while todo and len(seen) < _BUDGET:
        computation, name, stack = todo.pop(0)
        if (computation, name, stack) in seen:
            continue
        seen.add((computation, name, stack))
        i = p.named.get((computation, name))
        if i is None:
            continue
        if i.root and computation == p.entry:
            position = stack[-1] if i.op == "tuple" and len(stack) == 1 else 0 if not stack else None
            if position is not None and position not in found:
                found.append(position)
            continue
        if i.root:  # out of a fusion, a call or a loop's body: the caller's value
            todo += [(c.computation, c.name, stack) for c, _ in p.callers.get(computation) or ()]
        for user, at in p.users.get((computation, name)) or ():
            if user.op == "get-tuple-element":
                k = int(m[1]) if (m := _INDEX.search(user.args)) else 0
                if stack and stack[-1] == k:
                    todo.append((user.computation, user.name, stack[:-1]))
                elif not stack:  # an element of what a multi-output fusion made of the value
                    todo.append((user.computation, user.name, stack))
            elif user.op == "tuple":
                todo.append((user.computation, user.name, (*stack, at)))
            elif user.op == "while":  # into the body's state, and out as the loop's result
                body = next((m[1].lstrip("%") for m in re.finditer(r"\bbody=(%[\w.\-]+)", user.args)), "")
                todo += [(body, j.name, stack) for j in p.computations.get(body) or [] if j.op == "parameter"]
                todo.append((user.computation, user.name, stack))
            elif not stack and not computes(p, user):
                todo.append((user.computation, user.name, stack))
    return found
