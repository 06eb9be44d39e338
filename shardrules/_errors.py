"""Diagnostics and the exception hierarchy.

Every problem shardrules reports is a `Diagnostic`: a stable code (`SRnnn`), a
severity, a message, where it happened (a span in a rule file and/or a leaf's
path) and a hint that says how to fix it. Exceptions carry one or more
diagnostics and render them with the offending source line and a caret.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

Severity = Literal["error", "warning", "note"]
Shape = tuple[int, ...]

_MAX_SHOWN = 12
EXAMPLES = 3  # leaves named after a grouped finding's own (more: `render(examples=None)`)


@dataclasses.dataclass(frozen=True)
class Span:
    """A region of a rule file: 1-based line and column, end exclusive."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclasses.dataclass(frozen=True)
class Diagnostic:
    """One finding about a rule file or a plan.

    **Attributes:**

    - `code`: stable identifier such as `"SR104"` (catalogue: docs/diagnostics.md).
    - `severity`: `"error"`, `"warning"`, or `"note"` (only from `shardrules
      lint`: a check it could not run, and how to make it run).
    - `message`: what is wrong, in one sentence.
    - `span`: where in a rule file, or `None`.
    - `path`: the leaf path concerned (the first, for a finding about several
      leaves), or `None`.
    - `hint`: how to fix it, or `""`.
    - `paths`: `(path, shape)` of every leaf the finding is about, `path`'s
      first (shape `None` where unknown); `()` for a finding about no leaf.
    - `cause`: the message without its leaf, when the producer knows it
      (`""`: the message with the leaf's path left out); findings with the
      same code, severity, span and cause are one finding (`group`).
    - `count` (a property): how many leaves the finding is about, at least 1.
    """

    code: str
    severity: Severity
    message: str
    span: Span | None = None
    path: str | None = None
    hint: str = ""
    paths: tuple[tuple[str, Shape | None], ...] = ()
    cause: str = ""

    @property
    def count(self) -> int:
        """How many leaves the finding is about (1 for a finding about none)."""
        return len(self.paths) or 1

    def render(self, sources: Mapping[str, str] | None = None, *, examples: int | None = EXAMPLES) -> str:
        """`FILE:LINE:COL: CODE message`, the source line with a caret, the other
        leaves of a grouped finding (`examples` of them, `None`: every one), the hint."""
        where = f"{self.span}: " if self.span is not None else ""
        lines = [f"{where}{self.code} {self.message}"]
        if self.span is not None and sources and self.span.file in sources:
            lines.extend(_excerpt(sources[self.span.file], self.span))
        lines.extend(self.more_leaves(examples))
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)

    def more_leaves(self, examples: int | None = EXAMPLES) -> list[str]:
        """The lines naming the leaves after the first: `(and N more leaves like
        it: ...)` with `examples` of them, or (`None`) every one, a line each."""
        others = self.paths[1:]
        if not others:
            return []
        noun = "leaf" if len(others) == 1 else "leaves"
        if examples is None:
            width = max(len(_leaf_name(p)) for p, _ in others)
            listed = [
                f"    {_leaf_name(p).ljust(width)}  {'' if s is None else s}".rstrip() for p, s in others
            ]
            return [f"  and {len(others)} more {noun} like it:", *listed]
        shown = ", ".join(_leaf_text(p, s) for p, s in others[:examples])
        etc = ", ..." if len(others) > examples else ""
        return [f"  (and {len(others)} more {noun} like it: {shown}{etc})"]


def _leaf_name(path: str) -> str:
    return path or "(a lone array: no path)"


def _leaf_text(path: str, shape: Shape | None) -> str:
    return f"`{path}`" + ("" if shape is None else f" {shape}")


_WIDTH = 100  # longest source excerpt shown; longer lines are cut around the span


def _excerpt(text: str, span: Span) -> list[str]:
    source_lines = text.split("\n")  # as the parser counts lines: not at \f or \u2028
    if not 1 <= span.line <= len(source_lines):
        return []
    line = source_lines[span.line - 1].rstrip("\r").expandtabs(1)
    end = span.end_col if span.end_line == span.line else len(line) + 1
    start = span.col - 1
    width = max(1, min(end, len(line) + 1) - span.col)
    prefix = ""
    if len(line) > _WIDTH:
        first = max(0, min(start - 20, len(line) - _WIDTH))
        shown = line[first : first + _WIDTH]
        prefix = "…" if first else ""
        line = prefix + shown + ("…" if first + _WIDTH < len(line) else "")
        start = start - first + len(prefix)
        width = max(1, min(width, _WIDTH - (start - len(prefix))))
    line = "".join(c if c.isprintable() or c == " " else "�" for c in line)
    gutter = " " * len(str(span.line))
    return [
        f"  {span.line} | {line}",
        f"  {gutter} | {' ' * start}{'^' * width}",
    ]


