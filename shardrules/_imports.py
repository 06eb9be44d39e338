"""`module:attr` sources: a Python object named on the command line (shape
functions, train steps, other projects' rules), imported as `python -m` would."""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any

_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_ATTR = _MODULE


def import_attr(spec: str, example: str, error: type[Exception], what: str = "attr") -> Any:
    """The object `module:attr` names (`attr` may be dotted), imported with
    the working directory searched first, only while importing.

    **Arguments:**

    - `spec`: `module:attr`, e.g. `mymodel.shapes:llama_70b`.
    - `example`: a spec to show when `spec` is malformed.
    - `error`: the exception class to raise, with a message saying what is wrong.
    - `what`: how messages name the part after the colon (`attr`, `function`).

    **Returns:** the object.

    ```python
    import_attr("os.path:join", "pkg.mod:fn", ValueError)
    ```
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise error(f"{spec!r}: write `module:{what}`, e.g. `{example}`")
    if not _MODULE.fullmatch(module_name) or not _ATTR.fullmatch(attr):
        raise error(
            f"{spec!r}: {module_name!r} is not a module name; write `module:{what}`, e.g. `{example}`"
        )
    added = os.getcwd() not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        where = ""
        if isinstance(err, ModuleNotFoundError) and err.name == module_name.split(".")[0]:
            where = f" (looked for in the current directory, {os.getcwd()}, then on sys.path: run from the folder that holds it, or add that folder to PYTHONPATH)"
        raise error(f"{spec!r}: cannot import {module_name!r}: {err}{where}") from None
    except SystemExit as err:  # the module's own code exited on import
        raise error(f"{spec!r}: importing it exited (SystemExit: {err.code!r})") from None
    except Exception as err:  # the module's own code failed on import
        raise error(f"{spec!r}: importing it raised {type(err).__name__}: {err}") from None
    finally:
        if added:
            sys.path.remove(os.getcwd())
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise error(f"{spec!r}: {module_name!r} has no attribute {attr!r}") from None
    return obj
