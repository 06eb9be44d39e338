"""Hints for syntax errors: from what the parser found, what it expected and
the text around it, how the line should be written (the `hint:` of SR001)."""

from __future__ import annotations

import ast
import re
import unicodedata

from .._errors import did_you_mean

# Quotes that are not `"`: single quotes, and the typographic ones an editor or
# a chat window substitutes for `"` and `'`.
QUOTES = {"'": "'", "\u201c": "\u201d", "\u201d": "\u201d", "\u2018": "\u2019", "\u2019": "\u2019"}


def quote_hint(rest: str, expected: set[str]) -> str:
    """What to write instead of the quoted text that starts `rest`."""
    close = rest.find(QUOTES[rest[0]], 1)
    inner = rest[1:close] if close > 0 else ""
    if "STRING" not in expected:
        shown = f": {inner}" if inner.isidentifier() else ", e.g. `rules params:`"
        return f"names are written without quotes{shown}"
    example = f'"{inner}"' if inner and '"' not in inner else '"attn/kernel"'
    return f"patterns and include paths are written in double quotes: {example}"


def show_char(char: str) -> str:
    """`x` as itself in backquotes; invisible or look-alike characters by name."""
    if char.isascii() and char.isprintable():
        return f"`{char}`"
    name = unicodedata.name(char, "")
    code = f"U+{ord(char):04X}"
    shown = f"`{char}` " if char.isprintable() and not char.isspace() else ""
    return f"{shown}({code}{' ' + name if name else ''})"


# The line breaks of `str.splitlines` that do not end a line of a rule file
# (only `\n` and `\r\n` do: grammar/shardrules.lark), by name.
_BREAK_NAMES = {
    "\r": "a carriage return (`\\r`) without `\\n` after it",
    "\x0b": "a vertical tab (`\\v`, U+000B)",
    "\x0c": "a form feed (`\\f`, U+000C)",
    "\x1c": "a file separator (U+001C)",
    "\x1d": "a group separator (U+001D)",
    "\x1e": "a record separator (U+001E)",
    "\x85": "a next-line character (U+0085)",
    "\u2028": "a line separator (U+2028)",
    "\u2029": "a paragraph separator (U+2029)",
}


def is_line_break(char: str) -> bool:
    """Whether `char` is a line break to `str.splitlines` (and so to some
    editors and viewers) other than `\n`: none may stand in a rule file."""
    return len(char) == 1 and char != "\n" and len(f"a{char}a".splitlines()) > 1


def line_break_at(line: str, col: int) -> int:
    """The column of the first line break (`is_line_break`) in `line` (a line
    of the file, split at `\n`) at or after `col`, or 0; the `\r` of a
    closing `\r\n` is a line end, not a break."""
    body = line.removesuffix("\r")
    for i in range(col - 1, len(body)):
        if is_line_break(body[i]):
            return i + 1
    return 0


def line_break_error(char: str, whole_file_has_no_newline: bool) -> tuple[str, str]:
    """The message and hint of SR001 for a line break that does not end a line."""
    name = _BREAK_NAMES.get(char, show_char(char))
    message = f"{name}: a line of a rule file ends only at `\\n` or `\\r\\n`"
    if char == "\r" and whole_file_has_no_newline:
        return message, "this file has lone `\\r` line ends (old Mac line ends); save it with `\\n` line ends"
    return message, (
        "editors and Python's `str.splitlines` may show the text after it as a line of its own, "
        "which the parser would not: where a line should end, write a newline (`\\n`); "
        "anywhere else, delete the character"
    )


_KEYWORDS = ("mesh", "include", "alias", "rules", "default", "replicated", "auto", "logical")


def hint_for(found_type: str, found: str, expected: set[str]) -> str:
    if found_type == "NAME":
        close = did_you_mean(found.lower(), _KEYWORDS)
        if close and found not in _KEYWORDS:
            return close + " (keywords are lower case)" if found.lower() in _KEYWORDS else close
    if found_type == "STRING" and expected & {"LPAR", "RPAR", "ELLIPSIS", "UNSHARDED"}:
        return "mesh axes and aliases are written without quotes, e.g. (data, model)"
    if found_type == "STRING" and "NAME" in expected:
        return "names are written without quotes, e.g. `rules params:` or `alias embed = fsdp`"
    if "STRING" in expected and found_type == "NAME":
        return f'patterns are quoted: "{found}"; statements start with mesh, include, alias, rules or default'
    if {"LPAR", "REPLICATED"} <= expected and found_type == "NAME":
        return f"a spec has one entry per dimension in parentheses: ({found})"
    if expected == {"COLON"}:
        return "a group header ends with a colon, e.g. `rules params:`"
    if "ARROW" in expected:
        return 'a rule reads "pattern" -> (spec)'
    if "RPAR" in expected and found_type == "_NL":
        return "close the parenthesis; a rule fits on one line"
    if found_type in ("_NL", "$END") and expected & {"NAME", "LPAR", "ELLIPSIS", "UNSHARDED"}:
        return "the spec stops early: write its next entry and close the parenthesis on this line"
    return ""


