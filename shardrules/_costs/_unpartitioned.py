"""A step's FLOPs before XLA partitions it: the ideal when the step will not
compile for one device.

The ideal is the step compiled for one device of its mesh, its FLOPs divided
among the devices. A model that builds its layouts from a mesh it holds
itself (MaxText's) cannot be compiled for another mesh: it states shardings
on its own. The program JAX lowers for the step's mesh is still the whole
computation, before XLA splits it among the devices: XLA's cost analysis of
it counts the FLOPs of the whole step, each loop body once; `loop_extra`
adds the trips it leaves out, read from the program's counters. The text
XLA prints of a program it has not compiled names its instructions without
`%` and its computations without signatures; `long_form` writes it as the
compiled programs `_hlo` reads are written.

On the models where both can be had, this ideal is within 2% of the
one-device compile's (it counts the program before XLA's simplifications).
"""

from __future__ import annotations

import re
from typing import Any

_HEADER = re.compile(r"^(?P<entry>ENTRY\s+)?(?P<name>[\w.\-]+)\s*\{\s*$")
_DEFINED = re.compile(r"^(?P<indent>\s*)(?P<root>ROOT\s+)?(?P<name>[\w.\-]+)\s*=\s")
_NAME = re.compile(r"(?<![%\w.\-])(?P<name>[A-Za-z_][\w\-]*\.\d+)(?![\w.\-])")


def long_form(hlo: str) -> str:
    """`hlo` (an uncompiled program's text) with `%` before every name of an
    instruction or computation, and each computation's header as a
    signature (`%name () -> () {`)."""
    defined = set()
    for line in hlo.splitlines():
        if (m := _HEADER.match(line)) or (m := _DEFINED.match(line)):
            defined.add(m["name"])
    out = []
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header is not None:
            out.append(f"{header['entry'] or ''}%{header['name']} () -> () {{")
            continue
        m = _DEFINED.match(line)
        if m is None:
            out.append(line)
            continue
        rest = line[m.end() :]
        parts = rest.split('"')  # names are not changed inside quoted strings
        for k in range(0, len(parts), 2):
            parts[k] = _NAME.sub(lambda n: f"%{n['name']}" if n["name"] in defined else n["name"], parts[k])
        out.append(f"{m['indent']}{m['root'] or ''}%{m['name']} = " + '"'.join(parts))
    return "\n".join(out)


class Unpartitioned:
    """The lowered step read as `cost_of` reads a one-device compile: its
    cost analysis and its text (`long_form`)."""

    def __init__(self, lowered: Any) -> None:
        self._lowered = lowered

    def cost_analysis(self) -> Any:
        return self._lowered.cost_analysis()

    def as_text(self) -> str:
        return long_form(self._lowered.as_text(dialect="hlo"))