class ShardRulesError(Exception):
    """Root of every error shardrules raises.

    **Attributes:**

    - `diagnostics`: the findings behind the error (at least one).
    - `code`, `span`, `path`, `hint`: those of the first finding.
    """

    def __init__(
        self,
        diagnostics: Diagnostic | Sequence[Diagnostic],
        sources: Mapping[str, str] | None = None,
    ):
        if isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics: tuple[Diagnostic, ...] = tuple(diagnostics)
        if not self.diagnostics:
            raise ValueError("an error needs at least one diagnostic")
        self._sources = dict(sources or {})
        super().__init__(self._render())

    def _render(self) -> str:
        shown = [d.render(self._sources) for d in self.diagnostics[:_MAX_SHOWN]]
        more = len(self.diagnostics) - _MAX_SHOWN
        if more > 0:
            shown.append(f"... and {more} more")
        return "\n".join(shown)

    def __str__(self) -> str:
        return self._render()

    @property
    def code(self) -> str:
        return self.diagnostics[0].code

    @property
    def span(self) -> Span | None:
        return self.diagnostics[0].span

    @property
    def path(self) -> str | None:
        return self.diagnostics[0].path

    @property
    def hint(self) -> str:
        return self.diagnostics[0].hint


class RuleSyntaxError(ShardRulesError, ValueError):
    """A rule file is not well formed: bad syntax or an invalid regex."""


class RuleDefinitionError(ShardRulesError, ValueError):
    """A rule file parses but does not make sense: unknown or clashing names,
    alias or include cycles, bad sizes, misplaced rules."""


class IncludeNotFoundError(ShardRulesError, FileNotFoundError):
    """A rule file, or a file it includes, does not exist or cannot be read."""


class GroupNotFoundError(ShardRulesError, KeyError):
    """The requested `rules GROUP:` is not in the rule file."""

    def __str__(self) -> str:  # KeyError would quote the message
        return self._render()


class MeshError(ShardRulesError, ValueError):
    """No usable mesh: none given, or one that lacks axes the rules name."""


class PlanError(ShardRulesError, ValueError):
    """The rules do not fit the tree on this mesh: unmatched leaves, rank
    mismatches, dimensions that do not divide, an axis used twice."""


class PlacementError(ShardRulesError, ValueError):
    """Inputs cannot be moved as planned: committed elsewhere, deleted, or abstract."""


class ShardRulesWarning(ShardRulesError, UserWarning):
    """A plan that works but is probably not what was meant, warned about (not
    raised) by `apply` and `jit` with `warnings.warn`: a rule that matches no
    leaf of the tree (SR201), more of the plan's bytes fully replicated than
    the tolerance allows (SR116), a layout that drops a mesh axis (SR210), an
    activation rule that matches no scope (SR211), an argument left without
    a group that rules would shard (SR212), a leaf whose arrays the walker
    cannot see (SR213), a positional spec against the tree's logical names
    (SR214). Python's warning filters control it; turned
    into an error (`-W error`, `filterwarnings("error")`) it is caught by
    `except ShardRulesError` like any of ours. `code`, `diagnostics` and the
    rest are those of `ShardRulesError`.

    ```python
    import warnings
    warnings.filterwarnings("error", category=shardrules.ShardRulesWarning)  # make them fail
    ```
    """


class ProcessMismatchError(ShardRulesError, ValueError):
    """In a multi-process run, the processes passed trees that differ (paths,
    shapes, dtypes or values) where they must be the same, or one of them
    stopped on an error the others did not find (SR112)."""


class TreeError(ShardRulesError, TypeError):
    """The input is not a pytree shardrules can walk."""


class PlanFileError(ShardRulesError, ValueError):
    """A plan file (`Plan.from_json`, `shardrules diff`) that cannot be read:
    not JSON, another format or version, a key or value the format does not
    have, or leaves that no plan could hold (SR124)."""


