"""Reading a plan file back, strictly: what `Plan.from_json`, `shardrules diff`
and `assert_plan_matches` accept (versions 1 to 4 of the format `_dump`
writes; the step cost of 2, 3 and 4 is `_costfile`'s to read).

A file is read only if some plan could have written it, so that a hand edit
gone wrong is an error naming what is wrong (`PlanFileError`, SR124), never a
plan read differently from what the file says:

- JSON without a key written twice in one object, with `"format":
  "shardrules-plan"` and `"version"` 1, 2, 3 or 4 (a whole number; another
  version is refused naming those this reads);
- exactly the keys of its version (2, 3 and 4 add `step_cost`), at the top, on each mesh axis and on each
  leaf: an unknown key (a typo, or a key of a later version) is refused. A
  later version that adds keys writes a higher version number, so a reader
  never drops what it does not know;
- values of their type: text where text is written, whole numbers where
  numbers are (not `true`, not `4.7`, not `"4"`), a spec a list of entries;
- values in range: axis sizes of at least 1 and at most `MAX_DEVICES`
  devices in all; axis types `explicit`, `auto` or `manual` for every axis,
  or `unknown` for every axis; shapes as `_shapes.shape_problem` allows
  (whole numbers, none negative, at most 64 dimensions and 1 PiB); dtypes
  named as JAX names them, of a kind a `jax.Array` can have;
- a layout a plan could have: a spec no longer than its shape, naming axes of
  the mesh once each, dividing each dimension evenly; bytes per device that
  follow from shape, dtype, spec and mesh; the header's totals those of the
  leaves. A leaf that is not an array has no shape, dtype or spec and the
  rule `not an array`;
- in version 2, a `step_cost` as `_costfile.read_cost` reads it; in version
  3, one with a target's keys too (`_targetfile`), which version 2 refuses;
  in version 4, one with `by_rule` (`_rulebytes`), which 2 and 3 refuse.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
from typing import Any

from .._errors import PlanFileError
from .._planning._blocks import UNCONSTRAINED, entry_axes
from .._planning._dtypes import jax_holds, named_dtype
from .._planning._mesh import MAX_DEVICES
from .._planning._shapes import MAX_RANK, shape_problem
from .._planning._shapes import shown as named
from ._costfile import VERSION_WITH_TARGET, read_cost
from ._dump import FORMAT, VERSION, VERSION_WITH_COST, Entry, Kind, Table, nbytes_of
from ._refuse import fail, shown
from ._rulebytes import VERSION_WITH_RULES

HEADER_KEYS = (
    "format",
    "version",
    "rules",
    "group",
    "mesh",
    "arrays",
    "bytes_per_device",
    "total_bytes",
    "leaves",
)
HEADER_KEYS_WITH_COST = (*HEADER_KEYS[:-1], "step_cost", "leaves")  # versions 2, 3 and 4
AXIS_KEYS = ("name", "size", "type")
LEAF_KEYS = ("path", "shape", "dtype", "spec", "rule", "bytes")
AXIS_TYPES = ("explicit", "auto", "manual", "unknown")
NOT_AN_ARRAY = "not an array"
_REFUSED_RULES = ("unmatched", "error")  # leaves of a plan with errors, which is never written


class _Twice(Exception):
    """A key written twice in one JSON object."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Twice(key)
        out[key] = value
    return out


def _json(text: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_object)
    except _Twice as twice:
        raise fail(f"the key {shown(twice.args[0])} is written twice in one object") from None
    except RecursionError:
        raise fail("it is nested too deeply to read") from None
    except ValueError as err:  # also numbers of more than 4,300 digits
        raise fail(f"it is not JSON ({str(err)[:200]})") from None


