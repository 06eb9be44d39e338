"""Text → `RuleFile`: run the Lark parser, build the syntax tree, and turn
Lark's exceptions into `RuleSyntaxError`s that show the line and a caret."""

from __future__ import annotations

import re
from collections.abc import Iterable
from fractions import Fraction
from typing import Any, Literal

import lark
import lark.exceptions

from .._errors import Diagnostic, RuleSyntaxError, Span
from .._gcpause import paused
from . import _grammar, _guards, _hints
from ._sizes import UNITS
from ._syntax import (
    Alias,
    AliasTarget,
    AxisRef,
    Comment,
    Entry,
    Include,
    Item,
    MeshAxis,
    MeshDecl,
    RuleFile,
    RuleLine,
    RulesHeader,
    Spec,
)

# How each terminal is named in "expected ..." messages.
_DESCRIBE = {
    "NAME": "a name",
    "STRING": 'a quoted pattern such as "attn/kernel"',
    "NUMBER": "a number",
    "COMMENT": "a comment",
    "_NL": "the end of the line",
    "$END": "the end of the file",
    "ELLIPSIS": "`...`",
    "OPTIONAL": "`?`",
    "ARROW": "`->`",
    "LPAR": "`(`",
    "RPAR": "`)`",
    "STAR": "`*`",
    "COMPARE": "a comparison (`>=`, `<`, `==`, ...)",
}


def parse(text: str, name: str = "<string>") -> RuleFile:
    """Parse one rule file's text (includes are not followed).

    **Arguments:**

    - `text`: the rule file's contents.
    - `name`: the file name used in error messages.

    **Returns:** the file's `RuleFile`.

    **Raises:** `RuleSyntaxError` (code SR001, or SR003 for a bad number).
    """
    if not isinstance(text, str):
        raise TypeError(f"rule text must be str, not {type(text).__name__}")
    # A newline ends the last line; after a lone `\r` it comes as `\r\n`, so that it does not make
    # that `\r` a line end: the lexer stops at it, as at any lone `\r`.
    source = text if text.endswith("\n") else text + ("\r\n" if text.endswith("\r") else "\n")
    with paused():  # a parse makes many objects and no cycles: see `_gcpause`
        try:
            tree = _grammar.parser().parse(source)
        except lark.exceptions.UnexpectedInput as err:
            raise _syntax_error(err, source, text, name) from None
        return RuleFile(tuple(_Builder(name, text).items(tree)), name=name, source=text)


# ------------------------------------------------------------------ errors


def _describe(terminal: str) -> str:
    if terminal in _DESCRIBE:
        return _DESCRIBE[terminal]
    try:
        pattern = _grammar.parser().get_terminal(terminal).pattern
    except KeyError:
        return terminal
    return f"`{pattern.value}`" if pattern.type == "str" else terminal.lower()


def _expected(names: Iterable[str]) -> str:
    shown = sorted({_describe(n) for n in names if n != "COMMENT"})
    if len(shown) <= 1:
        return "".join(shown) or "nothing more"
    return ", ".join(shown[:-1]) + " or " + shown[-1]


