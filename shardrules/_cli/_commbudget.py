"""A step's communication held to a budget in CI: `lint --step
--max-collective-bytes SIZE` fails the run when the step's collectives move
more than SIZE per device per step (SR129), `--max-collective-increase PCT`
when they grew by more than PCT over a `--baseline` plan file written by
`dump --step` (SR130). Each finding points at the rule line that moves (or
grew) most, read off `StepCost.by_rule`, and names the next ones with the
arrays under each; the baseline's rule lines are matched to the step's by
their text, pattern, then line (`_reports/_rulebytes.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._errors import Diagnostic, Span
from .._language._rules import RuleSet
from .._planning._plan import format_bytes
from .._reports._rulebytes import collective_bytes, has_rules, moves, recorded_rules
from ._lint import UsageError

SHOWN_RULES = 3  # rule lines a finding names
SHOWN_ARRAYS = 2  # arrays named under each


def _origin(args: Any, option: str, flag: str) -> str:
    return (getattr(args, "origins", {}) or {}).get(option, flag)


def _span(rules: RuleSet, rule: str) -> Span | None:
    """The span of the rule line `rule` (`FILE:LINE`) names in `rules`; `None`
    for `inferred`, the model's code, or a line it does not have."""
    file, _, line = rule.rpartition(":")
    if not line.isdigit():
        return None
    found = [r for _, group in rules.group_items for r in group] + [r for _, r in rules.default_items]
    for r in found:
        if r.span is not None and r.span.file == file and r.span.line == int(line):
            return r.span
    return None


def _rule_name(rule: str, text: str) -> str:
    return f"{rule} `{text}`" if text else rule


def _arrays(cost: Any, rule: str) -> str:
    """The arrays under `rule` whose collectives move most, with their bytes."""
    under = [a for a in cost.by_array if a.rule == rule][:SHOWN_ARRAYS]
    more = sum(1 for a in cost.by_array if a.rule == rule) - len(under)
    listed = ", ".join(f"{a.array} {format_bytes(a.bytes_per_device)}" for a in under)
    return f" ({listed}{f', {more} more' if more > 0 else ''})" if listed else ""


def _top_rules(cost: Any) -> str:
    moving = [r for r in cost.by_rule if r.bytes_per_device]  # not those that own matrix products alone
    shown = moving[:SHOWN_RULES]
    lines = [
        f"{_rule_name(r.rule, r.text)} {format_bytes(r.bytes_per_device)}{_arrays(cost, r.rule)}"
        for r in shown
    ]
    more = len(moving) - len(shown)
    return "; ".join(lines) + (f"; and {more} more" if more > 0 else "")


def _file_of(rule: str) -> str:
    """The rule file of a rule line `FILE:LINE`; `RULES` for an owner that is no rule line."""
    file, _, line = rule.rpartition(":")
    return file if file and line.isdigit() else "RULES"


def _fix(rule: str, text: str, option: str, step: str | None = None) -> str:
    """What to change for the collectives of `rule` (a rule line, or an owner that is none)."""
    from .._costs._attribute import INFERRED, MODEL

    if rule == INFERRED:
        where = (
            "no rule laid those arrays out: write `rules activations:` lines for their scopes "
            "(`explain --step` lists each layout the step infers), or lay out the arrays they are "
            "made from so that fewer bytes cross the mesh"
        )
    elif rule == MODEL:
        where = "the model's own code states those layouts (`reshard`, `out_sharding=`): change them there"
    else:
        where = (
            f"change the rule line {_rule_name(rule, text)}: lay its arrays out so that fewer bytes "
            "cross the mesh (the same axes as the arrays they meet, or fewer axes split)"
        )
    file = _file_of(rule)
    return (
        f"{where}; `shardrules explain {file} --step {step or 'MODULE:FUNCTION'} --cost` shows every "
        f"collective. If the communication is the price of the layout, raise the budget ({option})"
    )


def findings(cost: Any, rules: RuleSet, span: Span | None, args: Any) -> list[Diagnostic]:
    """SR129 for a step whose collectives move more than
    `args.max_collective_bytes` per device per step, SR130 for one whose
    collective bytes grew by more than `args.max_collective_increase` over
    `args.baseline`'s."""
    found = []
    limit = getattr(args, "max_collective_bytes", None)
    if limit is not None:
        found += _over_bytes(cost, rules, span, args, limit)
    if getattr(args, "max_collective_increase", None) is not None and getattr(args, "baseline", None):
        found += _over_increase(cost, rules, span, args)
    return found


def _total(cost: Any) -> int:
    return sum(c.bytes_per_device for c in cost.collectives)


