"""Which array, and which rule line, each collective of a compiled step is for.

A collective moves or sums one array (each element of a combined one, one
array each). Which array, and so which rule line laid it out, is read off
the HLO's data flow (`_flow`) and the names JAX writes in it:

- a gather, all-to-all or permute moves what it is made from: a parameter
  or another argument leaf of the step (the entry's parameter, named by its
  path in the HLO's metadata) is laid out by the rule that placed it; a
  value the step computes is an activation of the scope that computed it;
- a sum (all-reduce, reduce-scatter) finishes a contraction split over a
  mesh axis. Where the sum becomes one of the step's outputs (a gradient
  becoming the updated parameter), it is that output's, laid out by its
  output group's rule; otherwise it is the contraction's, owned by the
  parameter among its operands whose layout split it (a row-parallel
  weight), else by the activation it computes.

An activation's rule is the activation rule of its scope, or of the
nearest enclosing scope one lays out; with none, the layout was inferred
(`INFERRED`: by shardrules on Explicit axes, by XLA on Auto ones), or
stated by the model's code (`MODEL`: `jax.sharding.reshard`,
`out_sharding=`). Every collective has an owner: the per-rule bytes add up
to the step's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from .._planning._units import format_bytes, shown_location
from ._flow import Argument, Made, destinations, source
from ._hlo import KINDS, CollectiveCall, Program, op_name, operands_of, program, size
from ._opnames import scope_of

INFERRED = "inferred"
"""The owner of a collective no rule laid out: its layout was inferred."""
MODEL = "the model's code"
"""The owner of a collective whose layout the model's own code states."""
_MOVING = ("all-gather", "all-to-all", "collective-permute")


@dataclasses.dataclass(frozen=True)
class Leaf:
    """An array of the step: how it is shown, and the rule that lays it out
    (`rule`, `"file:line"`; `None`: no rule) as written (`text`)."""

    label: str
    rule: str | None = None
    text: str = ""
    span: Any = dataclasses.field(default=None, compare=False)
    nbytes: int = 0


@dataclasses.dataclass(frozen=True)
class Owners:
    """What a step's arrays are, for `attribute`.

    - `inputs`: the argument leaves by the name JAX gives them in the HLO
      (`params['layers']['w']`); `numbered`, the same in the order of the
      flattened arguments (the parameter numbers, where JAX pruned none).
    - `outputs`: the output leaves, in order.
    - `scopes`: the activation rule of each scope an activation rule lays out.
    - `stated`: the scopes where the model's code states a layout.
    """

    inputs: dict[str, Leaf]
    numbered: tuple[Leaf, ...]
    outputs: tuple[Leaf, ...]
    scopes: dict[str, Leaf] = dataclasses.field(default_factory=dict)
    stated: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class Owner:
    """Whom one collective (or one element of a combined one) is for: the
    `array` and the `rule` line (or `INFERRED`, `MODEL`) as written (`text`)."""

    array: str
    rule: str
    text: str = ""
    span: Any = dataclasses.field(default=None, compare=False)


def _scope(name: str) -> str:
    found = [s for s in scope_of(name) if s] if name else []
    return found[0] if found else ""


def _activation(scope: str, owners: Owners) -> Owner:
    """The owner of a value computed in `scope` (`NAME (backward)` for the
    gradient's): the activation rule of it or of the nearest scope around it."""
    plain = scope.removesuffix(" (backward)")
    array = f"activation {scope}" if scope else "activation outside every scope"
    parts = plain.split("/") if plain else []
    for end in range(len(parts), 0, -1):
        leaf = owners.scopes.get("/".join(parts[:end]))
        if leaf is not None and leaf.rule is not None:
            return Owner(array, leaf.rule, leaf.text, leaf.span)
    for end in range(len(parts), 0, -1):
        if "/".join(parts[:end]) in owners.stated:
            return Owner(array, MODEL)
    return Owner(array, INFERRED)


def _leaf(leaf: Leaf | None, label: str, suffix: str = "") -> Owner:
    if leaf is None:
        return Owner(label + suffix, INFERRED)
    return Owner(leaf.label + suffix, leaf.rule or INFERRED, leaf.text if leaf.rule else "", leaf.span)


def _argument(found: Argument, owners: Owners) -> Leaf | None:
    name = op_name(found.instruction).replace("\\'", "'").replace('\\"', '"')
    leaf = owners.inputs.get(name)
    if leaf is None and len(owners.numbered) > found.number and len(owners.numbered) == len(owners.inputs):
        leaf = owners.numbered[found.number]
    return leaf if leaf is not None else (Leaf(name) if name else None)


