"""Checks on a compiled plan beyond "does it compile": warnings about the rules,
the replicated share (the memory budget: `_memory`; where input arrays already
live: `_inputs`).

Codes (catalogue: docs/diagnostics.md):

- SR116 (error; a warning from `apply` and `jit`): the replicated share of the
  plan's bytes over the tolerance.
- SR201 (warning): a rule that matches no leaf (unless a catch-all takes
  leaves it was written for: SR125, an error, from `_catchall`).
- SR202 (warning): a rule whose every leaf is taken by earlier rules.
- SR203 (warning): a sharded spec on a scalar.
- SR204 (warning): a large array fully replicated.
- SR205 (warning): a mesh axis no rule uses.
- SR209 (warning): an alternative of an alias that never applies (`_choice`).
- SR215 (warning): a rule whose axes all have size 1 on this mesh (`_size_one`).
"""

from __future__ import annotations

import dataclasses
import math

from .._errors import Diagnostic, ShardRulesWarning, group
from .._language._load import iter_rules
from .._language._rules import Rule, RuleSet
from .._pspec import entries
from .._quiet import warn
from . import _mesh
from ._choice import alternative_warnings
from ._match import by_key, search_all
from ._plan import LeafPlan, LeafPlans, Plan, format_bytes, plural
from ._segments import names_of, respelled
from ._size_one import size_one_warnings

DEFAULT_REPLICATED_THRESHOLD = 64 * 2**20
"""Arrays at least this large (bytes) draw SR204 when fully replicated."""


def rule_warnings(plan: Plan) -> list[Diagnostic]:
    """SR201 (dead rule), SR202 (shadowed rule) and SR203 (sharded scalar)."""
    out: list[Diagnostic] = []
    arrays = [leaf for leaf in plan.leaves if leaf.is_array]
    winners = {id(leaf.rule) for leaf in arrays if leaf.rule is not None}
    paths = [leaf.path for leaf in arrays]
    groups: dict[bytes, list[int]] | None = None
    spelling: tuple[list[str], set[str]] | None = None  # for SR201's did-you-mean
    # A rule SR125 names (a catch-all takes leaves it was written for) is that error, not also SR201.
    named = {(d.span.file, d.span.line) for d in plan.diagnostics if d.code == "SR125" and d.span is not None}
    for rule in plan.rules.group(plan.group):
        if id(rule) in winners or rule.pattern is None:
            continue
        if rule.span is not None and (rule.span.file, rule.span.line) in named:
            continue
        if groups is None:
            groups = by_key(paths)  # as in matching: digit-blind patterns tried once per key
        taken_by: dict[int, tuple[Rule, int]] = {}
        matched = search_all(rule.pattern, paths, groups)
        if rule.guard is not None:  # the leaves its guard refuses were never its to take
            admitted = [i for i in matched if _admits(rule, arrays[i])]
            if matched and not admitted:
                out.append(_refused(rule, [arrays[i] for i in matched]))
                continue
            matched = admitted
        for i in matched:
            leaf = arrays[i]
            if leaf.rule is not None:
                first, count = taken_by.get(id(leaf.rule), (leaf.rule, 0))
                taken_by[id(leaf.rule)] = (first, count + 1)
        if not taken_by:
            example = f"; paths look like `{arrays[0].path}`" if arrays else ""
            spelling = spelling or names_of(paths)
            fixed = respelled(rule.pattern, spelling)
            if fixed is not None:
                example = f"; did you mean `{fixed[0]}`? It matches `{fixed[1]}`"
            out.append(
                Diagnostic(
                    "SR201",
                    "warning",
                    f"rule `{rule.pattern}` matches no leaf of this tree (none of its {plural(len(arrays), 'array')})",
                    rule.pattern_span or rule.span,
                    hint="check the pattern against the paths `shardrules explain` lists"
                    f"{example}; or delete the rule",
                )
            )
            continue
        earlier = sorted(taken_by.values(), key=lambda item: item[0].index)
        if len(earlier) == 1:
            where = earlier[0][0].location
        else:
            where = ", ".join(f"{r.location} ({plural(n, 'leaf', 'leaves')})" for r, n in earlier)
        count = sum(n for _, n in earlier)
        what = "the one leaf it matches is" if count == 1 else f"all {count} leaves it matches are"
        if rule.guard is not None:
            what = what.replace("it matches", "it matches and its guard admits")
        out.append(
            Diagnostic(
                "SR202",
                "warning",
                f"rule `{rule.pattern}` never applies: {what} taken first by {where}",
                rule.pattern_span or rule.span,
                hint=f"move it above {earlier[0][0].location} if it should win, make the earlier "
                "pattern more specific, or delete it",
            )
        )

    seen: set[int] = set()
    for leaf in arrays:
        rule = leaf.rule
        if leaf.why != "scalar" or rule is None or id(rule) in seen:
            continue
        if rule.spec.kind == "entries" and any(e.kind == "axes" for e in rule.spec.entries):
            seen.add(id(rule))
            out.append(
                Diagnostic(
                    "SR203",
                    "warning",
                    f"`{leaf.path}` is a scalar, so the spec of the rule it matches shards nothing",
                    rule.spec.span or rule.span,
                    leaf.path,
                    "scalars are always replicated; keep them out of this pattern "
                    "(e.g. anchor it with `$`) or give them their own `replicated` rule",
                )
            )
    return out


