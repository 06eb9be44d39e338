"""Layouts that are correct but waste communication or memory, found in a
compiled step and named with the rule line that causes them
(`StepCost.findings`, warnings SR216-SR219).

- SR216: a gradient summed across devices on every trip of a loop and then
  added into an accumulator carried by the loop (gradient accumulation over
  microbatches): the sum of the reductions is the reduction of the sum, so
  one reduction after the loop would do; the loop's trips multiply the bytes.
- SR217: a parameter gathered whole on every device once and the whole copy
  used by both the forward and the backward pass, so it is held from one to
  the other: its sharded layout saves no memory while the step runs (FSDP
  that shards nothing at run time). Reported where such copies are at least
  a tenth of the step's peak.
- SR218: an output laid out over the mesh (an updated parameter) computed
  whole on every device and only then cut to its layout: the embedding's
  gradient, a scatter-add into the whole table, is the usual one. Reported
  for values of at least 1 MiB.
- SR219: an array moved to another layout and straight back (two
  collectives, the second's result shaped like the first's operand, nothing
  computed between them).

Each finding is about the rule line that lays out the array (its span, for
the caret and for `# noqa`), says the bytes per step it costs and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .._errors import Diagnostic
from .._planning._units import format_bytes
from ._attribute import INFERRED, MODEL, Owner, Owners
from ._flow import computes
from ._hlo import CollectiveCall, Instruction, Program, op_name, operands_of, size
from ._opnames import scope_of

_INDEX = re.compile(r"\bindex=(\d+)")
_PASS = ("copy", "bitcast", "convert", "reshape", "transpose")
_MIB = 1 << 20


def _through(p: Program, i: Instruction | None) -> Instruction | None:
    """`i`, or what it copies, bitcasts, converts, reshapes or transposes."""
    while i is not None and i.op in _PASS and (names := operands_of(i.args)):
        i = p.named.get((i.computation, names[0]))
    return i


def _carried(p: Program, i: Instruction | None) -> int | None:
    """The element of its loop's state `i` is (`get-tuple-element` of the
    body's parameter), `None` for anything else."""
    i = _through(p, i)
    if i is None or i.op != "get-tuple-element":
        return None
    state = p.named.get((i.computation, (operands_of(i.args) or [""])[0]))
    if state is None or state.op != "parameter":
        return None
    return int(m[1]) if (m := _INDEX.search(i.args)) else None


def _depends_on(p: Program, i: Instruction) -> set[int]:
    """The elements of the loop's state that `i` is computed from."""
    found: set[int] = set()
    todo, seen = [i], set()
    while todo and len(seen) < 4000:
        j = todo.pop()
        if j.name in seen:
            continue
        seen.add(j.name)
        if (k := _carried(p, j)) is not None:
            found.add(k)
            continue
        todo += [x for n in operands_of(j.args) if (x := p.named.get((j.computation, n))) is not None]
    return found


def _adds(p: Program, i: Instruction) -> bool:
    """Whether `i` adds (an `add`, or a fusion whose root is one) rather
    than writes a slice (a stacked gradient, one slice per layer)."""
    if i.op == "add":
        return True
    if i.op != "fusion":
        return False
    called = re.search(r"\bcalls=%?([\w.\-]+)", i.args)
    body = p.computations.get(called[1], []) if called else []
    return any(j.root and j.op == "add" for j in body) and not any(
        j.op == "dynamic-update-slice" for j in body
    )


