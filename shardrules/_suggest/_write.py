"""A strategy's layout written as `suggest`'s rule file: the draft loaded and
planned, its findings answered (arrays left to `default` by their shape,
embeddings split where lint would refuse them whole, acknowledged warnings),
and the text with its header, aliases, rules and inputs."""

from __future__ import annotations

import dataclasses
from typing import Any

from .._errors import ShardRulesError
from .._language._format import format_text
from .._language._load import loads
from .._planning._check import DEFAULT_REPLICATED_THRESHOLD
from .._planning._plan import format_bytes
from . import _text as T
from ._draft import Draft, draft, embedding_layouts, replication_findings, say_whole
from ._findings import acknowledge_whole, batch_for_unused, mostly_replicated, planned
from ._leaves import Kind
from ._patterns import patterns, shared_paths
from ._roles import DESCRIPTIONS
from ._strategy import Layout

WHOLE_LIMIT = DEFAULT_REPLICATED_THRESHOLD
"""A recognised array this large that its role's rule would leave whole on
every device (no dimension of its role divides) is left to `default`
instead, which splits it by shape: lint warns about such arrays (SR204)."""


@dataclasses.dataclass(frozen=True)
class Suggestion:
    """A drafted rule file and what it comes to (for the command line)."""

    text: str
    strategy: str
    rules: int  # rules with a pattern
    arrays: int
    total_bytes: int
    bytes_per_device: int
    by_shape: int  # arrays left to `default`
    over_budget: bool
    replicated: str = ""  # what lint's SR116 would say of it (an error), or ""


def write(
    kinds: list[Kind],
    facts: Any,
    layout: Layout,
    sizes: dict[str, int],
    maxtext: bool,
    min_bytes: int,
    budget: int | None,
    embedding: str | None,
    haliax: bool = False,
) -> Suggestion:
    default = f"auto({_axes(layout.fallback)}, min_bytes={min_bytes})" if layout.fallback else "replicated"
    moved: dict[int, str] = {}  # recognised kinds left to `default`, and why
    split: dict[int, str] = {}  # embeddings the convention keeps whole that lint would report, and why
    while True:
        vocab = embedding_layouts(kinds, facts, layout, embedding, split)
        kept = {i for i, (whole, _) in vocab.items() if whole}  # vocabulary whole
        asked = kept if embedding == "whole" else set()
        rules, fallback = draft(
            kinds,
            facts,
            layout,
            sizes,
            maxtext=maxtext,
            by_shape=frozenset(moved),
            vocab=vocab,
            haliax=haliax,
        )
        clash = shared_paths(kinds, rules, fallback)
        if clash:  # no pattern can tell them apart: each layer's leaves by their own shape
            moved |= {i: "a path it shares with leaves of another layout" for i in clash}
            continue
        found_patterns = patterns([[kinds[i] for i in r.kinds] for r in rules], [kinds[i] for i in fallback])
        missing = {i for r, p in zip(rules, found_patterns, strict=True) if p is None for i in r.kinds}
        if missing:  # no pattern small enough tells them apart: by their shape
            moved |= {i: "no rule pattern small enough tells its paths from the others'" for i in missing}
            continue
        regexes = [p for p in found_patterns if p is not None]
        body = _body(kinds, rules, regexes, layout, sizes, default, [])
        loaded = loads("\n".join(body) + "\n", name="<suggest>")
        specs, per_device, kept_whole = planned(kinds, rules, fallback, loaded, sizes)
        whole = {
            i
            for r in rules
            for i in r.kinds
            if i in kept_whole and kinds[i].leaf_bytes >= WHOLE_LIMIT and i not in kept
        }
        if whole and layout.fallback:
            moved |= {i: "its rule would keep it whole on every device" for i in whole}
            continue
        found = {i: replication_findings(kinds, kept_whole, i) for i in kept & kept_whole}
        lint = {i: why["SR116"] for i, why in found.items() if "SR116" in why and i not in asked}
        if lint:  # the convention's whole vocabulary would make the plan mostly replicated: vocab-parallel
            split |= lint
            continue
        if budget is not None and sum(per_device.values()) > budget:  # a budget before a convention
            why = f"the weights over the budget of {format_bytes(budget)} per device"
            yields = {i: why for i in kept - asked}
            if yields:
                split |= yields
                continue
        break
    say_whole(rules, found, asked)
    acknowledged = acknowledge_whole(rules, kinds, kept_whole, fallback, layout, sizes)
    layout, idle = batch_for_unused(layout, rules, sizes)
    replicated = mostly_replicated(kinds, kept_whole, rules, layout, sizes, asked)
    total = sum(k.nbytes for k in kinds)
    need = sum(per_device.values())
    over = budget is not None and need > budget
    unknown = [i for i in fallback if i not in moved]
    moved = {i: f"{_described(facts.roles[i])}: {why}" for i, why in moved.items()}
    listing = T.fallback_lines(unknown, moved, kinds, specs)
    listing += [line for note in acknowledged for line in T.comment_lines(note, "  ")]
    header = T.header(kinds, facts, layout, sizes, total, need, budget, per_device, specs, idle)
    noqa = "  # noqa: SR204" if acknowledged else ""
    body = _body(kinds, rules, regexes, layout, sizes, default + noqa, listing)
    text = "\n".join([*header, "", *body]) + "\n"
    text = format_text(text, "<suggest>")
    try:
        loads(text, name="<suggest>")
    except ShardRulesError as err:  # a bug here, not in the input: say what was drafted
        raise AssertionError(f"the drafted rules do not load:\n{err}\n\n{text}") from None
    return Suggestion(
        text,
        layout.strategy,
        len(rules),
        sum(k.count for k in kinds),
        total,
        need,
        sum(kinds[i].count for i in fallback),
        over,
        replicated,
    )


def _described(role: Any) -> str:
    return "not recognised by name" if role is None else DESCRIPTIONS[role.name]


def _axes(axes: tuple[str, ...]) -> str:
    return axes[0] if len(axes) == 1 else "(" + ", ".join(axes) + ")"


def _body(
    kinds: list[Kind],
    rules: list[Draft],
    regexes: list[str],
    layout: Layout,
    sizes: dict[str, int],
    default: str,
    listing: list[str],
) -> list[str]:
    used = {e for r in rules if r.entries is not None for e in r.entries}
    lines = [T.mesh_line(sizes), "", *T.alias_lines(layout, used, sizes), "", "rules params:"]
    for rule, regex in zip(rules, regexes, strict=True):
        for note in rule.notes:
            lines += T.comment_lines(note, "  ")
        noqa = f"; noqa: {', '.join(sorted(rule.acknowledged))}" if rule.acknowledged else ""
        lines.append(
            f"  {T.literal(regex)} -> {rule.spec_text()}  "
            f"# {T.label(rule, layout)}: {T.covers(rule.kinds, kinds)}{noqa}"
        )
    lines += listing
    lines.append(f"  default -> {default}")
    lines += ["", "rules inputs:", f"  default -> ({layout.names['batch']}, ...)"]
    return lines
