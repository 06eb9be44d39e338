"""Rule patterns: which regular expressions a rule file may use, and the engine
that matches them.

Rule files come from other people's repositories, and a backtracking engine
(Python's `re`) can take exponential time on a pattern such as `(a|aa)+$`. No
analysis of a pattern can rule that out completely, so patterns are matched by
RE2, whose time is linear in the length of the path whatever the pattern.

A pattern is written in Python's syntax, and must mean the same to RE2 as to
Python's `re` (with `re.ASCII`: `\\d`, `\\w`, `\\s` and `\\b` are ASCII). That
leaves out what RE2 lacks (backreferences, lookarounds, atomic groups,
possessive repeats, conditionals, `\\Z`, verbose mode) and the few spellings
the two read differently (`x{,3}`, `x{,}`, `[[:alpha:]]`, `[^[:alpha:]]`, `\\B`);
each gets an SR017 that names the construct and says what to write instead. One difference remains, and is
documented: `$` is the end of the path (Python also allows a final newline
before it).
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable
from typing import Any

import re2

from . import _sets

# Python's own regex parser (the one `re.compile` uses); private, so untyped.
_p: Any = importlib.import_module("re._parser")
_c: Any = importlib.import_module("re._constants")

MAX_REPEAT = 1000  # RE2's largest repeat count
_MAX_MEM = 8 << 20  # RE2's memory budget for one compiled pattern (its default)
MAX_PROGRAM = 10_000
"""The largest compiled pattern accepted, in RE2 instructions. Matching takes
time proportional to the path's length times at most this; realistic patterns
take under 200 (`"e" + ".{0,30}" * 10` takes 2,706)."""

_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", None)} - {None}

Search = Callable[[bytes], Any]
"""A compiled pattern's `search`: a match (not `None`) where it occurs in a
path given as UTF-8 bytes."""


class UnsupportedPattern(Exception):
    """Why a valid Python pattern cannot be used in a rule file, and what to write instead."""

    def __init__(self, reason: str, hint: str):
        super().__init__(reason)
        self.reason, self.hint = reason, hint


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # errors are ours to report, not RE2's to print
    options.never_capture = True
    options.max_mem = _MAX_MEM
    return options


def check(pattern: str) -> int:
    """Raise `re.error` if `pattern` is not a Python regular expression, and
    `UnsupportedPattern` if RE2 cannot match it or would read it otherwise;
    else return the size of its compiled program (RE2 instructions)."""
    # `[[`, `--`, `&&`...: a set that RE2 reads otherwise, and Python warns about. Found
    # before parsing, so that Python never warns: catching its warning would change the
    # process's warning filters, which is not thread-safe (see `_sets`).
    if (ambiguous := _sets.ambiguous_set(pattern)) is not None:
        raise UnsupportedPattern(
            f"a character class that Python and RE2 read differently ({ambiguous.lower()})",
            "escape `[`, `-`, `&`, `~` and `|` inside a class with `\\`, and write POSIX classes "
            "as ranges: `[a-z]` rather than `[[:lower:]]`",
        )
    parsed = _p.parse(pattern)
    _constructs(_items(parsed))  # what is left to Python's compiler (lookbehind width) is refused here
    if parsed.state.flags & re.VERBOSE:
        raise UnsupportedPattern(
            "verbose mode `(?x)`",
            "write the pattern without spaces and comments; put comments after the rule",
        )
    _counts(pattern)
    _posix_classes(pattern)
    try:
        size = compiled(pattern).programsize
    except re2.error as err:
        raise _re2_error(err) from None
    if size > MAX_PROGRAM:
        raise _too_large(f"{size:,} instructions compiled, over the {MAX_PROGRAM:,} allowed")
    return size


_ASSERTIONS = {
    (True, True): "a lookahead `(?=...)`",
    (True, False): "a lookbehind `(?<=...)`",
    (False, True): "a negative lookahead `(?!...)`",
    (False, False): "a negative lookbehind `(?<!...)`",
}


_PLAIN = {_c.LITERAL, _c.NOT_LITERAL, _c.IN, _c.ANY, _c.CATEGORY}
_ATOMIC = {getattr(_c, name) for name in ("ATOMIC_GROUP", "POSSESSIVE_REPEAT") if hasattr(_c, name)}
_NO_BOUNDARY = {
    getattr(_c, name)
    for name in ("AT_NON_BOUNDARY", "AT_LOC_NON_BOUNDARY", "AT_UNI_NON_BOUNDARY")
    if hasattr(_c, name)
}


def _items(sub: Any) -> list[Any]:
    """The items of a parsed (sub)pattern, as a list (its `data`, when it has one)."""
    return sub.data if hasattr(sub, "data") else list(sub)


def _constructs(items: list[Any]) -> None:
    """Raise `UnsupportedPattern` for the first construct RE2 lacks."""
    for op, av in items:
        if op in _PLAIN:
            continue
        if op == _c.GROUPREF:
            raise UnsupportedPattern(
                "a backreference (`\\1`, `(?P=name)`)", "match the text itself; RE2 has no backreferences"
            )
        if op == _c.GROUPREF_EXISTS:
            raise UnsupportedPattern("a conditional group `(?(1)...|...)`", "write one rule for each case")
        if op in (_c.ASSERT, _c.ASSERT_NOT):
            raise UnsupportedPattern(
                _ASSERTIONS[op == _c.ASSERT, av[0] >= 0],
                "match the text itself; to leave some paths out, put a rule for them earlier in the "
                "group (the first matching rule wins)",
            )
        if op in _ATOMIC:
            raise UnsupportedPattern(
                "an atomic group `(?>...)` or possessive repeat (`a*+`, `a++`)",
                "drop the `?>` or the second `+`: RE2 never backtracks, so `(?>a+)` and `a++` mean `a+`",
            )
        if op == _c.AT and av == _c.AT_END_STRING:
            raise UnsupportedPattern("`\\Z`", "write `$`: in a rule pattern it is the end of the path")
        if op == _c.AT and av in _NO_BOUNDARY:
            raise UnsupportedPattern(
                "`\\B`, which engines read differently next to non-ASCII characters and in an empty path",
                "say what stands on each side instead, e.g. a `\\w` on the side that must be a letter",
            )
        if op in _REPEATS:
            low, high, sub = av
            if low > MAX_REPEAT or (high != _c.MAXREPEAT and high > MAX_REPEAT):
                raise UnsupportedPattern(
                    f"a repeat count over {MAX_REPEAT}", "paths are short: use `+` or `*`, or a smaller count"
                )
            _constructs(_items(sub))
        elif op == _c.SUBPATTERN:
            _constructs(_items(av[-1]))
        elif op == _c.BRANCH:
            for branch in av[1]:
                _constructs(_items(branch))


# A repeat count `{m}`, `{m,}`, `{m,n}` or `{,n}` (outside classes, not escaped).
_COUNT = re.compile(r"\{(\d*)(?:(,)(\d*))?\}")


def _outside_classes(pattern: str) -> str:
    """`pattern` with every escape and character class blanked out."""
    return re.sub(r"\\.|\[\^?\]?(?:\\.|[^\]\\])*\]", lambda m: "_" * len(m.group()), pattern, flags=re.S)


def _counts(pattern: str) -> None:
    """Refuse repeat counts that RE2 reads as literal text: `{,n}` (Python: 0
    to n), `{,}` (Python: any number, as `*`) and counts with a leading zero
    (`{01}`)."""
    for found in _COUNT.finditer(_outside_classes(pattern)):
        low, comma, high = found.groups()
        written = found.group()
        if not low and comma and not high:
            raise UnsupportedPattern(
                "`{,}`, which RE2 reads as literal text (Python: any number of times)",
                "write `*` for any number of times, or `\\{,\\}` for the text",
            )
        if not low and comma and high:
            raise UnsupportedPattern(
                f"`{written}`, which RE2 reads as literal text",
                f"write `{{0{written[1:]}` for up to that many",
            )
        if any(len(n) > 1 and n.startswith("0") for n in (low, high or "")):
            fixed = "{" + str(int(low or 0)) + (comma or "") + (str(int(high)) if high else "") + "}"
            raise UnsupportedPattern(
                f"`{written}`: a count with a leading zero, which RE2 reads as literal text",
                f"write `{fixed}`",
            )


# A character class as Python reads it: `[`, maybe `^`, maybe a leading `]`
# (a character there), then escapes and other characters up to `]`.
_CLASS = re.compile(r"\\.|(\[\^?\]?(?:\\.|[^\]\\])*\])", re.S)


def _posix_classes(pattern: str) -> None:
    """Refuse `[:` inside a character class when a `:]` follows: RE2 reads
    `[^[:alpha:]]` and `[a[:digit:]]` as POSIX classes, Python as the
    characters `[`, `:`, `a`, ... followed by a `]`. (A class that starts with
    `[[` is refused already: Python warns about it.)"""
    for found in _CLASS.finditer(pattern):
        if found.group(1) is None:
            continue
        body = re.sub(r"\\.", "__", found.group(1), flags=re.S)
        at = body.find("[:", 1)
        if at >= 0 and ":]" in pattern[found.start(1) + at + 2 :]:
            raise UnsupportedPattern(
                "`[:` inside a character class, which RE2 reads as a POSIX class such as `[:alpha:]` "
                "and Python as the characters `[` and `:`",
                "write `\\[` for the character `[`, and ranges for POSIX classes: `[^a-zA-Z]` rather than "
                "`[^[:alpha:]]`",
            )


def _for_re2(pattern: str) -> str:
    """`pattern` as RE2 must read it to mean what it means to Python with
    `re.ASCII`: `\\s` (and `\\S`) also take the vertical tab, as Python's do."""
    if "\\s" not in pattern and "\\S" not in pattern:
        return pattern
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            pair = pattern[i : i + 2]
            if pair in ("\\s", "\\S"):
                name = "[:space:]" if pair == "\\s" else "[:^space:]"
                out.append(name if in_class else f"[{name}]")
            else:
                out.append(pair)
            i += 2
            continue
        if char == "[" and not in_class:
            in_class = True
            out.append(char)
            i += 1
            for lead in ("^", "]"):  # `[^]...]`, `[]...]`: a leading `]` is a character
                if pattern.startswith(lead, i):
                    out.append(lead)
                    i += 1
            continue
        if char == "]" and in_class:
            in_class = False
        out.append(char)
        i += 1
    return "".join(out)