def _accumulated(p: Program, call: CollectiveCall) -> int | None:
    """The trips of the loop whose body sums `call`'s result into an element
    of its state that `call` is not computed from (gradient accumulation);
    `None` where it is not so."""
    loops = [c for c, _ in p.callers.get(call.computation, ()) if c.op == "while"]
    i = p.named.get((call.computation, call.instruction))
    if not loops or i is None:
        return None
    before = _depends_on(p, i)
    todo, seen = [i], set()
    while todo and len(seen) < 2000:
        j = todo.pop()
        if j.name in seen:
            continue
        seen.add(j.name)
        for user, position in p.users.get((j.computation, j.name)) or ():
            if user.root and user.op == "tuple":
                if _adds(p, j) and position not in before:
                    carried = [_carried(p, p.named.get((j.computation, n))) for n in operands_of(j.args)]
                    if position in carried:
                        outer = p.runs(loops[0].computation) or 1
                        return max(1, p.runs(call.computation) // outer)
            elif not computes(p, user) or user.op == "get-tuple-element":
                todo.append(user)
    return None


def _finding(code: str, owner: Owner, message: str, hint: str) -> Diagnostic:
    rule = {
        INFERRED: "no rule lays it out: the layout is inferred",
        MODEL: "laid out by the model's code",
    }.get(owner.rule, f"rule {owner.rule}")
    said = (
        message if owner.span is not None else f"{message} ({rule})"
    )  # a rule's line is shown with its caret
    return Diagnostic(code, "warning", said, span=owner.span, hint=hint)


def _loop_reductions(p: Program, found: Sequence[tuple[CollectiveCall, Owner, int]]) -> list[Diagnostic]:
    out = []
    for call, owner, nbytes in found:
        if call.kind not in ("all-reduce", "reduce-scatter") or call.runs <= 1:
            continue
        trips = _accumulated(p, call)
        if trips is None or trips <= 1:
            continue
        out.append(
            _finding(
                "SR216",
                owner,
                f"{owner.array} is reduced ({call.kind}) on each of the {trips} trips of a loop and added "
                f"into an accumulator: {format_bytes(nbytes)} per device per step where one reduction after "
                f"the loop would move {format_bytes(nbytes // trips)}",
                "accumulate the microbatches' gradients before they are reduced, and reduce once after the "
                "loop: in `jax.shard_map`, sum the local gradients over the loop and `jax.lax.psum` the sum "
                "after it; or lay the accumulator out over the batch's mesh axes as `unreduced` "
                "(`PartitionSpec(..., unreduced={...})`, JAX 0.8+) and reshard it to the parameter's "
                "layout after the loop",
            )
        )
    return out


def _gathered_and_kept(
    p: Program, found: Sequence[tuple[CollectiveCall, Owner, int]], owners: Owners, peak: int
) -> list[Diagnostic]:
    whole = {leaf.label: leaf.nbytes for leaf in owners.numbered}
    kept: dict[str, list[tuple[Owner, int]]] = {}
    for call, owner, _ in found:
        if call.kind != "all-gather" or call.runs != 1 or whole.get(owner.array, 0) <= 0:
            continue
        i = p.named.get((call.computation, call.instruction))
        if i is None or size(i.shape) < whole[owner.array]:
            continue
        uses, todo, seen = set(), [i], set()
        while todo and len(seen) < 500:
            j = todo.pop()
            if j.name in seen:
                continue
            seen.add(j.name)
            for user, _ in p.users.get((j.computation, j.name)) or ():
                if computes(p, user):
                    uses.add("transpose(" in op_name(user))
                else:
                    todo.append(user)
        if uses == {True, False}:
            kept.setdefault(owner.rule, []).append((owner, size(i.shape)))
    out = []
    for arrays in kept.values():
        total = sum(n for _, n in arrays)
        if total * 10 < peak:
            continue
        names = ", ".join(o.array for o, _ in arrays[:3]) + (
            f" and {len(arrays) - 3} more" if len(arrays) > 3 else ""
        )
        out.append(
            _finding(
                "SR217",
                arrays[0][0],
                f"{len(arrays)} parameter{'s' * (len(arrays) != 1)} laid out by this rule "
                f"({names}) {'are' if len(arrays) != 1 else 'is'} gathered whole on every device and kept "
                f"from the forward pass to the backward pass: {format_bytes(total)} per device "
                f"({100 * total / max(peak, 1):.0f}% of the step's peak), so the split saves no memory while "
                "the step runs",
                "gather each weight where it is used and again for the gradient: `jax.checkpoint` the layers "
                "(so the backward pass gathers again instead of keeping the copy), or, where memory allows, "
                "replicate these parameters and spend no gathers on them",
            )
        )
    return out


def _computed_whole(p: Program, owners: Owners) -> list[Diagnostic]:
    from ._flow import Made, source

    entry = p.computations.get(p.entry, [])
    root = next((i for i in entry if i.root), None)
    if root is None:
        return []
    out = []
    values = operands_of(root.args) if root.op == "tuple" else [root.name]  # one output: the root itself
    for position, name in enumerate(values):
        leaf = owners.outputs[position] if position < len(owners.outputs) else None
        value = p.named.get((p.entry, name))
        if leaf is None or value is None or leaf.nbytes < _MIB or size(value.shape) >= leaf.nbytes:
            continue  # small, or not laid out over the mesh
        passed: list[Instruction] = []
        made = source(p, p.entry, name, passed)
        if not isinstance(made, Made) or size(made.instruction.shape) < leaf.nbytes:
            continue
        if any(i.op.removesuffix("-start") in ("all-reduce", "reduce-scatter") for i in passed):
            continue  # each device's partial sum (its share of the batch), then reduced: not repeated
        owner = Owner(leaf.label, leaf.rule or INFERRED, leaf.text, leaf.span)
        name_of = op_name(made.instruction)
        scope = scope_of(name_of)[0] if name_of else ""
        what = name_of.rsplit("/", 1)[-1] if name_of else made.instruction.op
        where = (f"in `{scope}`" if scope else "outside every scope") + (
            " of the backward pass" if "transpose(" in name_of else ""
        )
        out.append(
            _finding(
                "SR218",
                owner,
                f"output {leaf.label} is computed whole on every device ({format_bytes(leaf.nbytes)}, a "
                f"`{what}` {where}) and only then cut to its layout "
                f"({format_bytes(size(value.shape))} per device)",
                "the value it is made from is laid out on no mesh axis: for a gradient, give the parameter's "
                "forward use (a gather from an embedding table, a dot) a layout split like the parameter, or "
                "an activation rule for the scope that computes it",
            )
        )
    return out


def _back_and_forth(p: Program, found: Sequence[tuple[CollectiveCall, Owner, int]]) -> list[Diagnostic]:
    moving = ("all-to-all", "collective-permute")
    by_name: dict[tuple[str, str], tuple[CollectiveCall, Owner, int]] = {}
    for call, owner, nbytes in found:  # a combined collective's elements, together
        if call.kind in moving:
            key = (call.computation, call.instruction)
            _, first, total = by_name.get(key, (call, owner, 0))
            by_name[key] = (call, first, total + nbytes)
    out = []
    for (computation, name), (call, owner, nbytes) in by_name.items():
        i = p.named.get((computation, name))
        j = p.named.get((computation, (operands_of(i.args) or [""])[0])) if i is not None else None
        while j is not None and not computes(p, j) and (j.computation, j.name) not in by_name:
            names = operands_of(j.args)
            j = p.named.get((j.computation, names[0])) if names else None
        if i is None or j is None or (j.computation, j.name) not in by_name:
            continue
        there, _, first = by_name[(j.computation, j.name)]
        if sum(size(t) for t in j.operands) != size(i.shape) or size(j.shape) != sum(
            size(t) for t in i.operands
        ):
            continue  # not the same array's bytes there and back
        out.append(
            _finding(
                "SR219",
                owner,
                f"{owner.array} is moved to another layout ({there.kind}) and straight back ({call.kind}) "
                f"with nothing computed between: {format_bytes(first + nbytes)} per device per step",
                "lay the array out where it is used as it is where it is made (the rule for its scope, or the "
                "parameter's rule), or drop the reshard that undoes the other, so that neither move is needed",
            )
        )
    return out


def waste(
    p: Program, found: Sequence[tuple[CollectiveCall, Owner, int]], owners: Owners, peak: int
) -> tuple[Diagnostic, ...]:
    """The findings SR216-SR219 of a compiled step (see the module's
    docstring): `found` is its collectives with their owners and bytes,
    `peak` its peak bytes per device."""
    out: list[Any] = []
    out += _loop_reductions(p, found)
    out += _gathered_and_kept(p, found, owners, peak)
    out += _computed_whole(p, owners)
    out += _back_and_forth(p, found)
    return tuple(out)