def _admits(rule: Rule, leaf: LeafPlan) -> bool:
    assert rule.guard is not None and leaf.shape is not None
    return leaf.dtype is None or rule.guard.holds(leaf.shape, leaf.dtype)


def _refused(rule: Rule, leaves: list[LeafPlan]) -> Diagnostic:
    """SR201 for a guarded rule whose pattern matches leaves its guard all refuses."""
    largest = max(leaves, key=lambda leaf: leaf.nbytes)
    shown = f"`{largest.path}`, shape {largest.shape}, {largest.dtype}, {format_bytes(largest.nbytes)}"
    which = (
        f"the one leaf its pattern matches ({shown})"
        if len(leaves) == 1
        else (f"all {len(leaves)} leaves its pattern matches (the largest: {shown})")
    )
    return Diagnostic(
        "SR201",
        "warning",
        f"rule `{rule.pattern}` applies to no leaf: its guard (`{rule.guard}`) refuses {which}",
        rule.guard.span if rule.guard is not None and rule.guard.span is not None else rule.span,
        hint="check the guard's numbers and dtypes against these leaves; or delete the rule",
    )


DEFAULT_REPLICATED_TOLERANCE = 0.25
"""The largest share of a plan's bytes that may be fully replicated (SR116)."""


def replicated_share(plan: Plan) -> tuple[float, int, int]:
    """`(share, replicated bytes, total bytes)`: how much of the plan's array
    bytes every device holds whole (0 on a mesh of one device, or without one)."""
    if plan.mesh is None or math.prod(_mesh.sizes_of(plan.mesh).values()) <= 1:
        return 0.0, 0, 0
    total = replicated = 0
    leaves = plan.leaves
    kinds = (
        leaves.kind_counts()
        if isinstance(leaves, LeafPlans)
        else [((leaf.shape, leaf.dtype, leaf.rule, leaf.spec, 0, leaf.why), 1) for leaf in leaves]
    )
    for (shape, dtype, _rule, spec, _per_device, why, *_where), count in kinds:  # `where`: read from a file
        if spec is None or not shape:
            continue
        if dtype is None:
            continue
        nbytes = math.prod(shape) * dtype.itemsize * count
        total += nbytes
        if why not in ("size-1", "key") and all(entry is None for entry in entries(spec)):
            replicated += nbytes
    return (replicated / total if total else 0.0), replicated, total


def tolerance_diagnostics(
    plan: Plan,
    tolerance: float = DEFAULT_REPLICATED_TOLERANCE,
    threshold: int = DEFAULT_REPLICATED_THRESHOLD,
) -> list[Diagnostic]:
    """SR116 (error): more than `tolerance` of the plan's bytes, and at least
    `threshold` bytes, would be held whole by every device, in a group whose
    rules mean to shard something (a group of only `replicated` rules, such as
    pure data parallelism, is replicated on purpose and never draws it).
    Scalars and size-1 arrays, always replicated, are not counted."""
    if not any(
        rule.spec.axes or rule.spec.choice_axes or rule.spec.kind in ("auto", "logical")
        for rule in _group_rules(plan)
    ):
        return []
    share, replicated, total = replicated_share(plan)
    if share <= tolerance or replicated < threshold:
        return []
    biggest = sorted(
        (
            leaf
            for leaf in plan.leaves
            if leaf.spec is not None and leaf.shape and all(e is None for e in entries(leaf.spec))
        ),
        key=lambda leaf: -leaf.nbytes,
    )[:3]
    shown = ", ".join(f"`{leaf.path}` ({format_bytes(leaf.nbytes)})" for leaf in biggest)
    return [
        Diagnostic(
            "SR116",
            "error",
            f"{share:.0%} of the plan's bytes ({format_bytes(replicated)} of {format_bytes(total)}) are "
            f"fully replicated, over the tolerance of {tolerance:.0%}: every device would hold them whole "
            f"(largest: {shown})",
            dict(plan.rules.group_span_items).get(plan.group),
            None,
            "check that the sharding rules match these paths (lint's SR201 lists rules that match "
            "nothing; paths may be dotted, `model.layers.0`, rather than slashed); or allow it with "
            "--replicated-tolerance (`replicated-tolerance` in [tool.shardrules]; `replicated_tolerance=` "
            "in Python), e.g. 1.0 for data parallelism",
        )
    ]


