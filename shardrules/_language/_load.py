"""Rule files → `RuleSet`: the public `load` and `loads`.

Loading runs in four steps, each in its own module:

1. read the file and its includes into statements (`_includes`), each file
   refused before it is parsed if it takes the load over a limit: bytes,
   lines and rules (`_files`, `_includes`), the patterns' RE2 instructions
   (`_build.PatternBudget`);
2. check the `mesh` line and resolve the aliases (`_names`);
3. build the rules: patterns checked, specs resolved (`_build`);
4. bundle them in a frozen `RuleSet` (here).

A file that cannot be read or parsed stops at step 1; problems with the
includes are raised after step 1; everything steps 2 and 3 find is raised
together. Everything here needs no mesh.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from .._errors import Diagnostic, IncludeNotFoundError, ShardRulesError, error_for
from .._gcpause import paused
from ._build import PatternBudget, build_rules
from ._files import MAX_FILE_BYTES, read_rule_file, resolved
from ._includes import Statements, read_statements
from ._names import check_mesh, resolve_aliases
from ._rules import Rule, RuleSet
from ._syntax import MeshDecl


def load(path: str | os.PathLike[str], *, include_root: str | os.PathLike[str] | None = None) -> RuleSet:
    """Load a rule file and the files it includes.

    **Arguments:**

    - `path`: the rule file, e.g. `"sharding/llama.shard"`.
    - `include_root`: the folder that `include` lines may not leave; by default
      the folder of `path`.

    **Returns:** the `RuleSet`.

    **Raises:** `RuleSyntaxError`, `RuleDefinitionError`, `IncludeNotFoundError`.

    ```python
    rules = shardrules.load("sharding/llama.shard")
    params = shardrules.apply(params, rules)
    ```
    """
    display = os.fspath(path)
    root = Path(include_root if include_root is not None else Path(display).parent or ".")
    text = read_rule_file(Path(display), display, None)
    real = resolved(Path(display), display, None)
    top = resolved(root, os.fspath(root), None)
    return _load(text, display, real, top, explicit_root=include_root is not None)


def loads(
    text: str | bytes, name: str = "<string>", *, include_root: str | os.PathLike[str] | None = None
) -> RuleSet:
    """Load rules from a string.

    **Arguments:**

    - `text`: the rules (`bytes` are read as UTF-8).
    - `name`: the name errors show for this text.
    - `include_root`: the folder `include` paths are relative to and may not
      leave; by default the current directory.

    **Returns:** the `RuleSet`.

    ```python
    rules = shardrules.loads('''
    rules params:
      "kernel" -> (_, model)
      default  -> replicated
    ''')
    ```
    """
    root = Path(include_root if include_root is not None else ".").resolve()
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as err:
            raise error_for(
                [
                    Diagnostic(
                        "SR005", "error", f"`{name}` is not UTF-8 text ({err.reason} at byte {err.start})"
                    )
                ]
            ) from None
    if not isinstance(text, str):
        raise TypeError(f"rule text must be str or bytes, not {type(text).__name__}")
    if len(text) > MAX_FILE_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise error_for(
            [
                Diagnostic(
                    "SR009",
                    "error",
                    f"`{name}` is larger than {MAX_FILE_BYTES >> 20} MiB; rule files are small text files",
                    hint="check that this is the rule text you meant",
                )
            ]
        )
    return _load(text, name, root / "<string>", root, explicit_root=include_root is not None)


def _load(text: str, name: str, real: Path, root: Path, *, explicit_root: bool) -> RuleSet:
    """The `RuleSet` of rule text `text` (named `name`, at `real`), includes
    resolved under `root`; raises every problem found, together."""
    with paused():  # a large file makes many objects, none in a cycle: see `_gcpause`
        return _build_ruleset(text, name, real, root, explicit_root=explicit_root)


def _build_ruleset(text: str, name: str, real: Path, root: Path, *, explicit_root: bool) -> RuleSet:
    found = read_statements(
        text, name, real, root, explicit_root=explicit_root, before_parse=PatternBudget().scan
    )
    if found.errors:
        raise error_for(found.errors, found.sources)
    mesh = check_mesh(found.meshes, found.errors)
    alternatives: dict[str, tuple[tuple[str, ...], ...]] = {}
    aliases = resolve_aliases(found.alias_decls, mesh, found.errors, alternatives)
    groups, defaults = build_rules(found, mesh, aliases, alternatives=alternatives)
    if found.errors:
        raise error_for(found.errors, found.sources)
    return _ruleset(name, found, mesh, (aliases, alternatives), groups, defaults)


def _ruleset(
    name: str,
    found: Statements,
    mesh: MeshDecl | None,
    resolved: tuple[dict[str, tuple[str, ...]], dict[str, tuple[tuple[str, ...], ...]]],
    groups: dict[str, tuple[Rule, ...]],
    defaults: dict[str, Rule],
) -> RuleSet:
    """The `RuleSet`; `resolved`: the aliases of one alternative, and those with
    alternatives (in the order of their `alias` lines)."""
    aliases, alternatives = resolved
    named = {**aliases, **alternatives}
    first = {}  # each alias's first definition (a second is SR012)
    for alias in reversed(found.alias_decls):
        first[alias.name] = alias
    return RuleSet(
        name=name,
        mesh=mesh,
        alias_items=tuple(sorted(aliases.items())),
        alias_span_items=tuple((a.name, a.span) for a in found.alias_decls if a.name in named),
        group_span_items=tuple(found.headers.items()),
        group_items=tuple(groups.items()),
        default_items=tuple(defaults.items()),
        source_items=tuple(found.sources.items()),
        alternative_items=tuple(alternatives.items()),
        alternative_decls=tuple(first[n] for n in alternatives),
        acknowledged_items=tuple(found.acknowledged.items()),
        real_file_items=tuple((name, str(real)) for name, real in found.files.items()),
    )


def load_partial(path: str) -> tuple[RuleSet | None, list[Diagnostic], dict[str, str]]:
    """For `shardrules lint`: what can be planned of a rule file that has
    errors, and every finding of loading it. A file that cannot be read or
    parsed gives `(None, [its error])`; otherwise the `RuleSet` holds every
    rule it could build (a rule whose spec has an error keeps its place with an
    `"unresolved"` spec, and an SR302 note says so), and the findings list every
    load error, as `load` would raise them, plus those notes."""
    display = os.fspath(path)
    root = Path(display).parent or Path(".")
    try:
        text = read_rule_file(Path(display), display, None)
        real = resolved(Path(display), display, None)
        top = resolved(root, os.fspath(root), None)
        with paused():
            found = read_statements(
                text, display, real, top, explicit_root=False, before_parse=PatternBudget().scan
            )
            mesh = check_mesh(found.meshes, found.errors)
            alternatives: dict[str, tuple[tuple[str, ...], ...]] = {}
            aliases = resolve_aliases(found.alias_decls, mesh, found.errors, alternatives)
            notes: list[Diagnostic] = []
            groups, defaults = build_rules(found, mesh, aliases, partial=notes, alternatives=alternatives)
    except ShardRulesError as err:  # unreadable, or a syntax error: nothing to plan
        if isinstance(err, IncludeNotFoundError) and err.span is None:
            raise  # the file itself is missing: the caller's usage error
        return None, list(err.diagnostics), dict(getattr(err, "_sources", {}))
    rules = _ruleset(display, found, mesh, (aliases, alternatives), groups, defaults)
    return rules, [*found.errors, *notes] if found.errors else [], dict(found.sources)


def iter_rules(rules: RuleSet, group: str) -> Iterator[Rule]:
    """The rules of `group` in match order, its `default` last."""
    yield from rules.groups.get(group, ())
    if group in rules.defaults:
        yield rules.defaults[group]
