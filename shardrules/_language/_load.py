"""Rule files → `RuleSet`: follow includes, check names, resolve aliases,
compile patterns and group the rules. Everything here needs no mesh."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from pathlib import Path

from .._errors import Diagnostic, Span, did_you_mean, error_for
from . import _regex
from ._files import MAX_FILE_BYTES, read_rule_file
from ._parse import parse
from ._rules import (
    Alias,
    AxisGroup,
    AxisRef,
    Entry,
    Include,
    MeshDecl,
    ResolvedEntry,
    ResolvedSpec,
    Rule,
    RuleLine,
    RuleSet,
    RulesHeader,
    Spec,
)

_AUTO_OPTIONS = ("min_bytes",)

MAX_INCLUDE_DEPTH = 16
"""How deep `include`s may nest."""


def load(path: str | os.PathLike[str], *, include_root: str | os.PathLike[str] | None = None) -> RuleSet:
    """Load a rule file and the files it includes.

    **Arguments:**

    - `path`: the rule file, e.g. `"sharding/llama.shard"`.
    - `include_root`: the folder that `include` lines may not leave; by default
      the folder of `path`.

    **Returns:** the `RuleSet`.

    **Raises:** `RuleSyntaxError`, `RuleDefinitionError`, `IncludeNotFoundError`.

    ```python
    rules = shardrules.load("sharding/llama.shard")
    params = shardrules.apply(params, rules)
    ```
    """
    display = os.fspath(path)
    root = Path(include_root if include_root is not None else Path(display).parent or ".")
    text = read_rule_file(Path(display), display, None)
    return _Loader(root.resolve(), explicit_root=include_root is not None).run(
        text, display, Path(display).resolve()
    )


def loads(
    text: str | bytes, name: str = "<string>", *, include_root: str | os.PathLike[str] | None = None
) -> RuleSet:
    """Load rules from a string.

    **Arguments:**

    - `text`: the rules (`bytes` are read as UTF-8).
    - `name`: the name errors show for this text.
    - `include_root`: the folder `include` paths are relative to and may not
      leave; by default the current directory.

    **Returns:** the `RuleSet`.

    ```python
    rules = shardrules.loads('''
    rules params:
      "kernel" -> (_, model)
      default  -> replicated
    ''')
    ```
    """
    root = Path(include_root if include_root is not None else ".").resolve()
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as err:
            raise error_for(
                [
                    Diagnostic(
                        "SR005", "error", f"`{name}` is not UTF-8 text ({err.reason} at byte {err.start})"
                    )
                ]
            ) from None
    if not isinstance(text, str):
        raise TypeError(f"rule text must be str or bytes, not {type(text).__name__}")
    if len(text) > MAX_FILE_BYTES:
        raise error_for(
            [
                Diagnostic(
                    "SR009",
                    "error",
                    f"`{name}` is larger than {MAX_FILE_BYTES >> 20} MiB; rule files are small text files",
                    hint="check that this is the rule text you meant",
                )
            ]
        )
    return _Loader(root, explicit_root=include_root is not None).run(text, name, root / "<string>")


@dataclasses.dataclass
class _Loader:
    root: Path
    explicit_root: bool
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    errors: list[Diagnostic] = dataclasses.field(default_factory=list)
    meshes: list[MeshDecl] = dataclasses.field(default_factory=list)
    alias_decls: list[Alias] = dataclasses.field(default_factory=list)
    rule_lines: list[tuple[str, RuleLine]] = dataclasses.field(default_factory=list)
    headers: dict[str, Span | None] = dataclasses.field(default_factory=dict)
    done: set[Path] = dataclasses.field(default_factory=set)
    stack: list[tuple[Path, str]] = dataclasses.field(default_factory=list)

    def error(self, code: str, message: str, span: Span | None, hint: str = "") -> None:
        self.errors.append(Diagnostic(code, "error", message, span, hint=hint))

    def run(self, text: str, name: str, real: Path) -> RuleSet:
        self.visit(text, name, real)
        self.raise_errors()
        mesh = self.check_mesh()
        aliases = self.resolve_aliases(mesh)
        groups, defaults = self.build_rules(mesh, aliases)
        self.raise_errors()
        return RuleSet(
            name=name,
            mesh=mesh,
            alias_items=tuple(sorted(aliases.items())),
            alias_span_items=tuple((a.name, a.span) for a in self.alias_decls if a.name in aliases),
            group_span_items=tuple(self.headers.items()),
            group_items=tuple(groups.items()),
            default_items=tuple(defaults.items()),
            source_items=tuple(self.sources.items()),
        )

    def raise_errors(self) -> None:
        if self.errors:
            raise error_for(self.errors, self.sources)

    # -------------------------------------------------------------- includes

    def visit(self, text: str, name: str, real: Path) -> None:
        text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark is not part of the rules
        self.sources[name] = text
        rule_file = parse(text, name)
        self.done.add(real)
        self.stack.append((real, name))
        group: str | None = None
        for stmt in rule_file.statements:
            if isinstance(stmt, MeshDecl):
                self.meshes.append(stmt)
            elif isinstance(stmt, Alias):
                self.alias_decls.append(stmt)
            elif isinstance(stmt, RulesHeader):
                group = stmt.group
                self.headers.setdefault(group, stmt.span)
            elif isinstance(stmt, RuleLine):
                if group is None:
                    self.error(
                        "SR007",
                        "rule outside a `rules` group",
                        stmt.span,
                        "put a header such as `rules params:` above the first rule",
                    )
                else:
                    self.rule_lines.append((group, stmt))
            elif isinstance(stmt, Include):
                self.include(stmt, name, real)
        self.stack.pop()

    def include(self, stmt: Include, parent_name: str, parent_real: Path) -> None:
        if not stmt.path or "\x00" in stmt.path:
            what = "an empty path" if not stmt.path else "a path with a NUL character"
            self.error(
                "SR005", f"include of {what}", stmt.span, 'write the file to include: include "common.shard"'
            )
            return
        target = Path(stmt.path)
        display = os.path.normpath(os.path.join(os.path.dirname(parent_name), stmt.path))
        if target.is_absolute() and not self.explicit_root:
            self.error(
                "SR006",
                f"include of an absolute path `{stmt.path}`",
                stmt.span,
                "include files by a path relative to the including file",
            )
            return
        real = (parent_real.parent / target).resolve()
        if not real.is_relative_to(self.root):
            self.error(
                "SR006",
                f"include of `{stmt.path}` leaves the include root `{self.root}`",
                stmt.span,
                "keep included files in the folder of the top-level rule file (or below it), "
                "or pass include_root= to load()",
            )
            return
        chain = [n for r, n in self.stack]
        if any(r == real for r, _ in self.stack):
            start = next(i for i, (r, _) in enumerate(self.stack) if r == real)
            cycle = " -> ".join([*chain[start:], display])
            self.error("SR004", f"include cycle: {cycle}", stmt.span, "remove one of these includes")
            return
        if real in self.done:  # included before: every file is read once
            return
        if len(self.stack) >= MAX_INCLUDE_DEPTH:
            self.error(
                "SR008",
                f"includes nest deeper than {MAX_INCLUDE_DEPTH} files: {' -> '.join(chain[:3])} -> ... -> {display}",
                stmt.span,
                "include the shared files from one top-level file instead of chaining them",
            )
            return
        text = read_rule_file(real, display, stmt.span, self.sources)
        self.visit(text, display, real)

    # -------------------------------------------------------------- mesh

    def check_mesh(self) -> MeshDecl | None:
        if not self.meshes:
            return None
        first = self.meshes[0]
        for other in self.meshes[1:]:
            if other != first:
                self.error(
                    "SR014",
                    f"a second, different `mesh` line (the first is at {first.span})",
                    other.span,
                    "keep one mesh line, or make them identical",
                )
        seen: dict[str, Span | None] = {}
        stars = 0
        for axis in first.axes:
            if axis.name in seen:
                self.error("SR014", f"mesh axis `{axis.name}` listed twice", axis.span)
            if axis.name == "_":
                self.error("SR014", "`_` means unsharded and cannot name a mesh axis", axis.span)
            seen[axis.name] = axis.span
            stars += axis.size == "*"
        if stars > 1:
            self.error(
                "SR014",
                "more than one mesh axis sized `*`",
                first.span,
                "`*` takes the devices the other axes leave; give the others numbers",
            )
        return first

    # -------------------------------------------------------------- aliases

    def resolve_aliases(self, mesh: MeshDecl | None) -> dict[str, tuple[str, ...]]:
        axes = set(mesh.names) if mesh else set()
        decls: dict[str, Alias] = {}
        for alias in self.alias_decls:
            if alias.name in decls:
                self.error(
                    "SR012",
                    f"alias `{alias.name}` defined twice (first at {decls[alias.name].span})",
                    alias.span,
                    "keep one definition",
                )
                continue
            if alias.name in axes:
                self.error(
                    "SR013",
                    f"alias `{alias.name}` has the name of a mesh axis",
                    alias.span,
                    "rename the alias; a name cannot mean both",
                )
                continue
            if alias.name == "_":
                self.error("SR013", "`_` means unsharded and cannot be an alias", alias.span)
                continue
            decls[alias.name] = alias

        resolved: dict[str, tuple[str, ...]] = {}
        failed: set[str] = set()

        def resolve(name: str, trail: tuple[str, ...]) -> tuple[str, ...] | None:
            if name in resolved:
                return resolved[name]
            if name in failed:
                return None
            alias = decls[name]
            if name in trail:
                loop = trail[trail.index(name) :]
                failed.update(loop)
                cycle = " -> ".join([*loop, name])
                self.error("SR011", f"alias cycle: {cycle}", alias.span, "an alias must end in mesh axes")
                return None
            out: list[str] = []
            for ref in alias.target:
                if ref.name == "_" and len(alias.target) > 1:
                    self.error(
                        "SR010",
                        "`_` (unsharded) cannot be one of several axes in an alias",
                        ref.span,
                        "list only mesh axes or aliases in the tuple, or write `alias NAME = _`",
                    )
                    failed.add(name)
                    return None
                if ref.name in decls:
                    sub = resolve(ref.name, (*trail, name))
                    if sub is None:
                        failed.add(name)
                        return None
                    out.extend(sub)
                elif mesh is not None and ref.name not in axes:
                    self.unknown_name(ref, axes, {n: a for n, a in decls.items() if n != name})
                    failed.add(name)
                    return None
                else:
                    out.append(ref.name)
            resolved[name] = tuple(out)
            return resolved[name]

        for name in decls:
            try:
                resolve(name, ())
            except RecursionError:
                self.error(
                    "SR011",
                    f"alias chain too long from `{name}`",
                    decls[name].span,
                    "point aliases at mesh axes directly, or through a few other aliases",
                )
                break
        return resolved

    def unknown_name(
        self, ref: AxisRef, axes: set[str], aliases: dict[str, Alias] | dict[str, tuple[str, ...]]
    ) -> None:
        known = sorted(axes | set(aliases))
        if ref.name in ("None", "none", "null"):
            self.error(
                "SR010",
                f"unknown name `{ref.name}`: not a mesh axis or an alias",
                ref.span,
                "write `_` for a dimension that is not sharded",
            )
            return
        hint = did_you_mean(ref.name, known) or (
            f"known names: {', '.join(known)}" if known else "declare it in the mesh line or as an alias"
        )
        self.error("SR010", f"unknown name `{ref.name}`: not a mesh axis or an alias", ref.span, hint)

    # -------------------------------------------------------------- rules

    def build_rules(
        self, mesh: MeshDecl | None, aliases: dict[str, tuple[str, ...]]
    ) -> tuple[dict[str, tuple[Rule, ...]], dict[str, Rule]]:
        groups: dict[str, list[Rule]] = {}
        defaults: dict[str, Rule] = {}
        counts: dict[str, int] = {}
        for group, line in self.rule_lines:
            index = counts.get(group, 0)
            counts[group] = index + 1
            if line.pattern is not None:
                self.check_pattern(line)
            spec = self.resolve_spec(line.spec, mesh, aliases)
            if spec is None:
                continue
            rule = Rule(group, line.pattern, spec, line.spec, index, line.span, line.pattern_span)
            if line.pattern is None:
                if group in defaults:
                    self.error(
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
        return {
            g: tuple(groups.get(g, ())) for g in self.headers if g in groups or g not in defaults
        }, defaults

    def check_pattern(self, line: RuleLine) -> None:
        assert line.pattern is not None
        try:
            try:
                re.compile(line.pattern)
            except (RecursionError, OverflowError, ValueError) as err:  # nesting or counts too large
                raise re.error(f"too complex to compile ({type(err).__name__})") from None
            try:
                _regex.check(line.pattern)
            except RecursionError:
                raise _regex.UnsafePattern(
                    "groups nested too deeply", "use fewer levels of parentheses"
                ) from None
        except _regex.UnsafePattern as err:
            self.error(
                "SR017",
                f"unsafe regular expression: {err.reason}",
                line.pattern_span,
                f"{err.hint} (see docs/language.md#safe-patterns)",
            )
        except re.error as err:
            span = line.pattern_span
            if span is not None and err.pos is not None and span.line == span.end_line:
                col = span.col + 1 + err.pos
                span = Span(span.file, span.line, col, span.line, col + 1)
            self.error(
                "SR002",
                f"invalid regular expression: {err.msg}",
                span,
                "patterns are Python regular expressions; escape special characters with `\\`",
            )

    def resolve_spec(
        self, spec: Spec, mesh: MeshDecl | None, aliases: dict[str, tuple[str, ...]]
    ) -> ResolvedSpec | None:
        before = len(self.errors)
        if spec.kind == "replicated":
            return ResolvedSpec("replicated", span=spec.span)
        if spec.kind == "logical":  # resolved per leaf, from its names, when compiled
            named = [*(mesh.names if mesh else ()), *(a for axes in aliases.values() for a in axes)]
            return ResolvedSpec("logical", span=spec.span, logical_axes=tuple(dict.fromkeys(named)))
        if spec.kind == "auto":
            assert spec.auto_axes is not None
            seen: set[str] = set()
            for (name, _), span in zip(
                spec.options, spec.option_spans or [None] * len(spec.options), strict=True
            ):
                if name in seen:
                    self.error("SR016", f"option `{name}` given twice", span, "keep one")
                seen.add(name)
                if name not in _AUTO_OPTIONS:
                    self.error(
                        "SR016",
                        f"unknown option `{name}` for auto()",
                        span,
                        did_you_mean(name, _AUTO_OPTIONS) or f"options: {', '.join(_AUTO_OPTIONS)}",
                    )
            entry = self.resolve_entry(spec.auto_axes, mesh, aliases)
            if entry is not None and any(g.optional for g in entry.groups):
                self.error(
                    "SR016",
                    "`?` has no meaning inside auto()",
                    spec.auto_axes.span,
                    "auto() already skips dimensions that do not divide",
                )
            if entry is not None and not entry.axes:
                self.error("SR016", "auto() needs at least one mesh axis", spec.auto_axes.span)
            if len(self.errors) > before or entry is None:
                return None
            options = dict(spec.options)
            return ResolvedSpec(
                "auto", auto_axes=entry.axes, min_bytes=options.get("min_bytes", 0), span=spec.span
            )
        entries = [self.resolve_entry(e, mesh, aliases) for e in spec.entries]
        ellipses = [e for e in spec.entries if e.kind == "ellipsis"]
        if len(ellipses) > 1:
            self.error(
                "SR016",
                "`...` may appear once in a spec",
                ellipses[1].span,
                "`...` stands for all the dimensions not written out",
            )
        done = [e for e in entries if e is not None]
        if len(self.errors) > before:
            return None
        return ResolvedSpec("entries", tuple(done), span=spec.span)

    def resolve_entry(
        self, entry: Entry, mesh: MeshDecl | None, aliases: dict[str, tuple[str, ...]]
    ) -> ResolvedEntry | None:
        if entry.kind != "axes":
            return ResolvedEntry(entry.kind, span=entry.span)
        groups: list[AxisGroup] = []
        axes = set(mesh.names) if mesh else set()
        for ref in entry.axes:
            if ref.name in aliases:
                names = aliases[ref.name]
            elif ref.name in {a.name for a in self.alias_decls} and ref.name not in axes:
                return None  # an alias whose definition failed: that error is reported already
            elif ref.name == "_" or (mesh is not None and ref.name not in axes):
                self.unknown_name(ref, axes, aliases)
                return None
            else:
                names = (ref.name,)
            if names:
                groups.append(AxisGroup(names, ref.optional, ref.span, ref.name))
        if entry.optional and groups:  # `(a, b)?`: the whole tuple, or nothing
            written = "(" + ", ".join(r.name for r in entry.axes) + ")"
            groups = [AxisGroup(tuple(a for g in groups for a in g.axes), True, entry.span, written)]
        if not groups:
            return ResolvedEntry("unsharded", span=entry.span)
        return ResolvedEntry("axes", tuple(groups), span=entry.span)


def iter_rules(rules: RuleSet, group: str) -> Iterator[Rule]:
    """The rules of `group` in match order, its `default` last."""
    yield from rules.groups.get(group, ())
    if group in rules.defaults:
        yield rules.defaults[group]
