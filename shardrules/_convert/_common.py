"""What every converter shares: the result (`Conversion`), reading a source
file, importing a `module:attr` source, what the language accepts as a name or
a pattern literal (and refuses as a pattern), a `PartitionSpec` as a spec, and
the finished text: a provenance header, the notes (what
did not convert exactly), formatted canonically and checked by loading it."""

from __future__ import annotations

import dataclasses
import os
import re
import reprlib
import stat
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._errors import ShardRulesError
from .._imports import import_attr
from .._language._build import pattern_problem
from .._language._files import MAX_FILE_BYTES
from .._language._format import format_text
from .._language._includes import MAX_LINES, MAX_RULES
from .._language._load import loads
from .._pspec import entries as spec_entries

MAX_SOURCE_BYTES = 4 << 20
"""The largest source read (4 MiB): configs and plans are a few kilobytes."""

MAX_NOTES_WRITTEN = 100
"""The most notes written as comments in the rule file; `Conversion.notes`
(and `shardrules convert`'s standard error) has them all."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NOT_NAMES = frozenset({"_", "auto", "explicit", "unconstrained"})
_MODULE = re.compile(r"[^\W\d]\w*(?:\.[^\W\d]\w*)*")

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 60, 60, 40
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6


class SourceError(ValueError):
    """A source that cannot be converted: not what its format reads, or malformed."""


@dataclasses.dataclass(frozen=True)
class Conversion:
    """A rule file converted from another project's sharding rules.

    `text` is the rule file (canonical layout, ending in a newline), `notes`
    says what could not be converted exactly (each also a comment at the top
    of `text`), `format` is the source's format (`maxtext`, `flax`, `hf` or
    `regex`) and `source` what was read, as shown in the provenance comment.
    """

    text: str
    notes: tuple[str, ...]
    format: str
    source: str

    @property
    def exact(self) -> bool:
        """Whether everything converted exactly: no notes."""
        return not self.notes


def is_name(text: object) -> bool:
    """Whether `text` can be a mesh axis or alias name in a rule file: the
    language's name characters, and none of the words it reads otherwise
    where converters write names (`mesh auto` is an axis type, an
    `unconstrained` entry is not an axis)."""
    return isinstance(text, str) and text not in _NOT_NAMES and _NAME.fullmatch(text) is not None


def one_line(text: str) -> str:
    """`text` with line breaks and other unprintable characters escaped
    (`\\n`, `\\x85`, ...): what input text becomes in a comment or message,
    so that it can never start a line of its own."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def shown(value: object, limit: int = 160) -> str:
    """`value` (a str, or a short repr of anything else) safe to put in a
    comment or message: on one line (`one_line`) and at most about `limit`
    characters, whatever the value holds (a config's aliases can stand for
    millions of values; an integer can have too many digits to print)."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = _REPR.repr(value)
        except Exception:  # a repr that raises: an integer too long to print, a user's __repr__
            text = f"<{type(value).__name__}>"
    if len(text) <= limit:
        return one_line(text)
    return one_line(text[:limit]) + f"... ({len(text):,} characters)"


def check_count(count: int, where: str, what: str) -> None:
    """Refuse, before any of them is converted, more source rules than a rule
    file may hold (`what`: what they are, for the message)."""
    if count > MAX_RULES:
        raise SourceError(
            f"{where}: {count:,} {what}, more than the {MAX_RULES:,} rules a rule file may hold (SR009); "
            "a model needs tens: check that this is the source you meant"
        )


def pattern_literal(regex: str) -> str:
    """The rule-file string for the regular expression `regex`, meaning the same:
    a bare `"` becomes `\\"`, a line break, tab or other control character its
    escape (`\\n`, `\\x0b`: no raw control character reaches the file; the
    literal's text is taken verbatim, backslashes included, so an escaped quote
    is a quote). U+2028 and U+2029, line breaks a rule file may not hold and
    that no escape writes alike for Python and RE2, become `\\S` (in both, any
    character but ASCII whitespace; in a set too), which matches them."""
    out: list[str] = []
    i = 0
    while i < len(regex):
        c = regex[i]
        if c == "\\" and i + 1 < len(regex):
            nxt = regex[i + 1]
            out.append(_escape(nxt) if _is_control(nxt) else _BREAKS.get(nxt, "\\" + nxt))  # `\<tab>`: `\t`
            i += 2
            continue
        out.append(
            '\\"' if c == '"' else "\\\\" if c == "\\" else _escape(c) if _is_control(c) else _plain(c)
        )
        i += 1
    return '"' + "".join(out) + '"'


_BREAKS = {"\u2028": "\\S", "\u2029": "\\S"}
"""Line breaks above U+00FF (no `\\xHH` escape), and what matches them."""


def _plain(c: str) -> str:
    """A character that is not a control character, as the pattern writes it."""
    return _BREAKS.get(c, c)


def _is_control(c: str) -> bool:
    return ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0


def _escape(c: str) -> str:
    """A control character as a regex escape both engines read alike."""
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c) or f"\\x{ord(c):02x}"


def read_text(path: str | os.PathLike[str], what: str) -> str:
    """The UTF-8 text of the source file at `path` (`what` it should be, for
    messages). Only regular files are read, at most `MAX_SOURCE_BYTES`.

    **Raises:** `FileNotFoundError`, `OSError` for a file that cannot be read,
    `SourceError` for one that is not UTF-8 or too large."""
    where = Path(path)
    fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, f"is a folder, not {what}", str(path))
        if not stat.S_ISREG(mode):
            raise OSError(f"{path}: not a regular file (a FIFO, a device or a socket), not {what}")
        data = f.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise SourceError(f"{path}: larger than {MAX_SOURCE_BYTES >> 20} MiB; {what} is a small text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SourceError(f"{path}: not UTF-8 text ({err.reason}); expected {what}") from None


def import_object(spec: str, example: str) -> Any:
    """The object `module:attr` names (see `_imports.import_attr`); a
    `SourceError` saying what is wrong otherwise (`example`: a spec to show),
    also when importing it runs code that raises or exits."""
    module_name, sep, attr = spec.partition(":")
    if sep and module_name and attr and _MODULE.fullmatch(module_name) is None:
        raise SourceError(
            f"{shown(spec)}: `{shown(module_name)}` is not a module name; write `module:attr` with a "
            f"dotted module name (no leading dot), e.g. `{example}`"
        )
    try:
        return import_attr(spec, example, SourceError)
    except SourceError:
        raise
    except SystemExit as exit_:
        raise SourceError(f"{shown(spec)}: importing it exited (SystemExit: {shown(exit_.code)})") from None
    except Exception as err:
        raise SourceError(
            f"{shown(spec)}: importing it raised {type(err).__name__}: {shown(str(err))}"
        ) from None


def called(obj: Any, where: str) -> Any:
    """`obj`, or what it returns when it is a function (called with no
    arguments): a `module:attr` source may name the rules or a function
    returning them (EasyLM's `LLaMAConfig.get_partition_rules`). What the
    call raises, `SystemExit` included, is a `SourceError`."""
    if not callable(obj) or isinstance(obj, type):
        return obj
    try:
        return obj()
    except TypeError as err:
        raise SourceError(
            f"{shown(where)}: names a function that cannot be called with no arguments: {shown(str(err))}"
        ) from None
    except SystemExit as exit_:
        raise SourceError(
            f"{shown(where)}: names a function that exited (SystemExit: {shown(exit_.code)}) instead of "
            "returning the rules"
        ) from None
    except Exception as err:
        raise SourceError(
            f"{shown(where)}: names a function that raised {type(err).__name__}: {shown(str(err))}"
        ) from None


def finish(fmt: str, source: str, read: list[str], body: list[str], notes: list[str]) -> Conversion:
    """The `Conversion` of the rule-file lines `body`: a provenance comment
    (`fmt`, `source`, the lines of `read` saying what was read), the notes as
    comments (the first `MAX_NOTES_WRITTEN`), then `body`; formatted
    canonically and checked by loading it.

    Input text reaches the file only escaped: in comments through `shown`
    and `one_line`, in patterns through `pattern_literal`, as names only when
    `is_name`. A body line that would still break in two is refused here, so
    no input can add a line (a rule) of its own."""
    for line in body:
        if "\n" in line or "\r" in line:
            raise SourceError(
                f"{shown(source)}: a converted line would break in two ({shown(line)}); nothing is written"
            )
    lines = [f"# Converted by shardrules convert {fmt} from {shown(source, 1000)}"]
    lines += [f"# {one_line(line)}" for line in read]
    if notes:
        lines.append(f"# Not converted exactly ({len(notes)}):")
        for note in notes[:MAX_NOTES_WRITTEN]:
            wrapped = textwrap.wrap(one_line(note), width=96, break_on_hyphens=False, break_long_words=False)
            lines += [("#   - " if i == 0 else "#     ") + part for i, part in enumerate(wrapped)]
        if len(notes) > MAX_NOTES_WRITTEN:
            lines.append(
                f"#   - and {len(notes) - MAX_NOTES_WRITTEN:,} more (Conversion.notes, standard error)"
            )
    text = "\n".join([*lines, "", *body]) + "\n"
    _check_size(text, source)
    name = f"<convert {fmt}>"
    try:
        text = format_text(text, name)
        loads(text, name=name)
    except ShardRulesError as err:
        raise SourceError(f"{shown(source)}: the converted rules do not load:\n{err}") from None
    return Conversion(text, tuple(notes), fmt, source)


def _check_size(text: str, source: str) -> None:
    """Refuse, before it is parsed, a converted text over a rule file's limits (SR009)."""
    size, lines, rules = len(text.encode("utf-8", "surrogatepass")), text.count("\n"), text.count("->")
    over = [
        f"{size:,} bytes (at most {MAX_FILE_BYTES:,})" if size > MAX_FILE_BYTES else "",
        f"{lines:,} lines (at most {MAX_LINES:,})" if lines > MAX_LINES else "",
        f"{rules:,} rules (at most {MAX_RULES:,})" if rules > MAX_RULES else "",
    ]
    if any(over):
        raise SourceError(
            f"{shown(source)}: the converted rule file would have {', '.join(o for o in over if o)}: more "
            "than a rule file may hold (SR009); nothing is written"
        )


def refused_pattern(literal: str) -> tuple[str, str] | None:
    """Why the rule file refuses the pattern `literal` (as `pattern_literal`
    writes it: its text between the quotes is the pattern), or `None`.

    **Returns:** `(what, fix)`, each on one line: the code and what the
    pattern uses (`SR017 unsupported regular expression: a backreference
    ...`), and how to write it instead, ending with the page that says more
    (`...; see docs/language.md#patterns`), not in parentheses."""
    _, problem = pattern_problem(literal[1:-1])
    if problem is None:
        return None
    fix = re.sub(r" \(see ([^()]*)\)$", r"; see \1", problem.hint)
    return shown(f"{problem.code} {problem.message}", 300), shown(fix, 300)


def spec_text(spec: Any, what: str, where: str, notes: list[str], axes: dict[str, None]) -> str:
    """The rule-file spec for the `PartitionSpec` `spec` (mesh axes it names
    added to `axes`); an entry with no equivalent is written `_`, with a note."""
    import jax

    partition_spec = jax.sharding.PartitionSpec
    if isinstance(spec, partition_spec):
        extra = [f"{k}={v}" for k in ("unreduced", "reduced") if (v := getattr(spec, k, None))]
        if extra:
            notes.append(f"{what}: its spec's {', '.join(extra)} is not converted")
        entries = list(spec_entries(spec))
    elif isinstance(spec, (tuple, list)):
        entries = list(spec)
    else:
        raise SourceError(f"{where}: {what}: {shown(spec)} is not a PartitionSpec")
    if not entries:
        return "replicated"
    out = []
    for entry in entries:
        names = (entry,) if isinstance(entry, str) else entry
        if entry is None or names == ():
            out.append("_")
            continue
        if isinstance(names, (tuple, list)) and names and all(is_name(n) for n in names):
            axes.update(dict.fromkeys(names))
            out.append(names[0] if len(names) == 1 else "(" + ", ".join(names) + ")")
            continue
        unconstrained = entry is partition_spec.UNCONSTRAINED
        notes.append(
            f"{what}: the entry {'UNCONSTRAINED' if unconstrained else shown(entry)} "
            + (
                "(XLA chooses) has no rule-file equivalent for parameters"
                if unconstrained
                else "is not a mesh axis name"
            )
            + "; written `_` (unsharded)"
        )
        out.append("_")
    return "(" + ", ".join([*out, "..."]) + ")"


def regex_pair(
    rule: Any, number: int, where: str, notes: list[str], axes: dict[str, None]
) -> tuple[str, str, str, tuple[str, str] | None]:
    """One `(regex, PartitionSpec)` rule of a Python rule list, checked:
    `(regex, literal, spec, refused)`, the regex as a rule file's pattern
    literal, the spec as rule-file text (its axes added to `axes`, its notes
    to `notes`), and `refused_pattern`'s `(what, fix)` where a rule file's
    regular expressions cannot say the regex (else `None`). A rule that is not
    such a pair, or whose regex Python does not compile, is a `SourceError`
    naming rule `number` of `where`."""
    if isinstance(rule, (str, bytes)) or not isinstance(rule, Sequence) or len(rule) != 2:
        raise SourceError(f"{where}: rule {number} is {shown(rule)}, not a (regex, PartitionSpec) pair")
    regex, spec = rule
    if not isinstance(regex, str):
        raise SourceError(f"{where}: rule {number}: {shown(regex)} is not a regular expression")
    try:
        re.compile(regex)
    except (re.error, OverflowError, ValueError, RecursionError) as err:
        raise SourceError(
            f"{where}: rule {number}: {shown(repr(regex))} is not a regular expression: {shown(str(err))}"
        ) from None
    text = spec_text(spec, f"rule {number} ({shown(repr(regex))})", where, notes, axes)
    literal = pattern_literal(regex)
    return regex, literal, text, refused_pattern(literal)
