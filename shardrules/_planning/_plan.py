"""The compiled plan: one `LeafPlan` per leaf, plus what was found wrong."""

from __future__ import annotations

import collections
import dataclasses
import math
import os
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any, Literal, overload

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .._errors import Diagnostic, Span, error_for
from .._gcpause import paused
from .._language._rules import Rule, RuleSet
from .._pspec import described
from ._mesh import MeshLike, axis_types_text, sizes_of
from ._units import format_bytes as format_bytes
from ._units import format_flops as format_flops

if TYPE_CHECKING:
    from ._loadcost import LoadCost

Why = Literal["rule", "default", "scalar", "size-1", "key", "not an array", "unmatched", "error"]


@dataclasses.dataclass(frozen=True)
class LeafPlan:
    """The plan for one leaf.

    **Attributes:**

    - `path`: the leaf's `/`-joined path.
    - `shape`, `dtype`: the array's, or `None` for a leaf that is not an array.
      A PRNG key array's shape leaves out the key data's trailing dimension,
      and its dtype is JAX's key dtype (`key<fry>`, with the key data's
      `itemsize`).
    - `rule`: the rule that decided the spec (`rule.span` says where it is written),
      or `None`.
    - `spec`: the `PartitionSpec`, one entry per dimension; `None` for a leaf that
      is not an array or could not be planned.
    - `bytes_per_device`: the largest shard's size in bytes.
    - `why`: `"rule"`, `"default"`, `"scalar"`, `"size-1"` (replicated without a
      rule), `"key"` (a PRNG key array no rule matches: replicated), `"not an
      array"` (passed through), `"unmatched"` or `"error"`.
    - `where`: for a plan read from a file (`Plan.from_json`), the rule's
      location as the file gives it (`"model.shard:12"`; `rule` is then `None`);
      otherwise `None`.
    """

    path: str
    shape: tuple[int, ...] | None
    dtype: np.dtype | None
    rule: Rule | None
    spec: PartitionSpec | None
    bytes_per_device: int
    why: Why
    where: str | None = dataclasses.field(default=None, compare=False)

    @property
    def is_array(self) -> bool:
        """`True` for an array leaf (`shape is not None`)."""
        return self.shape is not None

    @property
    def nbytes(self) -> int:
        """The whole array's size in bytes."""
        if self.shape is None or self.dtype is None:
            return 0
        return math.prod(self.shape) * self.dtype.itemsize


_new = object.__new__
_set = object.__setattr__


class LeafPlans(Sequence[LeafPlan]):
    """The `LeafPlan`s of a plan, made on first use.

    Most leaves of a large tree share everything but their path with many
    others (every expert's `up_proj/kernel`: one shape, one rule, one spec). A
    plan keeps each leaf's path and the index of its *kind* — `(shape, dtype,
    rule, spec, bytes per device, why)` — and makes the `LeafPlan` objects only
    when they are looked at; `sr.specs` never needs them. Reads like a tuple.
    """

    __slots__ = ("_kinds", "_made", "_parts", "_paths", "_specs")

    def __init__(self, paths: list[str], kinds: list[int], parts: list[tuple[Any, ...]]):
        self._paths = paths
        self._kinds = kinds
        self._parts = parts  # (shape, dtype, rule, spec, bytes_per_device, why[, where])
        self._made: tuple[LeafPlan, ...] | None = None
        self._specs: list[PartitionSpec | None] | None = None

    def _all(self) -> tuple[LeafPlan, ...]:
        made = self._made
        if made is None:
            names: tuple[str, ...] = ("shape", "dtype", "rule", "spec", "bytes_per_device", "why", "where")
            # Each kind's `__dict__`, path first (as `LeafPlan(...)` makes it); each leaf's
            # is a copy with its path filled in.
            fields: list[dict[str, Any]] = [
                {"path": None, **dict(zip(names[: len(part)], part, strict=True))} for part in self._parts
            ]
            paths, count = self._paths, len(self._paths)
            with paused():  # every LeafPlan outlives the loop, and none is in a cycle
                # All in `map`s: no Python code runs per leaf.
                states = list(map(dict.copy, map(fields.__getitem__, self._kinds)))
                collections.deque(map(dict.__setitem__, states, repeat("path", count), paths), 0)
                made = tuple(map(_new, repeat(LeafPlan, count)))
                collections.deque(map(_set, made, repeat("__dict__", count), states), 0)
            self._made = made
        return made

    def kind_counts(self) -> list[tuple[tuple[Any, ...], int]]:
        """Each kind of leaf `(shape, dtype, rule, spec, bytes_per_device, why)`
        with how many leaves are of it, without making the `LeafPlan`s."""
        counts = collections.Counter(self._kinds)
        return [(self._parts[kind], n) for kind, n in counts.items()]

    def tables(self) -> tuple[list[str], list[int], list[tuple[Any, ...]]]:
        """Every leaf's path, the index of its kind, and the kinds (not copied)."""
        return self._paths, self._kinds, self._parts

    def specs(self) -> list[PartitionSpec | None]:
        """Every leaf's spec, without making the `LeafPlan`s (made once: a plan
        from the cache gives the same list again; do not change it)."""
        found = self._specs
        if found is None:
            specs = [part[3] for part in self._parts]
            found = self._specs = list(map(specs.__getitem__, self._kinds))
        return found

    def __len__(self) -> int:
        return len(self._paths)

    @overload
    def __getitem__(self, index: int) -> LeafPlan: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[LeafPlan, ...]: ...
    def __getitem__(self, index: int | slice) -> LeafPlan | tuple[LeafPlan, ...]:
        return self._all()[index]

    def __iter__(self) -> Iterator[LeafPlan]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (LeafPlans, tuple)):
            return self._all() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._all())

    def __add__(self, other: tuple[LeafPlan, ...]) -> tuple[LeafPlan, ...]:
        return self._all() + tuple(other)

    def __radd__(self, other: tuple[LeafPlan, ...]) -> tuple[LeafPlan, ...]:
        return tuple(other) + self._all()

    def __repr__(self) -> str:
        return repr(self._all())


