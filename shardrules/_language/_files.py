"""Reading rule files: size limits, regular files only, UTF-8, and errors that
say what went wrong with the path (not found: where it looked and what is
close; a folder, a FIFO, a loop of links; rule text passed where a path goes)."""

from __future__ import annotations

import difflib
import errno
import os
import re
import stat
from pathlib import Path

from .._errors import Diagnostic, ShardRulesError, Span, error_for

MAX_FILE_BYTES = 1 << 20
"""The largest rule file read (1 MiB); rule files are a few kilobytes."""

MAX_TOTAL_BYTES = 2 << 20
"""The most bytes one load reads, over the file and all it includes (2 MiB)."""


def read_rule_file(
    path: Path,
    display: str,
    span: Span | None,
    sources: dict[str, str] | None = None,
    limit: int = MAX_FILE_BYTES,
) -> str:
    """The text of a rule file, or an SR009 (too large) or SR005 (cannot be read)
    error that says why and what to do; `span` is the `include` line that named
    it (`None` for the top file), `display` the name to show, `limit` the bytes
    it may hold (less than `MAX_FILE_BYTES` when other files of the same load
    have used part of `MAX_TOTAL_BYTES`). Only regular files are read: a FIFO
    or a device is refused without waiting on it."""
    try:
        # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(path)
            if not stat.S_ISREG(mode):
                raise _NotRegular(_kind(mode))
            data = f.read(limit + 1)
        if len(data) > limit:
            raise error_for([_too_large(display, span, limit)], sources)
        return data.decode("utf-8")
    except ShardRulesError:  # SR009 above: a ValueError, not a path that cannot be read
        raise
    except FileNotFoundError:
        message, hint = _not_found(path, display, included=span is not None)
    except IsADirectoryError:
        inside = sorted(p.name for p in path.glob("*.shard"))[:3]
        message = f"`{display}` is a folder, not a rule file"
        hint = (
            f"name a rule file in it, e.g. `{os.path.join(display, inside[0])}`"
            if inside
            else "name the rule file itself, e.g. `sharding/model.shard`"
        )
    except _NotRegular as err:
        message = f"`{display}` is {err.kind}, not a regular file"
        hint = "rule files are read only from regular files; name the rule file itself"
    except UnicodeDecodeError as err:
        message, hint = f"`{display}` is not UTF-8 text ({err.reason})", "save the rule file as UTF-8"
    except UnicodeEncodeError:
        message = f"`{_shown(display)}` cannot be a file name (it holds a lone surrogate character)"
        hint = "check how the path was built; file names are UTF-8 text"
    except (OSError, ValueError) as err:  # also a name too long for a path, or with a NUL in it
        if span is None and looks_like_rules(display):
            message, hint = _rule_text(display)
        elif isinstance(err, OSError) and err.errno == errno.ELOOP:
            message = f"`{_shown(display)}` is a loop of symbolic links"
            hint = "point the link at the rule file itself"
        else:
            message = f"cannot read `{_shown(display)}`: {err.strerror if isinstance(err, OSError) else err}"
            hint = (
                "check that the file exists and that this user may read it"
                if isinstance(err, OSError)
                else "a path cannot hold a NUL character; check how it was built"
            )
    raise error_for([Diagnostic("SR005", "error", message, span, hint=hint)], sources)


def resolved(path: Path, display: str, span: Span | None, sources: dict[str, str] | None = None) -> Path:
    """`path` made absolute with every symbolic link followed, or an SR005 that
    says why it cannot be (a loop of links, a name that cannot be encoded)."""
    try:
        return path.resolve()
    except RuntimeError:  # pathlib: "Symlink loop from ..."
        message = f"`{_shown(display)}` is a loop of symbolic links"
        hint = "point the link at the rule file itself"
    except UnicodeEncodeError:
        message = f"`{_shown(display)}` cannot be a file name (it holds a lone surrogate character)"
        hint = "check how the path was built; file names are UTF-8 text"
    except (OSError, ValueError) as err:
        message = f"cannot resolve `{_shown(display)}`: {err}"
        hint = "check the path"
    raise error_for([Diagnostic("SR005", "error", message, span, hint=hint)], sources)


def _too_large(display: str, span: Span | None, limit: int) -> Diagnostic:
    if limit < MAX_FILE_BYTES:
        return Diagnostic(
            "SR009",
            "error",
            f"`{display}` takes the rule files of this load over {MAX_TOTAL_BYTES >> 20} MiB in all",
            span,
            hint="rule files are small text files; check that the includes name the files you meant",
        )
    return Diagnostic(
        "SR009",
        "error",
        f"`{display}` is larger than {MAX_FILE_BYTES >> 20} MiB; rule files are small text files",
        span,
        hint="check that this is the rule file you meant",
    )


class _NotRegular(Exception):
    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def _shown(display: str) -> str:
    shown = display.encode("utf-8", "backslashreplace").decode("utf-8")
    return shown if len(shown) <= 80 else shown[:60] + "…"


def looks_like_rules(text: str) -> bool:
    """Whether a string given as a path is rule text instead."""
    return "\n" in text or re.search(r"->|^\s*(rules\s+\w+\s*:|mesh\s+\w|alias\s+\w+\s*=)", text) is not None


def _rule_text(text: str) -> tuple[str, str]:
    """The message and hint for rule text passed where a path goes."""
    first = text.strip().split("\n")[0]
    shown = first if len(first) <= 40 and first == text.strip() else first[:40] + "…"
    return (
        f"rule file `{shown}` not found: this is rule text, not the path of a rule file",
        "a str given as rules is read as a path; for rules in a string, call "
        "`shardrules.loads(text)` and pass the RuleSet it returns",
    )


def _not_found(path: Path, display: str, *, included: bool) -> tuple[str, str]:
    """The message and hint for a rule file that does not exist."""
    if included:
        return f"rule file `{display}` not found", "include paths are relative to the including file"
    if looks_like_rules(display):
        return _rule_text(display)
    tried = path.absolute()
    folder = tried.parent
    relative = (
        "" if path.is_absolute() else f"; a relative path starts from the current directory, {Path.cwd()}"
    )
    looked = "" if path.is_absolute() else f" (looked for {tried})"
    message = f"rule file `{display}` not found{looked}"
    if not folder.is_dir():
        return message, f"the folder {folder} does not exist{relative}"
    close = difflib.get_close_matches(path.name, [p.name for p in folder.glob("*.shard")], n=1, cutoff=0.6)
    if close:
        return message, f"did you mean `{os.path.join(os.path.dirname(display), close[0])}`?"
    return message, f"check the path{relative}"