def _syntax_error(err: lark.exceptions.UnexpectedInput, source: str, text: str, name: str) -> RuleSyntaxError:
    """SR001 for Lark's `err`, raised on `source` (`text` with its last line ended)."""
    line, col = max(err.line, 1), max(err.column, 1)
    hint = ""
    expected: set[str]
    if isinstance(err, lark.exceptions.UnexpectedToken):
        token = err.token
        expected = set(err.expected)
        if token.type == "_NL":
            found = "end of line"
        elif token.type == "$END":
            found = "end of file"
        else:
            found = f"`{token.value}`"
        width = max(1, len(str(token.value))) if token.type not in ("_NL", "$END") else 1
        hint = _hints.hint_for(token.type, str(token.value), expected)
    elif isinstance(err, lark.exceptions.UnexpectedCharacters):
        if err.char == '"' or _hints.is_line_break(err.char):  # a line break, or quoted text holding one
            at = _hints.line_break_at(source.split("\n")[line - 1], col)
            if at:
                return _line_break(source.split("\n")[line - 1][at - 1], text, name, line, at)
        expected = set(err.allowed or ())
        found = _hints.show_char(err.char)
        width = 1
        if err.char == '"':
            span = Span(name, line, col, line, col + 1)
            return RuleSyntaxError(
                Diagnostic(
                    "SR001",
                    "error",
                    "unterminated string",
                    span,
                    hint='close the quoted text with `"` on the same line',
                ),
                {name: text},
            )
        elif err.char in _hints.QUOTES:
            hint = _hints.quote_hint(text.split("\n")[line - 1][col - 1 :], expected)
        elif err.char.isalnum() or err.char == "_":
            word = re.match(r"[^\s,()]*", text.split("\n")[line - 1][col - 1 :])
            assert word is not None
            found = f"`{word.group()}`"
            width = max(1, len(word.group()))
            hint = _hints.hint_for("NAME", word.group(), expected)
    else:  # UnexpectedEOF
        expected = set(getattr(err, "expected", ()) or ())
        found, width = "end of file", 1
    expected.discard("IF")  # a guard may end any rule: naming it in every error after a spec is noise
    line_text = text.split("\n")[line - 1] if line <= text.count("\n") + 1 else ""
    arrow = line_text.find("->")
    if 0 <= arrow < col - 1:  # in a spec: one written as Python gets its translation
        hint = _hints.python_spec_hint(line_text[arrow + 2 :]) or hint
        if _guards.in_guard(line_text[arrow + 2 : col - 1]):
            hint = _guards.syntax_hint(found, line_text[: col - 1])
    if not hint and found not in ("end of line", "end of file"):
        source = text.split("\n")[line - 1] if line <= text.count("\n") + 1 else ""
        hint = _hints.layout_hint(source[: col - 1], source[col - 1 :], expected) if source[col - 1 :] else ""
    if not hint:
        hint = _hints.expected_hint(expected)
    message = f"unexpected {found}; expected {_expected(expected)}"
    span = Span(name, line, col, line, col + width)
    return RuleSyntaxError(Diagnostic("SR001", "error", message, span, hint=hint), {name: text})


def _line_break(char: str, text: str, name: str, line: int, col: int) -> RuleSyntaxError:
    """SR001 for `char`, a line break other than `\\n` and `\\r\\n`, at `line`,
    `col` (grammar/shardrules.lark: a rule file holds none, so that the lines a
    reader sees are the lines the parser reads)."""
    message, hint = _hints.line_break_error(char, "\n" not in text)
    span = Span(name, line, col, line, col + 1)
    return RuleSyntaxError(Diagnostic("SR001", "error", message, span, hint=hint), {name: text})


# ------------------------------------------------------------------ tree → AST


