"""The rule language's resolved layer (`RuleSet`, `Rule`, `ResolvedSpec`): what a
rule file means once includes are expanded and aliases resolved, what the
compiler uses. Immutable. The file layer, what one file says as written, is
`_syntax`.

Source spans never take part in equality, so two files that differ only in layout compare equal.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from .._errors import Diagnostic, Span, did_you_mean, error_for
from . import _regex
from ._acknowledge import acknowledges
from ._guards import Guard
from ._syntax import Alias, MeshDecl, Spec
from ._syntax import span_field as _span

# ------------------------------------------------------------------ resolved layer


@dataclasses.dataclass(frozen=True)
class AxisGroup:
    """Mesh axes that one name in a spec stands for, e.g. an alias of a tuple.
    An optional group is dropped where the dimension does not divide by it.

    For an alias with alternatives (`alias embed = (fsdp, expert) | fsdp | _`),
    `axes` is `()` and `alternatives` holds each alternative's mesh axes (`()`
    for `_`): which one the group stands for is settled per spec when a leaf is
    planned (`_planning._choice`), aliases in the order of their `alias` lines
    (`order`)."""

    axes: tuple[str, ...]
    optional: bool
    span: Span | None = _span()
    written: str = dataclasses.field(default="", compare=False, repr=False)
    alternatives: tuple[tuple[str, ...], ...] = ()
    order: int = 0

    @property
    def is_choice(self) -> bool:
        """Whether this group is an alias with alternatives, still to be settled."""
        return bool(self.alternatives)


@dataclasses.dataclass(frozen=True)
class ResolvedEntry:
    """One spec entry with aliases resolved; `kind` as in `Entry`. `optional`:
    a whole tuple's `?` over groups that hold a choice, `(embed, model)?`; the
    groups are made one optional group once the choice is settled (without a
    choice, they are one already)."""

    kind: Literal["axes", "unsharded", "ellipsis", "unconstrained"]
    groups: tuple[AxisGroup, ...] = ()
    span: Span | None = _span()
    optional: bool = False

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(a for g in self.groups for a in g.axes)

    @staticmethod
    def of(groups: list[AxisGroup], span: Span | None, whole: str | None = None) -> ResolvedEntry:
        """The entry of settled `groups`: unsharded when there are none; with
        `whole` (a tuple's own `?`, as written: `(a, b)`), one optional group
        holding them all, the whole tuple or nothing."""
        if whole is not None and groups:
            groups = [AxisGroup(tuple(a for g in groups for a in g.axes), True, span, whole)]
        if not groups:
            return ResolvedEntry("unsharded", span=span)
        return ResolvedEntry("axes", tuple(groups), span=span)


@dataclasses.dataclass(frozen=True)
class ResolvedSpec:
    """A spec with aliases resolved; `kind` as in `Spec`. A `"logical"` spec has
    no entries here: they come from each leaf's metadata when it is compiled.
    An `"unresolved"` spec stands in, only in `shardrules lint`'s partial load,
    for a rule whose spec has an error: it keeps the rule's place in match
    order, and the leaves it takes are not planned."""

    kind: Literal["entries", "replicated", "auto", "logical", "unresolved"]
    entries: tuple[ResolvedEntry, ...] = ()
    auto_axes: tuple[str, ...] = ()
    min_bytes: int = 0
    span: Span | None = _span()
    # For `logical`: each axis the file's mesh line and aliases name, once.
    logical_axes: tuple[str, ...] = ()

    @property
    def axes(self) -> tuple[str, ...]:
        """Every mesh axis this spec may use."""
        if self.kind == "auto":
            return self.auto_axes
        if self.kind == "logical":
            return self.logical_axes
        return tuple(a for e in self.entries for a in e.axes)

    @property
    def needs_sizes(self) -> bool:
        """Whether compiling it needs the mesh's axis sizes (`?` or `auto`)."""
        if self.kind == "auto":
            return True
        return any(g.optional or e.optional for e in self.entries for g in e.groups)

    @property
    def choice_axes(self) -> tuple[str, ...]:
        """Every mesh axis an alternative of an alias in this spec names: axes it
        may use, depending on the choice (not in `axes`)."""
        found = (a for e in self.entries for g in e.groups for alt in g.alternatives for a in alt)
        return tuple(dict.fromkeys(found))


@dataclasses.dataclass(frozen=True)
class Rule:
    """One rule of a group, resolved.

    **Attributes:**

    - `group`: the `rules GROUP:` it belongs to.
    - `pattern`: the regex source, or `None` for `default`.
    - `spec`: the resolved spec.
    - `index`: position in its group (0-based, includes expanded).
    - `span`: where the rule is written; `str(rule.span)` is `file:line:col`.
    - `guard`: the rule's `if ...` (a `Guard`: `guard.holds(shape, dtype)`,
      `str(guard)` as written), or `None`: the rule applies to a leaf its
      pattern matches only where the guard holds.
    """

    group: str
    pattern: str | None
    spec: ResolvedSpec
    written: Spec
    index: int
    span: Span | None = _span()
    pattern_span: Span | None = _span()
    guard: Guard | None = None

    @property
    def is_default(self) -> bool:
        """`True` for a group's `default` rule (`pattern is None`)."""
        return self.pattern is None

    @property
    def regex(self) -> Any:
        """The compiled `pattern`, or `None` for a `default` rule: an RE2 pattern,
        the engine rules are matched with, with `re.Pattern`'s `search`,
        `match` and `fullmatch` (`rule.regex.search(path) is not None`)."""
        return None if self.pattern is None else _regex.compiled(self.pattern)

    @property
    def location(self) -> str:
        """`"file:line:col"` of the rule, or `"<rules>"` for a rule with no span."""
        return str(self.span) if self.span is not None else "<rules>"


class PlanCache:
    """Compiled plans of one `RuleSet`, most recently used kept; safe to share
    between threads (a lookup or store holds a lock; compiling, and comparing
    a tree's leaves with what a plan was made for, do not).

    A plan is stored under a key (group, structure, mesh) with what it was
    made for (`seen`, leaf by leaf); a key keeps up to `variants` plans, for
    trees of one structure with other leaves (the same model in another dtype).
    """

    def __init__(self, size: int = 32, variants: int = 4):
        self._size = size
        self._variants = variants
        self._items: collections.OrderedDict[Any, list[tuple[Any, Any]]] = collections.OrderedDict()
        self._memo: dict[Any, Any] = {}
        self._lock = threading.Lock()

    def get(self, key: Any, fits: Callable[[Any], bool] | None = None) -> Any:
        """The plan stored under `key` whose `seen` satisfies `fits` (any, without
        `fits`), or `None`."""
        with self._lock:
            found = self._items.pop(key, None)  # and back at the end: one comparison of keys
            if found is None:
                return None
            self._items[key] = found
            found = list(found)
        for seen, value in found:
            if fits is None or fits(seen):
                return value
        return None

    def put(self, key: Any, value: Any, seen: Any = None) -> None:
        """Store `value`, a plan made for leaves that looked like `seen`, under `key`."""
        with self._lock:
            found = self._items.pop(key, [])
            self._items[key] = [(seen, value), *found[: self._variants - 1]]
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        """How many plans are kept."""
        with self._lock:
            return sum(len(found) for found in self._items.values())

    def memo(self, key: Any, make: Callable[[], Any]) -> Any:
        """The value kept for `key`, made by `make()` the first time (at most
        1024 kept). Planning keeps one `NamedSharding` object per mesh and
        spec here: JAX moves data faster to shardings it has seen."""
        with self._lock:
            found = self._memo.get(key)
        if found is None:
            found = make()
            with self._lock:
                if len(self._memo) >= 1024:
                    self._memo.clear()
                self._memo[key] = found
        return found

    # A copied or unpickled RuleSet starts with an empty cache (locks do not copy).
    def __getstate__(self) -> dict[str, Any]:
        return {"size": self._size, "variants": self._variants}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["size"], state.get("variants", 4))

    def __deepcopy__(self, memo: dict[int, Any]) -> PlanCache:
        return PlanCache(self._size, self._variants)


