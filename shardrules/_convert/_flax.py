"""`convert_flax`: a Flax `logical_axis_rules` sequence as a rule file.

The rules are what `nn.logical_to_mesh_axes(names, rules)` and
`nn.logical_to_mesh_sharding` take: `(logical name, mesh axes)` pairs, the
axes a mesh axis name, a sequence of them, or `None`. The output is one alias
per logical name (see `_logical`) and `rules params: default -> logical`, with
no `mesh` line: Flax's rules do not say which mesh they are for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._common import Conversion, called, finish, import_object
from ._logical import alias_lines, read_rules


def convert_flax(rules: str | Sequence[Any], *, source: str | None = None) -> Conversion:
    """Convert Flax logical axis rules to a rule file.

    **Arguments:**

    - `rules`: a sequence of `(logical name, mesh axes)` pairs, as Flax's
      `logical_axis_rules` and `nn.logical_to_mesh_axes` take them (the axes: a
      mesh axis name, a sequence of them, or `None`), or `"module:attr"` naming
      one (`attr` may be dotted; the working directory is searched first), or
      a function that returns them when called with no arguments.
    - `source`: what to call the rules in the provenance comment (default: the
      `module:attr`, or `<rules>`).

    **Returns:** a `Conversion`: one alias per logical name with its rules as
    alternatives in list order and `| _` last, and `rules params:` with
    `default -> logical`; no `mesh` line.

    **Raises:** `ValueError` for a `module:attr` that does not import (or
    whose import or function raises or exits), more than 10,000 rules, or
    rules that are not such pairs.
    """
    where = source or (rules if isinstance(rules, str) else "<rules>")
    if isinstance(rules, str):
        rules = called(import_object(rules, "mymodel.sharding:LOGICAL_AXIS_RULES"), where)
    pairs, notes = read_rules(rules, where)
    aliases, more = alias_lines(pairs, ())
    notes += more
    read = [
        f"Read: {len(pairs)} logical axis rules for {len({name for name, _ in pairs})} names.",
        "Each alias holds a logical name's rules in order, then `_`: the first that applies wins,",
        "as in Flax's logical_to_mesh_axes (a name no rule applies to stays unsharded).",
    ]
    body = [*aliases, "", "rules params:", "  default -> logical"]
    return finish("flax", where, read, body, notes)
