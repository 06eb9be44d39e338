"""User code that a command runs: a `--step` train step and its module, a
`--shapes MODULE:FUNCTION` shape function, `convert`'s `module:attr` source.

What such code writes to standard output would be mixed into what the
command writes there (`dump -o -`, every `--format json`), so while it runs,
standard output goes to standard error: Python's `sys.stdout` (`print`) and
file descriptor 1 (`os.write(1, ...)`, C extensions) alike. A `SystemExit` it
raises is not the command's exit: callers turn it into a usage error
(`exited`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def output_to_stderr() -> Iterator[None]:
    """While inside, what is written to standard output goes to standard error."""
    sys.stdout.flush()  # what the command wrote before stays first, and where it was
    saved = None
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except (OSError, ValueError):  # no file descriptors 1 and 2 to swap (embedded): sys.stdout alone
        if saved is not None:
            os.close(saved)
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def exited(err: SystemExit) -> str:
    """How a message says that user code called `sys.exit`."""
    return f"exited (SystemExit: {err.code!r}, as `sys.exit` raises)"