def _re2_error(err: Exception) -> UnsupportedPattern:
    message = (
        err.args[0].decode("utf-8", "replace") if err.args and isinstance(err.args[0], bytes) else str(err)
    )
    if "escape sequence" in message:
        escape = message.rpartition(": ")[2]
        return UnsupportedPattern(
            f"the escape `{escape}`, which RE2 does not have",
            "write the character itself, or `\\xHH` for an ASCII one (`[\\b]` is `\\x08`)",
        )
    if "too large" in message or "out of memory" in message:
        return _too_large("over RE2's memory budget")
    if "perl operator" in message or "flag" in message:
        operator = message.rpartition(": ")[2]
        operator += ")" if len(operator) == 3 else "...)"
        return UnsupportedPattern(
            f"the group or flag `{operator}`, which RE2 does not have",
            "remove it: `(?i)`, `(?m)` and `(?s)` are the flags RE2 knows; `\\d`, `\\w` and `\\s` are "
            "always ASCII",
        )
    return UnsupportedPattern(f"RE2 cannot compile it ({message})", "simplify the pattern")


def _too_large(detail: str) -> UnsupportedPattern:
    return UnsupportedPattern(
        f"too large to match quickly ({detail})",
        "use `.*` or `+` rather than large or many `{m,n}` counts, or split the pattern over several rules",
    )


@functools.lru_cache(maxsize=16384)
def compiled(pattern: str) -> Any:
    """RE2's compiled `pattern` (checked before), matching `str` or UTF-8 `bytes`."""
    return re2.compile(_for_re2(pattern).encode("utf-8", "surrogatepass"), _options())


def compiled_size(pattern: str) -> int:
    """The RE2 instructions `pattern` compiles to (cached, as `compiled`), not
    yet checked: what a load's budget counts before the file is parsed; 0 for
    a pattern RE2 cannot compile or over `MAX_PROGRAM` (SR017 once checked)."""
    try:
        size = compiled(pattern).programsize
    except re2.error:
        return 0
    return size if size <= MAX_PROGRAM else 0


def searcher(pattern: str) -> Search:
    """`pattern`'s search over a path's UTF-8 bytes (`path_bytes(path)`)."""
    return compiled(pattern).search


def path_bytes(path: str) -> bytes:
    """A path as the bytes patterns are searched in (lone surrogates kept)."""
    return path.encode("utf-8", "surrogatepass")


def search(pattern: str, path: str) -> bool:
    """Whether `pattern` occurs anywhere in `path`, as rules match."""
    return compiled(pattern).search(path_bytes(path)) is not None