@dataclasses.dataclass(frozen=True)
class Plan:
    """How every leaf of a tree is laid out on a mesh. Made by `shardrules.plan`.

    **Attributes:**

    - `leaves`: one `LeafPlan` per leaf, in `jax.tree_util` order (a sequence
      that reads like a tuple).
    - `diagnostics`: everything found wrong (empty when the plan is sound).
    - `group`, `rules`, `mesh`: what it was compiled from; `mesh` may be a
      `Mesh`, an `AbstractMesh`, a dict of sizes, or `None`.
    """

    leaves: Sequence[LeafPlan]
    treedef: Any
    diagnostics: tuple[Diagnostic, ...]
    group: str
    rules: RuleSet
    mesh: MeshLike | None

    @property
    def ok(self) -> bool:
        """True when no diagnostic is an error."""
        return not self.errors

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        """The diagnostics of severity `"error"`."""
        return tuple(d for d in self.diagnostics if d.severity == "error")

    def raise_for_errors(self) -> None:
        """Raise the error these diagnostics describe, if any."""
        if self.errors:
            raise error_for(self.errors, self.rules.sources)

    def __iter__(self) -> Iterator[LeafPlan]:
        return iter(self.leaves)

    def __len__(self) -> int:
        return len(self.leaves)

    def __getitem__(self, path: str) -> LeafPlan:
        """The plan of the leaf at `path` (e.g. `plan["layers/0/kernel"]`)."""
        for leaf in self.leaves:
            if leaf.path == path:
                return leaf
        raise KeyError(path)

    def specs(self) -> Any:
        """The `PartitionSpec` pytree (`None` for leaves that are not arrays)."""
        self.raise_for_errors()
        with paused():  # one new node per container of the tree
            return jax.tree_util.tree_unflatten(self.treedef, self._specs())

    def _specs(self) -> list[PartitionSpec | None]:
        if isinstance(self.leaves, LeafPlans):
            return self.leaves.specs()
        return [leaf.spec for leaf in self.leaves]

    def shardings(self, mesh: jax.sharding.Mesh | None = None) -> Any:
        """The `NamedSharding` pytree on `mesh` (default: the plan's mesh)."""
        self.raise_for_errors()
        mesh = mesh if mesh is not None else self.mesh  # type: ignore[assignment]
        if not isinstance(mesh, (jax.sharding.Mesh, jax.sharding.AbstractMesh)):
            raise TypeError("shardings need a jax.sharding.Mesh; pass mesh=")
        return jax.tree_util.tree_unflatten(
            self.treedef,
            [None if spec is None else NamedSharding(mesh, spec) for spec in self._specs()],
        )

    @property
    def bytes_per_device(self) -> int:
        """Bytes each device holds under this plan (shards are equal in size)."""
        return sum(leaf.bytes_per_device for leaf in self.leaves)

    @property
    def total_bytes(self) -> int:
        """Bytes of all the arrays, counted once."""
        return sum(leaf.nbytes for leaf in self.leaves)

    def load_cost(self, hosts: int = 1) -> LoadCost:
        """What loading a checkpoint into this layout with `load_checkpoint` costs each
        host (a run of consecutive devices in mesh order): the reads it issues, their bytes, its peak.

        **Arguments:** `hosts`: how many hosts share the mesh's devices (it divides their number).
        **Returns:** a `LoadCost` (a row per host, totals, SR220 `findings`); `ValueError` if hosts do not divide.

        ```python
        print(sr.plan(shapes, rules, {"fsdp": 16, "model": 8}).load_cost(hosts=16))
        ```
        """
        from ._loadcost import load_cost  # imports this module

        return load_cost(self, hosts)

    def to_json(self) -> str:
        """The plan as versioned JSON, the text `shardrules dump` writes: one leaf
        per line, sorted by path; the same plan always gives the same text.

        **Raises:** the plan's error, if it has one (as `specs` does).
        """
        from .._reports._dump import dumps, table_of

        self.raise_for_errors()
        return dumps(table_of(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Plan:
        """The plan a `to_json` text (or a `shardrules dump` file) holds.

        **Arguments:**

        - `text`: the file's text (`str`, or UTF-8 `bytes`), e.g.
          `Path("plan.json").read_text()`.

        **Returns:** a `Plan` whose `to_json()` gives `text` back (for a version 2
        file, one that records a step's cost, the text without its `step_cost`:
        a `Plan` holds layouts, not a cost), leaves in path order; each leaf's rule is its location (`LeafPlan.where`), `rules` is an
        empty `RuleSet` named after the file, `mesh` an `AbstractMesh` (or a dict
        of sizes when the file has no axis types), and `specs()` a dict by path.

        **Raises:** `PlanFileError` (SR124, also a `ValueError`) for text
        that is not a plan file this shardrules reads: not UTF-8 or not JSON,
        another format or version, a key the format does not have or one it
        lacks, a value of the wrong type or out of range, or leaves no plan
        could hold (a hand edit gone wrong); nothing else for any `str` or
        `bytes`. `TypeError` for something that is not text.
        """
        from .._reports._dump import plan_of
        from .._reports._dumpread import fail, loads

        if isinstance(text, (bytes, bytearray)):
            try:
                text = bytes(text).decode("utf-8")
            except UnicodeDecodeError as err:
                raise fail(f"it is not UTF-8 text ({err})") from None
        if not isinstance(text, str):
            raise TypeError(
                f"Plan.from_json takes the file's text, not a {type(text).__name__}: "
                "Plan.from_json(Path('plan.json').read_text())"
            )
        if text.lstrip()[:1] not in ("{", "") and text.rstrip().endswith(".json"):
            raise fail(
                f"{text.strip()[:200]!r} looks like a file name",
                hint=f"pass the file's text: Plan.from_json(Path({text.strip()[:200]!r}).read_text())",
            )
        return plan_of(loads(text))

    def table(self) -> str:
        """A plain-text table: path, shape, dtype, spec, rule, bytes per device."""
        rows = [("path", "shape", "dtype", "spec", "rule", "per device")]
        for leaf in self.leaves:
            if not leaf.is_array:
                continue
            rule = leaf.where or (
                _short(leaf.rule.span)
                if leaf.rule is not None and leaf.rule.span is not None and leaf.why in ("rule", "default")
                else leaf.why
            )
            rows.append(
                (
                    leaf.path,
                    str(leaf.shape),
                    str(leaf.dtype),
                    spec_str(leaf.spec),
                    rule,
                    format_bytes(leaf.bytes_per_device),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        mesh = (
            ""
            if self.mesh is None
            else " on " + ", ".join(f"{k}={v}" for k, v in sizes_of(self.mesh).items())
        )
        types = axis_types_text(self.mesh, self.rules) if self.mesh is not None else None
        mesh += f" ({types})" if types else ""
        lines.append(
            f"{plural(len(rows) - 1, 'array')}{mesh}: {format_bytes(self.total_bytes)} in all, "
            f"{format_bytes(self.bytes_per_device)} per device"
        )
        if self.errors:  # the leaves marked `error` and `unmatched` count 0 B above
            codes = ", ".join(dict.fromkeys(d.code for d in self.errors))
            lines.append(
                f"{plural(len(self.errors), 'error')} ({codes}); the leaves they concern count 0 B: "
                "print(plan.errors[0].render()) shows the first, plan.raise_for_errors() raises them all"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        """The plan as HTML for notebooks: the page `shardrules explain --html`
        writes, as a `<div>`."""
        from .._reports._html import fragment

        return fragment(self)


def _short(span: Span) -> str:
    """`file:line:col`, the file relative to the working directory when it is inside it."""
    file = span.file
    if os.path.isabs(file):
        try:
            relative = os.path.relpath(file)
        except ValueError:  # another drive on Windows
            relative = file
        if not relative.startswith(".."):
            file = relative
    return f"{file}:{span.line}:{span.col}"


def spec_str(spec: PartitionSpec | None) -> str:
    """`P('fsdp', None)`; an unconstrained dimension as `unconstrained`, as rules write it."""
    if spec is None:
        return "-"
    return described(spec, lambda e: "unconstrained" if e is PartitionSpec.UNCONSTRAINED else repr(e))


def spec_repr(spec: Any) -> str:
    """A `PartitionSpec` (or JAX's text of one) as JAX 0.10 to 0.12 write
    it, `P('data', None)`, on every JAX: JAX 0.8 writes
    `PartitionSpec('data', None)`."""
    text = spec if isinstance(spec, str) else repr(spec)
    return "P(" + text.removeprefix("PartitionSpec(") if text.startswith("PartitionSpec(") else text


def plural(n: int, noun: str, nouns: str = "") -> str:
    """`plural(1, "array")` → `"1 array"`; `plural(3, "array")` → `"3 arrays"`."""
    return f"{n} {noun}" if n == 1 else f"{n} {nouns or noun + 's'}"