@dataclasses.dataclass(frozen=True)
class RuleSet:
    """A loaded rule file: includes expanded, aliases resolved, rules grouped.

    Get one with `shardrules.load(path)` or `shardrules.loads(text)`.

    **Attributes:**

    - `name`: the top-level file's name.
    - `mesh`: the `mesh` line (`MeshDecl`), or `None`.
    - `aliases`: alias name → the mesh axes it stands for (aliases of one
      alternative).
    - `alternatives`: alias name → its alternatives' mesh axes, in order (`()`
      for `_`), for each alias with alternatives, in the order of the `alias` lines.
    - `groups`: group name → its rules in order (a `default` rule, if any, is in
      `defaults`, not here).
    - `defaults`: group name → its `default` rule.
    - `files`: every file read, the top-level one first.
    """

    name: str
    mesh: MeshDecl | None
    alias_items: tuple[tuple[str, tuple[str, ...]], ...]
    group_items: tuple[tuple[str, tuple[Rule, ...]], ...]
    default_items: tuple[tuple[str, Rule], ...]
    source_items: tuple[tuple[str, str], ...] = dataclasses.field(default=(), compare=False, repr=False)
    alias_span_items: tuple[tuple[str, Span | None], ...] = dataclasses.field(
        default=(), compare=False, repr=False
    )
    group_span_items: tuple[tuple[str, Span | None], ...] = dataclasses.field(
        default=(), compare=False, repr=False
    )
    alternative_items: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = ()
    alternative_decls: tuple[Alias, ...] = dataclasses.field(default=(), compare=False, repr=False)
    acknowledged_items: tuple[tuple[tuple[str, int], frozenset[str]], ...] = dataclasses.field(
        default=(), compare=False, repr=False
    )
    real_file_items: tuple[tuple[str, str], ...] = dataclasses.field(default=(), compare=False, repr=False)
    _plan_cache: PlanCache = dataclasses.field(
        default_factory=lambda: PlanCache(), init=False, compare=False, repr=False
    )

    @property
    def aliases(self) -> Mapping[str, tuple[str, ...]]:
        return dict(self.alias_items)

    @property
    def alternatives(self) -> Mapping[str, tuple[tuple[str, ...], ...]]:
        return dict(self.alternative_items)

    @property
    def groups(self) -> Mapping[str, tuple[Rule, ...]]:
        return dict(self.group_items)

    @property
    def defaults(self) -> Mapping[str, Rule]:
        return dict(self.default_items)

    @property
    def group_names(self) -> tuple[str, ...]:
        """Every group with at least one rule, pattern or `default`."""
        names = [g for g, _ in self.group_items]
        names += [g for g, _ in self.default_items if g not in names]
        return tuple(names)

    @property
    def acknowledged(self) -> Mapping[tuple[str, int], frozenset[str]]:
        """`(file, line)` → the warning codes a `# noqa: CODE` comment on that
        line acknowledges (see `kept`); `file` as errors show it, one name per
        file read (the acknowledgements are kept by each file's resolved path)."""
        names = {real: name for name, real in self.real_file_items}
        return {(names[real], line): codes for (real, line), codes in self.acknowledged_items}

    def acknowledges(self, diagnostic: Diagnostic) -> bool:
        """Whether `diagnostic` is a warning this file acknowledges (`kept` leaves it out)."""
        if not self.acknowledged_items:
            return False
        return acknowledges(dict(self.acknowledged_items), dict(self.real_file_items), diagnostic)

    def kept(self, diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
        """`diagnostics` less the warnings this file acknowledges: those whose
        code a `# noqa: CODE` comment names on the line the warning points at.
        Errors and notes are always kept.

        ```python
        rules = shardrules.loads('mesh model\\nrules params:\\n  default -> replicated  # noqa: SR204\\n')
        rules.kept(shardrules.check(params, rules, {"model": 8}))  # no SR204 about `default`
        ```
        """
        if not self.acknowledged_items:
            return list(diagnostics)
        table, files = dict(self.acknowledged_items), dict(self.real_file_items)
        return [d for d in diagnostics if not acknowledges(table, files, d)]

    @property
    def sources(self) -> Mapping[str, str]:
        """File name → text of every file read (shows source lines in errors)."""
        return dict(self.source_items)

    def group(self, name: str) -> tuple[Rule, ...]:
        """The rules of group `name` in order, without its `default` rule.

        **Raises:** `GroupNotFoundError` (SR018) if the file has no such group,
        with the closest name as a hint.
        """
        if not isinstance(name, str):
            raise TypeError(f"group must be the name of a rules group (a str), not {type(name).__name__}")
        if name not in self.group_names:
            known = self.group_names
            hint = did_you_mean(name, known) or (
                f"groups in {self.name}: {', '.join(known)}"
                if known
                else "the file has no `rules GROUP:` header"
            )
            raise error_for(
                [Diagnostic("SR018", "error", f"no `rules {name}:` group in {self.name}", hint=hint)],
                self.sources,
            )
        return self.groups.get(name, ())

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(f for f, _ in self.source_items)

    def __repr__(self) -> str:
        def count(group: str) -> str:
            n = len(self.groups.get(group, ())) + (group in self.defaults)
            return f"{group}: {n} rule{'' if n == 1 else 's'}"

        counts = ", ".join(count(g) for g in self.group_names)
        return f"RuleSet({self.name!r}, {{{counts}}})"