def layout_hint(before: str, rest: str, expected: set[str]) -> str:
    """A hint from the text around an unexpected token: `before` it on its line,
    and the `rest` of the line from it."""
    head, char = before.strip(), rest[0]
    if rest.startswith("//"):
        return "comments start with `#`"
    if char in "[{":
        return "a spec is written in parentheses, e.g. (fsdp, model)"
    if char == ";":
        return "a statement ends with its line; remove the `;`"
    if char in ".\u2026" and "ELLIPSIS" in expected:
        return "write `...`, three ASCII dots"
    if char == "?":
        if head.startswith("alias"):
            return "an alias cannot be optional; write the `?` in the spec that uses it, e.g. (vocab?)"
        return "`?` follows the axis it makes optional, e.g. (fsdp, model?)"
    if char == "-" and "ARROW" in expected:
        return 'a rule reads "pattern" -> (spec), with nothing between `-` and `>`'
    word = re.search(r"\w+$", before)
    if char == "-" and word is not None:
        joined = word.group() + "_" + re.match(r"-(\w*)", rest).group(1)  # type: ignore[union-attr]
        return f"names are letters, digits and `_`, e.g. `{joined}`"
    if re.search(r"min_bytes\s*=\s*[0-9][\w.]*\s*$", before):
        return "write a size as digits and an optional unit, without spaces: 1048576 or 1MiB"
    if "NUMBER" in expected and head.startswith("mesh"):
        return "a mesh axis size is a positive whole number or `*`, e.g. `mesh data=2, model=*`"
    if char == ":" and head.startswith("mesh"):
        return "mesh axis sizes are written with `=`, e.g. `mesh data=2, model=4`"
    if char == "=" and re.search(r"auto\(\s*\w+$", head):
        return "auto() takes its mesh axes first, e.g. auto(fsdp, min_bytes=1MiB)"
    if char == "(" and head == "mesh":
        return "list the axes without parentheses: `mesh data, fsdp, model`"
    if char == "(" and head.endswith("replicated"):
        return "`replicated` takes no parentheses"
    if char == "(" and "NAME" in expected:
        return "a dimension takes one flat tuple of axes, e.g. ((data, fsdp), model)"
    if char == ")" and head.endswith(","):
        return "remove the comma before `)`"
    if char == '"' and "NUMBER" in expected:
        return "sizes are written without quotes, e.g. min_bytes=1MiB"
    if "LPAR" in expected and head.endswith("auto"):
        return "auto takes its axes in parentheses, e.g. auto(fsdp)"
    if expected & {"EQUAL", "NAME"} and head.startswith("alias"):
        return "an alias reads `alias NAME = AXES`, e.g. alias embed = fsdp"
    if "COMMA" in expected and char.isascii() and (char.isalpha() or char == "_"):
        if head.startswith("mesh"):
            return "separate the mesh axes with commas, e.g. `mesh data, fsdp`"
        return "separate the entries with commas, e.g. (fsdp, model)"
    if rest.startswith("->"):
        return 'a rule starts with its quoted pattern, e.g. "attn/kernel" -> (fsdp, model)'
    if char == "\x00":
        return "rule files are UTF-8 text; this one holds a NUL character (is it a binary file?)"
    if not char.isascii():
        plain = "a plain space" if char.isspace() else "its ASCII look-alike"
        return f"outside quotes and comments rule files are ASCII: replace {show_char(char)} with {plain}"
    if char in "]}" and head.endswith(")"):
        return f"remove the `{char}`: a spec is written in round parentheses, e.g. (fsdp, model)"
    if expected <= {"_NL", "COMMENT"}:
        return "one statement per line: move this to a line of its own"
    return ""


def expected_hint(expected: set[str]) -> str:
    """A hint from what the parser expected, for a token nothing more specific
    explains: the form of the statement it is in."""
    if "ARROW" in expected:
        return 'a rule reads "pattern" -> (spec), with `->` after the closing quote'
    if expected & {"RPAR", "OPTIONAL"}:
        return "a spec lists mesh axes or aliases, separated by commas, in parentheses, e.g. (fsdp, model?)"
    if "EQUAL" in expected or "STAR" in expected:
        return "a mesh line names its axes, each with an optional size: `mesh data=2, model=*`"
    return (
        'a line is one of: `mesh AXES`, `include "FILE"`, `alias NAME = AXES`, `rules GROUP:`, '
        '`"PATTERN" -> SPEC` or `default -> SPEC`, optionally followed by a `#` comment'
    )


_PYTHON_SPEC = re.compile(r"^\s*(?:jax\s*\.\s*sharding\s*\.\s*)?(?:P|PartitionSpec)\s*\((.*)\)\s*(?:#.*)?$")


def python_spec_hint(after_arrow: str) -> str:
    """A hint for a spec written as Python (`P(None, 'model')`,
    `PartitionSpec('data', None)`, `None`, `(None, 'model')`), in the rule
    language's spelling (`(_, model)`); `""` if `after_arrow` is not one."""
    text = after_arrow.split("#", 1)[0].strip()
    if text == "None":
        return "a spec is not Python: write `replicated` for an array no dimension of which is sharded"
    found = _PYTHON_SPEC.match(text)
    inner = found.group(1) if found else text[1:-1] if text.startswith("(") and text.endswith(")") else None
    if inner is None or not (found or re.search(r"None|['\"]", inner)):
        return ""
    try:
        entries = ast.literal_eval(f"({inner},)") if inner.strip() else ()
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return ""
    written = [_entry_text(e) for e in entries]
    if not all(written):
        return ""
    spec = "(" + ", ".join(written) + ")" if written else "replicated"
    return (
        f"a spec is not Python: write `{spec}` (`_` for None, names without quotes, a tuple for several axes)"
    )


def _entry_text(entry: object) -> str:
    if entry is None:
        return "_"
    if isinstance(entry, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", entry):
        return entry
    if isinstance(entry, tuple) and entry and all(isinstance(e, str) for e in entry):
        names = [_entry_text(e) for e in entry]
        return "(" + ", ".join(names) + ")" if all(names) else ""
    return ""
