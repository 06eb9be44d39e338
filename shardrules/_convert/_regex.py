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

import re
from collections.abc import Sequence
from typing import Any

from .._language._build import pattern_problem
from .._pspec import entries as spec_entries
from ._common import (
    Conversion,
    SourceError,
    called,
    check_count,
    finish,
    import_object,
    is_name,
    pattern_literal,
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
        if isinstance(rule, (str, bytes)) or not isinstance(rule, Sequence) or len(rule) != 2:
            raise SourceError(f"{where}: rule {number} is {shown(rule)}, not a (regex, PartitionSpec) pair")
        regex, spec = rule
        if not isinstance(regex, str):
            raise SourceError(f"{where}: rule {number}: {shown(regex)} is not a regular expression")
        try:
            re.compile(regex)
        except (re.error, OverflowError, ValueError, RecursionError) as err:
            raise SourceError(
                f"{where}: rule {number}: {shown(repr(regex))} is not a regular expression: {shown(str(err))}"
            ) from None
        text = _spec(spec, f"rule {number} ({shown(repr(regex))})", where, notes, axes)
        literal = pattern_literal(regex)
        refused = _refused(literal)
        if refused:
            notes.append(
                f"rule {number} ({shown(repr(regex))}): the rule file's regular expressions cannot say this "
                f"one ({refused}); written as a comment, so the leaves it matched fall to the rules below"
            )
            lines.append(f"# {literal} -> {text}  # not converted: {refused}")
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


def _refused(literal: str) -> str | None:
    """Why the rule file refuses the pattern `literal` (as `pattern_literal`
    writes it: its text between the quotes is the pattern), on one line, or
    `None`."""
    _, problem = pattern_problem(literal[1:-1])
    if problem is None:
        return None
    return shown(f"{problem.code} {problem.message}; {problem.hint}", 400)


def _spec(spec: Any, what: str, where: str, notes: list[str], axes: dict[str, None]) -> str:
    """The rule-file spec for the `PartitionSpec` `spec` (mesh axes it names
    added to `axes`); an entry with no equivalent is written `_`, with a note."""
    import jax

    partition_spec = jax.sharding.PartitionSpec
    if isinstance(spec, partition_spec):
        extra = [f"{k}={v}" for k in ("unreduced", "reduced") if (v := getattr(spec, k, None))]
        if extra:
            notes.append(f"{what}: its spec's {', '.join(extra)} is not converted")
        entries = list(spec_entries(spec))
    elif isinstance(spec, (tuple, list)):
        entries = list(spec)
    else:
        raise SourceError(f"{where}: {what}: {shown(spec)} is not a PartitionSpec")
    if not entries:
        return "replicated"
    out = []
    for entry in entries:
        names = (entry,) if isinstance(entry, str) else entry
        if entry is None or names == ():
            out.append("_")
            continue
        if isinstance(names, (tuple, list)) and names and all(is_name(n) for n in names):
            axes.update(dict.fromkeys(names))
            out.append(names[0] if len(names) == 1 else "(" + ", ".join(names) + ")")
            continue
        unconstrained = entry is partition_spec.UNCONSTRAINED
        notes.append(
            f"{what}: the entry {'UNCONSTRAINED' if unconstrained else shown(entry)} "
            + (
                "(XLA chooses) has no rule-file equivalent for parameters"
                if unconstrained
                else "is not a mesh axis name"
            )
            + "; written `_` (unsharded)"
        )
        out.append("_")
    return "(" + ", ".join([*out, "..."]) + ")"