def warn_about(
    plan: Plan, tolerance: float = DEFAULT_REPLICATED_TOLERANCE, stacklevel: int = 3, where: str = ""
) -> None:
    """Warn (`ShardRulesWarning`) about what `apply` and `jit` would otherwise
    carry out silently: a rule of the group that matches no leaf of the tree
    (SR201), leaves hiding arrays that are passed over (SR213, grouped by
    cause), more of the plan's bytes fully replicated than `tolerance` (SR116,
    here a warning), an alias alternative naming an axis the mesh lacks but
    has one close to (SR209: a typo). Once per plan cached on the rule set.
    `where`: what the tree is, put before each message (`in_groups[1] (argument
    `opt_state`)`)."""
    found = [d for d in rule_warnings(plan) if d.code == "SR201"]
    found += group(d for d in plan.diagnostics if d.code in UNSEEN_WARNINGS)
    found += [dataclasses.replace(d, severity="warning") for d in tolerance_diagnostics(plan, tolerance)]
    # An alternative naming an axis the mesh lacks is how one file serves several meshes;
    # one naming an axis close to one the mesh has is most likely a typo.
    sizes = None if plan.mesh is None else _mesh.sizes_of(plan.mesh)
    found += [d for d in alternative_warnings(plan.rules, sizes) if d.hint.startswith("did you mean")]
    for diagnostic in plan.rules.kept(found):
        if where:
            diagnostic = dataclasses.replace(diagnostic, message=f"{where}: {diagnostic.message}")
        warn(ShardRulesWarning(diagnostic, plan.rules.sources), stacklevel=stacklevel)


UNSEEN_WARNINGS = ("SR213",)
"""Codes of `plan.diagnostics` about leaves passed over, warned about where trees are laid out."""


def warn_unseen(plan: Plan, stacklevel: int = 3) -> None:
    """Warn (`ShardRulesWarning`, one per cause) about the leaves of `plan`
    that hide arrays and are passed over (SR213): what `specs` and
    `shardings` would otherwise leave `None` without a word."""
    for diagnostic in group(d for d in plan.rules.kept(plan.diagnostics) if d.code in UNSEEN_WARNINGS):
        warn(ShardRulesWarning(diagnostic, plan.rules.sources), stacklevel=stacklevel)


def _group_rules(plan: Plan) -> list[Rule]:
    return list(iter_rules(plan.rules, plan.group))


def replication_warnings(plan: Plan, threshold: int = DEFAULT_REPLICATED_THRESHOLD) -> list[Diagnostic]:
    """SR204: arrays of at least `threshold` bytes that every device holds whole."""
    if plan.mesh is None or math.prod(_mesh.sizes_of(plan.mesh).values()) <= 1:
        return []
    sizes = _mesh.sizes_of(plan.mesh)
    biggest = max(sizes, key=lambda a: sizes[a])
    out = []
    for leaf in plan.leaves:
        if leaf.spec is None or not leaf.shape or leaf.nbytes < threshold:
            continue
        if all(entry is None for entry in entries(leaf.spec)):
            rule = leaf.rule
            out.append(
                Diagnostic(
                    "SR204",
                    "warning",
                    f"`{leaf.path}` (shape {leaf.shape}, {format_bytes(leaf.nbytes)}) is fully "
                    "replicated: every device holds all of it",
                    None if rule is None else (rule.spec.span or rule.span),
                    leaf.path,
                    f"shard one of its dimensions, e.g. with a rule `-> auto({biggest})`; this warning "
                    f"is for replicated arrays of {format_bytes(threshold)} or more "
                    "(set with --replicated-threshold, `replicated-threshold` in [tool.shardrules], or "
                    "`replicated_threshold=` in Python)"
                    + (
                        "; if every device is meant to hold it whole, say so at the end of the rule's line: "
                        "`# noqa: SR204`"
                        if rule is not None and rule.pattern is not None
                        else ""
                    ),
                )
            )
    return out


