"""A plan as a file: the versioned JSON that `Plan.to_json` and `shardrules dump`
write and `Plan.from_json` reads (reading it, strictly, is `_dumpread`'s).

The layout is chosen for `git diff`: a header of one key per line, then one
leaf per line, sorted by path, keys in a fixed order. A change of one leaf's
layout is a change of one line; a 136k-leaf plan is 136k lines, not the
million that indented JSON would make of the shapes and specs.

Both directions work on a *table*: each leaf's path and the index of its kind
`(shape, dtype, spec, rule, bytes per device)`, as `LeafPlans` keeps them, so
that the large trees (most leaves share their kind with many others) are
written and compared without a `LeafPlan` object per leaf.
"""

from __future__ import annotations

import dataclasses
import json
import os
from json.encoder import encode_basestring_ascii as _quote  # type: ignore[attr-defined]
from typing import Any

import jax
from jax.sharding import AbstractMesh, AxisType, Mesh, PartitionSpec

from .._language._rules import RuleSet
from .._planning._blocks import UNCONSTRAINED
from .._planning._dtypes import named_dtype
from .._planning._mesh import sizes_of
from .._planning._plan import LeafPlans, Plan
from .._pspec import entries
from ._costfile import VERSION_WITH_TARGET, cost_text
from ._rulebytes import VERSION_WITH_RULES

FORMAT = "shardrules-plan"
VERSION = 1
VERSION_WITH_COST = 2
"""Version 2 is version 1 and one key more, `step_cost` (what a train step
costs each device under the plan, `shardrules dump --step`). A plan without a
cost is written as version 1, byte for byte as before. Version 3
(`VERSION_WITH_TARGET`) is version 2 with a target's keys in `step_cost`
(`dump --step --target NAME`, see `_targetfile`); a cost without a target is
written as version 2, byte for byte as before. Version 4 (`VERSION_WITH_RULES`)
adds `by_rule` to `step_cost`, with or without a target's keys: a cost whose
collectives are attributed to rule lines (`_rulebytes`)."""

Entry = None | str | tuple[str, ...]
Kind = tuple[tuple[int, ...] | None, str | None, tuple[Entry, ...] | None, str, int]
"""A kind of leaf as a file holds it: shape, dtype name, spec entries, rule label, bytes per device."""


@dataclasses.dataclass(frozen=True)
class Table:
    """A plan as a dump holds it (see the module's docstring)."""

    rules: str  # the top-level rule file's name, without its folder
    group: str
    mesh: (
        tuple[tuple[str, int, str], ...] | None
    )  # (name, size, type) per axis; type "unknown" for sizes only
    paths: list[str]
    kinds: list[int]
    parts: list[Kind]
    step_cost: dict[str, Any] | None = None  # `_costfile.recorded`: version 2's (3's) `step_cost`

    @property
    def version(self) -> int:
        """The file's version: 1 without a cost, 2 with one, 3 with one for a
        target, 4 with one that records its collectives per rule line."""
        if self.step_cost is None:
            return VERSION
        if "by_rule" in self.step_cost:
            return VERSION_WITH_RULES
        return VERSION_WITH_TARGET if self.step_cost.get("target") is not None else VERSION_WITH_COST

    @property
    def sizes(self) -> dict[str, int]:
        return {name: size for name, size, _ in self.mesh or ()}

    def kind_of(self) -> dict[str, int]:
        """Path → kind index."""
        return dict(zip(self.paths, self.kinds, strict=True))

    @property
    def bytes_per_device(self) -> int:
        counts = [0] * len(self.parts)
        for kind in self.kinds:
            counts[kind] += 1
        return sum(n * part[4] for n, part in zip(counts, self.parts, strict=True))


def _mesh_rows(mesh: Any, rules: Any = None) -> tuple[tuple[str, int, str], ...] | None:
    """(name, size, type) per axis: the mesh's types, else those the rule
    file's `mesh` line states for these axes, else `unknown`."""
    if mesh is None:
        return None
    sizes = sizes_of(mesh)
    declared = rules.mesh if rules is not None else None
    if isinstance(mesh, (Mesh, AbstractMesh)):
        types = [t.name.lower() for t in mesh.axis_types]
    elif declared is not None and list(declared.names) == list(sizes) and all(declared.axis_types):
        types = [str(t) for t in declared.axis_types]
    else:
        types = ["unknown"] * len(sizes)
    return tuple((name, size, kind) for (name, size), kind in zip(sizes.items(), types, strict=True))


def spec_entries(spec: PartitionSpec | None) -> tuple[Entry, ...] | None:
    """A spec's entries as a file holds them; an unconstrained one as `"unconstrained"`."""
    if spec is None:
        return None
    return tuple(
        UNCONSTRAINED
        if e is PartitionSpec.UNCONSTRAINED
        else e
        if e is None or isinstance(e, str)
        else tuple(str(a) for a in e)
        for e in entries(spec)
    )


def rule_label(leaf_rule: Any, why: str, folder: str, where: str | None = None) -> str:
    """What a file says decided a leaf: `FILE:LINE` of its rule (the file
    relative to the top-level rule file's `folder`), `default`, or `why`."""
    if where is not None:
        return where
    if why == "rule" and leaf_rule is not None and leaf_rule.span is not None:
        file = leaf_rule.span.file
        if os.path.isabs(file) or folder:
            relative = os.path.relpath(file, folder or ".")
            file = file if relative.startswith("..") else relative
        return f"{file.replace(os.sep, '/')}:{leaf_rule.span.line}"
    return why


