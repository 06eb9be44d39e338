"""Aliases with alternatives, settled per spec when a leaf is planned.

`alias embed = (fsdp, expert) | fsdp | _` stands for the first alternative
that applies in the spec at hand: every mesh axis it names is in the mesh, and
no other dimension of the spec uses it. The spec's fixed entries (mesh axes,
aliases of one alternative) are placed first; then the entries naming aliases
with alternatives are settled one alias at a time, in the order of their
`alias` lines, each seeing the choices made before it. This is how Flax reads
`logical_axis_rules` (rules in list order; a rule whose mesh axes are taken
loses) when each name's rules are consecutive in the list.

"In the mesh" means the mesh the plan is for; without one, the names of the
file's `mesh` line; without either, every name. When no alternative applies the
leaf gets SR119. Lint's SR209 (`alternative_warnings`) reports alternatives
that can never apply.
"""

from __future__ import annotations

import dataclasses

from .._errors import Diagnostic, Span, did_you_mean
from .._interop._paths import LeafInfo
from .._language._rules import AxisGroup, ResolvedEntry, RuleSet
from .._language._syntax import Alias, AliasTarget
from ._mesh import absent_axes


@dataclasses.dataclass(frozen=True)
class Unsettled:
    """No alternative of `group`'s alias applies to dimension `dim`: each
    alternative's reasons, in order."""

    group: AxisGroup
    dim: int
    reasons: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]  # (alternative, why not)
    mesh: str  # the mesh the names were looked up in, as shown


def present_axes(sizes: dict[str, int] | None, rules: RuleSet) -> set[str] | None:
    """The axes that exist for this plan: the mesh's (and the `mesh` line's
    `NAME?` axes it lacks, of size 1); else the `mesh` line's; `None` (every
    name exists) without either."""
    if sizes is not None:
        return set(sizes) | absent_axes(rules, sizes)
    return set(rules.mesh.names) if rules.mesh is not None else None


def choice_group(rules: RuleSet, name: str, span: Span | None, optional: bool = False) -> AxisGroup | None:
    """The unsettled group for alias `name` if it has alternatives, else `None`."""
    alternatives = rules.alternatives
    if name not in alternatives:
        return None
    return AxisGroup((), optional, span, name, alternatives[name], list(alternatives).index(name))


def settle(
    entries: list[ResolvedEntry], sizes: dict[str, int] | None, rules: RuleSet
) -> tuple[list[ResolvedEntry], Unsettled | None]:
    """`entries` (one per dimension, `...` expanded) with each alias with
    alternatives replaced by the alternative chosen, or the first one that
    could not be settled."""
    pending = sorted(
        (g.order, dim, i) for dim, e in enumerate(entries) for i, g in enumerate(e.groups) if g.is_choice
    )
    if not pending:
        return entries, None
    present = present_axes(sizes, rules)
    used: dict[str, int] = {}  # axis → the dimension that uses it
    for dim, entry in enumerate(entries):
        for axis in entry.axes:
            used.setdefault(axis, dim)
    chosen: dict[tuple[int, int], tuple[str, ...]] = {}
    for _, dim, i in pending:
        group = entries[dim].groups[i]
        reasons = [(alt, _why_not(alt, used, present)) for alt in group.alternatives]
        pick = next((alt for alt, why in reasons if not why), None)
        if pick is None:
            return entries, Unsettled(group, dim, tuple(reasons), _mesh_text(sizes, rules))
        chosen[dim, i] = pick
        for axis in pick:
            used.setdefault(axis, dim)
    return [_settled(entry, dim, chosen) for dim, entry in enumerate(entries)], None


def _why_not(alt: tuple[str, ...], used: dict[str, int], present: set[str] | None) -> tuple[str, ...]:
    """Why alternative `alt` does not apply (`()`: it does)."""
    why: list[str] = []
    for axis in dict.fromkeys(alt):
        if present is not None and axis not in present:
            why.append(f"axis `{axis}` is not in the mesh")
        elif axis in used:
            why.append(f"axis `{axis}` is used by dimension {used[axis]}")
        elif alt.count(axis) > 1:
            why.append(f"it names axis `{axis}` twice")
    return tuple(why)


def _settled(entry: ResolvedEntry, dim: int, chosen: dict[tuple[int, int], tuple[str, ...]]) -> ResolvedEntry:
    """`entry` with its choices replaced by the alternatives chosen (an entry
    without a choice, of whatever kind, is returned as it is)."""
    if not any(g.is_choice for g in entry.groups):
        return entry
    groups: list[AxisGroup] = []
    for i, g in enumerate(entry.groups):
        if not g.is_choice:
            groups.append(g)
        elif chosen[dim, i]:  # `_` contributes no axis
            groups.append(AxisGroup(chosen[dim, i], g.optional, g.span, g.written))
    whole = "(" + ", ".join(g.written for g in entry.groups) + ")" if entry.optional else None
    return ResolvedEntry.of(groups, entry.span, whole)  # `(embed, model)?`: the whole tuple, or nothing


