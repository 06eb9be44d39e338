"""`convert_maxtext`: a MaxText YAML config's `mesh_axes` and
`logical_axis_rules` as a rule file.

MaxText lays parameters out with Flax: `nn.logical_to_mesh_sharding(names,
mesh, config.logical_axis_rules)` on the logical axis names of each
parameter, the mesh having `config.mesh_axes`. A `custom_mesh_and_rule/*.yml`
file replaces both lists (and `data_sharding`) of `base.yml` when named by
`custom_mesh_and_rule=NAME`, so each such file converts on its own, as
`base.yml` does. The output is a `mesh` line, one alias per logical name (see
`_logical`) and `rules params: default -> logical`.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ._common import Conversion, SourceError, finish, is_name, read_text, shown
from ._documents import EXTRA_HINT as EXTRA_HINT
from ._documents import parse_yaml as parse_yaml
from ._documents import yaml_module
from ._logical import alias_lines, read_rules

# Keys of a MaxText config that hold sharding settings this converter does not read.
_NOT_READ = {
    "data_sharding": "the input batch's sharding",
    "input_data_sharding_logical_axes": "the input batch's logical axes",
    "logical_axis_rules_for_eval": "the rules for evaluation",
    "custom_mesh_and_rule": "a custom mesh and rule file to load instead",
}


def convert_maxtext(
    config: str | os.PathLike[str] | Mapping[str, Any], *, source: str | None = None
) -> Conversion:
    """Convert a MaxText config's `mesh_axes` and `logical_axis_rules` to a rule file.

    **Arguments:**

    - `config`: the path of a MaxText YAML config (`base.yml`, or a
      `custom_mesh_and_rule/*.yml` file, whose lists replace `base.yml`'s), or
      the config already read, as a mapping.
    - `source`: what to call the config in the provenance comment (default:
      the path, or `<mapping>`).

    **Returns:** a `Conversion`: a `mesh` line with `mesh_axes`, one alias per
    logical name with its rules as alternatives in list order and `| _` last,
    and `rules params:` with `default -> logical`.

    **Raises:** `ImportError` naming the `yaml` extra when PyYAML is missing
    (only a path needs it); `FileNotFoundError` or `OSError` for a file that
    cannot be read; `ValueError` for one that is not YAML, is over the bounds
    of `_documents` (nesting, values with aliases expanded), has no
    `logical_axis_rules` list or more than 10,000 rules.
    """
    if isinstance(config, (str, os.PathLike)):
        yaml_module()  # before the file: a missing extra is said first
        where = source or os.fspath(config)
        return from_document(parse_yaml(read_text(config, "a MaxText YAML config"), where), where)
    return from_document(config, source or "<mapping>")


def from_document(data: Any, where: str) -> Conversion:
    """`convert_maxtext` of a YAML document already read (`data`: whatever it
    holds; `where`: the source, for messages and the provenance comment)."""
    if not isinstance(data, Mapping):
        raise SourceError(f"{where}: expected a MaxText config (a YAML mapping), got {type(data).__name__}")
    if "logical_axis_rules" not in data:
        raise SourceError(
            f"{where}: has no `logical_axis_rules`; name a config that sets them (e.g. base.yml)"
        )
    rules, notes = read_rules(data["logical_axis_rules"], f"{where}: logical_axis_rules")
    mesh_axes = _mesh_axes(data.get("mesh_axes"), where, notes)
    aliases, more = alias_lines(rules, mesh_axes or ())
    notes += more
    names = len({name for name, _ in rules})
    read = [
        f"Read: mesh_axes ({len(mesh_axes)} axes) and logical_axis_rules "
        f"({len(data['logical_axis_rules'])} rules for {names} names)."
        if mesh_axes is not None
        else f"Read: logical_axis_rules ({len(data['logical_axis_rules'])} rules for {names} names).",
        "Each alias holds a logical name's rules in order, then `_`: the first that applies wins,",
        "as in Flax's logical_to_mesh_axes (a name no rule applies to stays unsharded).",
    ]
    skipped = [f"{key} ({what})" for key, what in _NOT_READ.items() if data.get(key)]
    if skipped:
        read.append("Not read: " + "; ".join(skipped) + ".")
    if "base_config" in data:
        notes.append(
            f"the config inherits from {shown(data['base_config'])}, whose rules MaxText merges with these; "
            "only this file's rules are converted"
        )
    body = [f"mesh {', '.join(mesh_axes)}", ""] if mesh_axes else []
    body += [*aliases, "", "rules params:", "  default -> logical"]
    return finish("maxtext", where, read, body, notes)


def _mesh_axes(raw: Any, where: str, notes: list[str]) -> list[str] | None:
    """The config's `mesh_axes`, or `None` (with a note) when it has none."""
    if raw is None:
        notes.append(
            "the config has no `mesh_axes`: the rule file has no `mesh` line, so lint cannot check axis names"
        )
        return None
    if isinstance(raw, str) or not isinstance(raw, (list, tuple)):
        raise SourceError(f"{where}: mesh_axes should be a list of axis names, got {shown(raw)}")
    bad = [a for a in raw if not is_name(a)]
    if bad:
        more = f" (and {len(bad) - 5:,} more)" if len(bad) > 5 else ""
        raise SourceError(
            f"{where}: mesh_axes: {', '.join(shown(a) for a in bad[:5])}{more} cannot be a mesh axis name"
        )
    twice = sorted(a for a, n in Counter(raw).items() if n > 1)
    if twice:
        raise SourceError(f"{where}: mesh_axes names an axis twice: {shown(', '.join(twice))}")
    return list(raw)
