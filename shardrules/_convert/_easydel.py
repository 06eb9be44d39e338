"""`convert_easydel`: an EasyDeL model config's `(regex, PartitionSpec)` rules as a rule file.

EasyDeL configs give `get_partition_rules()`, a tuple of `(regex,
PartitionSpec)` pairs that eformer's `match_partition_rules(rules, tree,
min_size=0)` applies: each leaf's key path joined with `/` (dict key, attribute
name, sequence index, as a rule file's paths are), the first rule whose regex
`re.search` finds in the path wins, a leaf no rule matches is an error. Scalars
and leaves without a shape are replicated; a matched leaf of fewer than
`min_size` elements is replicated (eformer's default is 0: none; EasyDeL 0.1's
eformer replicated every leaf under 16,384 elements); a spec longer than the
leaf's rank is cut to the rank. The mesh axes are the config's
(`dp, fsdp, ep, tp, sp` by default).

Each rule becomes one rule of the file (two, guarded by `elements`, with
`min_size`). What the file cannot say is reported, never dropped: a regex RE2
cannot match (backreferences, lookarounds: SR017) is refused (the command
exits 2), since leaving its rule out would give its leaves to later rules (a
config's catch-all `.*`) and change the layout; `convert_regex` writes it as
a comment instead, its output being a draft to finish by hand. A spec longer than a
leaf's rank, which eformer cuts, is SR103 when the file is applied: an error
naming the leaf, never a silent difference. Size-1 arrays, which eformer
matches like any other, are replicated by a rule file without a rule.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from typing import Any

from ._common import (
    Conversion,
    SourceError,
    check_count,
    finish,
    import_object,
    is_name,
    regex_pair,
    shown,
)

EASYDEL_AXES = ("dp", "fsdp", "ep", "tp", "sp")
"""EasyDeL's mesh axes, in its order (`sharding_axis_names`' default)."""

_UNICODE_CLASSES = re.compile(r"(?<!\\)(?:\\\\)*\\[dDwWsSbB]")


def convert_easydel(
    config: Any, *, min_size: int = 0, axes: Sequence[str] | None = None, source: str | None = None
) -> Conversion:
    """Convert an EasyDeL config's partition rules to a rule file.

    **Arguments:**

    - `config`: an EasyDeL config (anything with `get_partition_rules()`:
      an instance, or a class made with no arguments), its rules (a sequence
      of `(regex, PartitionSpec)` pairs), `"module:attr"` naming any of those,
      or a model type EasyDeL ships (`"llama"`: the config class of
      `easydel.modules.llama`, with its defaults).
    - `min_size`: eformer's `match_partition_rules(min_size=...)`: a matched
      leaf with fewer elements is replicated (default 0, eformer's; EasyDeL
      0.1 used 16384).
    - `axes`: the mesh axes, in order (default: the config's
      `sharding_axis_names` or `axis_names`, else `dp, fsdp, ep, tp, sp`, and
      any other axis a spec names after them).
    - `source`: what to call the rules in the provenance comment.

    **Returns:** a `Conversion`: a `mesh` line and `rules params:` with the
    rules in order.

    **Raises:** `ValueError` for a source that does not import or whose
    `get_partition_rules()` raises, pairs that are not `(regex,
    PartitionSpec)`, a regex Python cannot compile or RE2 cannot match
    (SR017: the message names the construct), a negative `min_size`, or
    more rules than a rule file may hold (10,000; 5,000 with `min_size`).
    """
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
        raise SourceError(f"min_size must be a whole number of elements, 0 or more; got {shown(min_size)}")
    where = source or (config if isinstance(config, str) else None)
    config, found = _config(config)
    where = where or found
    if isinstance(config, type):
        try:
            config = config()
        except (Exception, SystemExit) as err:
            raise SourceError(f"{where}: making it with no arguments raised {type(err).__name__}") from None
    rules = _rules(config, where)
    mesh_axes = _axes(config if axes is None else None, axes, where)
    check_count(len(rules) * (2 if min_size else 1), where, "rules (with their min_size guards)")
    notes: list[str] = []
    named: dict[str, None] = {}
    lines: list[str] = []
    unicode = False
    for number, rule in enumerate(rules, start=1):
        regex, literal, text, refused = regex_pair(rule, number, where, notes, named)
        if refused:  # left out, the leaves it takes would fall to later rules: refused
            what, fix = refused
            raise SourceError(
                f"{where}: rule {number} ({shown(repr(regex))}): {what}, which a rule file's regular "
                "expressions cannot say. Not converted: leaving the rule out would hand its leaves to the "
                f"rules below it and change the layout. Rewrite the regex: {fix}"
            )
        unicode = unicode or _UNICODE_CLASSES.search(regex) is not None
        if min_size:
            lines.append(f"{literal} -> replicated if elements < {min_size}")
        lines.append(f"{literal} -> {text}")
    mesh_axes += [a for a in named if a not in mesh_axes]
    read = [
        f"Read: {len(rules)} EasyDeL (regex, PartitionSpec) rules (eformer's match_partition_rules"
        + (f", min_size={min_size}" if min_size else "")
        + ").",
        "The first rule whose regex is found in a leaf's /-joined path wins; scalars and size-1 arrays",
        "are replicated (by eformer: scalars); trailing dimensions a spec leaves out are unsharded",
        "(`...`); a spec longer than a leaf's rank, which eformer cuts, is an error here (SR103).",
    ]
    if min_size:
        read.append(f"A matched leaf of fewer than {min_size:,} elements is replicated (the guarded rules).")
    if unicode:
        read.append("\\d, \\w, \\s and \\b are ASCII here and Unicode in Python: the same on ASCII paths.")
    body = [f"mesh {', '.join(mesh_axes)}", "", "rules params:", *("  " + line for line in lines)]
    return finish("easydel", where, read, body, notes)


_INSTALL = "docs/convert.md#easydel-easydel-model-configs"
"""The page's section with the install lines of EasyDeL's stack."""


def _config(config: Any) -> tuple[Any, str]:
    """The config or rules `config` names, and what to call it."""
    if not isinstance(config, str):
        name = type(config).__name__ if hasattr(config, "get_partition_rules") else "<rules>"
        if isinstance(config, type):
            name = config.__name__
        return config, name
    if ":" in config:
        return import_object(config, "easydel.modules.llama:LlamaConfig"), config
    if not is_name(config):
        raise SourceError(
            f"{shown(config)}: not an EasyDeL model type (`llama`) nor module:attr "
            "(easydel.modules.llama:LlamaConfig)"
        )
    try:
        module = importlib.import_module(f"easydel.modules.{config}")
    except ImportError as err:
        missing = getattr(err, "name", None)
        if missing == "easydel":
            why = (
                "EasyDeL is not installed here. Its models import only with their own pinned stack "
                "(EasyDeL 0.2.0.2, eformer 0.0.85, JAX 0.8): install it in a virtualenv of its own as "
                f"{_INSTALL} shows, and run the conversion there"
            )
        elif missing == f"easydel.modules.{config}":
            why = f"EasyDeL has no model type {config!r} (no module easydel.modules.{config})"
        else:
            why = (
                f"{type(err).__name__}: {shown(str(err))}. EasyDeL's models import only with their own "
                f"pinned stack (EasyDeL 0.2.0.2, eformer 0.0.85, JAX 0.8): see {_INSTALL}"
            )
        raise SourceError(f"easydel.modules.{config}: does not import: {why}") from None
    except (Exception, SystemExit) as err:
        raise SourceError(f"easydel.modules.{config}: importing it raised {type(err).__name__}") from None
    classes = [
        value
        for key, value in vars(module).items()
        if isinstance(value, type) and key.endswith("Config") and hasattr(value, "get_partition_rules")
    ]
    exact = [c for c in classes if vars(c).get("model_type") == config]  # its own, not inherited
    chosen = exact or classes
    if len(chosen) != 1:
        names = ", ".join(sorted(c.__name__ for c in chosen)) or "none"
        raise SourceError(
            f"easydel.modules.{config}: expected one config class, found {names}; "
            f"name it: easydel.modules.{config}:CLASS"
        )
    return chosen[0], f"easydel.modules.{config}:{chosen[0].__name__}"


def _rules(config: Any, where: str) -> Sequence[Any]:
    """The `(regex, PartitionSpec)` pairs of `config` (a config, a config
    class, a function returning the rules, or the rules)."""
    try:
        if hasattr(config, "get_partition_rules"):
            rules = config.get_partition_rules()
        elif callable(config):
            rules = config()
        else:
            rules = config
    except SystemExit as exit_:
        raise SourceError(f"{where}: getting its rules exited (SystemExit: {shown(exit_.code)})") from None
    except Exception as err:
        raise SourceError(
            f"{where}: getting its rules raised {type(err).__name__}: {shown(str(err))}"
        ) from None
    if rules is None:
        raise SourceError(
            f"{where}: get_partition_rules() returned None: this config has no regex rules (EasyDeL "
            "then shards by its modules' own hooks), so there is nothing to convert"
        )
    if isinstance(rules, (str, bytes)) or not isinstance(rules, Sequence):
        raise SourceError(f"{where}: expected (regex, PartitionSpec) pairs, got {type(rules).__name__}")
    return rules


def _axes(config: Any, axes: Sequence[str] | None, where: str) -> list[str]:
    """The mesh axes in order: `axes`, else the config's, else EasyDeL's default."""
    if axes is None and config is not None:
        for attr in ("sharding_axis_names", "axis_names"):
            found = getattr(config, attr, None)
            if isinstance(found, (tuple, list)) and found:
                axes = found
                break
    chosen = list(EASYDEL_AXES if axes is None else axes)
    for axis in chosen:
        if not is_name(axis):
            raise SourceError(f"{where}: the mesh axis {shown(axis)} is not a name a rule file can use")
    if len(set(chosen)) != len(chosen):
        raise SourceError(f"{where}: the mesh axes {shown(chosen)} name an axis twice")
    return chosen
