"""The rule language's file layer: what one rule file says, as written
(`RuleFile` and its statements). The formatter prints it back and
`parse(format(f)) == f`; `_rules` holds what a file means once resolved.

Source spans never take part in equality, so two files that differ only in layout compare equal.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from .._errors import Span


def span_field() -> Any:
    """A dataclass field for a source span: not compared, not shown."""
    return dataclasses.field(default=None, compare=False, repr=False)


_span = span_field


# ------------------------------------------------------------------ file layer


@dataclasses.dataclass(frozen=True)
class MeshAxis:
    """A `mesh` line's axis: `size` an int, `"*"` or `None`; `type` as written
    on it, or `None`; `optional` for `model?`: a mesh may lack it, and is then
    taken to have it of size 1."""

    name: str
    size: int | Literal["*"] | None = None
    span: Span | None = _span()
    type: Literal["explicit", "auto"] | None = None
    optional: bool = False


@dataclasses.dataclass(frozen=True)
class MeshDecl:
    """A `mesh` line; `type` is the one written after `mesh`, for every axis."""

    axes: tuple[MeshAxis, ...]
    span: Span | None = _span()
    type: Literal["explicit", "auto"] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    @property
    def optional(self) -> tuple[str, ...]:
        """The axes written `NAME?`: a mesh may lack them (then they are size 1)."""
        return tuple(a.name for a in self.axes if a.optional)

    @property
    def axis_types(self) -> tuple[Literal["explicit", "auto"] | None, ...]:
        """Each axis's type: its own, else the line's, else `None`."""
        return tuple(a.type or self.type for a in self.axes)


@dataclasses.dataclass(frozen=True)
class Include:
    path: str
    span: Span | None = _span()


@dataclasses.dataclass(frozen=True)
class AxisRef:
    """A mesh axis or alias named in a spec; `optional` for a trailing `?`."""

    name: str
    optional: bool = False
    span: Span | None = _span()


@dataclasses.dataclass(frozen=True)
class AliasTarget:
    """One alternative of an alias, as written: a tuple of names (`is_tuple`
    for `(a, b)`); `()` means `_`."""

    target: tuple[AxisRef, ...]
    is_tuple: bool = False
    span: Span | None = _span()


@dataclasses.dataclass(frozen=True)
class Alias:
    """`alias name = target`: target is a tuple of names; `()` means `_`.

    `more` holds the alternatives written after the first, `alias name = a | b | _`
    (`()` for an alias of one alternative); `alternatives` gives them all.
    """

    name: str
    target: tuple[AxisRef, ...]
    is_tuple: bool = False
    span: Span | None = _span()
    more: tuple[AliasTarget, ...] = ()
    target_span: Span | None = _span()

    @property
    def alternatives(self) -> tuple[AliasTarget, ...]:
        """Every alternative in order, the first (`target`) included."""
        return (AliasTarget(self.target, self.is_tuple, self.target_span), *self.more)


@dataclasses.dataclass(frozen=True)
class RulesHeader:
    group: str
    span: Span | None = _span()


@dataclasses.dataclass(frozen=True)
class Entry:
    """One spec entry, written as `kind`:

    - `"axes"`: `axes` holds one name (`model`, `model?`) or, if `is_tuple`,
      several (`(data, fsdp)`); `optional` is the tuple's own trailing `?`;
    - `"unsharded"`: `_`;
    - `"ellipsis"`: `...`;
    - `"unconstrained"`: `unconstrained` (the compiler chooses the layout).
    """

    kind: Literal["axes", "unsharded", "ellipsis", "unconstrained"]
    axes: tuple[AxisRef, ...] = ()
    is_tuple: bool = False
    optional: bool = False
    span: Span | None = _span()


@dataclasses.dataclass(frozen=True)
class Spec:
    """The right-hand side of a rule, written as `kind`:

    - `"entries"`: `(e1, e2, ...)`;
    - `"replicated"`;
    - `"auto"`: `auto(axes, name=value, ...)`, with `auto_axes` one `Entry`
      of kind `"axes"` and `options` the `name=value` pairs (values in bytes);
    - `"logical"`: each leaf's own logical axis names, read through the aliases.
    """

    kind: Literal["entries", "replicated", "auto", "logical"]
    entries: tuple[Entry, ...] = ()
    auto_axes: Entry | None = None
    options: tuple[tuple[str, int], ...] = ()
    span: Span | None = _span()
    option_spans: tuple[Span | None, ...] = dataclasses.field(default=(), compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class Condition:
    """One condition of a rule's guard, as written: `variable op value`
    (`elements >= 16384`), or for `op` `"in"`/`"not in"` a list of values
    (`dtype in (float32, bfloat16)`).

    A value is an `int` where it was a whole number (for `bytes`, any size,
    in bytes: `1MiB` is `1048576`), else the text as written. Which variables,
    operators and values make sense is checked when the rules are built
    (SR019, `_guards`).
    """

    variable: str
    op: str  # `<`, `<=`, `>`, `>=`, `==`, `!=`, `in`, `not in`
    values: tuple[int | str, ...]
    span: Span | None = _span()
    variable_span: Span | None = _span()
    op_span: Span | None = _span()
    value_spans: tuple[Span | None, ...] = dataclasses.field(default=(), compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class RuleLine:
    """`"pattern" -> spec`, or `default -> spec` when `pattern` is `None`;
    `guard`: the conditions of a trailing `if ... and ...` (`()` without one)."""

    pattern: str | None
    spec: Spec
    span: Span | None = _span()
    pattern_span: Span | None = _span()
    guard: tuple[Condition, ...] = ()
    guard_span: Span | None = _span()


@dataclasses.dataclass(frozen=True)
class Comment:
    """`# text` (text includes the `#`); `trailing` if it ends a statement's line."""

    text: str
    trailing: bool = False
    span: Span | None = _span()


Statement = MeshDecl | Include | Alias | RulesHeader | RuleLine
Item = Statement | Comment


@dataclasses.dataclass(frozen=True)
class RuleFile:
    """One rule file as written: its statements and comments in source order."""

    items: tuple[Item, ...]
    name: str = dataclasses.field(default="<string>", compare=False)
    source: str = dataclasses.field(default="", compare=False, repr=False)

    @property
    def statements(self) -> tuple[Statement, ...]:
        return tuple(i for i in self.items if not isinstance(i, Comment))
