"""Reading rule files: a size limit, UTF-8, and errors that say what went
wrong with the path (not found: where it looked and what is close; a folder;
rule text passed where a path goes)."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

from .._errors import Diagnostic, ShardRulesError, Span, error_for

MAX_FILE_BYTES = 1 << 20
"""The largest rule file read (1 MiB); rule files are a few kilobytes."""


def read_rule_file(path: Path, display: str, span: Span | None, sources: dict[str, str] | None = None) -> str:
    """The text of a rule file, or an SR009 (too large) or SR005 (cannot be read)
    error that says why and what to do; `span` is the `include` line that named
    it (`None` for the top file), `display` the name to show."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise error_for(
                [
                    Diagnostic(
                        "SR009",
                        "error",
                        f"`{display}` is larger than {MAX_FILE_BYTES >> 20} MiB; rule files are small text files",
                        span,
                        hint="check that this is the rule file you meant",
                    )
                ],
                sources,
            )
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
    except UnicodeDecodeError as err:
        message, hint = f"`{display}` is not UTF-8 text ({err.reason})", "save the rule file as UTF-8"
    except (OSError, ValueError) as err:  # also a name too long for a path, or with a NUL in it
        if span is None and looks_like_rules(display):
            message, hint = _rule_text(display)
        else:
            shown = display if len(display) <= 80 else display[:60] + "…"
            message = f"cannot read `{shown}`: {err.strerror if isinstance(err, OSError) else err}"
            hint = (
                "check that the file exists and that this user may read it"
                if isinstance(err, OSError)
                else "a path cannot hold a NUL character; check how it was built"
            )
    raise error_for([Diagnostic("SR005", "error", message, span, hint=hint)], sources)


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
