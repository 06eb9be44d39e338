"""The `logical` spec: lay a leaf out by the logical axis names it carries.

Flax lets model code name each parameter's dimensions (`("embed", "mlp")`),
in `nn.with_logical_partitioning` (linen: the value is boxed in a
`LogicallyPartitioned`), `nn.with_partitioning` (a `Partitioned` naming mesh
axes) or NNX's `out_sharding` metadata of an `nnx.Variable`; a haliax
`NamedArray` names every dimension of its array itself (`axis_names`). A rule
`default -> logical` reads those names the way a spec reads its entries: each
is an alias of the rule file, else a mesh axis, so the file's `alias` lines
play the part of Flax's `logical_axis_rules`.

As in Flax, a name that is neither leaves its dimension unsharded; shardrules
says so with an SR206 warning. An alias with alternatives plays the part of a
name's several rules (`_choice`). A leaf that carries no names is an SR113 error.

The names live on the boxes around the arrays, which the compiler never sees,
so this module reads them from the tree and fills in the plan's `logical`
leaves after the compiler has matched every leaf to its rule.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import jax

from .._errors import Diagnostic
from .._interop._paths import LeafInfo, box_types
from .._language._load import iter_rules
from .._language._rules import AxisGroup, ResolvedEntry, ResolvedSpec, Rule, RuleSet
from ._choice import choice_group
from ._dtypes import jax_holds
from ._mesh import MeshLike, absent_axes, sizes_of
from ._plan import LeafPlan, Plan, plural
from ._spec import LeafError, leaf_spec, shard_bytes

Names = tuple[Any, ...]


class MeshAxisNames(tuple):
    """Names that are mesh axes already (linen's `nn.with_partitioning`): each
    stands for the mesh axis of that name (SR101 if the mesh has none), where a
    logical name that is not an alias must be an axis of the known mesh."""


class NamedArrayNames(tuple):
    """The axis names of a haliax `NamedArray` (its `axis_names`): logical
    names, as a Flax box's are, told apart only to say where they came from."""


def box_names(box: Any) -> Names | None:
    """The logical axis names a box carries, or `None`.

    **Arguments:**

    - `box`: a linen `Partitioned`/`LogicallyPartitioned` (its `names`), an
      NNX `Variable` (its `out_sharding`, `sharding_names` or `sharding`
      metadata) or a haliax `NamedArray` (its `axis_names`).

    **Returns:** one entry per dimension (a name, a tuple of names, or `None`).

    ```python
    box_names(nn.LogicallyPartitioned(x, ("embed", "mlp")))   # ("embed", "mlp")
    ```
    """
    names = getattr(box, "names", None)
    haliax = False
    if names is None:
        names = getattr(box, "axis_names", None)  # haliax
        haliax = names is not None
    if names is None and hasattr(box, "get_metadata"):
        try:
            metadata = box.get_metadata()
        except Exception:
            metadata = {}
        for key in ("out_sharding", "sharding_names", "sharding"):
            if metadata.get(key):
                names = metadata[key]
                break
    if names is None or isinstance(names, (str, bytes)):
        return None
    try:
        found = tuple(names)
    except TypeError:
        return None
    if haliax:
        return NamedArrayNames(found)
    spmd = sys.modules.get("flax.linen.spmd")
    logical = getattr(spmd, "LogicallyPartitioned", None)
    if hasattr(box, "names") and not (isinstance(logical, type) and isinstance(box, logical)):
        return MeshAxisNames(found)  # a plain `Partitioned`: its names are mesh axes
    return found


def logical_names(tree: Any) -> list[Names | None] | None:
    """For each leaf of `tree` (in `jax.tree_util` order), the names of the box
    around it, or `None`; `None` in place of the list when `tree` has no box."""
    boxes = box_types()
    if not boxes:
        return None

    def is_box(x: Any) -> bool:
        return isinstance(x, boxes)

    outer = jax.tree_util.tree_leaves(tree, is_leaf=is_box)
    if not any(is_box(x) for x in outer):
        return None
    out: list[Names | None] = []
    for node in outer:
        if is_box(node):
            names = box_names(node)
            out.extend([names] * len(jax.tree_util.tree_leaves(node)))
        else:
            out.append(None)
    return out


def uses_logical(rules: RuleSet, group: str) -> bool:
    """Whether any rule of `group` has the `logical` spec."""
    return any(r.spec.kind == "logical" for r in iter_rules(rules, group))


def resolve(plan: Plan, tree: Any, mesh: MeshLike | None) -> Plan:
    """`plan` with the leaves that a `logical` rule matched laid out by their names."""
    rules, group = plan.rules, plan.group
    if not uses_logical(rules, group) or any(d.code == "SR013" for d in plan.diagnostics):
        return plan  # SR013 breaks every rule of the group: nothing to fill in
    names = logical_names(tree)
    if names is not None and len(names) != len(plan.leaves):  # cannot happen
        names = None
    sizes = sizes_of(mesh) if mesh is not None else None
    leaves = list(plan.leaves)
    diagnostics = [d for d in plan.diagnostics if d.code != "SR113"]
    nameless: dict[int, list[LeafPlan]] = {}
    unknown: dict[str, list[tuple[Rule, LeafPlan, int]]] = {}
    haliax: dict[str, set[bool]] = {}  # for each unknown name: whether its boxes are `NamedArray`s
    memo: dict[Any, Any] = {}
    for i, lp in enumerate(leaves):
        rule = lp.rule
        if rule is None or rule.spec.kind != "logical" or lp.shape is None or lp.dtype is None:
            continue
        if lp.why in ("scalar", "size-1") or not jax_holds(lp.dtype):  # SR115 reported it
            continue
        leaf = names[i] if names is not None else None
        if leaf is None:
            nameless.setdefault(id(rule), []).append(lp)
            leaves[i] = dataclasses.replace(lp, spec=None, bytes_per_device=0, why="error")
            continue
        info = LeafInfo(lp.path, lp.shape, lp.dtype)
        key = (id(rule), lp.shape, lp.dtype, type(leaf), leaf)
        if key not in memo:  # an error is reported once, for the first leaf of its kind
            try:
                spec, missing = _leaf_spec(rule, info, leaf, sizes, rules)
                memo[key] = spec, missing, shard_bytes(info, spec, sizes)
            except LeafError as err:
                memo[key] = None
                diagnostics.append(
                    Diagnostic(
                        err.code,
                        "error",
                        err.message,
                        err.span,
                        lp.path,
                        err.hint,
                        ((lp.path, lp.shape),),
                        err.cause,
                    )
                )
        if memo[key] is None:
            leaves[i] = dataclasses.replace(lp, spec=None, bytes_per_device=0, why="error")
            continue
        spec, missing, per_device = memo[key]
        why = "default" if rule.is_default else "rule"
        leaves[i] = LeafPlan(lp.path, lp.shape, lp.dtype, rule, spec, per_device, why)
        for name, dim in missing:
            unknown.setdefault(name, []).append((rule, lp, dim))
            haliax.setdefault(name, set()).add(isinstance(leaf, NamedArrayNames))
    for found in nameless.values():
        diagnostics.append(_nameless(found))
    diagnostics.extend(_unaliased(name, found, haliax[name]) for name, found in unknown.items())
    return dataclasses.replace(plan, leaves=tuple(leaves), diagnostics=tuple(diagnostics))


def _leaf_spec(
    rule: Rule,
    info: LeafInfo,
    names: Names,
    sizes: dict[str, int] | None,
    rules: RuleSet,
) -> tuple[Any, list[tuple[str, int]]]:
    """The spec `names` give the array `info`, and the names that stayed unsharded
    because no alias or mesh axis has them (with their dimension)."""
    assert info.shape is not None
    shown = "(" + ", ".join(_show(n) for n in names) + ")"
    span = rule.spec.span
    if len(names) != len(info.shape):
        raise LeafError(
            "SR103",
            f"`{info.path}` has {plural(len(info.shape), 'dimension')} (shape {info.shape}) but "
            f"{plural(len(names), 'logical axis name')} {shown}",
            span,
            "give the parameter one logical name per dimension where the model creates it, "
            "or add an earlier rule that matches this path",
            f"{len(info.shape)} dimensions but logical axis names {shown}",
        )
    mesh_axes = (
        set(sizes) | absent_axes(rules, sizes)  # `model?` the mesh lacks: size 1, dropped by `leaf_spec`
        if sizes is not None
        else set(rules.mesh.names)
        if rules.mesh
        else None
    )
    entries: list[ResolvedEntry] = []
    missing: list[tuple[str, int]] = []
    used: dict[str, str] = {}
    for dim, entry in enumerate(names):
        groups: list[AxisGroup] = []
        for name in entry if isinstance(entry, (tuple, list)) else (entry,):
            if not isinstance(name, str):  # None, or Flax's UNCONSTRAINED: unsharded
                continue
            choice = choice_group(rules, name, span)
            if choice is not None:  # settled by `leaf_spec`, after the fixed names
                groups.append(choice)
                continue
            if name in rules.aliases:
                axes = rules.aliases[name]
            elif isinstance(names, MeshAxisNames) or name in (mesh_axes or ()):
                axes = (name,)
            else:
                missing.append((name, dim))
                continue
            for axis in axes:
                if sizes is not None and axis not in sizes:
                    via = f"alias `{name}`" if name in rules.aliases else f"`{name}`"
                    mesh = ", ".join(f"{k}={v}" for k, v in sizes.items())
                    raise LeafError(
                        "SR101",
                        f"mesh axis `{axis}` (from {via}, a logical axis name of `{info.path}`) "
                        f"is not in the mesh ({mesh})",
                        span,
                        f"point `alias {name}` at axes of this mesh",
                        f"mesh axis `{axis}` (from {via}) is not in the mesh ({mesh})",
                    )
                if axis in used:
                    raise LeafError(
                        "SR102",
                        f"mesh axis `{axis}` is used twice by the logical axis names {shown} of "
                        f"`{info.path}` (through `{used[axis]}` and `{name}`)",
                        span,
                        "a mesh axis can shard only one dimension of an array; "
                        "point one of these aliases at another axis",
                        f"mesh axis `{axis}` used twice by {shown} (`{used[axis]}`, `{name}`)",
                    )
                used[axis] = name
            if axes:
                groups.append(AxisGroup(tuple(axes), False, span, name))
        entries.append(ResolvedEntry("axes", tuple(groups), span) if groups else ResolvedEntry("unsharded"))
    resolved = dataclasses.replace(rule, spec=ResolvedSpec("entries", tuple(entries), span=span))
    try:
        return leaf_spec(resolved, info, sizes, rules), missing
    except LeafError as err:
        if err.code == "SR104":
            err.hint = (
                f"{err.hint.split('write `')[0]}point the alias at other axes, or add a rule for "
                f"`{info.path}` above this one that writes its spec with `?`"
            )
        raise


def _show(name: Any) -> str:
    if isinstance(name, (tuple, list)):
        return "(" + ", ".join(_show(n) for n in name) + ")"
    return str(name) if isinstance(name, str) else "_"


def _nameless(found: list[LeafPlan]) -> Diagnostic:
    """SR113 for the leaves one `logical` rule matched that carry no names: one
    finding naming the first, every leaf in its `paths`."""
    first = found[0]
    assert first.rule is not None
    return Diagnostic(
        "SR113",
        "error",
        f"`{first.path}` (shape {first.shape}) has no logical axis names for `logical` to use",
        first.rule.spec.span,
        first.path,
        "name the dimensions where the model creates the parameter "
        '(linen: `nn.with_logical_partitioning(init, ("embed", "mlp"))`; NNX: `out_sharding` metadata; '
        "haliax: a `NamedArray`), "
        f'or add a rule above this one for these paths, e.g. `"{first.path}$" -> replicated`',
        tuple((lp.path, lp.shape) for lp in found),
        "no logical axis names",
    )


_ALSO = {
    frozenset({False}): " (Flax also leaves names missing from its rules unsharded)",
    frozenset({True}): " (haliax also leaves an axis its mapping does not name unsharded)",
}
"""What the library whose boxes carry the name does with it (Flax's boxes,
haliax's `NamedArray`s); nothing where the tree holds both."""


def _unaliased(name: str, found: list[tuple[Rule, LeafPlan, int]], haliax: set[bool]) -> Diagnostic:
    """SR206 for the logical name `name` that no alias or mesh axis has, on
    the leaves `found` (`haliax`: whether each kind of box carrying it is a
    haliax `NamedArray`), its hint saying what that library does with it."""
    rule, first, dim = found[0]
    more = f" (and {plural(len(found) - 1, 'more leaf', 'more leaves')})" if len(found) > 1 else ""
    return Diagnostic(
        "SR206",
        "warning",
        f"logical axis name `{name}` is not an alias or a mesh axis: dimension {dim} of "
        f"`{first.path}`{more} stays unsharded",
        rule.spec.span,
        first.path,
        f"add `alias {name} = AXES` to shard it, or `alias {name} = _` to keep it unsharded "
        f"without this warning{_ALSO.get(frozenset(haliax), '')}",
    )
