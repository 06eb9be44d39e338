"""The canonical printer: a `RuleFile` back to text, in one layout.

Rules are indented two spaces under their group header; the `->` of
consecutive rules line up, as do the `=` of consecutive aliases and the `if`
of the guarded rules among consecutive rules; entries are
separated by `, `; sizes print in the largest unit that is exact; comments are
kept (trailing ones two spaces after the code, aligned within a run of lines);
runs of blank lines become one, with none at the start or the end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ._syntax import (
    Alias,
    AliasTarget,
    AxisRef,
    Comment,
    Condition,
    Entry,
    Include,
    Item,
    MeshDecl,
    RuleFile,
    RuleLine,
    RulesHeader,
    Spec,
)

INDENT = "  "

# Largest first; at each prefix the binary unit (the larger) comes first.
_UNITS = (
    ("TiB", 2**40),
    ("TB", 10**12),
    ("GiB", 2**30),
    ("GB", 10**9),
    ("MiB", 2**20),
    ("MB", 10**6),
    ("KiB", 2**10),
    ("KB", 10**3),
)


def format_text(text: str, name: str = "<string>") -> str:
    """Format rule-file `text` (`name`: the file name its errors show); raises
    `RuleSyntaxError` if it does not parse. A leading UTF-8 byte-order mark is
    dropped, as the loader drops it."""
    from ._parse import parse  # the parser (Lark) loads when text is first parsed, not with the printer

    return format_file(parse(text.removeprefix("\ufeff"), name))


def format_file(rule_file: RuleFile) -> str:
    """The canonical text of a parsed rule file."""
    lines = _Printer(rule_file.items).lines()
    return "\n".join(lines) + "\n" if lines else ""


def byte_size_text(n: int) -> str:
    """In the largest exact unit: `1048576` → `"1MiB"`, `16000000` → `"16MB"`,
    `1000` → `"1KB"`, `1500` → `"1500"`."""
    for unit, scale in _UNITS:
        if n and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def _ref_text(ref: AxisRef) -> str:
    return ref.name + ("?" if ref.optional else "")


def entry_text(entry: Entry) -> str:
    if entry.kind == "unsharded":
        return "_"
    if entry.kind == "ellipsis":
        return "..."
    if entry.kind == "unconstrained":
        return "unconstrained"
    if not entry.is_tuple:
        return _ref_text(entry.axes[0])
    inner = ", ".join(_ref_text(r) for r in entry.axes)
    return f"({inner})" + ("?" if entry.optional else "")


def spec_text(spec: Spec) -> str:
    """A spec as written in canonical form, e.g. `(..., embed, heads)`."""
    if spec.kind in ("replicated", "logical"):
        return spec.kind
    if spec.kind == "auto":
        assert spec.auto_axes is not None
        args = [entry_text(spec.auto_axes)]
        args += [f"{name}={byte_size_text(value)}" for name, value in spec.options]
        return f"auto({', '.join(args)})"
    return "(" + ", ".join(entry_text(e) for e in spec.entries) + ")"


def guard_text(guard: Sequence[Condition]) -> str:
    """A rule's guard in canonical form, `if bytes >= 1MiB and dtype in (float32, bfloat16)`."""
    return "if " + " and ".join(_condition_text(c) for c in guard)


def _condition_text(cond: Condition) -> str:
    def value(v: int | str) -> str:
        return byte_size_text(v) if cond.variable == "bytes" and isinstance(v, int) else str(v)

    if cond.op in ("in", "not in"):
        return f"{cond.variable} {cond.op} ({', '.join(value(v) for v in cond.values)})"
    return f"{cond.variable} {cond.op} {' '.join(value(v) for v in cond.values)}"


def _alias_target(alias: Alias) -> str:
    """The alias's alternatives, `a | (b, c) | _` (one: as it alone)."""
    return " | ".join(_alternative_text(alt) for alt in alias.alternatives)


def _alternative_text(alt: AliasTarget) -> str:
    if not alt.target:
        return "_"
    if not alt.is_tuple:
        return alt.target[0].name
    return "(" + ", ".join(r.name for r in alt.target) + ")"


