"""What lint would find in a draft, and how the draft answers it, so that it
lints clean:

- **SR204** (a large array whole on every device): under `dp` every weight
  is whole, as meant; under another strategy an array none of whose
  dimensions divides by the axes stays whole. The line that keeps it whole
  (its rule, or `default`) acknowledges the warning (`# noqa: SR204`), with
  a note saying why, where a reviewer reads it.
- **SR205** (a mesh axis no rule uses): an axis that splits no weight (a
  tensor-parallel axis for a convolutional network, an FSDP axis the hidden
  size does not divide by) splits the batch, as a data axis does: it joins
  `batch`, and the header says it holds copies of the weights.
- **SR116** (most of the weights whole on every device, an error): no line
  can acknowledge it; `mostly_replicated` says how much, for `auto` to try
  another strategy and an explicit strategy to be refused with the reason.

`planned` works out each kind's spec under the draft, as the planner does.
"""

from __future__ import annotations

import dataclasses
import math

from .._interop._paths import LeafInfo
from .._language._load import iter_rules
from .._language._rules import Rule, RuleSet
from .._planning._check import DEFAULT_REPLICATED_THRESHOLD, DEFAULT_REPLICATED_TOLERANCE
from .._planning._plan import format_bytes, spec_str
from .._planning._spec import LeafError, leaf_spec, shard_bytes
from .._pspec import entries
from ._draft import Draft
from ._leaves import Kind
from ._strategy import Layout
from ._text import counted


def acknowledge_whole(
    rules: list[Draft],
    kinds: list[Kind],
    whole: set[int],
    fallback: list[int],
    layout: Layout,
    sizes: dict[str, int],
) -> list[str]:
    """Acknowledge SR204 on the rules keeping arrays of 64 MiB or more whole
    (`whole`: the kinds every device holds whole), with a note; the note for
    `default`'s line, if it keeps such arrays whole (its `noqa` is then the
    caller's to write)."""
    if math.prod(sizes.values()) <= 1:
        return []
    large = {i for i in whole if kinds[i].leaf_bytes >= DEFAULT_REPLICATED_THRESHOLD}
    for rule in rules:
        mine = [i for i in rule.kinds if i in large]
        if mine and "SR204" not in rule.acknowledged:
            rule.acknowledged.add("SR204")
            rule.notes.append(_note(mine, kinds, layout))
    rest = [i for i in fallback if i in large]
    return [_note(rest, kinds, layout)] if rest else []


def _note(indices: list[int], kinds: list[Kind], layout: Layout) -> str:
    count = sum(kinds[i].count for i in indices)
    size = format_bytes(sum(kinds[i].nbytes for i in indices))
    one = count == 1
    why = (
        "as strategy dp means"
        if layout.strategy == "dp"
        else f"as none of {'its' if one else 'their'} dimensions divides by the axes that would split "
        + ("it" if one else "them")
    )
    return (
        f"Every device holds {counted(count, 'array')} of 64 MiB or more whole here ({size}), {why}: "
        "lint's SR204, acknowledged (`noqa`) as meant."
    )


def batch_for_unused(layout: Layout, rules: list[Draft], sizes: dict[str, int]) -> tuple[Layout, list[str]]:
    """`layout` with the mesh axes that no rule of the draft uses added to
    `batch` (in mesh order: they split the batch), and the axes that split
    no weight (those, and those of `batch` no rule uses)."""
    used = set(layout.fallback)
    used.update(a for rule in rules for e in rule.entries or () for a in _axes_of(e, layout))
    idle = [a for a, size in sizes.items() if size > 1 and a not in used]
    missing = [a for a in idle if a not in layout.axes("batch")]
    if not missing:
        return layout, idle
    batch = tuple(a for a in sizes if a in missing or a in layout.axes("batch"))
    return dataclasses.replace(layout, targets={**layout.targets, "batch": (batch,)}), idle


def _axes_of(entry: str, layout: Layout) -> set[str]:
    """The mesh axes a spec entry (an alias's name, or `_`) may stand for."""
    return {
        a
        for role, name in layout.names.items()
        if name == entry
        for alternative in layout.targets.get(role, ())
        for a in alternative
    }


def mostly_replicated(
    kinds: list[Kind],
    whole: set[int],
    rules: list[Draft],
    layout: Layout,
    sizes: dict[str, int],
    asked: frozenset[int] | set[int] = frozenset(),
) -> str:
    """What lint's SR116 would say of a draft whose rules shard something but
    leave more than 25% of the weights (and 64 MiB or more) whole on every
    device (`whole`: those kinds); `""` where it would not, or would only for
    the kinds kept whole as asked (`asked`: `embedding="whole"`, whose rule
    says so)."""
    whole = whole - asked
    shards = bool(layout.fallback) or any(_axes_of(e, layout) for rule in rules for e in rule.entries or ())
    if not shards or math.prod(sizes.values()) <= 1:
        return ""
    held = sum(kinds[i].nbytes for i in whole)
    share = held / sum(k.nbytes for k in kinds)
    if held < DEFAULT_REPLICATED_THRESHOLD or share <= DEFAULT_REPLICATED_TOLERANCE:
        return ""
    largest = sorted(whole, key=lambda i: -kinds[i].nbytes)[:2]
    shown = ", ".join(f"{kinds[i].key} {kinds[i].shape}" for i in largest)
    return (
        f"{share:.0%} of the weights ({format_bytes(held)}) whole on every device, over the "
        f"{DEFAULT_REPLICATED_TOLERANCE:.0%} lint allows (SR116; largest: {shown})"
    )


def planned(
    kinds: list[Kind], rules: list[Draft], fallback: list[int], loaded: RuleSet, sizes: dict[str, int]
) -> tuple[dict[int, str], dict[int, int], set[int]]:
    """Each kind's spec (as text), bytes per device (all its leaves) and
    whether it is kept whole on every device, as the planner gives them
    under the rule drafted for it."""
    written = list(iter_rules(loaded, "params"))
    by_kind: dict[int, Rule] = {i: written[n] for n, rule in enumerate(rules) for i in rule.kinds}
    for i in fallback:
        by_kind[i] = written[-1]
    specs: dict[int, str] = {}
    per_device: dict[int, int] = {}
    whole: set[int] = set()
    for i, kind in enumerate(kinds):
        info = LeafInfo(kind.example, kind.shape, kind.dtype)
        try:
            spec = leaf_spec(by_kind[i], info, sizes, loaded)
        except LeafError as err:  # a bug here, not in the input
            raise AssertionError(f"{kind.example}: {err.message}") from None
        specs[i] = spec_str(spec)
        per_device[i] = shard_bytes(info, spec, sizes) * kind.count
        if all(entry is None for entry in entries(spec)):
            whole.add(i)
    return specs, per_device, whole