def _mesh_text(sizes: dict[str, int] | None, rules: RuleSet) -> str:
    if sizes is not None:
        return "the mesh has " + ", ".join(f"{k}={v}" for k, v in sizes.items())
    if rules.mesh is not None:
        return "no mesh is known; the `mesh` line names " + ", ".join(rules.mesh.names)
    return ""


def alternative_text(axes: tuple[str, ...]) -> str:
    """`_`, `fsdp` or `(fsdp, expert)`."""
    if not axes:
        return "_"
    return axes[0] if len(axes) == 1 else "(" + ", ".join(axes) + ")"


def describe(failure: Unsettled, info: LeafInfo, rules: RuleSet) -> tuple[str, str, Span | None, str, str]:
    """SR119 for `failure`: `(code, message, span, hint, cause)` of a `LeafError`."""
    name = failure.group.written
    defined = dict(rules.alias_span_items).get(name)
    where = f" (defined at {defined})" if defined is not None else ""
    tried = "; ".join(f"`{alternative_text(alt)}`: {', '.join(why)}" for alt, why in failure.reasons)
    mesh = f" ({failure.mesh})" if failure.mesh else ""
    cause = f"no alternative of alias `{name}`{where} applies to dimension {failure.dim}: {tried}{mesh}"
    message = (
        f"no alternative of alias `{name}`{where} applies to dimension {failure.dim} of `{info.path}` "
        f"(shape {info.shape}): {tried}{mesh}"
    )
    hint = (
        "end the alias with `| _` to leave the dimension unsharded where no alternative applies, "
        "or add an alternative over axes of this mesh that the rest of this spec leaves free"
    )
    return "SR119", message, failure.group.span, hint, cause


# ------------------------------------------------------------------ SR209


def alternative_warnings(rules: RuleSet, sizes: dict[str, int] | None) -> list[Diagnostic]:
    """SR209: alternatives of an alias that never apply, on the mesh of `sizes`
    (else the `mesh` line's axes; without either, only pre-emption is checked):
    one that names an axis the mesh lacks, or one that an earlier alternative
    always takes first (its axes are a subset of this one's; `_` is a subset of all)."""
    present = present_axes(sizes, rules)
    out: list[Diagnostic] = []
    for decl in rules.alternative_decls:
        resolved = rules.alternatives.get(decl.name)
        if resolved is None or len(resolved) != len(decl.alternatives):
            continue
        for j, alt in enumerate(decl.alternatives):
            found = _lacking(decl, alt, present, rules, sizes) or _preempted(decl, j, resolved)
            if found is not None:
                out.append(found)
    return out


def _lacking(
    decl: Alias, alt: AliasTarget, present: set[str] | None, rules: RuleSet, sizes: dict[str, int] | None
) -> Diagnostic | None:
    if present is None:
        return None
    for ref in alt.target:
        for axis in rules.aliases.get(ref.name, (ref.name,)):
            if axis in present:
                continue
            via = f" (through alias `{ref.name}`)" if axis != ref.name else ""
            mesh = (
                "the mesh (" + ", ".join(f"{k}={v}" for k, v in sizes.items()) + ")"
                if sizes is not None
                else f"the `mesh` line ({', '.join(rules.mesh.names if rules.mesh else sorted(present))})"
            )
            return Diagnostic(
                "SR209",
                "warning",
                f"alternative `{_written(alt)}` of alias `{decl.name}` never applies: axis `{axis}`{via} "
                f"is not in {mesh}",
                ref.span,
                hint=did_you_mean(axis, sorted(present))
                or "it applies only on a mesh with that axis; delete it if these rules are for this mesh only",
            )
    return None


def _preempted(decl: Alias, j: int, resolved: tuple[tuple[str, ...], ...]) -> Diagnostic | None:
    alt = decl.alternatives[j]
    for i in range(j):
        if set(resolved[i]) <= set(resolved[j]):
            earlier = _written(decl.alternatives[i])
            why = (
                "`_` before it always applies"
                if not resolved[i]
                else f"wherever it could apply, the earlier alternative `{earlier}` applies too and is taken"
            )
            return Diagnostic(
                "SR209",
                "warning",
                f"alternative `{_written(alt)}` of alias `{decl.name}` never applies: {why}",
                alt.span,
                hint=f"delete it, or move it before `{earlier}` if it should be tried first",
            )
    return None


def _written(alt: AliasTarget) -> str:
    """An alternative as written: `_`, `name` or `(a, b)`."""
    names = [r.name for r in alt.target]
    if not names:
        return "_"
    return "(" + ", ".join(names) + ")" if alt.is_tuple else names[0]