@dataclasses.dataclass
class _Line:
    """One output line: `left` and `right` are joined by `sep` (aligned later)."""

    left: str
    sep: str = ""
    right: str = ""
    comment: str | None = None  # a trailing comment
    kind: str = ""  # "comment", "rule", "alias" or another statement's kind
    blank_before: bool = False
    guard: str = ""  # a rule's `if ...`, after `right` (aligned later)

    @property
    def code(self) -> str:
        return self.left + self.sep + self.right + (" " + self.guard if self.guard else "")


class _Printer:
    def __init__(self, items: Sequence[Item]):
        self.items = list(items)

    def lines(self) -> list[str]:
        records: list[_Line] = []
        prev_end: int | None = None
        in_block = False
        for item in self.items:
            if isinstance(item, Comment) and item.trailing and records:
                records[-1].comment = item.text
                continue
            line = item.span.line if item.span else (prev_end or 0) + 1
            blank = bool(records) and prev_end is not None and line - prev_end > 1
            prev_end = item.span.end_line if item.span else line
            if isinstance(item, Comment):
                indent = INDENT if in_block and item.span is not None and item.span.col > 1 else ""
                records.append(_Line(indent + item.text, kind="comment", blank_before=blank))
                continue
            if isinstance(item, RulesHeader):
                in_block = True
            record = self.statement(item)
            record.blank_before = blank
            records.append(record)
        self.align(records, "rule")
        self.align_guards(records)
        self.align(records, "alias")
        return self.with_comments(records)

    @staticmethod
    def statement(stmt: Item) -> _Line:
        if isinstance(stmt, MeshDecl):
            axes = ", ".join(
                a.name
                + "?" * a.optional
                + ("" if a.size is None else f"={a.size}")
                + (f" {a.type}" if a.type else "")
                for a in stmt.axes
            )
            return _Line(f"mesh {stmt.type + ' ' if stmt.type else ''}{axes}", kind="mesh")
        if isinstance(stmt, Include):
            return _Line(f'include "{stmt.path}"', kind="include")
        if isinstance(stmt, Alias):
            return _Line(f"alias {stmt.name}", " = ", _alias_target(stmt), kind="alias")
        if isinstance(stmt, RulesHeader):
            return _Line(f"rules {stmt.group}:", kind="header")
        assert isinstance(stmt, RuleLine)
        head = "default" if stmt.pattern is None else f'"{stmt.pattern}"'
        guard = guard_text(stmt.guard) if stmt.guard else ""
        return _Line(INDENT + head, " -> ", spec_text(stmt.spec), kind="rule", guard=guard)

    @staticmethod
    def align(records: list[_Line], kind: str) -> None:
        """Pad `left` over runs of `kind` lines; blank lines and other
        statements end a run, comment lines do not."""
        run: list[_Line] = []

        def flush() -> None:
            width = max((len(r.left) for r in run), default=0)
            for r in run:
                r.left = r.left.ljust(width)
            run.clear()

        for record in records:
            if record.blank_before:
                flush()
            if record.kind == kind:
                run.append(record)
            elif record.kind != "comment":
                flush()
        flush()

    @staticmethod
    def align_guards(records: list[_Line]) -> None:
        """Pad the specs of guarded rules so that their `if`s line up over a
        run of rule lines (runs as in `align`); unguarded rules are not padded."""
        run: list[_Line] = []

        def flush() -> None:
            width = max((len(r.right) for r in run), default=0)
            for r in run:
                r.right = r.right.ljust(width)
            run.clear()

        for record in records:
            if record.blank_before:
                flush()
            if record.kind == "rule":
                if record.guard:
                    run.append(record)
            elif record.kind != "comment":
                flush()
        flush()

    @staticmethod
    def with_comments(records: list[_Line]) -> list[str]:
        """Render, aligning trailing comments over runs of consecutive
        statement lines (blank lines and comment lines end a run)."""
        out: list[str] = []
        run: list[tuple[int, _Line]] = []

        def flush() -> None:
            col = max((len(r.code) for _, r in run if r.comment is not None), default=0) + 2
            for at, r in run:
                if r.comment is not None:
                    out[at] = r.code.ljust(col) + r.comment
            run.clear()

        for record in records:
            if record.blank_before or record.kind == "comment":
                flush()
            if record.blank_before:
                out.append("")
            out.append(record.code)
            if record.kind != "comment":
                run.append((len(out) - 1, record))
        flush()
        return out