class TargetError(ShardRulesError, ValueError):
    """A step cannot be costed for the target named (`step.cost(target=)`,
    `--target`): a name that is neither a TPU topology nor a known GPU, a TPU
    target without the TPU compiler (`pip install "shardrules[tpu]"`), or a
    mesh whose sizes do not multiply to the target's chips (SR126)."""


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """` did you mean `x`?` for the closest candidate, or `""`."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else ""


class Findings(list[Diagnostic]):
    """Diagnostics collected while a stage runs, to be raised (or reported)
    together once it is done, so that one call shows every problem."""

    def error(self, code: str, message: str, span: Span | None, hint: str = "") -> None:
        """Record an error: `code` (`SRnnn`), what is wrong, where, and how to fix it."""
        self.append(Diagnostic(code, "error", message, span, hint=hint))


def join_hint(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


# The exception class for each diagnostic code that can be raised.
_CLASSES: dict[str, type[ShardRulesError]] = {
    "SR001": RuleSyntaxError,
    "SR002": RuleSyntaxError,
    "SR003": RuleSyntaxError,
    "SR017": RuleSyntaxError,
    "SR005": IncludeNotFoundError,
    "SR018": GroupNotFoundError,
    "SR101": MeshError,
    "SR108": MeshError,
    "SR106": PlacementError,
    "SR107": PlacementError,
    "SR111": PlacementError,
    "SR131": PlacementError,
    "SR132": PlacementError,
    "SR112": ProcessMismatchError,
    "SR114": ProcessMismatchError,
    "SR109": TreeError,
    "SR124": PlanFileError,
    "SR126": TargetError,
}


_RANK = {"error": 0, "warning": 1, "note": 2}


def ordered(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """`diagnostics` in the order they are shown everywhere: errors, then
    warnings, then notes; each by rule file, line and column (findings with no
    location last), then by leaf path. Ties keep the order given.

    **Arguments:**

    - `diagnostics`: findings in any order.

    **Returns:** a new list, sorted.

    ```python
    ordered(plan.diagnostics)[0]  # the first finding `shardrules lint` prints
    ```
    """
    return sorted(diagnostics, key=_position)


def _position(d: Diagnostic) -> tuple[int, str, int, int, str]:
    if d.span is None:
        return (_RANK.get(d.severity, len(_RANK)), "\uffff", 0, 0, d.path or "")
    return (_RANK.get(d.severity, len(_RANK)), d.span.file, d.span.line, d.span.col, d.path or "")


def error_for(diagnostics: Sequence[Diagnostic], sources: Mapping[str, str] | None = None) -> ShardRulesError:
    """The exception for these diagnostics, listed in the order of `ordered`
    (as `shardrules lint` prints them), one per cause (`group`), and typed by
    the first one's code.

    Codes SR0xx not listed above are `RuleDefinitionError`s; SR1xx are `PlanError`s.
    """
    diagnostics = group(ordered(diagnostics))
    code = diagnostics[0].code
    default = RuleDefinitionError if code < "SR100" else PlanError
    return _CLASSES.get(code, default)(diagnostics, sources)


def group(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """One finding per cause: the findings about leaves that have the same code,
    severity, span and cause (`Diagnostic.cause`, else the message and hint with
    the leaf's path left out) become the first of them, with every leaf in
    `paths`. Findings about no leaf are kept as they are. The order is that of
    each group's first finding; give `ordered` findings for the order lint prints.

    **Arguments:**

    - `diagnostics`: findings, e.g. `plan.diagnostics` (one per leaf).

    **Returns:** a new list, one finding per cause.

    ```python
    group(ordered(plan.diagnostics))  # what `shardrules lint` and `check` show
    ```
    """
    groups: dict[object, list[Diagnostic]] = {}
    for d in diagnostics:
        groups.setdefault(_cause_key(d), []).append(d)
    return [_merge(members) for members in groups.values()]


def _cause_key(d: Diagnostic) -> object:
    if d.path is None and not d.paths:
        return id(d)  # about no leaf: never merged
    path = d.path if d.path is not None else d.paths[0][0]
    cause = d.cause or _without(d.message, path)
    return (d.code, d.severity, d.span, cause, _without(d.hint, path))


def _without(text: str, path: str) -> str:
    return text.replace(f"`{path}`", "`\0`")


def _merge(members: list[Diagnostic]) -> Diagnostic:
    first = members[0]
    if len(members) == 1:
        return first
    paths: dict[tuple[str, Shape | None], None] = {}
    for d in members:
        for leaf in d.paths or ((d.path or "", None),):
            paths[leaf] = None
    return dataclasses.replace(first, paths=tuple(paths))
