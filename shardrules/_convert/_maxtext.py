"""`convert_maxtext`: a MaxText YAML config's `mesh_axes` and
`logical_axis_rules` as a rule file.

MaxText lays parameters out with Flax: `nn.logical_to_mesh_sharding(names,
mesh, config.logical_axis_rules)` on the logical axis names of each
parameter, the mesh having `config.mesh_axes`. A `custom_mesh_and_rule/*.yml`
file replaces both lists (and `data_sharding`) of `base.yml` when named by
`custom_mesh_and_rule=NAME`, so each such file converts on its own, as
`base.yml` does. Several configs (`base.yml`, then `models/NAME.yml`, then
overrides) are merged as MaxText merges them (`merge`). The output is a
`mesh` line, one alias per logical name (see `_logical`), and `rules
params:` with a rule for the RNG streams (arrays with no logical names, which
Flax leaves replicated) and `default -> logical`.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ._common import Conversion, SourceError, finish, is_name, read_text, shown
from ._documents import EXTRA_HINT as EXTRA_HINT
from ._documents import parse_yaml as parse_yaml
from ._documents import yaml_module
from ._logical import alias_lines, read_rules

# MaxText's RNG streams (an NNX model's `rngs`) carry no logical names: Flax's
# `get_partition_spec` leaves such arrays replicated. A model without them
# (the linen path) has nothing there, which the acknowledgement says.
RNG_RULE = [
    "  # RNG streams have no logical names; Flax replicates them (none in a linen model's state)",
    '  "(^|/)rngs/" -> replicated  # noqa: SR201',
]

# Keys of a MaxText config that hold sharding settings this converter does not read.
_NOT_READ = {
    "data_sharding": "the input batch's sharding",
    "input_data_sharding_logical_axes": "the input batch's logical axes",
    "logical_axis_rules_for_eval": "the rules for evaluation",
    "custom_mesh_and_rule": "a custom mesh and rule file to load instead",
}


Config = str | os.PathLike[str] | Mapping[str, Any]


def convert_maxtext(config: Config | Sequence[Config], *, source: str | None = None) -> Conversion:
    """Convert a MaxText config's `mesh_axes` and `logical_axis_rules` to a rule file.

    **Arguments:**

    - `config`: the path of a MaxText YAML config (`base.yml`, or a
      `custom_mesh_and_rule/*.yml` file, whose lists replace `base.yml`'s), or
      the config already read, as a mapping; or a list of them, merged in
      order as MaxText merges `base.yml`, `models/NAME.yml` and overrides: a
      later config's keys replace the earlier ones', and its
      `logical_axis_rules` replace the earlier rules for the same logical
      names (all of them: those rules are dropped, the new ones added at the
      end), or all the rules where it sets `override_logical_axis_rules: true`.
    - `source`: what to call the config in the provenance comment (default:
      the paths joined with ` + `, or `<mapping>`).

    **Returns:** a `Conversion`: a `mesh` line with `mesh_axes`, one alias per
    logical name with its rules as alternatives in list order and `| _` last,
    and `rules params:` with `"(^|/)rngs/" -> replicated` (MaxText's RNG
    streams, which carry no logical names and which Flax leaves replicated)
    and `default -> logical`.

    **Raises:** `ImportError` naming the `yaml` extra when PyYAML is missing
    (only a path needs it); `FileNotFoundError` or `OSError` for a file that
    cannot be read; `ValueError` for one that is not YAML, is over the bounds
    of `_documents` (nesting, values with aliases expanded), has no
    `logical_axis_rules` list or more than 10,000 rules.
    """
    configs = [config] if isinstance(config, (str, os.PathLike, Mapping)) else list(config)
    if not configs:
        raise SourceError("convert_maxtext: give at least one config")
    if any(isinstance(c, (str, os.PathLike)) for c in configs):
        yaml_module()  # before the files: a missing extra is said first
    documents, names = [], []
    for n, item in enumerate(configs, 1):
        if isinstance(item, (str, os.PathLike)):
            name = os.fspath(item)
            documents.append(parse_yaml(read_text(item, "a MaxText YAML config"), name))
        else:
            name = "<mapping>" if len(configs) == 1 else f"<mapping {n}>"
            documents.append(item)
        names.append(name)
    if len(documents) == 1:
        return from_document(documents[0], source or names[0])
    return from_documents(documents, names, source)


def from_documents(documents: Sequence[Any], names: Sequence[str], source: str | None = None) -> Conversion:
    """`convert_maxtext` of several configs already read, merged in order
    (`merge`); what each later one replaced is said in the provenance comment."""
    where = source or " + ".join(names)
    for document, name in zip(documents, names, strict=True):
        if not isinstance(document, Mapping):
            raise SourceError(
                f"{name}: expected a MaxText config (a YAML mapping), got {type(document).__name__}"
            )
    merged, said = merge(documents, names)
    merged.pop("base_config", None)  # the configs it inherits from are the ones given
    return from_document(merged, where, said)


def merge(documents: Sequence[Mapping[str, Any]], names: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """The configs merged as MaxText's `pyconfig` merges them, and a line per
    later config saying what it changed of the rules and the mesh."""
    merged: dict[str, Any] = {}
    said: list[str] = []
    for n, (document, name) in enumerate(zip(documents, names, strict=True)):
        new_rules = document.get("logical_axis_rules")
        rules = merged.get("logical_axis_rules")
        for key, value in document.items():
            if key != "logical_axis_rules":
                merged[key] = value
        if n and "mesh_axes" in document:
            said.append(f"{name} sets mesh_axes.")
        if not new_rules:
            continue
        if rules is None or not n:
            merged["logical_axis_rules"] = (
                list(new_rules) if isinstance(new_rules, (list, tuple)) else new_rules
            )
            continue
        if not isinstance(new_rules, (list, tuple)) or not isinstance(rules, (list, tuple)):
            merged["logical_axis_rules"] = new_rules  # read_rules says what is wrong with it
            continue
        if document.get("override_logical_axis_rules"):
            merged["logical_axis_rules"] = list(new_rules)
            said.append(f"{name} replaces all the rules (override_logical_axis_rules).")
            continue
        names_new = {r[0] for r in new_rules if isinstance(r, (list, tuple)) and r}
        kept = [r for r in rules if not (isinstance(r, (list, tuple)) and r and r[0] in names_new)]
        merged["logical_axis_rules"] = [*kept, *new_rules]
        listed = ", ".join(shown(x) for x in sorted(map(str, names_new))[:8])
        more = f" and {len(names_new) - 8} more" if len(names_new) > 8 else ""
        count = f"{len(names_new)} name" + ("s" if len(names_new) != 1 else "")
        said.append(f"{name} replaces the rules for {count} ({listed}{more}), now last.")
    return merged, said


def from_document(data: Any, where: str, merged: Sequence[str] = ()) -> Conversion:
    """`convert_maxtext` of a YAML document already read (`data`: whatever it
    holds; `where`: the source, for messages and the provenance comment;
    `merged`: what merging several configs changed, said in that comment)."""
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
        *merged,
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
    body += [*aliases, "", "rules params:", *RNG_RULE, "  default -> logical"]
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
