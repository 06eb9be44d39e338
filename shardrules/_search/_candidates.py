"""Each mesh of the search space as a rule file: `suggest`'s draft for the
weights, the step's other groups added, planned on the mesh's sizes alone
(no device, nothing compiled) for what rules a candidate out before it is
compiled, and what makes two candidates the same layout.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._errors import ShardRulesError
from .._language._format import format_text
from .._language._load import loads
from .._planning._api import plan
from .._pspec import entries
from .._suggest._strategy import StrategyError, choose
from .._suggest._suggest import drafted
from ._probe import Probe
from ._space import Shape, batch_product


@dataclasses.dataclass
class Candidate:
    """A mesh of the space, drafted: its rule file, what its arguments come
    to on each device (`argument_bytes`), the layout it stands for (`key`:
    equal keys, equal programs), and why it was set aside (`rejected`)."""

    shape: Shape
    text: str = ""
    rules: Any = None
    argument_bytes: int = 0
    key: Any = None
    rejected: str = ""


def draft(shape: Shape, found: Probe, tree: Any, options: dict[str, Any]) -> Candidate:
    """The candidate `shape` stands for: drafted, its groups added, planned."""
    out = Candidate(shape)
    sizes = shape.mesh
    if found.rows is not None:
        layout = choose(shape.strategy, sizes, total_bytes=0, stacked_experts=False, any_experts=True)
        batch = layout.targets["batch"][0]
        over = batch_product(shape, batch)
        if found.rows % over:
            names = " x ".join(f"{a}={sizes[a]}" for a in batch)
            product = f" = {over}" if len(batch) > 1 else ""
            out.rejected = f"the batch of {found.rows} rows does not divide over {names}{product}"
            return out
    try:
        suggestion = drafted(tree, sizes, shape.strategy, **options)
    except StrategyError as err:
        out.rejected = _first_sentence(str(err))
        return out
    if suggestion.replicated:
        out.rejected = f"it would leave {suggestion.replicated}"
        return out
    out.text = format_text(with_groups(suggestion.text, found), "<search>")
    out.rules = loads(out.text, name="<search>")
    key: list[Any] = [tuple(sizes.values())]
    position = {name: i for i, name in enumerate(sizes)}
    for group, trees in found.groups.items():
        for tree_ in trees:
            try:
                planned = plan(tree_, out.rules, sizes, group=group)
            except ShardRulesError as err:
                out.rejected = _first_sentence(str(err))
                return out
            if planned.errors:
                first = planned.errors[0]
                out.rejected = f"{first.code} {_first_sentence(first.message)}"
                return out
            out.argument_bytes += planned.bytes_per_device
            key.append(tuple(_canonical(leaf.spec, position) for leaf in planned.leaves))
    out.key = tuple(key)
    return out


def _canonical(spec: Any, position: dict[str, int]) -> Any:
    """A spec with each mesh axis as its place in the mesh (names aside)."""
    if spec is None:
        return None
    out = []
    for entry in entries(spec):
        if entry is None:
            out.append(None)
        elif isinstance(entry, str):
            out.append((position[entry],))
        else:
            out.append(tuple(position[a] for a in entry))
    return tuple(out)


def _first_sentence(text: str) -> str:
    line = text.strip().split("\n", 1)[0]
    return line if len(line) <= 160 else line[:157] + "..."


def with_groups(text: str, found: Probe) -> str:
    """`suggest`'s text with the step's groups: its `rules params:` block under
    the weights' group's name (and again under each other weights group),
    its `rules inputs:` block under each batch group's name (none without)."""
    lines = text.rstrip("\n").split("\n")
    heads = [i for i, line in enumerate(lines) if line.startswith("rules ")]
    params_at, inputs_at = heads[0], heads[1]
    before, params, inputs = lines[:params_at], lines[params_at + 1 : inputs_at], lines[inputs_at + 1 :]
    while params and not params[-1].strip():
        params.pop()
    out = [*before]
    for group in (found.params, *found.weights):
        out += [f"rules {group}:", *params, ""]
    for group in found.batches:
        out += [f"rules {group}:", *inputs, ""]
    if not found.batches:  # the batch alias then names no input: lines that say so stay true
        out = [line for line in out if not line.startswith("alias batch ")]
    return "\n".join(out).rstrip("\n") + "\n"
