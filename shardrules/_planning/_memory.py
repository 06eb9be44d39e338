"""SR110: a plan that puts more bytes on a device than a memory budget allows
(`device_memory=` of `check`, `apply`, `reshard`; `lint --device-memory`),
naming the rule whose leaves take the largest part."""

from __future__ import annotations

from .._errors import Diagnostic
from ._plan import LeafPlan, Plan, format_bytes, plural


def memory_diagnostics(plan: Plan, budget: int) -> list[Diagnostic]:
    """SR110: the plan puts more than `budget` bytes on a device."""
    need = plan.bytes_per_device
    if need <= budget:
        return []
    by_rule: dict[int, tuple[LeafPlan, int, int]] = {}
    for leaf in plan.leaves:
        if leaf.bytes_per_device:
            first, total, count = by_rule.get(id(leaf.rule), (leaf, 0, 0))
            by_rule[id(leaf.rule)] = (first, total + leaf.bytes_per_device, count + 1)
    first, total, count = max(by_rule.values(), key=lambda item: item[1])
    rule = first.rule
    source = (
        f"the rule at {rule.location}"
        if rule is not None
        else f"leaves replicated without a rule ({first.why})"
    )
    return [
        Diagnostic(
            "SR110",
            "error",
            f"each device needs {format_bytes(need)} under this plan, over the budget of {format_bytes(budget)}",
            None if rule is None else rule.span,
            None,
            f"the largest part, {format_bytes(total)} over {plural(count, 'leaf', 'leaves')} "
            f"(e.g. `{first.path}`), comes from {source}; shard those leaves over more mesh axes, "
            "or use a bigger mesh",
        )
    ]