def owner(p: Program, call: CollectiveCall, element: int | None, owners: Owners) -> Owner:
    """The owner of `call` (of its `element`, for a combined collective)."""
    i = p.named.get((call.computation, call.instruction))
    if i is None:
        return _activation(call.scopes[0] if call.scopes else "", owners)
    operands = operands_of(i.args)
    operand = operands[element] if element is not None and element < len(operands) else operands[0]
    came = source(p, call.computation, operand)
    made = op_name(came.instruction) if isinstance(came, Made) else ""
    if element is not None and made:  # one of several arrays: whether its own operation is the gradient's
        backward = "transpose(" in made
    else:
        backward = any(s.endswith("(backward)") for s in call.scopes) or "transpose(" in call.op_name
    if isinstance(came, Argument) and call.kind in _MOVING:
        return _leaf(_argument(came, owners), "argument")
    went = destinations(p, call.computation, call.instruction, element) if call.kind not in _MOVING else []
    if went and went[0] < len(owners.outputs):
        return _leaf(owners.outputs[went[0]], "output", " (gradient)" if backward else "")
    if isinstance(came, Argument):
        return _leaf(_argument(came, owners), "argument")
    if isinstance(came, Made):
        if call.kind not in _MOVING:  # a split contraction: the parameter whose layout split it
            found = [source(p, came.instruction.computation, o) for o in operands_of(came.instruction.args)]
            weights = [(size(f.instruction.shape), f) for f in found if isinstance(f, Argument)]
            if weights:
                return _leaf(_argument(max(weights, key=lambda w: w[0])[1], owners), "argument")
        return _activation(_scope(made) or (call.scopes[0] if call.scopes else ""), owners)
    return _activation(call.scopes[0] if call.scopes else "", owners)


