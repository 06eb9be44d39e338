"""Rule lines → `Rule`s: check each pattern, resolve each spec's names through
the aliases to mesh axes, and sort the rules into their groups.

Nothing here needs a mesh at hand: sizes matter only when a plan is compiled.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from .._errors import Diagnostic, Findings, Span, did_you_mean, error_for
from . import _regex
from ._format import guard_text
from ._guards import check_guard
from ._includes import MAX_RULES, Statements
from ._names import unknown_name
from ._rules import AxisGroup, ResolvedEntry, ResolvedSpec, Rule
from ._syntax import Entry, MeshDecl, RuleLine, Spec

_AUTO_OPTIONS = ("min_bytes",)

MAX_TOTAL_PROGRAM = 100 * MAX_RULES
"""The most RE2 instructions the patterns of one load may compile to: 100 per
rule of the `MAX_RULES` a load may hold (1,000,000), each pattern at most
`_regex.MAX_PROGRAM`. A file of `MAX_RULES` ordinary rules must load: a
pattern compiles to about one instruction per character, real ones to 10 to 60
(`layers/\\d+/block_9999/attn/(q|k|v)_proj/kernel$`: 45), and a 1 MiB file of
`MAX_RULES` rules has about 100 characters per line (the 200,000 this once was
refused such a file at its 4,475th rule). What the budget bounds is a few large
patterns: ten thousand thousand-character repeats (80 million instructions)
took 12 s and 2.5 GB before there was one. Measured at the budget (x86_64,
google-re2 1.1): 124 patterns of 8,009 instructions take 27 MiB and 0.25 s to
check and compile; 10,000 patterns of 100 take 115 MiB and 1.5 s, mostly per
pattern (10,000 ordinary ones of 45: 57 MiB), which `MAX_RULES` bounds, not
this. Checked before each file is parsed (`PatternBudget`)."""

# A rule line with a pattern, as the grammar lexes it: a quoted STRING (no
# newline inside) at the start of a line, then `->`. The text between the
# quotes is the pattern, verbatim. A `rules GROUP:` header before it in the
# same file puts it in a group (a rule outside one is SR007, never compiled).
_PATTERN_LINE = re.compile(r'^[ \t\f]*("(?:[^"\\\n]|\\[^\n])*")[ \t\f]*->', re.MULTILINE)
_HEADER = re.compile(r"^[ \t\f]*rules[ \t\f]+[A-Za-z_][A-Za-z0-9_]*[ \t\f]*:", re.MULTILINE)


@dataclasses.dataclass
class PatternBudget:
    """The RE2 instructions of one load's patterns, counted file by file before
    each is parsed (`read_statements(..., before_parse=budget.scan)`): a load
    over `MAX_TOTAL_PROGRAM` is refused (SR009) at the first pattern that takes
    it over, before that file is parsed and before any later pattern is
    compiled. The rule lines found are the parser's (see `_PATTERN_LINE`), each
    pattern counted as RE2 compiles it (`_regex.compiled_size`, cached: the
    rules are built from the same compiled patterns). A pattern that
    `check_pattern` refuses for another reason (SR002, SR017) counts here and
    not there, which changes only which error a file that cannot load gets:
    for a file that loads, this total is the one `build_rules` counts."""

    used: int = 0

    def scan(self, text: str, name: str, sources: dict[str, str]) -> None:
        header = _HEADER.search(text)
        if header is None:
            return
        for found in _PATTERN_LINE.finditer(text, header.end()):
            self.used += _regex.compiled_size(found.group(1)[1:-1])
            if self.used > MAX_TOTAL_PROGRAM:
                start = found.start(1)
                line_start = text.rfind("\n", 0, start) + 1
                line, col = text.count("\n", 0, start) + 1, start - line_start + 1
                span = Span(name, line, col, line, col + len(found.group(1)))
                raise error_for([over_budget(span, self.used)], sources)


def over_budget(span: Span | None, used: int) -> Diagnostic:
    """SR009 at the pattern that takes a load's patterns to `used` instructions,
    over `MAX_TOTAL_PROGRAM`."""
    return Diagnostic(
        "SR009",
        "error",
        f"the patterns of this load compile to more than {MAX_TOTAL_PROGRAM:,} RE2 instructions "
        f"({used:,} with this one); rule files hold tens of short patterns",
        span,
        hint=f"at most {MAX_TOTAL_PROGRAM // MAX_RULES} instructions per rule on average "
        f"(about one per character); check that this is the rule file you meant, and use fewer, "
        "simpler patterns: `.*` or `+` rather than large `{m,n}` counts",
    )


def build_rules(
    found: Statements,
    mesh: MeshDecl | None,
    aliases: dict[str, tuple[str, ...]],
    *,
    partial: list[Diagnostic] | None = None,
    alternatives: dict[str, tuple[tuple[str, ...], ...]] | None = None,
) -> tuple[dict[str, tuple[Rule, ...]], dict[str, Rule]]:
    """Each group's rules in file order, and each group's `default`.

    **Arguments:**

    - `found`: the statements read (`rule_lines`, `headers`, `alias_decls`);
      problems are added to `found.errors`.
    - `mesh`: the file's checked `mesh` line, or `None`.
    - `aliases`: the resolved aliases (`resolve_aliases`).
    - `alternatives`: the aliases with alternatives, resolved (`resolve_aliases`
      fills it): a spec entry naming one is settled when a leaf is planned.

    - `partial`: for `shardrules lint`, which plans what it can of a file with
      errors: a rule whose spec has an error is kept with an `"unresolved"`
      spec (so that the rules after it match as they will once it is fixed),
      and a note (SR302) saying why it is not planned is added here.

    **Returns:** `(groups, defaults)`; a rule with an error is left out (but see
    `partial`). Every `rules GROUP:` header makes its group, even one with no rules.
    """
    specs = _Specs(mesh, aliases, {a.name for a in found.alias_decls}, found.errors, alternatives or {})
    groups: dict[str, list[Rule]] = {}
    defaults: dict[str, Rule] = {}
    counts: dict[str, int] = {}
    program = 0  # RE2 instructions of the patterns so far
    for group, line in found.rule_lines:
        index = counts.get(group, 0)
        counts[group] = index + 1
        before = len(found.errors)
        if line.pattern is not None:
            if program > MAX_TOTAL_PROGRAM:
                continue  # reported once, below: no more patterns are compiled
            program += check_pattern(line, found.errors)
            if program > MAX_TOTAL_PROGRAM:  # refused before parsing by `PatternBudget`; kept as a backstop
                found.errors.append(over_budget(line.pattern_span, program))
            if len(found.errors) > before:
                if partial is not None:
                    reason = "its pattern has an error, so the rules after it plan the leaves it would take"
                    partial.append(_not_planned(line, reason, found.errors[before]))
                continue  # a pattern that cannot be matched takes no leaf
        guard = check_guard(line, guard_text(line.guard) if line.guard else "", found.errors)
        guard_failed = len(found.errors) > before  # SR019
        spec = specs.resolve(line.spec)
        if guard_failed:  # a guard that cannot be evaluated takes no leaf
            if partial is not None:
                reason = "its guard has an error, so the rules after it plan the leaves it would take"
                partial.append(_not_planned(line, reason, found.errors[before]))
            continue
        if spec is None:
            if partial is None:
                continue
            why = found.errors[before] if len(found.errors) > before else None
            refs = [*line.spec.entries, *([line.spec.auto_axes] if line.spec.auto_axes else [])]
            broken = [r.name for e in refs for r in e.axes if r.name in specs.failed_aliases]
            defined = specs.alias_spans(found)
            reason = (
                f"it uses alias `{broken[0]}`, whose definition at {defined[broken[0]]} has an error"
                if broken
                else "its spec has an error"
            )
            partial.append(_not_planned(line, reason, why))
            spec = ResolvedSpec("unresolved", span=line.spec.span)
        rule = Rule(group, line.pattern, spec, line.spec, index, line.span, line.pattern_span, guard)
        if line.pattern is None:
            if group in defaults:
                found.errors.error(
                    "SR015",
                    f"group `{group}` has a second `default` rule (the first is at {defaults[group].span})",
                    line.span,
                    "keep one default per group",
                )
                continue
            defaults[group] = rule
        else:
            groups.setdefault(group, []).append(rule)
    # Every `rules GROUP:` header makes its group, even one with no rules yet.
    return {g: tuple(groups.get(g, ())) for g in found.headers if g in groups or g not in defaults}, defaults


def _not_planned(line: RuleLine, reason: str, cause: Diagnostic | None) -> Diagnostic:
    where = f" ({cause.code} at {cause.span})" if cause is not None and cause.span is not None else ""
    unchecked = "" if "rules after it" in reason else "; the leaves it would take are not checked"
    return Diagnostic(
        "SR302",
        "note",
        f"rule not planned: {reason}{where}{unchecked}",
        line.span,
        hint="fix the error above; the rest of the file was checked",
    )


@dataclasses.dataclass(frozen=True)
class PatternProblem:
    """Why a pattern cannot be a rule's: its code (SR002 not a regular
    expression, SR017 what the matcher does not have), message and hint, and
    where in the pattern the mistake is (`offset`, when known)."""

    code: str
    message: str
    hint: str
    offset: int | None = None


def pattern_problem(pattern: str) -> tuple[int, PatternProblem | None]:
    """The size of `pattern`'s compiled program (RE2 instructions) and `None`,
    or `0` and what makes it unusable as a rule pattern (see `_regex`). Rule
    files and every other pattern the user gives (`explain --path`) are
    checked by this one function, so they are refused alike."""
    try:
        try:
            return _regex.check(pattern), None
        except (OverflowError, ValueError) as err:  # counts too large for Python's compiler
            raise re.error(f"too complex to compile ({type(err).__name__})") from None
        except RecursionError:
            raise _regex.UnsupportedPattern(
                "groups nested too deeply", "use fewer levels of parentheses"
            ) from None
    except _regex.UnsupportedPattern as err:
        problem = PatternProblem(
            "SR017",
            f"unsupported regular expression: {err.reason}",
            f"{err.hint} (see docs/language.md#patterns)",
        )
    except re.error as err:
        problem = PatternProblem(
            "SR002",
            f"invalid regular expression: {err.msg}",
            "patterns are Python regular expressions; escape special characters with `\\`",
            err.pos,
        )
    return 0, problem


def check_pattern(line: RuleLine, errors: Findings) -> int:
    """Report a rule's pattern that is not a regular expression (SR002, with
    the column of the mistake) or that uses what the matcher does not have
    (SR017: backreferences, lookarounds, ...; see `_regex`). Returns the size
    of its compiled program (0 for a pattern with an error)."""
    assert line.pattern is not None
    size, problem = pattern_problem(line.pattern)
    if problem is None:
        return size
    span = line.pattern_span
    if problem.offset is not None and span is not None and span.line == span.end_line:
        col = span.col + 1 + problem.offset
        span = Span(span.file, span.line, col, span.line, col + 1)
    errors.error(problem.code, problem.message, span, problem.hint)
    return 0


@dataclasses.dataclass
class _Specs:
    """Resolves specs against the file's mesh line and aliases."""

    mesh: MeshDecl | None
    aliases: dict[str, tuple[str, ...]]
    declared: set[str]  # every alias name defined, including those that failed to resolve
    errors: Findings
    alternatives: dict[str, tuple[tuple[str, ...], ...]] = dataclasses.field(default_factory=dict)
    _spans: dict[str, Span | None] | None = None

    # Computed once per load (the names do not change while rules are resolved):
    # per entry or per rule, they made a file of many axes and rules quadratic.
    @functools.cached_property
    def mesh_axes(self) -> set[str]:
        return set(self.mesh.names) if self.mesh else set()

    @functools.cached_property
    def alternative_order(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.alternatives)}

    @functools.cached_property
    def logical_axes(self) -> tuple[str, ...]:
        """Every mesh axis the file's names can stand for (for `logical` specs)."""
        named = [
            *(self.mesh.names if self.mesh else ()),
            *(a for axes in self.aliases.values() for a in axes),
        ]
        named += [a for alts in self.alternatives.values() for alt in alts for a in alt]
        return tuple(dict.fromkeys(named))

    @functools.cached_property
    def failed_aliases(self) -> set[str]:
        """Aliases defined but not resolved (their definition has an error)."""
        return self.declared - set(self.aliases) - set(self.alternatives)

    def alias_spans(self, found: Statements) -> dict[str, Span | None]:
        """Where each alias of `found` is defined (computed once)."""
        if self._spans is None:
            self._spans = {a.name: a.span for a in found.alias_decls}
        return self._spans

    def resolve(self, spec: Spec) -> ResolvedSpec | None:
        """`spec` with every name resolved to mesh axes, or `None` (and errors)."""
        before = len(self.errors)
        if spec.kind == "replicated":
            return ResolvedSpec("replicated", span=spec.span)
        if spec.kind == "logical":  # resolved per leaf, from its names, when compiled
            return ResolvedSpec("logical", span=spec.span, logical_axes=self.logical_axes)
        if spec.kind == "auto":
            assert spec.auto_axes is not None
            seen: set[str] = set()
            for (name, _), span in zip(
                spec.options, spec.option_spans or [None] * len(spec.options), strict=True
            ):
                if name in seen:
                    self.errors.error("SR016", f"option `{name}` given twice", span, "keep one")
                seen.add(name)
                if name not in _AUTO_OPTIONS:
                    self.errors.error(
                        "SR016",
                        f"unknown option `{name}` for auto()",
                        span,
                        did_you_mean(name, _AUTO_OPTIONS) or f"options: {', '.join(_AUTO_OPTIONS)}",
                    )
            entry = self.entry(spec.auto_axes)
            if entry is not None and any(g.optional for g in entry.groups):
                self.errors.error(
                    "SR016",
                    "`?` has no meaning inside auto()",
                    spec.auto_axes.span,
                    "auto() already skips dimensions that do not divide",
                )
            if entry is not None and any(g.is_choice for g in entry.groups):
                self.errors.error(
                    "SR016",
                    "an alias with alternatives has no meaning inside auto()",
                    spec.auto_axes.span,
                    "auto() needs fixed mesh axes: name them, or an alias of one alternative",
                )
            elif entry is not None and not entry.axes:
                self.errors.error("SR016", "auto() needs at least one mesh axis", spec.auto_axes.span)
            if len(self.errors) > before or entry is None:
                return None
            options = dict(spec.options)
            return ResolvedSpec(
                "auto", auto_axes=entry.axes, min_bytes=options.get("min_bytes", 0), span=spec.span
            )
        entries = [self.entry(e) for e in spec.entries]
        ellipses = [e for e in spec.entries if e.kind == "ellipsis"]
        if len(ellipses) > 1:
            self.errors.error(
                "SR016",
                "`...` may appear once in a spec",
                ellipses[1].span,
                "`...` stands for all the dimensions not written out",
            )
        done = [e for e in entries if e is not None]
        if len(self.errors) > before or len(done) < len(entries):  # an entry failed (or its alias did)
            return None
        return ResolvedSpec("entries", tuple(done), span=spec.span)

    def entry(self, entry: Entry) -> ResolvedEntry | None:
        """One entry of a spec, resolved, or `None` (and errors)."""
        mesh, aliases = self.mesh, self.aliases
        if entry.kind != "axes":
            return ResolvedEntry(entry.kind, span=entry.span)
        groups: list[AxisGroup] = []
        axes = self.mesh_axes
        for ref in entry.axes:
            if ref.name == "unconstrained":  # the keyword, read as a name inside `(...)` and `auto(...)`
                self.errors.error(
                    "SR016",
                    "`unconstrained` stands for a whole dimension and cannot be one of its mesh axes",
                    ref.span,
                    "write it alone as the dimension's entry, e.g. `(batch, unconstrained)`",
                )
                return None
            if ref.name in aliases:
                names = aliases[ref.name]
            elif ref.name in self.alternatives:  # settled per spec when a leaf is planned
                order = self.alternative_order[ref.name]
                alts = self.alternatives[ref.name]
                groups.append(AxisGroup((), ref.optional, ref.span, ref.name, alts, order))
                continue
            elif ref.name in self.declared and ref.name not in axes:
                return None  # an alias whose definition failed: that error is reported already
            elif ref.name == "_" or (mesh is not None and ref.name not in axes):
                unknown_name(ref, lambda: [*axes, *aliases, *self.alternatives], self.errors)
                return None
            else:
                names = (ref.name,)
            if names:
                groups.append(AxisGroup(names, ref.optional, ref.span, ref.name))
        if entry.optional and any(g.is_choice for g in groups):  # merged once the choice is settled
            return ResolvedEntry("axes", tuple(groups), span=entry.span, optional=True)
        whole = "(" + ", ".join(r.name for r in entry.axes) + ")" if entry.optional else None
        return ResolvedEntry.of(groups, entry.span, whole)  # `(a, b)?`: the whole tuple, or nothing
