"""Warnings that a caller asked not to be told: `quiet()` and `warn`.

`step.cost`, `step.compare` and the command line's trace of a `--step` have
the step planned and traced again, and what that says was said before (or
comes back as findings). Python's `warnings.catch_warnings` would silence it by
changing the process's warning filters, which is not thread-safe: two threads
inside it at once can leave the filter installed, and every later warning of
the process is dropped. Here the decision travels in a context variable of
this thread (or task) instead, and a warning is then never made.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Iterator

_quiet: contextvars.ContextVar[bool] = contextvars.ContextVar("shardrules_quiet", default=False)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """While inside, `warn` makes no warning, in this thread or task only; no
    warning filter of the process changes."""
    token = _quiet.set(True)
    try:
        yield
    finally:
        _quiet.reset(token)


def warn(warning: Warning, stacklevel: int = 1, at: tuple[str, int] | None = None) -> None:
    """`warnings.warn(warning, stacklevel=...)`, `stacklevel` counted from
    the caller as there (`at`: shown at that file and line instead, with
    `warnings.warn_explicit`), unless inside `quiet()`."""
    if _quiet.get():
        return
    if at is not None:
        warnings.warn_explicit(warning, type(warning), at[0], at[1])
    else:
        warnings.warn(warning, stacklevel=stacklevel + 1)