def table_of(plan: Plan) -> Table:
    """The `Table` of a plan: its leaves' kinds as a file holds them."""
    folder = os.path.dirname(plan.rules.name)
    leaves = plan.leaves
    if isinstance(leaves, LeafPlans):
        paths, kinds, raw = leaves.tables()
    else:
        paths, kinds, raw = [], [], []
        index: dict[Any, int] = {}
        for leaf in leaves:
            fields = (
                leaf.shape,
                leaf.dtype,
                leaf.rule,
                leaf.spec,
                leaf.bytes_per_device,
                leaf.why,
                leaf.where,
            )
            paths.append(leaf.path)
            kinds.append(index.setdefault(fields, len(index)))
        raw = list(index)
    parts: list[Kind] = []
    for shape, dtype, rule, spec, per_device, why, *where in raw:
        label = rule_label(rule, why, folder, where[0] if where else None)
        name = None if dtype is None else str(dtype)
        parts.append(
            (None if shape is None else tuple(shape), name, spec_entries(spec), label, int(per_device))
        )
    return Table(
        os.path.basename(plan.rules.name), plan.group, _mesh_rows(plan.mesh, plan.rules), paths, kinds, parts
    )


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True, separators=(", ", ": "))


def dumps(table: Table) -> str:
    """The file's text (see the module's docstring; ends with a newline)."""
    mesh = None if table.mesh is None else [{"name": n, "size": s, "type": t} for n, s, t in table.mesh]
    tails = [
        f', "shape": {_value(None if shape is None else list(shape))}, "dtype": {_value(dtype)}, '
        f'"spec": {_value(None if spec is None else [e if not isinstance(e, tuple) else list(e) for e in spec])}, '
        f'"rule": {_value(rule)}, "bytes": {per_device}}}'
        for shape, dtype, spec, rule, per_device in table.parts
    ]
    paths, kinds = table.paths, table.kinds
    order = sorted(range(len(paths)), key=paths.__getitem__)
    lines = [f'    {{"path": {_quote(paths[i])}{tails[kinds[i]]}' for i in order]
    arrays = sum(1 for kind in kinds if table.parts[kind][0] is not None)
    total = sum(nbytes_of(table.parts[kind]) for kind in kinds)
    head = [
        ("format", FORMAT),
        ("version", table.version),
        ("rules", table.rules),
        ("group", table.group),
        ("mesh", mesh),
        ("arrays", arrays),
        ("bytes_per_device", table.bytes_per_device),
        ("total_bytes", total),
    ]
    out = ["{"] + [f"  {_quote(key)}: {_value(value)}," for key, value in head]
    if table.step_cost is not None:
        out.append(f'  "step_cost": {cost_text(table.step_cost)},')
    body = ",\n".join(lines)
    out.append('  "leaves": [' + ("\n" + body + "\n  ]" if lines else "]"))
    return "\n".join(out) + "\n}\n"


def nbytes_of(part: Kind) -> int:
    """The whole array's bytes for a kind of leaf (0 for a leaf that is not an array)."""
    shape, dtype = part[0], part[1]
    if shape is None or dtype is None:
        return 0
    size = named_dtype(dtype).itemsize
    for n in shape:
        size *= n
    return size


_WHY = ("default", "scalar", "size-1", "key", "not an array", "unmatched", "error")


def plan_of(table: Table) -> Plan:
    """A `Plan` holding what the table holds (see `Plan.from_json`)."""
    mesh: Any = None
    if table.mesh is not None:
        names = tuple(n for n, _, _ in table.mesh)
        sizes = tuple(s for _, s, _ in table.mesh)
        types = [t for _, _, t in table.mesh]
        if "unknown" in types:
            mesh = dict(zip(names, sizes, strict=True))
        else:
            axis_types = tuple(AxisType[t.capitalize()] for t in types)
            mesh = AbstractMesh(sizes, names, axis_types=axis_types)
    parts: list[tuple[Any, ...]] = []
    for shape, dtype, spec, label, per_device in table.parts:
        why = label if label in _WHY else "rule"
        pspec = (
            None
            if spec is None
            else PartitionSpec(*(PartitionSpec.UNCONSTRAINED if e == UNCONSTRAINED else e for e in spec))
        )
        dt = None if dtype is None else named_dtype(dtype)
        parts.append((shape, dt, None, pspec, per_device, why, label if why == "rule" else None))
    order = sorted(range(len(table.paths)), key=table.paths.__getitem__)
    paths = [table.paths[i] for i in order]
    kinds = [table.kinds[i] for i in order]
    leaves = LeafPlans(paths, kinds, parts)
    unique = len(set(paths)) == len(paths)  # else (one path written twice) a list, in file order
    treedef = jax.tree_util.tree_structure(dict.fromkeys(paths, 0) if unique else [0] * len(paths))
    rules = RuleSet(table.rules, None, (), (), ())
    return Plan(leaves, treedef, (), table.group, rules, mesh)
