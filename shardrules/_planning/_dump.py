"""A plan as a file: the versioned JSON that `Plan.to_json` and `shardrules dump`
write and `Plan.from_json` reads.

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
from ._blocks import UNCONSTRAINED, entry_axes
from ._dtypes import named_dtype
from ._mesh import sizes_of
from ._plan import LeafPlans, Plan

FORMAT = "shardrules-plan"
VERSION = 1

Entry = None | str | tuple[str, ...]
Kind = tuple[tuple[int, ...] | None, str | None, tuple[Entry, ...] | None, str, int]
"""A kind of leaf as a file holds it: shape, dtype name, spec entries, rule label, bytes per device."""


class PlanFormatError(ValueError):
    """Text that is not a plan file `Plan.from_json` can read."""


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


def _entries(spec: PartitionSpec | None) -> tuple[Entry, ...] | None:
    """A spec's entries as a file holds them; an unconstrained one as `"unconstrained"`."""
    if spec is None:
        return None
    return tuple(
        UNCONSTRAINED
        if e is PartitionSpec.UNCONSTRAINED
        else e
        if e is None or isinstance(e, str)
        else tuple(str(a) for a in e)
        for e in spec
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
        parts.append((None if shape is None else tuple(shape), name, _entries(spec), label, int(per_device)))
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
    total = sum(_nbytes(table.parts[kind]) for kind in kinds)
    head = [
        ("format", FORMAT),
        ("version", VERSION),
        ("rules", table.rules),
        ("group", table.group),
        ("mesh", mesh),
        ("arrays", arrays),
        ("bytes_per_device", table.bytes_per_device),
        ("total_bytes", total),
    ]
    out = ["{"] + [f"  {_quote(key)}: {_value(value)}," for key, value in head]
    body = ",\n".join(lines)
    out.append('  "leaves": [' + ("\n" + body + "\n  ]" if lines else "]"))
    return "\n".join(out) + "\n}\n"


def _nbytes(part: Kind) -> int:
    shape, dtype = part[0], part[1]
    if shape is None or dtype is None:
        return 0
    size = named_dtype(dtype).itemsize
    for n in shape:
        size *= n
    return size


def _fail(what: str) -> PlanFormatError:
    return PlanFormatError(f"not a shardrules plan file: {what}")


def _entry(value: Any) -> Entry:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(a, str) for a in value):
        return tuple(value)
    raise _fail(f"a spec entry must be null, an axis name or a list of them, not {value!r}")


def loads(text: str) -> Table:
    """The `Table` a file's text holds.

    **Raises:** `PlanFormatError` for text that is not JSON, another format, a
    newer version, a leaf without its fields, or a leaf that no plan could
    hold (an axis the mesh lacks, an unknown dtype, bytes per device that do
    not follow from the shape, dtype and spec: a hand edit gone wrong)."""
    table = _lines(text)
    if table is None:
        table = _read(text)
    _validate(table)
    return table


def _validate(table: Table) -> None:
    sizes = table.sizes if table.mesh is not None else None
    first: dict[int, str] = {}
    for path, kind in zip(table.paths, table.kinds, strict=True):
        first.setdefault(kind, path)
    for kind, (shape, dtype, spec, _, per_device) in enumerate(table.parts):
        where = f"leaf {first.get(kind, '?')!r}"
        if shape is None:
            continue
        if dtype is None:
            raise _fail(f"{where}: an array without a dtype")
        try:
            named_dtype(dtype)
        except TypeError:
            raise _fail(f"{where}: {dtype!r} is not a dtype JAX knows") from None
        if spec is None:
            continue
        if len(spec) > len(shape):
            raise _fail(f"{where}: the spec has {len(spec)} entries for a shape of rank {len(shape)}")
        axes = [a for e in spec for a in entry_axes(e)]
        if len(set(axes)) != len(axes):
            raise _fail(f"{where}: the spec names a mesh axis twice")
        if sizes is None:
            continue
        missing = [a for a in axes if a not in sizes]
        if missing:
            raise _fail(f"{where}: the spec names {missing[0]!r}, which the mesh ({', '.join(sizes)}) lacks")
        blocks = 1
        for a in axes:
            blocks *= sizes[a]
        expected = _nbytes((shape, dtype, spec, "", 0)) // blocks
        if per_device != expected:
            raise _fail(
                f"{where}: {per_device} bytes per device, but its shape, dtype and spec make {expected}"
            )


def _read(text: str) -> Table:
    """`loads` for any JSON layout."""
    try:
        data = json.loads(text)
    except ValueError as err:
        raise _fail(f"not JSON ({err})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _fail(f'no "format": "{FORMAT}"')
    if data.get("version") != VERSION:
        raise _fail(f"version {data.get('version')!r}; this shardrules reads version {VERSION}")
    try:
        mesh = data["mesh"]
        rows = (
            None
            if mesh is None
            else tuple((str(a["name"]), int(a["size"]), str(a.get("type", "unknown"))) for a in mesh)
        )
        paths: list[str] = []
        kinds: list[int] = []
        index: dict[Kind, int] = {}
        for leaf in data["leaves"]:
            shape, spec = leaf["shape"], leaf["spec"]
            if shape is not None and not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
            ):
                raise _fail(f"leaf {leaf.get('path')!r}: a shape is a list of whole numbers, not {shape!r}")
            kind: Kind = (
                None if shape is None else tuple(shape),
                leaf["dtype"],
                None if spec is None else tuple(_entry(e) for e in spec),
                str(leaf["rule"]),
                int(leaf["bytes"]),
            )
            paths.append(str(leaf["path"]))
            kinds.append(index.setdefault(kind, len(index)))
        return Table(str(data["rules"]), str(data["group"]), rows, paths, kinds, list(index))
    except PlanFormatError:
        raise
    except (KeyError, TypeError, ValueError) as err:
        raise _fail(f"a field is missing or of the wrong type ({type(err).__name__}: {err})") from None


_OPEN, _SHAPE = '    {"path": "', '", "shape": '


def _lines(text: str) -> Table | None:
    """The table of a file laid out as `dumps` writes it, read line by line:
    each distinct leaf line's tail (all but the path) is parsed once. `None`
    for any other layout (then it is read as plain JSON)."""
    head, found, rest = text.partition('\n  "leaves": [\n')
    body, found_end, end = rest.rpartition("\n  ]\n}")
    if not found or not found_end or end.strip():
        return None
    try:
        table = _read(head + '\n  "leaves": []\n}')
    except PlanFormatError:
        return None
    paths: list[str] = []
    kinds: list[int] = []
    tails: dict[str, int] = {}
    for line in body.split(",\n"):
        cut = line.find(_SHAPE, len(_OPEN))
        if cut < 0 or not line.startswith(_OPEN):
            return None
        path = line[len(_OPEN) : cut]
        paths.append(path if "\\" not in path else json.loads(f'"{path}"'))
        kind = tails.get(line[cut + 1 :])
        if kind is None:
            kind = tails[line[cut + 1 :]] = len(tails)
        kinds.append(kind)
    try:
        leaves = "[" + ",".join('{"path": ""' + tail for tail in tails) + "]"
        parts = _read(head + '\n  "leaves": ' + leaves + "\n}").parts
    except PlanFormatError:
        return None
    if len(parts) != len(tails):  # two layouts of one kind: keep each line's own
        return None
    return dataclasses.replace(table, paths=paths, kinds=kinds, parts=parts)


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
