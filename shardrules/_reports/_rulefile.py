"""What version 4 of the plan file adds to `step_cost`: `by_rule`, the
collectives and matrix products each rule line is for (`StepCost.by_rule`,
`dump --step`), one rule per line. Written only where the cost attributes
something to a rule line (otherwise a cost is written as version 2 or 3,
byte for byte as before); a
version 4 cost has the target's keys (`_targetfile`) when it has a target.

Each entry: `rule` (`"model.shard:9"`, `"inferred"` or `"the model's code"`),
`text` (the rule as written, `""` for the other two), `collectives` (one
object per kind, in the order of `_costfile.KINDS`: `kind`, `count`,
`bytes_per_device`), `arrays` (the arrays these collectives are for,
most bytes first) and `matmul_flops_per_device` (the FLOPs of the matrix
products it owns)."""

from __future__ import annotations

import json
from typing import Any

from ._refuse import cost_fail, exact_keys, figure, shown

VERSION_WITH_RULES = 4
BY_RULE = "by_rule"
RULE_KEYS = ("rule", "text", "collectives", "arrays", "matmul_flops_per_device")
SHARE_KEYS = ("kind", "count", "bytes_per_device")


def recorded_rules(data: dict[str, Any]) -> list[dict[str, Any]]:
    """`by_rule` as the file holds it, from a `StepCost.to_json()` dict (or
    a file's `step_cost`): each entry's keys in the file's order."""
    return [
        {
            "rule": r["rule"],
            "text": r.get("text", ""),
            "collectives": [{key: s[key] for key in SHARE_KEYS} for s in r["collectives"]],
            "arrays": list(r.get("arrays", ())),
            "matmul_flops_per_device": r.get("matmul_flops_per_device", 0.0),
        }
        for r in data.get(BY_RULE) or ()
    ]


def rules_lines(cost: dict[str, Any]) -> list[str]:
    """The `"by_rule"` key as the file writes it, one rule per line."""
    rows = [f"      {json.dumps(r, ensure_ascii=True, separators=(', ', ': '))}" for r in cost[BY_RULE]]
    return ['    "by_rule": [' + ("\n" + ",\n".join(rows) + "\n    ]" if rows else "]")]


def read_rules(value: Any, kinds: tuple[str, ...], where: str) -> None:
    """Check a file's `by_rule`: a list of entries with exactly `RULE_KEYS`,
    each rule named once, its collectives one per kind in the order of
    `kinds`. `PlanFileError` (SR124) for anything else."""
    where = f'{where}: "by_rule"'
    if not isinstance(value, list):
        raise cost_fail(f"{where} is a list of objects, not {shown(value)}")
    seen: set[str] = set()
    for i, entry in enumerate(value):
        entry = exact_keys(entry, RULE_KEYS, f"{where}: entry {i}")
        rule = entry["rule"]
        if not isinstance(rule, str) or not rule:
            raise cost_fail(
                f"{where}: entry {i} has the rule {shown(rule)}, not a rule's FILE:LINE or its kind"
            )
        if rule in seen:
            raise cost_fail(f"{where}: the rule {shown(rule)} is listed twice")
        seen.add(rule)
        if not isinstance(entry["text"], str):
            raise cost_fail(f"{where}: the text of {rule} is the rule as written, not {shown(entry['text'])}")
        arrays = entry["arrays"]
        if not isinstance(arrays, list) or not all(isinstance(a, str) for a in arrays):
            raise cost_fail(f"{where}: the arrays of {rule} are a list of names, not {shown(arrays)}")
        figure(entry["matmul_flops_per_device"], f"{where}: the matmul FLOPs of {rule}")
        shares = entry["collectives"]
        if not isinstance(shares, list):
            raise cost_fail(f"{where}: the collectives of {rule} are a list of objects, not {shown(shares)}")
        order = -1
        for share in shares:
            share = exact_keys(share, SHARE_KEYS, f"{where}: a collective of {rule}")
            kind = share["kind"]
            if not isinstance(kind, str) or kind not in kinds or kinds.index(kind) <= order:
                raise cost_fail(
                    f"{where}: {rule} has the kind {shown(kind)} unknown, twice or out of order "
                    f"(the order is {', '.join(kinds)})"
                )
            order = kinds.index(kind)
            figure(share["count"], f"{where}: the count of {rule}'s {kind}", whole=True)
            figure(share["bytes_per_device"], f"{where}: the bytes of {rule}'s {kind}", whole=True)
