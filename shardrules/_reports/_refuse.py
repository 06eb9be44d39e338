"""How the strict readers of plan files refuse a file: the SR124 error and the
values they quote, as JSON writes them and cut short. Shared by the reader of
a file's plan (`_dumpread`) and of the step cost it records (`_costfile`,
`_targetfile`), with the checks of a cost's figures and objects both make.
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


COST_HINT = "write the file again with `shardrules dump --step` instead of editing it by hand"
MAX_FIGURE = 10**30
"""The largest figure a file may record (FLOPs, bytes, counts, seconds): far
beyond any step (a zettabyte), and small enough to compute with as a float."""


def cost_fail(what: str) -> PlanFileError:
    """SR124 for a step cost no writer would record."""
    return fail(what, hint=COST_HINT)


def figure(value: Any, where: str, *, whole: bool = False, null: bool = False, least: int = 0) -> Any:
    """`value` when it is a number (`whole`: a whole one) from `least` to
    `MAX_FIGURE` (`null`: or `None`); SR124 naming `where` otherwise."""
    if value is None and null:
        return None
    kinds = int if whole else (int, float)
    if (
        isinstance(value, bool)
        or not isinstance(value, kinds)
        or value != value  # NaN
        or not least <= value <= MAX_FIGURE
    ):
        kind = "a whole number" if whole else "a number"
        raise cost_fail(
            f"{where} is {kind} from {least} to 10^30{' or null' if null else ''}, not {shown(value)}"
        )
    return value


def exact_keys(value: Any, keys: tuple[str, ...], where: str) -> dict[str, Any]:
    """`value` when it is an object with exactly `keys`; SR124 naming `where` otherwise."""
    if not isinstance(value, dict):
        raise cost_fail(f"{where} is an object with the keys {', '.join(keys)}, not {shown(value)}")
    extra = [k for k in value if k not in keys]
    missing = [k for k in keys if k not in value]
    if extra:
        raise cost_fail(
            f"{where} has the key {shown(extra[0])}, which the format does not have (it has {', '.join(keys)})"
        )
    if missing:
        raise cost_fail(f"{where} lacks the key {missing[0]!r}")
    return value
