"""What every converter shares: the result (`Conversion`), reading a source
file, importing a `module:attr` source, what the language accepts as a name or
a pattern literal, and the finished text: a provenance header, the notes (what
did not convert exactly), formatted canonically and checked by loading it."""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import textwrap
from pathlib import Path
from typing import Any

from .._errors import ShardRulesError
from .._imports import import_attr
from .._language._format import format_text
from .._language._load import loads

MAX_SOURCE_BYTES = 16 << 20
"""The largest source file read (16 MiB): configs and plans are a few kilobytes."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
    """Whether `text` can be a mesh axis or alias name in a rule file."""
    return isinstance(text, str) and text != "_" and _NAME.fullmatch(text) is not None


def shown(text: object) -> str:
    """`text` (a str, or the repr of anything else) safe to put in a comment:
    line breaks and other unprintable characters escaped."""
    if not isinstance(text, str):
        text = repr(text)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def pattern_literal(regex: str) -> str:
    """The rule-file string for the regular expression `regex`, meaning the same:
    a bare `"` becomes `\\"` and a line break its escape (the literal's text is
    taken verbatim, backslashes included, so an escaped quote is a quote)."""
    out: list[str] = []
    i = 0
    while i < len(regex):
        c = regex[i]
        if c == "\\" and i + 1 < len(regex):
            nxt = regex[i + 1]
            out.append("\\" + {"\n": "n", "\r": "r"}.get(nxt, nxt))
            i += 2
            continue
        out.append({'"': '\\"', "\n": "\\n", "\r": "\\r", "\\": "\\\\"}.get(c, c))
        i += 1
    return '"' + "".join(out) + '"'


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
    `SourceError` saying what is wrong otherwise (`example`: a spec to show)."""
    return import_attr(spec, example, SourceError)


def called(obj: Any, where: str) -> Any:
    """`obj`, or what it returns when it is a function (called with no
    arguments): a `module:attr` source may name the rules or a function
    returning them (EasyLM's `LLaMAConfig.get_partition_rules`)."""
    if not callable(obj) or isinstance(obj, type):
        return obj
    try:
        return obj()
    except TypeError as err:
        raise SourceError(
            f"{where}: names a function that cannot be called with no arguments: {err}"
        ) from None


def finish(fmt: str, source: str, read: list[str], body: list[str], notes: list[str]) -> Conversion:
    """The `Conversion` of the rule-file lines `body`: a provenance comment
    (`fmt`, `source`, the lines of `read` saying what was read), the notes as
    comments, then `body`; formatted canonically and checked by loading it."""
    lines = [f"# Converted by shardrules convert {fmt} from {shown(source)}"]
    lines += [f"# {shown(line)}" for line in read]
    if notes:
        lines.append(f"# Not converted exactly ({len(notes)}):")
        for note in notes:
            wrapped = textwrap.wrap(shown(note), width=96, break_on_hyphens=False, break_long_words=False)
            lines += [("#   - " if i == 0 else "#     ") + part for i, part in enumerate(wrapped)]
    text = "\n".join([*lines, "", *body]) + "\n"
    name = f"<convert {fmt}>"
    try:
        text = format_text(text, name)
        loads(text, name=name)
    except ShardRulesError as err:
        raise SourceError(f"{shown(source)}: the converted rules do not load:\n{err}") from None
    return Conversion(text, tuple(notes), fmt, source)