def _keys(value: Any, keys: tuple[str, ...], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise fail(f"{where} is an object with the keys {', '.join(keys)}, not {shown(value)}")
    unknown = [k for k in value if k not in keys]
    if unknown:
        raise fail(
            f"{where} has the key {shown(unknown[0])}, which the format does not have "
            f"(it has {', '.join(keys)})"
        )
    missing = [k for k in keys if k not in value]
    if missing:
        raise fail(f"{where} lacks the key {missing[0]!r}")
    return value


def _text(value: Any, where: str, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise fail(f"{where} is {'text' if empty else 'non-empty text'}, not {shown(value)}")
    return value


def _count(value: Any, where: str, least: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise fail(f"{where} is a whole number of at least {least}, not {shown(value)}")
    return value


@dataclasses.dataclass(frozen=True)
class Header:
    """The top of a plan file: all but its leaves."""

    rules: str
    group: str
    mesh: tuple[tuple[str, int, str], ...] | None
    totals: tuple[int, int, int]  # arrays, bytes per device, total bytes
    leaves: Any
    step_cost: dict[str, Any] | None = None

    @property
    def sizes(self) -> dict[str, int] | None:
        return None if self.mesh is None else {name: size for name, size, _ in self.mesh}


def _header(data: Any) -> Header:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise fail(f'no "format": "{FORMAT}"', hint="give a file that `shardrules dump` wrote")
    version = data.get("version")
    if (
        not isinstance(version, int)
        or isinstance(version, bool)
        or version not in (VERSION, VERSION_WITH_COST, VERSION_WITH_TARGET, VERSION_WITH_RULES)
    ):
        raise fail(
            f"version {shown(version)}; this shardrules reads versions {VERSION}, {VERSION_WITH_COST}, "
            f"{VERSION_WITH_TARGET} and {VERSION_WITH_RULES}",
            hint="read it with the shardrules that wrote it, or write it again with this one",
        )
    if version == VERSION and "step_cost" in data:
        raise fail(
            f'the file has "step_cost", a key of version {VERSION_WITH_COST}, but says version {VERSION}'
        )
    _keys(data, HEADER_KEYS if version == VERSION else HEADER_KEYS_WITH_COST, "the file")
    totals = (
        _count(data["arrays"], '"arrays"'),
        _count(data["bytes_per_device"], '"bytes_per_device"'),
        _count(data["total_bytes"], '"total_bytes"'),
    )
    return Header(
        _text(data["rules"], '"rules"'),
        _text(data["group"], '"group"'),
        _mesh(data["mesh"]),
        totals,
        data["leaves"],
        None if version == VERSION else read_cost(data["step_cost"], version),
    )


def _mesh(value: Any) -> tuple[tuple[str, int, str], ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_RANK:
        raise fail(f'"mesh" is null or a list of at most {MAX_RANK} axes, not {shown(value)}')
    rows: list[tuple[str, int, str]] = []
    for i, axis in enumerate(value):
        _keys(axis, AXIS_KEYS, f"mesh axis {i}")
        name = _text(axis["name"], f"the name of mesh axis {i}", empty=False)
        size = _count(axis["size"], f"the size of mesh axis {named(name)}", least=1)
        kind = axis["type"]
        if kind not in AXIS_TYPES:
            raise fail(
                f"mesh axis {named(name)} has the type {shown(kind)}; types are {', '.join(AXIS_TYPES)}"
            )
        if any(name == row[0] for row in rows):
            raise fail(f"the mesh has two axes named {named(name)}")
        rows.append((name, size, kind))
    devices = math.prod(size for _, size, _ in rows)
    if devices > MAX_DEVICES:
        raise fail(f"the mesh has {devices} devices; a plan file's mesh has at most {MAX_DEVICES}")
    if len({kind == "unknown" for _, _, kind in rows}) > 1:
        raise fail('the mesh gives the type "unknown" for some axes only: give every type, or none')
    return tuple(rows)


def _entry(value: Any, where: str) -> Entry:
    if value is None:
        return None
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and all(isinstance(a, str) and a and a != UNCONSTRAINED for a in value):
        return tuple(value)
    raise fail(f"{where}: a spec entry is null, an axis name or a list of axis names, not {shown(value)}")


def leaf(data: Any, sizes: dict[str, int] | None) -> tuple[str, Kind]:
    """One leaf's path and kind, checked against the mesh's `sizes` (`None`: no mesh)."""
    path = data.get("path") if isinstance(data, dict) else None
    if not isinstance(path, str):
        raise fail(f'each leaf is an object with a text "path", not {shown(data)}')
    where = f"leaf {named(path, 120)}"
    _keys(data, LEAF_KEYS, where)
    shape, dtype, spec = data["shape"], data["dtype"], data["spec"]
    rule = _text(data["rule"], f"{where}: its rule", empty=False)
    per_device = _count(data["bytes"], f"{where}: its bytes per device")
    if rule in _REFUSED_RULES:
        raise fail(f"{where}: the rule {rule!r}; a plan with errors is not written to a file", path=path)
    if shape is None or rule == NOT_AN_ARRAY:
        if (shape, dtype, spec, rule, per_device) != (None, None, None, NOT_AN_ARRAY, 0):
            raise fail(
                f'{where}: a leaf that is not an array has "shape", "dtype" and "spec" null, "bytes" 0 '
                f'and the rule "{NOT_AN_ARRAY}"',
                path=path,
            )
        return path, (None, None, None, rule, 0)
    if not isinstance(dtype, str):
        raise fail(f"{where}: an array's dtype is its name, not {shown(dtype)}", path=path)
    try:
        known = named_dtype(dtype)
    except TypeError:
        known = None
    if known is None or str(known) != dtype or not jax_holds(known):
        raise fail(f"{where}: {shown(dtype)} is not a dtype JAX knows", path=path)
    problem = shape_problem(shape, known.itemsize)
    if problem:
        raise fail(f"{where}: {problem}", path=path)
    if not isinstance(spec, list):
        raise fail(f"{where}: an array's spec is a list of entries, not {shown(spec)}", path=path)
    if len(spec) > len(shape):
        raise fail(f"{where}: the spec has {len(spec)} entries for a shape of rank {len(shape)}", path=path)
    entries = tuple(_entry(e, where) for e in spec)
    kind: Kind = (tuple(shape), dtype, entries, rule, per_device)
    _check_layout(kind, sizes, where, path)
    return path, kind


def _check_layout(kind: Kind, sizes: dict[str, int] | None, where: str, path: str) -> None:
    """The spec's axes against the mesh, and the bytes per device against the layout."""
    shape, _, spec, _, per_device = kind
    assert shape is not None and spec is not None
    axes = [a for e in spec for a in entry_axes(e)]
    if len(set(axes)) != len(axes):
        raise fail(f"{where}: the spec names a mesh axis twice", path=path)
    blocks = 1
    if sizes is not None:
        missing = [a for a in axes if a not in sizes]
        if missing:
            raise fail(
                f"{where}: the spec names {missing[0]!r}, which the mesh ({', '.join(sizes)}) lacks",
                path=path,
            )
        for dim, (length, entry) in enumerate(zip(shape, spec, strict=False)):
            split = math.prod(sizes[a] for a in entry_axes(entry))
            if length % split:
                raise fail(
                    f"{where}: dimension {dim} ({length}) does not divide into {split} blocks", path=path
                )
            blocks *= split
    expected = nbytes_of(kind) // blocks
    if per_device != expected:
        raise fail(
            f"{where}: {per_device} bytes per device, but its shape, dtype and spec make {expected}",
            path=path,
        )


def loads(text: str) -> Table:
    """The `Table` a plan file's text holds (see the module's docstring).

    **Raises:** `PlanFileError` (SR124) for anything else."""
    table, header = _lines(text) or _read(text)
    counts = collections.Counter(table.kinds)  # each kind's sizes once, not each leaf's
    totals = (
        sum(n for kind, n in counts.items() if table.parts[kind][0] is not None),
        sum(n * table.parts[kind][4] for kind, n in counts.items()),
        sum(n * nbytes_of(table.parts[kind]) for kind, n in counts.items()),
    )
    for name, written, actual in zip(
        ("arrays", "bytes_per_device", "total_bytes"), header.totals, totals, strict=True
    ):
        if written != actual:
            raise fail(f'"{name}" is {written}, but the leaves make {actual}')
    return table


def _read(text: str) -> tuple[Table, Header]:
    """The table of a file in any JSON layout."""
    header = _header(_json(text))
    if not isinstance(header.leaves, list):
        raise fail(f'"leaves" is a list of leaves, not {shown(header.leaves)}')
    sizes = header.sizes
    paths: list[str] = []
    kinds: list[int] = []
    index: dict[Kind, int] = {}
    for data in header.leaves:
        path, kind = leaf(data, sizes)
        paths.append(path)
        kinds.append(index.setdefault(kind, len(index)))
    table = Table(header.rules, header.group, header.mesh, paths, kinds, list(index), header.step_cost)
    return table, header


_OPEN, _SHAPE = '    {"path": "', '", "shape": '


def _lines(text: str) -> tuple[Table, Header] | None:
    """`_read` for a file laid out as `dumps` writes it, read line by line:
    each distinct leaf line's tail (all but the path) is parsed once. `None`
    for any other layout, and for any line it cannot read (then the whole
    file is read as JSON, which says what is wrong)."""
    head, found, rest = text.partition('\n  "leaves": [\n')
    body, found_end, end = rest.rpartition("\n  ]\n}")
    if not found or not found_end or end.strip():
        return None
    try:
        header = _header(_json(head + '\n  "leaves": []\n}'))
    except PlanFileError:
        return None
    sizes = header.sizes
    paths: list[str] = []
    kinds: list[int] = []
    tails: dict[str, int] = {}
    parts: list[Kind] = []
    for line in body.split(",\n"):
        cut = line.find(_SHAPE, len(_OPEN))
        if cut < 0 or not line.startswith(_OPEN):
            return None
        path = line[len(_OPEN) : cut]
        if "\\" in path or '"' in path or not path.isprintable():  # read as JSON reads it
            try:
                path = json.loads(f'"{path}"')
            except ValueError:
                return None
        tail = line[cut + 1 :]
        kind = tails.get(tail)
        if kind is None:
            try:
                data = json.loads('{"path": ""' + tail, object_pairs_hook=_object)
                parts.append(leaf(data, sizes)[1])
            except (_Twice, ValueError, RecursionError):  # PlanFileError too: it is a ValueError
                return None
            kind = tails[tail] = len(tails)
        paths.append(path)
        kinds.append(kind)
    if len(set(parts)) != len(parts):  # two layouts of one kind: keep each line's own
        return None
    return Table(header.rules, header.group, header.mesh, paths, kinds, parts, header.step_cost), header
