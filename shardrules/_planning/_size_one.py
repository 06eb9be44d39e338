"""SR215 (warning): a rule that shards nothing on the mesh it is planned for.

A rule whose spec names mesh axes (directly, through an alias or its
alternatives, or in `auto(...)`) that all have size 1 on this mesh splits no
dimension: every leaf it lays out stays replicated, although the rule was
written to shard it (`-> (_, model)` on `mesh data=8, model=1`). Nothing
else says so: the plan is valid, and SR204 only speaks of arrays over its
threshold.

Not reported when every axis of the mesh has size 1 (a one-device mesh, as
references are planned on, shards nothing by design), for a rule that names
no axis (`replicated`, `_`), for one that names an axis of size greater than
1, for one naming an axis the mesh lacks (SR101 says so), or for `logical`
specs (their axes come from each leaf). Given a plan, its group's rules are
reported with the leaves and bytes they keep replicated, and a rule that
takes no leaf is left to SR201.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .._errors import Diagnostic
from .._language._load import iter_rules
from .._language._rules import Rule, RuleSet
from ._plan import LeafPlans, Plan, format_bytes

_COUNTED = ("rule", "default")
"""Why a leaf took its rule's spec: scalars and size-1 arrays are replicated by any rule."""


def size_one_warnings(
    rules: RuleSet,
    sizes: Mapping[str, int] | None,
    groups: Iterable[str],
    plan: Plan | None = None,
) -> list[Diagnostic]:
    """SR215 for each rule of `groups` whose axes all have size 1 in `sizes`,
    on a mesh with an axis of size greater than 1. The rules of `plan.group`
    (when a plan is given) are counted against its leaves."""
    if not sizes or max(sizes.values()) <= 1:
        return []
    taken = _taken(plan) if plan is not None else {}
    out = []
    for group in groups:
        for rule in iter_rules(rules, group):
            axes = _axes(rule)
            if not axes or any(sizes.get(a, 0) != 1 for a in axes):
                continue
            counted = plan is not None and group == plan.group
            count, nbytes = taken.get(id(rule), (0, 0))
            if counted and count == 0:
                continue  # it takes no leaf of this tree: SR201's to say
            out.append(_diagnostic(rule, axes, sizes, (count, nbytes) if counted else None))
    return out


def _axes(rule: Rule) -> tuple[str, ...]:
    """The mesh axes a rule names (an alias's alternatives too); none for a
    `logical` spec, or one lint could not resolve."""
    if rule.spec.kind not in ("entries", "auto"):
        return ()
    return tuple(dict.fromkeys((*rule.spec.axes, *rule.spec.choice_axes)))


def _taken(plan: Plan) -> dict[int, tuple[int, int]]:
    """Per rule (by `id`): how many array leaves it lays out, and their bytes per device."""
    leaves = plan.leaves
    kinds: Iterable[tuple[tuple[Any, ...], int]] = (
        leaves.kind_counts()
        if isinstance(leaves, LeafPlans)
        else [
            ((leaf.shape, leaf.dtype, leaf.rule, leaf.spec, leaf.bytes_per_device, leaf.why), 1)
            for leaf in leaves
        ]
    )
    found: dict[int, tuple[int, int]] = {}
    for (shape, _dtype, rule, _spec, per_device, why, *_where), count in kinds:
        if rule is None or shape is None or why not in _COUNTED:
            continue
        n, b = found.get(id(rule), (0, 0))
        found[id(rule)] = (n + count, b + count * int(per_device))
    return found


def _diagnostic(
    rule: Rule, axes: tuple[str, ...], sizes: Mapping[str, int], counted: tuple[int, int] | None
) -> Diagnostic:
    named = " and ".join(f"`{a}`" for a in axes)
    mesh = ", ".join(f"{name}={size}" for name, size in sizes.items())
    has = "has" if len(axes) == 1 else "each have"
    if counted is None:
        what = "every leaf it lays out stays replicated"
    else:
        count, nbytes = counted
        leaves = "the one leaf it lays out stays" if count == 1 else f"the {count} leaves it lays out stay"
        what = f"{leaves} replicated: {format_bytes(nbytes)} on every device"
    wide = sorted((name for name, size in sizes.items() if size > 1), key=lambda a: -sizes[a])
    other = ", ".join(f"`{a}` ({sizes[a]} devices)" for a in wide[:3])
    return Diagnostic(
        "SR215",
        "warning",
        f"rule `{rule.pattern or 'default'}` shards nothing on this mesh: mesh "
        f"{'axis' if len(axes) == 1 else 'axes'} {named} {has} size 1 ({mesh}), so {what}",
        rule.spec.span or rule.span,
        hint=f"give {named} a size above 1 on this mesh (--mesh, or the sizes of the `mesh` line), or "
        f"lay these leaves over an axis that has devices to split them: {other}; if every device is "
        "meant to hold them whole, write `-> replicated` (a rule kept for other meshes can say so at "
        "the end of its line: `# noqa: SR215`)",
    )
