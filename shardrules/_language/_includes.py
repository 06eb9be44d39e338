"""Reading a rule file and the files it includes into one list of statements.

`include "common.shard"` is relative to the including file and may not leave
the include root; every file is read once (a second include of it adds
nothing), a cycle or nesting deeper than `MAX_INCLUDE_DEPTH` is an error.
The statements come out in file order with includes expanded in place: that
is the order in which rules match.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

from .._errors import Diagnostic, Findings, Span, error_for
from . import _acknowledge
from ._acknowledge import Acknowledged
from ._files import MAX_FILE_BYTES, MAX_TOTAL_BYTES, read_rule_file, resolved
from ._syntax import Alias, Include, MeshDecl, RuleLine, RulesHeader

MAX_INCLUDE_DEPTH = 16
"""How deep `include`s may nest."""

MAX_RULES = 10_000
"""The most rules one load may hold, over the file and all it includes."""

MAX_LINES = 50_000
"""The most lines one load may hold, blank and comment lines included."""


@dataclasses.dataclass
class Statements:
    """What a rule file and its includes say, sorted by kind, in file order.

    `sources` maps each file's name (as errors show it) to its text, and
    `files` to its resolved path: one name per file, so that two files shown
    under one name (`link/../common.shard` and `common.shard` where `link` is
    a symbolic link to a folder) do not share a name, a source or a `noqa`;
    `rule_lines` pairs each rule with its group; `headers` holds every
    `rules GROUP:` header's first place; `errors` what could not be read;
    `acknowledged` the warnings `# noqa: CODE` comments acknowledge, by line.
    """

    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    files: dict[str, Path] = dataclasses.field(default_factory=dict)
    meshes: list[MeshDecl] = dataclasses.field(default_factory=list)
    alias_decls: list[Alias] = dataclasses.field(default_factory=list)
    rule_lines: list[tuple[str, RuleLine]] = dataclasses.field(default_factory=list)
    headers: dict[str, Span | None] = dataclasses.field(default_factory=dict)
    errors: Findings = dataclasses.field(default_factory=Findings)
    acknowledged: Acknowledged = dataclasses.field(default_factory=dict)


def read_statements(
    text: str,
    name: str,
    real: Path,
    root: Path,
    *,
    explicit_root: bool,
    before_parse: Callable[[str, str, dict[str, str]], None] | None = None,
) -> Statements:
    """The statements of the rule text `text` and of every file it includes.

    **Arguments:**

    - `text`: the top-level file's text; `name`: its name in errors; `real`:
      its resolved path (includes are relative to its folder).
    - `root`: the resolved folder includes may not leave.
    - `explicit_root`: whether the caller chose `root` (then absolute include
      paths inside it are allowed).
    - `before_parse`: called with each file's text, name and the sources read
      so far, once its bytes, lines and rules are counted and before it is
      parsed: a check that raises refuses the file before the parser sees it
      (the loader's is `PatternBudget.scan`, the patterns' RE2 instructions).

    **Returns:** the `Statements`, with what is wrong with the includes
    (SR004 to SR008) in `errors`.

    **Raises:** at once, for a file that cannot be read as rules: a syntax
    error (`RuleSyntaxError`), or an included file that is missing or not
    UTF-8 (SR005, `IncludeNotFoundError`) or too large (SR009), or whatever
    `before_parse` raises.

    ```python
    found = read_statements(text, "llama.shard", Path("llama.shard").resolve(), Path(".").resolve(),
                            explicit_root=False)
    ```
    """
    reader = _Reader(root, explicit_root, before_parse)
    reader.visit(text, name, real)
    return reader.found


@dataclasses.dataclass
class _Reader:
    root: Path
    explicit_root: bool
    before_parse: Callable[[str, str, dict[str, str]], None] | None = None
    found: Statements = dataclasses.field(default_factory=Statements)
    done: set[Path] = dataclasses.field(default_factory=set)
    stack: list[tuple[Path, str]] = dataclasses.field(default_factory=list)
    bytes: int = 0
    lines: int = 0
    rules: int = 0  # counted as arrows before parsing: an upper bound

    def visit(self, text: str, name: str, real: Path, span: Span | None = None) -> None:
        text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark is not part of the rules
        self.count(text, name, span)
        self.found.sources[name] = text
        self.found.files[name] = real
        if self.before_parse is not None:
            self.before_parse(text, name, self.found.sources)
        from ._parse import parse  # Lark loads with the first file parsed, not with the package

        rule_file = parse(text, name)
        _acknowledge.read(rule_file.items, name, str(real), self.found.acknowledged, self.found.errors)
        self.done.add(real)
        self.stack.append((real, name))
        group: str | None = None
        for stmt in rule_file.statements:
            if isinstance(stmt, MeshDecl):
                self.found.meshes.append(stmt)
            elif isinstance(stmt, Alias):
                self.found.alias_decls.append(stmt)
            elif isinstance(stmt, RulesHeader):
                group = stmt.group
                self.found.headers.setdefault(group, stmt.span)
            elif isinstance(stmt, RuleLine):
                if group is None:
                    self.found.errors.error(
                        "SR007",
                        "rule outside a `rules` group",
                        stmt.span,
                        "put a header such as `rules params:` above the first rule",
                    )
                else:
                    self.found.rule_lines.append((group, stmt))
            elif isinstance(stmt, Include):
                self.include(stmt, name, real)
        self.stack.pop()

    def include(self, stmt: Include, parent_name: str, parent_real: Path) -> None:
        if not stmt.path or "\x00" in stmt.path:
            what = "an empty path" if not stmt.path else "a path with a NUL character"
            self.found.errors.error(
                "SR005", f"include of {what}", stmt.span, 'write the file to include: include "common.shard"'
            )
            return
        target = Path(stmt.path)
        display = os.path.normpath(os.path.join(os.path.dirname(parent_name), stmt.path))
        if target.is_absolute() and not self.explicit_root:
            self.found.errors.error(
                "SR006",
                f"include of an absolute path `{stmt.path}`",
                stmt.span,
                "include files by a path relative to the including file",
            )
            return
        real = resolved(parent_real.parent / target, display, stmt.span, self.found.sources)
        if not real.is_relative_to(self.root):
            self.found.errors.error(
                "SR006",
                f"include of `{stmt.path}` leaves the include root `{self.root}`",
                stmt.span,
                "keep included files in the folder of the top-level rule file (or below it), "
                "or pass include_root= to load()",
            )
            return
        chain = [n for r, n in self.stack]
        if any(r == real for r, _ in self.stack):
            start = next(i for i, (r, _) in enumerate(self.stack) if r == real)
            cycle = " -> ".join([*chain[start:], display])
            self.found.errors.error(
                "SR004", f"include cycle: {cycle}", stmt.span, "remove one of these includes"
            )
            return
        if real in self.done:  # included before: every file is read once
            return
        if len(self.stack) >= MAX_INCLUDE_DEPTH:
            self.found.errors.error(
                "SR008",
                f"includes nest deeper than {MAX_INCLUDE_DEPTH} files: {' -> '.join(chain[:3])} -> ... -> {display}",
                stmt.span,
                "include the shared files from one top-level file instead of chaining them",
            )
            return
        display = self.unique(display, real)
        text = read_rule_file(real, display, stmt.span, self.found.sources, limit=self.bytes_left())
        self.visit(text, display, real, stmt.span)

    def unique(self, display: str, real: Path) -> str:
        """`display`, or, where another file of this load is shown under it (the
        name is made by joining paths, and `link/..` is not the folder `link` is
        in when `link` is a symbolic link), the file's resolved path."""
        name, n = display, 1
        while self.found.files.get(name, real) != real:
            n += 1
            name = str(real) if n == 2 else f"{real} ({n - 1})"
        return name

    def bytes_left(self) -> int:
        return max(0, min(MAX_FILE_BYTES, MAX_TOTAL_BYTES - self.bytes))

    def count(self, text: str, name: str, span: Span | None) -> None:
        """Refuse (SR009), before parsing it, a file that takes this load over
        `MAX_LINES` lines or `MAX_RULES` rules (each rule has its `->`)."""
        self.bytes += len(text.encode("utf-8", "surrogatepass"))
        self.lines += text.count("\n") + 1
        self.rules += text.count("->")
        if self.lines <= MAX_LINES and self.rules <= MAX_RULES:
            return
        what = f"{MAX_RULES:,} rules (lines with `->`)" if self.rules > MAX_RULES else f"{MAX_LINES:,} lines"
        whole = "" if span is None and len(self.found.sources) == 0 else " with the files it is included with"
        raise error_for(
            [
                Diagnostic(
                    "SR009",
                    "error",
                    f"`{name}` holds more than {what}{whole}; rule files are small text files",
                    span,
                    hint="check that this is the rule file you meant; a model needs tens of rules, not thousands",
                )
            ],
            self.found.sources,
        )
