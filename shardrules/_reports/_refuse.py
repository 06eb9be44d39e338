"""How the strict readers of plan files refuse a file: the SR124 error and the
values they quote, as JSON writes them and cut short. Shared by the reader of
a file's plan (`_dumpread`) and of the step cost it records (`_costfile`).
"""

from __future__ import annotations

import json
from typing import Any

from .._errors import Diagnostic, PlanFileError

REWRITE = "write the file again with `shardrules dump` or `Plan.to_json()` instead of editing it by hand"


def fail(what: str, hint: str = REWRITE, path: str | None = None) -> PlanFileError:
    """The error for a file that is not a plan file this shardrules reads."""
    return PlanFileError(
        Diagnostic("SR124", "error", f"not a shardrules plan file: {what}", path=path, hint=hint)
    )


def shown(value: Any, width: int = 60) -> str:
    """A value read from the file as JSON writes it (`true`, `"dm"`), cut to about `width` characters."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):  # pragma: no cover - values come from JSON
        text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."