def _elements(p: Program, call: CollectiveCall) -> list[tuple[int | None, int]]:
    """`call`'s elements (`None`: the one array) with their share of its bytes
    per run: a combined collective's split by its elements' sizes, the
    remainder on the last, so that the shares add up to its bytes."""
    i = p.named.get((call.computation, call.instruction))
    shape = i.shape if i is not None else ""
    if i is None or not shape.startswith("("):  # (a reduce-scatter the TPU writes as a sliced all-reduce too)
        return [(None, call.bytes_per_device)]
    operands = operands_of(i.args)
    if len(operands) < 2 or i.op.endswith("-start"):
        return [(None, call.bytes_per_device)]
    sizes = [size(s) for s in i.operands[: len(operands)]]
    total = sum(sizes) or 1
    shares = [call.bytes_per_device * s // total for s in sizes]
    shares[-1] += call.bytes_per_device - sum(shares)
    return list(enumerate(shares))


def owned(
    hlo: str, calls: Sequence[CollectiveCall], owners: Owners
) -> list[tuple[CollectiveCall, Owner, int]]:
    """Each collective of `calls` (read from the HLO text `hlo`), or each of
    its elements, with its owner and its bytes per device over every run."""
    p = program(hlo)
    return [
        (call, owner(p, call, element, owners), share * call.runs)
        for call in calls
        for element, share in _elements(p, call)
    ]


@dataclasses.dataclass(frozen=True)
class Share:
    """The collectives of one kind that one owner is for: how many runs of
    them one call of the step makes, and their bytes per device over all."""

    kind: str
    count: int
    bytes_per_device: int


class _Summed:
    """What `RuleCost` and `ArrayCost` sum over their `Share`s, and their JSON."""

    collectives: tuple[Share, ...]

    @property
    def bytes_per_device(self) -> int:
        """Bytes per device per step, over every kind."""
        return sum(s.bytes_per_device for s in self.collectives)

    @property
    def count(self) -> int:
        """Runs per step, over every kind."""
        return sum(s.count for s in self.collectives)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of every attribute (lists for tuples), `bytes_per_device` included."""
        out = dataclasses.asdict(self)  # pyright: ignore[reportArgumentType]  # each subclass is a dataclass
        out = {key: list(value) if isinstance(value, tuple) else value for key, value in out.items()}
        out["bytes_per_device"] = self.bytes_per_device
        return out


@dataclasses.dataclass(frozen=True)
class RuleCost(_Summed):
    """The collectives one rule line is for, in one call of the step.

    **Attributes:**

    - `rule`: `"file:line"` of the rule, or `"inferred"` (no rule laid the
      arrays out: inferred by shardrules on Explicit axes, by XLA on Auto
      ones), or `"the model's code"` (the model states their layout).
    - `text`: the rule as written (`"attn/o/kernel$" -> (heads, embed)`);
      `""` for the other two.
    - `collectives`: a `Share` per collective kind, in the order of `KINDS`.
    - `arrays`: the arrays whose collectives these are, most bytes first
      (`params/blocks/0/attn/o/kernel`, `... (gradient)`, `activation SCOPE`).
    - `matmul_flops_per_device`: the FLOPs per device of the matrix products
      (dots, convolutions) it owns: those with one of its arrays as an
      operand (the largest argument of the step among the operands, usually
      a parameter; the gradient's products too), else those of a scope its
      activation rule lays out; a loop's, once per trip.
    """

    rule: str
    text: str
    collectives: tuple[Share, ...]
    arrays: tuple[str, ...] = ()
    matmul_flops_per_device: float = 0.0


@dataclasses.dataclass(frozen=True)
class ArrayCost(_Summed):
    """The collectives one array is for, in one call of the step: its name
    (`array`), the `rule` line that lays it out (as in `RuleCost`) and its
    `text`, and a `Share` per collective kind."""

    array: str
    rule: str
    text: str
    collectives: tuple[Share, ...]


def _shares(found: Iterable[tuple[CollectiveCall, int]]) -> tuple[Share, ...]:
    """Per kind: the runs of the collectives in `found` (a combined one once,
    however many of its elements are there) and the bytes given with each."""
    counts: dict[str, tuple[int, int, set[int]]] = {}
    for call, nbytes in found:
        runs, total, seen = counts.get(call.kind, (0, 0, set()))
        counts[call.kind] = (runs + call.runs * (id(call) not in seen), total + nbytes, seen | {id(call)})
    return tuple(Share(k, counts[k][0], counts[k][1]) for k in KINDS if k in counts)


def by_owner(
    found: Sequence[tuple[CollectiveCall, Owner, int]], products: dict[str, tuple[Owner, float]] | None = None
) -> tuple[tuple[RuleCost, ...], tuple[ArrayCost, ...]]:
    """The collectives `owned` found, summed per rule line and per array,
    most bytes first."""
    arrays: dict[tuple[str, str], list[tuple[CollectiveCall, Owner, int]]] = {}
    for entry in found:
        arrays.setdefault((entry[1].array, entry[1].rule), []).append(entry)
    per_array = sorted(
        (
            ArrayCost(array, rule, group[0][1].text, _shares((c, n) for c, _, n in group))
            for (array, rule), group in arrays.items()
        ),
        key=lambda a: (-a.bytes_per_device, a.array),
    )
    rules: dict[str, list[tuple[CollectiveCall, Owner, int]]] = {}
    for entry in found:
        rules.setdefault(entry[1].rule, []).append(entry)
    products = products or {}
    texts = {rule: owner.text for rule, (owner, _) in products.items()}
    texts |= {rule: group[0][1].text for rule, group in rules.items()}
    per_rule = sorted(
        (
            RuleCost(
                rule,
                texts[rule],
                _shares((c, n) for c, _, n in rules.get(rule, ())),
                tuple(a.array for a in per_array if a.rule == rule),
                products[rule][1] if rule in products else 0.0,
            )
            for rule in texts
        ),
        key=lambda r: (-r.bytes_per_device, r.rule),
    )
    return tuple(per_rule), tuple(per_array)


def rule_cost_from_json(data: dict[str, Any]) -> RuleCost:
    return RuleCost(
        data["rule"],
        data.get("text", ""),
        tuple(Share(s["kind"], s["count"], s["bytes_per_device"]) for s in data["collectives"]),
        tuple(data.get("arrays", ())),
        float(data.get("matmul_flops_per_device", 0.0)),
    )


def products(hlo: str, owners: Owners) -> dict[str, tuple[Owner, float]]:
    """The FLOPs per device of the step's matrix products (fused ones too,
    a loop's once per trip) by the rule line that owns each (see
    `RuleCost.matmul_flops_per_device`), with that rule's owner."""
    from ._flops import flops  # `_flops` reads the program through `_hlo`, as this does

    p = program(hlo)
    out: dict[str, tuple[Owner, float]] = {}
    for i in p.instructions:
        if i.op not in ("dot", "convolution"):
            continue
        found = [source(p, i.computation, o) for o in operands_of(i.args)]
        weights = [(size(f.instruction.shape), f) for f in found if isinstance(f, Argument)]
        if weights:
            who = _leaf(_argument(max(weights, key=lambda w: w[0])[1], owners), "argument")
        else:
            who = _activation(_scope(op_name(i)), owners)
        owner, total = out.get(who.rule, (who, 0.0))
        out[who.rule] = (owner, total + flops(i) * p.runs(i.computation))
    return out


def array_cost_from_json(data: dict[str, Any]) -> ArrayCost:
    return ArrayCost(
        data["array"],
        data["rule"],
        data.get("text", ""),
        tuple(Share(s["kind"], s["count"], s["bytes_per_device"]) for s in data["collectives"]),
    )


def rule_lines(by_rule: Sequence[RuleCost], top: int = 5) -> list[str]:
    """The `top` rule lines of `by_rule` whose collectives move the most
    bytes, a line each (`FILE:LINE` relative to the working directory when
    inside it, the rule as written, bytes per device, runs per kind), and how
    many more there are with their bytes; none without rule lines."""
    by_rule = [r for r in by_rule if r.bytes_per_device]  # not those that own matrix products alone
    if not by_rule:
        return []
    out = ["by rule line (collective bytes per device per step, most first):"]
    for r in by_rule[:top]:
        written = f" {r.text}" if r.text else ""
        runs = ", ".join(f"{s.kind} {s.count}" for s in r.collectives)
        out.append(f"  {shown_location(r.rule)}{written}: {format_bytes(r.bytes_per_device)} ({runs})")
    rest = by_rule[top:]
    if rest:
        more = format_bytes(sum(r.bytes_per_device for r in rest))
        out.append(f"  ... and {len(rest)} more rule line{'s' * (len(rest) > 1)} ({more})")
    return out
