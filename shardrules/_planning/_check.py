"""Checks on a compiled plan beyond "does it compile": warnings about the rules,
the per-device memory budget, and where input arrays already live.

Codes (catalogue: docs/diagnostics.md):

- SR106/SR107 (error): inputs committed elsewhere, or with no data to move
  (a dtype JAX cannot hold, SR115, is found when compiling: `_dtypes`).
- SR110 (error): bytes per device over the memory budget.
- SR111 (error): arrays to be used together live on different devices.
- SR201 (warning): a rule that matches no leaf.
- SR202 (warning): a rule whose every leaf is taken by earlier rules.
- SR203 (warning): a sharded spec on a scalar.
- SR204 (warning): a large array fully replicated.
- SR205 (warning): a mesh axis no rule uses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

from .._errors import Diagnostic, Span, error_for
from .._language._load import iter_rules
from .._language._rules import Rule
from . import _mesh
from ._match import by_key, search_all
from ._plan import LeafPlan, Plan, format_bytes, plural

DEFAULT_REPLICATED_THRESHOLD = 64 * 2**20
"""Arrays at least this large (bytes) draw SR204 when fully replicated."""


def rule_warnings(plan: Plan) -> list[Diagnostic]:
    """SR201 (dead rule), SR202 (shadowed rule) and SR203 (sharded scalar)."""
    out: list[Diagnostic] = []
    arrays = [leaf for leaf in plan.leaves if leaf.is_array]
    winners = {id(leaf.rule) for leaf in arrays if leaf.rule is not None}
    paths = [leaf.path for leaf in arrays]
    groups: dict[bytes, list[int]] | None = None
    for rule in plan.rules.group(plan.group):
        if id(rule) in winners or rule.pattern is None:
            continue
        if groups is None:
            groups = by_key(paths)  # as in matching: digit-blind patterns tried once per key
        taken_by: dict[int, tuple[Rule, int]] = {}
        for i in search_all(rule.pattern, paths, groups):
            leaf = arrays[i]
            if leaf.rule is not None:
                first, count = taken_by.get(id(leaf.rule), (leaf.rule, 0))
                taken_by[id(leaf.rule)] = (first, count + 1)
        if not taken_by:
            example = f"; paths look like `{arrays[0].path}`" if arrays else ""
            out.append(
                Diagnostic(
                    "SR201",
                    "warning",
                    f"rule `{rule.pattern}` matches no leaf of this tree ({plural(len(arrays), 'array')})",
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
        matched = sum(n for _, n in earlier)
        what = "the one leaf it matches is" if matched == 1 else f"all {matched} leaves it matches are"
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
        if all(entry is None for entry in leaf.spec):
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
                    "(set with --replicated-threshold, or replicated_threshold=)",
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
    used = {a for group in rules.group_names for rule in iter_rules(rules, group) for a in rule.spec.axes}
    spans = {a.name: a.span for a in rules.mesh.axes} if rules.mesh is not None else {}
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


def _unplaceable(leaf: Any) -> str:
    """Why `jax.device_put` would refuse `leaf`, or `""`. (A dtype JAX cannot
    hold is an error of the plan, SR115: such a leaf has no spec.)"""
    if isinstance(leaf, np.ma.MaskedArray):
        return "masked arrays are not supported"
    if not isinstance(leaf, (np.ndarray, np.generic)):
        return "only NumPy arrays and jax.Arrays can be moved"
    return ""


def _rule_span(leaf: LeafPlan) -> Span | None:
    """Where the rule that planned `leaf` is written, if a rule did."""
    return leaf.rule.span if leaf.rule is not None else None


def placement_diagnostics(
    plan: Plan, leaves: Sequence[Any], mesh: jax.sharding.Mesh, *, abstract_ok: bool = False
) -> list[Diagnostic]:
    """SR106/SR107: input arrays that cannot be moved as planned (with
    `abstract_ok`, `jax.ShapeDtypeStruct` leaves are not reported)."""
    mesh_devices = set(mesh.devices.flat)
    order = _mesh.device_order(mesh)
    problems: list[Diagnostic] = []
    for lp, leaf in zip(plan.leaves, leaves, strict=True):
        if lp.spec is None or isinstance(leaf, Tracer):
            continue
        if isinstance(leaf, jax.ShapeDtypeStruct):
            if abstract_ok:
                continue
            problems.append(
                Diagnostic(
                    "SR107",
                    "error",
                    f"`{lp.path}` is abstract (jax.ShapeDtypeStruct {lp.shape} {lp.dtype}); there is no data to move",
                    _rule_span(lp),
                    lp.path,
                    hint="use shardrules.shardings() for abstract trees, or shardrules.apply() on real arrays",
                )
            )
            continue
        if not isinstance(leaf, jax.Array):
            problem = _unplaceable(leaf)
            if problem:
                problems.append(
                    Diagnostic(
                        "SR107",
                        "error",
                        f"`{lp.path}` ({type(leaf).__name__}, shape {lp.shape}) cannot become a jax.Array: {problem}",
                        _rule_span(lp),
                        lp.path,
                        "convert it first (e.g. np.asarray(x, np.float32)), or keep it out of the tree",
                    )
                )
            continue
        if leaf.is_deleted():
            problems.append(
                Diagnostic(
                    "SR107",
                    "error",
                    f"`{lp.path}` {lp.shape} has been deleted (donated or freed)",
                    _rule_span(lp),
                    lp.path,
                    hint="pass the arrays a donating call returned, not the ones it consumed",
                )
            )
            continue
        if not getattr(leaf, "committed", False):
            continue
        sharding = leaf.sharding
        devices = sharding.device_set
        outside = devices - mesh_devices
        if outside:
            ids = ", ".join(str(d.id) for d in sorted(outside, key=lambda d: d.id))
            problems.append(
                Diagnostic(
                    "SR106",
                    "error",
                    f"`{lp.path}` {lp.shape} is committed to devices outside the mesh "
                    f"({'device' if len(outside) == 1 else 'devices'} {ids})",
                    _rule_span(lp),
                    lp.path,
                    hint="pass the mesh those arrays live on, or move them first with jax.device_put",
                )
            )
        elif (
            isinstance(sharding, jax.sharding.NamedSharding)
            and devices == mesh_devices
            and _mesh.device_order(sharding.mesh) != order
        ):
            problems.append(
                Diagnostic(
                    "SR106",
                    "error",
                    f"`{lp.path}` {lp.shape} is on the mesh's devices in another order "
                    f"({list(_mesh.device_order(sharding.mesh))} vs the mesh's {list(order)})",
                    _rule_span(lp),
                    lp.path,
                    hint="use the mesh the arrays were placed with (x.sharding.mesh), "
                    "or build both meshes the same way",
                )
            )
    return problems


def all_warnings(plan: Plan, replicated_threshold: int = DEFAULT_REPLICATED_THRESHOLD) -> list[Diagnostic]:
    """Every warning about `plan`, rule order first."""
    return [
        *rule_warnings(plan),
        *replication_warnings(plan, replicated_threshold),
        *unused_axis_warnings(plan),
    ]


def _devices_of(array: jax.Array) -> tuple[frozenset[int], tuple[int, ...] | None]:
    sharding = array.sharding
    ids = frozenset(d.id for d in sharding.device_set)
    order = _mesh.device_order(sharding.mesh) if isinstance(sharding, jax.sharding.NamedSharding) else None
    return ids, order


def _ids(ids: Iterable[int]) -> str:
    return "{" + ", ".join(str(i) for i in sorted(ids)) + "}"


def check_devices(**trees: Any) -> None:
    """Check that arrays to be used together live on the same devices.

    Call it before a jitted step with the trees it takes, named as you like:
    `check_devices(params=params, batch=batch)`. Only committed `jax.Array`s
    count (what `jax.device_put` with a sharding, `shardrules.apply` or a jitted
    function returned); NumPy arrays and uncommitted arrays go anywhere.

    **Raises:** `PlacementError` (SR111) naming the first two leaves, as
    `NAME/PATH`, that sit on different devices or on the same devices in
    another mesh order — the mistake behind JAX's "incompatible devices" error.

    ```python
    params = shardrules.apply(params, rules, mesh)
    batch = jax.device_put(batch, other_devices)
    shardrules.check_devices(params=params, batch=batch)   # PlacementError: SR111 ...
    ```
    """
    from .._interop._paths import flatten, path_str

    reference: tuple[str, frozenset[int], tuple[int, ...] | None] | None = None
    for name, tree in trees.items():
        keyed, _ = flatten(tree)
        for keypath, leaf in keyed:
            if not isinstance(leaf, jax.Array) or isinstance(leaf, Tracer) or not leaf.committed:
                continue
            if leaf.is_deleted():
                continue
            path = f"{name}/{path_str(keypath)}" if keypath else name
            ids, order = _devices_of(leaf)
            if reference is None:
                reference = (path, ids, order)
                continue
            ref_path, ref_ids, ref_order = reference
            if ids != ref_ids:
                message = f"`{ref_path}` is on devices {_ids(ref_ids)} but `{path}` is on devices {_ids(ids)}"
            elif order is not None and ref_order is not None and order != ref_order:
                message = (
                    f"`{ref_path}` and `{path}` are on the same devices in another mesh order "
                    f"({list(ref_order)} vs {list(order)})"
                )
            else:
                continue
            raise error_for(
                [
                    Diagnostic(
                        "SR111",
                        "error",
                        message + "; arrays used together must share their devices",
                        path=path,
                        hint="place both with the same mesh (shardrules.apply(tree, rules, mesh) "
                        "for each), or move one with jax.device_put",
                    )
                ]
            )