class _Builder:
    def __init__(self, name: str, text: str):
        self.name = name
        self.text = text

    def span(self, node: Any) -> Span:
        if isinstance(node, lark.Token):
            return Span(
                self.name,
                node.line or 1,
                node.column or 1,
                node.end_line or node.line or 1,
                node.end_column or node.column or 1,
            )
        meta = node.meta
        return Span(self.name, meta.line, meta.column, meta.end_line, meta.end_column)

    def items(self, tree: Any) -> list[Item]:
        items: list[Item] = []
        last_line = 0
        for child in tree.children:
            if isinstance(child, lark.Token):  # a comment
                span = self.span(child)
                items.append(Comment(str(child).rstrip(), trailing=span.line == last_line, span=span))
                continue
            stmt = getattr(self, child.data)(child)
            items.append(stmt)
            last_line = stmt.span.end_line
        return items

    # statements

    def mesh(self, tree: Any) -> MeshDecl:
        children = list(tree.children)
        kind = None
        if children and getattr(children[0], "data", None) == "axis_type":
            kind = self.axis_type(children.pop(0))
        return MeshDecl(tuple(self.mesh_axis(t) for t in children), self.span(tree), kind)

    @staticmethod
    def axis_type(tree: Any) -> Literal["explicit", "auto"]:
        return "explicit" if str(tree.children[0]) == "explicit" else "auto"

    def mesh_axis(self, tree: Any) -> MeshAxis:
        name, *rest = tree.children
        optional = bool(rest) and getattr(rest[0], "type", None) == "OPTIONAL"
        if optional:
            rest.pop(0)
        kind = None
        if rest and getattr(rest[-1], "data", None) == "axis_type":
            kind = self.axis_type(rest.pop())
        value: int | Literal["*"] | None = None
        size = rest
        if size:
            tok = size[0]
            if tok.type == "STAR":
                value = "*"
            else:
                if not re.fullmatch(r"[0-9]{1,18}", tok) or int(tok) < 1:
                    raise self.number_error(tok, "a mesh axis size is a positive whole number or `*`")
                value = int(tok)
        return MeshAxis(str(name), value, self.span(tree), kind, optional)

    def include(self, tree: Any) -> Include:
        return Include(str(tree.children[0])[1:-1], self.span(tree))

    def alias(self, tree: Any) -> Alias:
        name, *targets = tree.children
        first, *more = [self.alias_target(t) for t in targets]
        return Alias(str(name), first.target, first.is_tuple, self.span(tree), tuple(more), first.span)

    def alias_target(self, tree: Any) -> AliasTarget:
        """One alternative of an alias: `name`, `(a, b)` or `_`."""
        if tree.data == "alias_unsharded":
            refs: tuple[AxisRef, ...] = ()
        else:
            refs = tuple(AxisRef(str(t), False, self.span(t)) for t in tree.children)
        return AliasTarget(refs, tree.data == "alias_tuple", self.span(tree))

    def rules_header(self, tree: Any) -> RulesHeader:
        return RulesHeader(str(tree.children[0]), self.span(tree))

    def rule(self, tree: Any) -> RuleLine:
        head, _arrow, spec, *guard = tree.children
        pattern = None if head.type == "DEFAULT" else str(head)[1:-1]
        conditions = _guards.conditions(guard[0], self.span, self.byte_size) if guard else ()
        guard_span = self.span(guard[0]) if guard else None
        return RuleLine(pattern, self.spec(spec), self.span(tree), self.span(head), conditions, guard_span)

    # specs

    def spec(self, tree: Any) -> Spec:
        if tree.data == "spec_replicated":
            return Spec("replicated", span=self.span(tree))
        if tree.data == "spec_logical":
            return Spec("logical", span=self.span(tree))
        if tree.data == "spec_entries":
            entries = tuple(self.entry(c) for c in tree.children)
            return Spec("entries", entries, span=self.span(tree))
        _auto, axes, *options = tree.children
        parsed = [self.option(o) for o in options]
        return Spec(
            "auto",
            auto_axes=self.entry(axes),
            options=tuple((n, v) for n, v, _ in parsed),
            span=self.span(tree),
            option_spans=tuple(s for _, _, s in parsed),
        )

    def option(self, tree: Any) -> tuple[str, int, Span]:
        name, value = tree.children
        return str(name), self.byte_size(value), self.span(tree)

    def entry(self, tree: Any) -> Entry:
        span = self.span(tree)
        if tree.data == "entry_unsharded":
            return Entry("unsharded", span=span)
        if tree.data == "entry_ellipsis":
            return Entry("ellipsis", span=span)
        if tree.data == "entry_unconstrained":
            return Entry("unconstrained", span=span)
        if tree.data == "axis_ref":
            return Entry("axes", (self.axis_ref(tree),), span=span)
        refs = tuple(self.axis_ref(c) for c in tree.children if isinstance(c, lark.Tree))
        optional = any(isinstance(c, lark.Token) and c.type == "OPTIONAL" for c in tree.children)
        return Entry("axes", refs, is_tuple=True, optional=optional, span=span)

    def axis_ref(self, tree: Any) -> AxisRef:
        name, *opt = tree.children
        return AxisRef(str(name), bool(opt), self.span(tree))

    # values

    def byte_size(self, tok: lark.Token) -> int:
        m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)", tok)
        assert m is not None  # the NUMBER terminal guarantees the shape
        number, unit = m.groups()
        if unit not in UNITS:
            from .._errors import did_you_mean

            units = [u for u in UNITS if u]
            raise self.number_error(
                tok,
                f"unknown unit `{unit}`; use one of {', '.join(units)}",
                did_you_mean(unit, units),
            )
        if len(number) > 30:
            raise self.number_error(tok, "a size this long is not a plausible number of bytes")
        scaled = Fraction(number) * UNITS[unit]  # exact: 1.001KB is 1001 bytes
        if scaled.denominator != 1:
            raise self.number_error(tok, "a size must come to a whole number of bytes")
        return int(scaled)

    def number_error(self, tok: lark.Token, message: str, hint: str = "") -> RuleSyntaxError:
        shown = str(tok) if len(tok) <= 40 else f"{tok[:16]}…{tok[-8:]}"
        return RuleSyntaxError(
            Diagnostic("SR003", "error", f"bad number `{shown}`: {message}", self.span(tok), hint=hint),
            {self.name: self.text},
        )