def unused_axis_warnings(plan: Plan) -> list[Diagnostic]:
    """SR205: mesh axes (of size > 1) that no rule of the file uses."""
    rules = plan.rules
    if plan.mesh is not None:
        axes = _mesh.sizes_of(plan.mesh)
    elif rules.mesh is not None:
        axes = {name: 0 for name in rules.mesh.names}
    else:
        return []
    used = {
        a
        for group in rules.group_names
        for rule in iter_rules(rules, group)
        for a in (*_names_used(rule), *rule.spec.choice_axes)  # an alias's alternatives count
    }
    spans = {a.name: a.span for a in rules.mesh.axes} if rules.mesh is not None else {}
    absent = _mesh.absent_axes(rules, axes if plan.mesh is not None else None)  # `model?`: size 1
    if rules.mesh is not None and any(
        a not in axes and a not in absent for a in rules.mesh.names if a in used
    ):
        # The mesh lacks axes the file uses (SR101 says so, once): its extra axes are
        # the misspelt ones, not unused ones.
        axes = {name: size for name, size in axes.items() if name in rules.mesh.names}
    return [
        Diagnostic(
            "SR205",
            "warning",
            f"mesh axis `{name}` is used by no rule",
            spans.get(name),
            hint=f"devices along `{name}` hold identical copies of everything; shard something over "
            "it (e.g. the batch in the inputs group) or drop it from the mesh",
        )
        for name, size in axes.items()
        if size != 1 and name not in used
    ]


def axis_type_warnings(rules: RuleSet, group: str = "activations") -> list[Diagnostic]:
    """SR207: an activation rule over both Explicit and Auto axes of the `mesh`
    line's declared types: neither `jax.sharding.reshard` (Explicit axes only)
    nor `with_sharding_constraint` (Auto axes only) can lay a value out so."""
    if rules.mesh is None or group not in rules.group_names:
        return []
    types = dict(zip(rules.mesh.names, rules.mesh.axis_types, strict=True))
    out = []
    for rule in iter_rules(rules, group):
        axes = [a for a in _names_used(rule) if types.get(a) is not None]
        explicit = [a for a in axes if types[a] == "explicit"]
        auto = [a for a in axes if types[a] == "auto"]
        if explicit and auto:
            out.append(
                Diagnostic(
                    "SR207",
                    "warning",
                    f"activation rule `{rule.pattern or 'default'}` lays values out over Explicit axes "
                    f"({', '.join(explicit)}) and Auto axes ({', '.join(auto)}) at once: neither "
                    "`jax.sharding.reshard` nor `with_sharding_constraint` can apply it",
                    rule.spec.span or rule.span,
                    hint="use axes of one type in an activation rule, or declare the axes one type in the "
                    "mesh line (`mesh explicit ...`)",
                )
            )
    return out


def _names_used(rule: Rule) -> tuple[str, ...]:
    """The mesh axes a rule uses; for a rule lint could not resolve (an error in
    its spec), every name written in it, so that its axes do not look unused."""
    if rule.spec.kind != "unresolved" or rule.written is None:
        return rule.spec.axes
    refs = [*rule.written.entries, *([rule.written.auto_axes] if rule.written.auto_axes else [])]
    return tuple(r.name for entry in refs for r in entry.axes)


def all_warnings(plan: Plan, replicated_threshold: int = DEFAULT_REPLICATED_THRESHOLD) -> list[Diagnostic]:
    """Every warning about `plan`, rule order first."""
    return [
        *rule_warnings(plan),
        *replication_warnings(plan, replicated_threshold),
        *unused_axis_warnings(plan),
        *axis_type_warnings(plan.rules),
        *alternative_warnings(plan.rules, None if plan.mesh is None else _mesh.sizes_of(plan.mesh)),
        *size_one_warnings(
            plan.rules, None if plan.mesh is None else _mesh.sizes_of(plan.mesh), [plan.group], plan
        ),
    ]