def _over_bytes(cost: Any, rules: RuleSet, span: Span | None, args: Any, limit: Any) -> list[Diagnostic]:
    from .._language._sizes import byte_size

    option = _origin(args, "max_collective_bytes", "--max-collective-bytes")
    try:
        budget = limit if isinstance(limit, int) else byte_size(str(limit))
    except ValueError as err:
        raise UsageError(f"{option}: {err}") from None
    total = _total(cost)
    if total <= budget:
        return []
    kinds = ", ".join(f"{c.kind} {format_bytes(c.bytes_per_device)}" for c in cost.collectives)
    top = cost.by_rule[0] if cost.by_rule else None
    by_rule = f"; by rule line, most first: {_top_rules(cost)}" if cost.by_rule else ""
    return [
        Diagnostic(
            "SR129",
            "error",
            f"the step's collectives move {format_bytes(total)} per device per step (at most "
            f"{format_bytes(budget)} allowed by {option}): {kinds}{by_rule}",
            (_span(rules, top.rule) if top is not None else None) or span,
            None,
            _fix(top.rule, top.text, option, args.step)
            if top is not None
            else _fix("", "", option, args.step),
        )
    ]


def baseline_cost(args: Any) -> dict[str, Any]:
    """The step cost the `--baseline` plan file records (read once per run).
    `UsageError` for a file that cannot be read or records no cost."""
    from ._plans import read_dump

    path = args.baseline
    cached = getattr(args, "baseline_read", None)
    if cached is not None and cached[0] == path:
        return cached[1]
    option = _origin(args, "baseline", "--baseline")
    try:
        table = read_dump(path)
    except UsageError as err:  # it names the file
        raise UsageError(f"{option}: {err}") from None
    if table.step_cost is None:
        raise UsageError(
            f"{option}: {path} records no step cost: write it with `shardrules dump RULES --step "
            f"{args.step or 'MODULE:FUNCTION'} -o {path}` (the step lint compiles, on the same mesh)"
        )
    args.baseline_read = (path, table.step_cost)
    return table.step_cost


def _over_increase(cost: Any, rules: RuleSet, span: Span | None, args: Any) -> list[Diagnostic]:
    old = baseline_cost(args)
    where = f"the baseline {args.baseline}"
    if old["devices"] != cost.devices or old.get("target") != cost.target:
        raise UsageError(
            f"{where} was costed on {old['devices']} devices ({old.get('target') or 'the mesh'}) and this "
            f"step on {cost.devices} ({cost.target or 'the mesh'}): record the baseline with the same mesh "
            "and --target, so that their collectives compare"
        )
    pct = args.max_collective_increase
    option = _origin(args, "max_collective_increase", "--max-collective-increase")
    before, after = collective_bytes(old), _total(cost)
    if after <= before * (1 + pct):
        return []
    growth = f"+{(after - before) / before:.1%}" if before else "from none"
    now = recorded_rules(cost.to_json()) or []
    message = (
        f"the step's collectives grew from {format_bytes(before)} to {format_bytes(after)} per device per "
        f"step ({growth}) over {where} (at most +{pct:.1%} allowed by {option})"
    )
    if has_rules(old):
        grown = _grown(old.get("by_rule") or [], now)
        message += f"; grown most, by rule line (before -> after): {'; '.join(m.text() for m in grown)}"
        edited = [m for m in _edited(old.get("by_rule") or [], now) if m not in grown]
        if edited:  # where a rule's own bytes fell, the arrays it meets may pay for its edit
            message += f"; rule lines edited since: {'; '.join(m.text() for m in edited)}"
        top = grown[0].after if grown and grown[0].after is not None else None
    else:
        message += (
            f"; {args.baseline} does not record the collectives per rule line (written before `by_rule`, "
            "plan file version 4), so which rule lines grew is not known; now most by rule line: "
            + _top_rules(cost)
        )
        top = now[0] if now else None
    rule, text = (top["rule"], top["text"]) if top is not None else ("", "")
    fix = _fix(rule, text, option, args.step).replace(
        "raise the budget", "raise the budget or record the baseline again"
    )
    changed = _edited(old.get("by_rule") or [], now) if has_rules(old) else []
    if changed and changed[0].after is not None and changed[0].after["rule"] != rule:
        first = changed[0].after
        fix = (
            f"the edit of {_rule_name(first['rule'], first['text'])} may be what grew them: a rule's layout "
            "decides what the arrays it meets must move; undo or rework it. Otherwise " + fix
        )
    file = _file_of(rule)
    shapes = f" --shapes {args.shapes}" if getattr(args, "shapes", None) else ""
    hint = (
        f"{fix}; to record it again: `shardrules dump {file}{shapes} --step {args.step} -o {args.baseline}`"
    )
    return [Diagnostic("SR130", "error", message, _span(rules, rule) or span, None, hint)]


def _grown(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]) -> list[Any]:
    found = [m for m in moves(before, after) if m.change > 0]
    return sorted(found, key=lambda m: -m.change)[:SHOWN_RULES]


def _edited(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]) -> list[Any]:
    """The rule lines in both whose text changed (an edited layout), most changed first."""
    found = [m for m in moves(before, after) if m.before and m.after and m.before["text"] != m.after["text"]]
    return sorted(found, key=lambda m: -abs(m.change))[:SHOWN_RULES]
