"""`convert_regex`: EasyLM / scalax `(regex, PartitionSpec)` rules as a rule file.

EasyLM's `match_partition_rules(rules, params)` renders each leaf's key path
joined with `/`, leaves scalars and size-1 arrays replicated, and gives every
other leaf the spec of the first rule whose regex `re.search` finds in the
path; a leaf no rule matches is an error. scalax's `TreePathShardingRule(*rules,
strict=True)` does the same; with `strict=False` an unmatched leaf is
replicated. A `PartitionSpec` shorter than the array leaves the trailing
dimensions unsharded, so `PS("fsdp", "tp")` becomes `(fsdp, tp, ...)`.

A regex the rule file's engine refuses (backreferences, lookarounds: see
SR017) cannot be converted: its rule is written as a comment and reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._common import (
    Conversion,
    SourceError,
    called,
    check_count,
    finish,
    import_object,
    regex_pair,
    shown,
)


def convert_regex(rules: Any, *, source: str | None = None) -> Conversion:
    """Convert EasyLM / scalax `(regex, PartitionSpec)` rules to a rule file.

    **Arguments:**

    - `rules`: a sequence of `(regex, PartitionSpec)` pairs, as EasyLM's
      `match_partition_rules` takes them; a scalax `TreePathShardingRule`
      (its `rules`, and `strict`); or `"module:attr"` naming either, or a
      function returning them when called with no arguments (EasyLM's
      `LLaMAConfig.get_partition_rules`).
    - `source`: what to call the rules in the provenance comment (default: the
      `module:attr`, or `<rules>`).

    **Returns:** a `Conversion`: a `mesh` line with the axes the specs name
    and `rules params:` with one rule per pair, in order (`default ->
    replicated` when unmatched leaves are replicated, scalax's
    `strict=False`).

    **Raises:** `ValueError` for a `module:attr` that does not import (or
    whose import or function raises or exits), more than 10,000 rules, pairs
    that are not `(regex, PartitionSpec)`, or a regex Python cannot compile.
    """
    where = source or (rules if isinstance(rules, str) else "<rules>")
    if isinstance(rules, str):
        rules = called(import_object(rules, "mymodel.sharding:partition_rules"), where)
    strict = True
    if hasattr(rules, "rules") and hasattr(rules, "strict"):  # scalax's TreePathShardingRule
        rules, strict = rules.rules, bool(rules.strict)
    if isinstance(rules, (str, bytes)) or not isinstance(rules, Sequence):
        raise SourceError(
            f"{where}: expected a list of (regex, PartitionSpec) pairs, got {type(rules).__name__}"
        )
    check_count(len(rules), where, "(regex, PartitionSpec) rules")
    notes: list[str] = []
    axes: dict[str, None] = {}  # the mesh axes named, in order
    lines: list[str] = []
    for number, rule in enumerate(rules, start=1):
        regex, literal, text, refused = regex_pair(rule, number, where, notes, axes)
        if refused:
            what, fix = refused
            notes.append(
                f"rule {number} ({shown(repr(regex))}): {what}, which a rule file's regular expressions "
                "cannot say: written as a comment, so the leaves it matched fall to the rules below. "
                f"To convert it, rewrite the regex: {fix}"
            )
            lines.append(f"# {literal} -> {text}  # not converted: {what}: {fix}")
            continue
        lines.append(f"{literal} -> {text}")
    if not strict:
        lines.append("default -> replicated")
    read = [
        f"Read: {len(rules)} (regex, PartitionSpec) rules"
        + ("; strict=False: a leaf no rule matches is replicated." if not strict else "."),
        "The first rule whose regex is found in a leaf's /-joined path wins; scalars and size-1",
        "arrays are replicated; trailing dimensions a spec leaves out are unsharded (`...`).",
    ]
    body = [f"mesh {', '.join(axes)}", ""] if axes else []
    body += ["rules params:", *("  " + line for line in lines)]
    return finish("regex", where, read, body, notes)
