"""RuleSet × pytree × mesh → `Plan`.

For each array leaf: the first rule whose pattern matches its path (else the
group's `default`) gives a spec, which `_spec.leaf_spec` turns into the leaf's
`PartitionSpec` (checking that every sharded dimension divides). Problems are
collected, not raised, so a plan reports all of them at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from itertools import repeat
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

from .._errors import Diagnostic, Span, did_you_mean
from .._gcpause import paused
from .._interop import _leaves
from .._interop._leaves import Signature, Unseen
from .._interop._paths import LeafInfo, flat_keys, flat_paths, flatten, is_key_dtype, leaf_paths, path_strs
from .._interop._quantized import containers
from .._language._format import spec_text
from .._language._load import iter_rules
from .._language._rules import Rule, RuleSet
from . import _catchall, _logical, _named_dims, _quantized
from ._dtypes import jax_holds, unholdable
from ._match import Matcher
from ._mesh import MeshLike, absent_axes, sizes_of
from ._plan import LeafPlans, Plan, Why
from ._spec import LeafError, leaf_spec, shard_bytes


def compile_plan(tree: Any, rules: RuleSet, mesh: MeshLike | None, group: str) -> Plan:
    """Compile `rules[group]` for `tree` on `mesh` (sizes only are used; `None`
    when no mesh is known, which works for specs without `?` or `auto`)."""
    return compile_leaves(tree, rules, mesh, group)[0]


def compile_leaves(tree: Any, rules: RuleSet, mesh: MeshLike | None, group: str) -> tuple[Plan, list[Any]]:
    """`compile_plan`, and the tree's leaves.

    Plans are cached on the `RuleSet`, keyed by the group, the tree's structure
    and the mesh's axis sizes, each with what it was made for leaf by leaf
    (`_leaves.Looks`: every leaf's type, shape and dtype): a second call for a
    tree of the same structure and leaves only flattens it and compares those.
    """
    _check_group(rules, group)  # before flattening: a typo'd group fails fast
    try:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
    except (ValueError, TypeError):
        flatten(tree)  # raises the SR109 error that explains it
        raise
    sizes = tuple(sizes_of(mesh).items()) if mesh is not None else None
    # The treedef's text tells apart dict keys that compare equal but make different
    # paths (0, 0.0 and False; "a" and a str-valued enum member); treedefs do not.
    # A dict of leaves with `str` keys (a shapes file's) is known by its keys alone,
    # quicker to read, hash and compare than its treedef (and its text).
    keys = flat_keys(treedef)
    text = "" if keys is not None else str(treedef)
    key = (group, tuple(keys) if keys is not None else (treedef, text), sizes)
    looks = _leaves.Looks(leaves)
    with paused():  # reading a million leaves' shapes may make as many tuples (NumPy's)
        cached = rules._plan_cache.get(key, looks.fits)
    if cached is not None:
        plan_leaves, diagnostics = cached
        return Plan(plan_leaves, treedef, diagnostics, group, rules, mesh), leaves
    with paused():  # every object made per leaf outlives the loop, and none is in a cycle
        signatures = looks.signatures()
        paths = flat_paths(treedef, leaves) or leaf_paths(tree)
        if len(paths) != len(leaves):  # cannot happen for pytrees JAX flattens consistently
            keyed, _ = flatten(tree)
            paths = path_strs([keypath for keypath, _ in keyed])
        plan = _compile(paths, signatures, treedef, rules, mesh, group)
        hidden = _leaves.hidden_in_nodes(tree, text)  # SR213: arrays in nodes' static data
        if hidden:
            plan = dataclasses.replace(plan, diagnostics=(*plan.diagnostics, *_leaves.diagnostics(hidden)))
    if _logical.uses_logical(rules, group):
        plan = _logical.resolve(plan, tree, mesh)  # `logical` specs read the boxes around leaves
    plan = _named_dims.check(plan, tree)  # SR214: positional specs against the boxes' names
    rules._plan_cache.put(key, (plan.leaves, plan.diagnostics), looks.seen())
    return plan, leaves


def compile_flat(
    keyed: list[tuple[Any, Any]], treedef: Any, rules: RuleSet, mesh: MeshLike | None, group: str
) -> Plan:
    """`compile_plan` for a tree already flattened with its key paths."""
    paths = path_strs([keypath for keypath, _ in keyed])
    plan = _compile(paths, [_leaves.signature(leaf) for _, leaf in keyed], treedef, rules, mesh, group)
    if _logical.uses_logical(rules, group):
        tree = jax.tree_util.tree_unflatten(treedef, [leaf for _, leaf in keyed])
        plan = _logical.resolve(plan, tree, mesh)
    return plan


def _compile(
    paths: list[str],
    signatures: list[Signature],
    treedef: Any,
    rules: RuleSet,
    mesh: MeshLike | None,
    group: str,
) -> Plan:
    """The plan for leaves given by their paths and `_signature`s."""
    _check_group(rules, group)
    sizes = sizes_of(mesh) if mesh is not None else None
    group_rules = list(iter_rules(rules, group))
    diagnostics: list[Diagnostic] = []
    broken = _check_rules(group_rules, rules, sizes, diagnostics)
    matcher = Matcher(group_rules)
    default = rules.defaults.get(group)
    guarded = matcher.guarded or (default is not None and default.guard is not None)
    quantized = containers(paths, signatures)  # planned after the others (`_quantized`)
    looked = signatures
    if quantized:
        signatures = [None if i in quantized else s for i, s in enumerate(signatures)]

    # A leaf's plan is its path and its kind: (shape, dtype, rule, spec, bytes per
    # device, why), the same for every array of one shape and dtype that one rule
    # matches. Kind 0 is "not an array".
    parts: list[tuple[Any, ...]] = [(None, None, None, None, 0, "not an array")]
    kind_of: dict[tuple[int, tuple[int, ...], np.dtype], int] = {}
    kinds: list[int] = []
    unmatched: list[LeafInfo] = []
    # SR115: leaves of a dtype JAX cannot hold, by dtype and rule
    unheld: dict[tuple[np.dtype, int], tuple[Rule | None, list[LeafInfo]]] = {}
    listed: dict[int, list[LeafInfo]] = {}  # kinds whose every leaf is listed in one finding
    reported: set[tuple[str, str, Span | None]] = set()
    unseen: list[tuple[str, Unseen]] = []  # SR121/SR213: leaves hiding arrays
    # Without guards, each path's first matching rule is found for all paths at once
    # (`Matcher.firsts`), and a leaf whose rule and signature (one object per distinct
    # shape and dtype) were seen before, with nothing to list, takes that kind at once.
    matches: Iterable[Rule | None] = repeat(None) if guarded else matcher.firsts(paths)
    seen: dict[tuple[int, int], int] = {}  # (id(first match), id(signature)) → kind
    for path, signature, matched in zip(paths, signatures, matches, strict=False):  # `repeat`: endless
        kind = seen.get((id(matched), id(signature)))
        if kind is not None:
            kinds.append(kind)
            continue
        if signature is None or isinstance(signature, Unseen):
            if signature is not None:
                unseen.append((path, signature))
            elif not guarded:
                seen[id(matched), id(signature)] = 0
            kinds.append(0)
            continue
        shape, dtype = signature
        rule = _fitting(matcher, default, path, shape, dtype) if guarded else matched or default
        key = (id(rule), shape, dtype)
        kind = kind_of.get(key)
        if kind is None:
            kind = len(parts)
            if not jax_holds(dtype):  # before anything else: no layout makes it placeable
                parts.append((shape, dtype, rule, None, 0, "error"))
                kind_of[key] = kind
                listed[kind] = unheld.setdefault((dtype, id(rule)), (rule, []))[1]
                listed[kind].append(LeafInfo(path, shape, dtype))
                kinds.append(kind)
                continue
            done = _plan_one(rule, path, shape, dtype, sizes, rules, broken, diagnostics, reported)
            if done is None:
                unmatched.append(LeafInfo(path, shape, dtype))
                part: tuple[Any, ...] = (shape, dtype, None, None, 0, "unmatched")
                listed[kind] = unmatched
            else:
                spec, per_device, why = done
                part = (shape, dtype, rule, spec, per_device, why)
            parts.append(part)
            # errors name their leaf: one diagnostic each (a `logical` rule's has none yet)
            if done is None or done[2] != "error" or rule.spec.kind == "logical":  # type: ignore[union-attr]
                kind_of[key] = kind
                if not guarded and kind not in listed:
                    seen[id(matched), id(signature)] = kind
        elif kind in listed:
            listed[kind].append(LeafInfo(path, shape, dtype))
        elif not guarded:
            seen[id(matched), id(signature)] = kind
        kinds.append(kind)

    if quantized:
        found, notes = _quantized.plan(
            quantized,
            paths,
            looked,
            lambda path, shape, dtype: _fitting(matcher, default, path, shape, dtype),
            lambda rule, path, shape, dtype: _plan_one(
                rule, path, shape, dtype, sizes, rules, broken, diagnostics, reported
            ),
            sizes,
            kinds,
            parts,
        )
        unmatched.extend(found)
        diagnostics.extend(notes)
    diagnostics.extend(unholdable(found, None if r is None else r.span) for r, found in unheld.values())
    if unmatched:
        diagnostics.append(_unmatched(unmatched, rules, group))
    diagnostics.extend(_leaves.diagnostics(unseen))
    diagnostics.extend(_catchall.findings(paths, kinds, parts, group_rules))  # SR125
    return Plan(LeafPlans(paths, kinds, parts), treedef, tuple(diagnostics), group, rules, mesh)


def _plan_one(
    rule: Rule | None,
    path: str,
    shape: tuple[int, ...],
    dtype: np.dtype,
    sizes: dict[str, int] | None,
    rules: RuleSet,
    broken: set[int],
    diagnostics: list[Diagnostic],
    reported: set[tuple[str, str, Span | None]],
) -> tuple[PartitionSpec | None, int, Why] | None:
    """Spec, bytes per device and why, for an array that `rule` matched (`None`:
    unmatched). The same for every array of this shape and dtype that the rule
    matches, except that an error is reported only once."""
    info = LeafInfo(path, shape, dtype)
    if info.size == 1 or not shape:
        return PartitionSpec(*([None] * len(shape))), info.nbytes, "scalar" if not shape else "size-1"
    if rule is None:
        if is_key_dtype(dtype):  # PRNG keys are state, not parameters: replicated unless a rule says
            return PartitionSpec(*([None] * len(shape))), info.nbytes, "key"
        return None
    if id(rule) in broken:
        return None, 0, "error"
    if rule.spec.kind == "logical":
        return None, 0, "error"  # until `_logical.resolve` lays it out by the names in its box
    try:
        spec = leaf_spec(rule, info, sizes, rules)
    except LeafError as err:
        if (err.code, err.message, err.span) not in reported:  # e.g. SR108: once per rule
            reported.add((err.code, err.message, err.span))
            diagnostics.append(
                Diagnostic(
                    err.code, "error", err.message, err.span, info.path, err.hint, ((path, shape),), err.cause
                )
            )
        return None, 0, "error"
    return spec, shard_bytes(info, spec, sizes), "default" if rule.is_default else "rule"


def _fitting(
    matcher: Matcher, default: Rule | None, path: str, shape: tuple[int, ...], dtype: np.dtype
) -> Rule | None:
    """The rule for an array at `path` in a group with guards: the first whose
    pattern matches and whose guard holds, else `default` if its guard holds."""
    rule = matcher.first_fitting(path, shape, dtype)
    if rule is None and default is not None and matcher.holds(default, shape, dtype):
        return default
    return rule


def _check_group(rules: RuleSet, group: str) -> None:
    rules.group(group)


def _check_rules(
    group_rules: list[Rule], rules: RuleSet, sizes: dict[str, int] | None, out: list[Diagnostic]
) -> set[int]:
    """Rule-level checks that need no leaf; returns the ids of broken rules."""
    broken: set[int] = set()
    # Axes of the file's `mesh` line that this mesh lacks: one finding about the
    # two meshes, not one per rule naming them (the rules are right; the mesh is not).
    lacking = _mesh_mismatch(group_rules, rules, sizes, out)
    absent = absent_axes(rules, sizes)  # `model?` that the mesh lacks: size 1, dropped from specs
    for rule in group_rules:
        if rule.spec.kind == "unresolved":  # lint's partial load: its error is reported already
            broken.add(id(rule))
            continue
        axes = rule.spec.axes
        twice = sorted({a for a in axes if axes.count(a) > 1})
        if twice:
            out.append(
                Diagnostic(
                    "SR102",
                    "error",
                    f"mesh axis `{twice[0]}` is used twice in one spec",
                    rule.spec.span,
                    hint="a mesh axis can shard only one dimension of an array; "
                    "check what the aliases in this spec stand for",
                )
            )
            broken.add(id(rule))
        if sizes is None:
            continue
        for entry in rule.spec.entries:
            for g in entry.groups:
                for axis in g.axes:
                    if axis not in sizes and axis not in absent:
                        if axis not in lacking:
                            out.append(_unknown_axis(axis, g.span or rule.spec.span, g.written, sizes))
                        broken.add(id(rule))
        if rule.spec.kind == "auto":
            for axis in rule.spec.auto_axes:
                if axis not in sizes and axis not in absent:
                    if axis not in lacking:
                        out.append(_unknown_axis(axis, rule.spec.span, axis, sizes))
                    broken.add(id(rule))
    for name in [*rules.aliases, *rules.alternatives]:
        if sizes is not None and name in sizes:
            out.append(
                Diagnostic(
                    "SR013",
                    "error",
                    f"alias `{name}` has the name of a mesh axis of this mesh",
                    dict(rules.alias_span_items).get(name),
                    hint="rename the alias; a name cannot mean both",
                )
            )
            broken.update(id(r) for r in group_rules)
    return broken


def _mesh_mismatch(
    group_rules: list[Rule], rules: RuleSet, sizes: dict[str, int] | None, out: list[Diagnostic]
) -> set[str]:
    """SR101 once, at the file's `mesh` line, when the mesh lacks axes that line
    declares and the rules use; returns those axes (the rules naming them are
    then not reported one by one)."""
    if sizes is None or rules.mesh is None:
        return set()
    used = {axis for rule in group_rules for axis in rule.spec.axes}
    absent = absent_axes(rules, sizes)  # `model?`: may be missing, then size 1
    lacking = [axis for axis in rules.mesh.names if axis not in sizes and axis in used and axis not in absent]
    if not lacking:  # what the rules use is all there
        return set()
    given = ", ".join(f"{k}={v}" for k, v in sizes.items())
    extra = [axis for axis in sizes if axis not in rules.mesh.names]
    meant = {m: a for a in extra for m in lacking if did_you_mean(a, [m])}  # model → modle
    renames = [f"`{a}` for `{m}`" for m, a in meant.items()]
    names = ", ".join(f"`{a}`" for a in lacking)
    fixed = ",".join(f"{a}={sizes.get(a, sizes.get(meant.get(a, ''), 'SIZE'))}" for a in rules.mesh.names)
    names_all = tuple(a for a in rules.mesh.names if a in sizes or a in lacking)
    ones = f"jax.make_mesh({tuple(sizes.get(a, 1) for a in names_all)}, {names_all})"
    optional = ", ".join(f"{a.name}?" if a.name in lacking or a.optional else a.name for a in rules.mesh.axes)
    hint = (
        (f"the file's axes are right and the mesh is not: {'; '.join(renames)}? " if renames else "")
        + f"give the mesh the file's axes (in lint: --mesh {fixed}; in Python: a mesh with these axis names, "
        f"of size 1 where it has no use for them: {ones}), or write `mesh {optional}` in the file: "
        "an axis written `NAME?` in the mesh line may be missing from the mesh, and is then size 1 "
        "(the dimensions it would shard stay unsharded)"
    )
    out.append(
        Diagnostic(
            "SR101",
            "error",
            f"the mesh ({given}) lacks {names} of the file's `mesh` line ({', '.join(rules.mesh.names)}); "
            "the rules that use it are not checked",
            rules.mesh.span,
            hint=hint,
        )
    )
    return set(lacking)


def _unknown_axis(axis: str, span: Span | None, written: str, sizes: dict[str, int]) -> Diagnostic:
    via = f" (through alias `{written}`)" if written and written != axis else ""
    mesh = ", ".join(f"{k}={v}" for k, v in sizes.items())
    hint = did_you_mean(axis, sizes) or f"the mesh has {mesh}"
    return Diagnostic(
        "SR101", "error", f"mesh axis `{axis}`{via} is not in the mesh ({mesh})", span, hint=hint
    )


def _unmatched(leaves: list[LeafInfo], rules: RuleSet, group: str) -> Diagnostic:
    """SR105: one finding for every unmatched leaf, naming the first; the
    others are in its `paths` (rendered as `(and N more leaves like it: ...)`)."""
    first = leaves[0]
    name = f"`{first.path}`" if first.path else "a lone array (no path)"
    cause = f"matches no rule in group `{group}` of {rules.name}"
    hint = f"add rules for these paths, or a fallback such as `default -> replicated` under `rules {group}:`"
    default = rules.defaults.get(group)
    if default is not None and default.guard is not None:  # the default's guard refused them
        cause += f", and the guard of its `default` (`{default.guard}`, at {default.location}) does not hold"
        hint = (
            f'write that fallback as a pattern rule, `"." -> {spec_text(default.written)} {default.guard}`, '
            "and end the group with an unguarded `default -> replicated`"
        )
    return Diagnostic(
        "SR105",
        "error",
        f"array leaf {name} (shape {first.shape}, {first.dtype}) {cause}",
        dict(rules.group_span_items).get(group),
        first.path,
        hint,
        tuple((leaf.path, leaf.shape) for leaf in leaves),
        cause,
    )
