"""Which rule files a command works on. `fmt` takes the files named and every
`*.shard` below the folders named; `lint` takes the *top-level* ones among
them: a file that another rule file of the project includes is checked
through the top-level files that include it, not on its own (it may not load
alone), unless `lint-included = true`."""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from .._errors import ShardRulesError
from .._language._files import MAX_FILE_BYTES
from .._language._parse import parse
from .._language._syntax import Include
from . import _config

# Folders never searched when a folder is given (name it to search it anyway).
SKIPPED = {"node_modules", "site-packages", "__pycache__"}


def excluded(path: Path, patterns: Sequence[str]) -> bool:
    """Whether `path` (absolute) or one of its folders matches a pattern."""
    return any(fnmatch.fnmatch(str(c), p) for c in (path, *path.parents) for p in patterns)


def _patterns(exclude: Sequence[str], config: _config.Config | None) -> list[str]:
    """`--exclude` globs (relative to the working directory) and the config's
    (relative to its pyproject.toml), as absolute globs."""
    return [str(Path(g).resolve()) for g in exclude] + (config.excludes if config is not None else [])


def _search(folder: Path, patterns: Sequence[str]) -> list[Path]:
    """Every `*.shard` file below `folder`, sorted, skipping hidden folders,
    installed packages and what `patterns` exclude (never descending into them)."""
    out: list[Path] = []
    for root, dirs, files in os.walk(folder):
        base = Path(root)
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith(".") and d not in SKIPPED and not excluded(real_path(base / d), patterns)
        ]
        out += (
            base / f
            for f in files
            if f.endswith(".shard") and (base / f).is_file() and not excluded(real_path(base / f), patterns)
        )
    return sorted(out)


def shard_files(
    paths: Sequence[Path], exclude: Sequence[str] = (), force_exclude: bool = False
) -> list[Path]:
    """The files named, and every `*.shard` under the folders named, skipping
    hidden folders (`.git`, `.venv`, ...), installed packages, and what
    `--exclude` or `exclude` in the `[tool.shardrules]` nearest to the folder
    name. A file named is kept even if excluded, unless `force_exclude`."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out += _search(path, _patterns(exclude, _config.nearest(path)))
        elif not (force_exclude and path.exists() and _is_excluded_file(path, exclude)):
            out.append(path)
    return out


def _is_excluded_file(path: Path, exclude: Sequence[str]) -> bool:
    real = real_path(path)
    return excluded(real, _patterns(exclude, _config.nearest(real.parent)))


def real_path(path: Path) -> Path:
    """`path` with its symbolic links followed; only made absolute where that
    fails (a loop of links, which lint then reports for the file that has it)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError, ValueError):
        return Path(os.path.abspath(path))


def includes(path: Path) -> list[Path]:
    """The resolved files that the rule file `path` includes, from its syntax
    alone; nothing for a file that cannot be read or parsed (lint reports it)."""
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode) or path.stat().st_size > MAX_FILE_BYTES:
            return []
        rule_file = parse(path.read_bytes().decode("utf-8").removeprefix("\ufeff"), str(path))
    except (OSError, UnicodeDecodeError, ShardRulesError):
        return []
    return [
        real_path(path.parent / s.path)
        for s in rule_file.statements
        if isinstance(s, Include) and s.path and "\x00" not in s.path and not Path(s.path).is_absolute()
    ]


class Project:
    """The rule files below a folder (a project's root) and who includes whom."""

    def __init__(self, files: Sequence[Path]):
        self.included_by: dict[Path, set[Path]] = {}
        for file in files:
            real = real_path(file)
            for target in includes(file):
                if target != real:
                    self.included_by.setdefault(target, set()).add(real)

    def top_level(self, real: Path) -> list[Path]:
        """The files that include `real` (directly or not) and that nothing
        includes, sorted; `[real]` itself when nothing includes it, or when
        only a cycle of includes does (then loading it reports the cycle)."""
        seen: set[Path] = set()
        todo = [real]
        while todo:
            for parent in self.included_by.get(todo.pop(), ()):
                if parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
        tops = sorted(p for p in seen if not self.included_by.get(p) and p != real)
        return tops or [real]


def lint_files(
    paths: Sequence[str],
    exclude: Sequence[str] = (),
    *,
    lint_included: bool = False,
    force_exclude: bool = False,
) -> list[str]:
    """The rule files `lint` checks for the files and folders named, each once,
    in the order named (what a folder or a file gives, sorted). A file that another rule
    file of its project includes is replaced by the top-level files that
    include it (with `lint_included`, both are checked). The project is the
    folder of the nearest pyproject.toml with `[tool.shardrules]`, else the
    folder named (for a file, its folder)."""
    projects: dict[Path, Project] = {}

    def project(start: Path) -> Project:
        config = _config.nearest(start)
        root = config.folder if config is not None else start.resolve()
        if root not in projects:
            projects[root] = Project(_search(root, _patterns(exclude, config)))
        return projects[root]

    out: dict[Path, str] = {}
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found, where = shard_files([path], exclude), project(path)
        elif path.is_file():
            if force_exclude and _is_excluded_file(path, exclude):
                continue
            found, where = [path], project(path.parent)
        else:  # lint says it is missing
            out.setdefault(Path(os.path.abspath(path)), name)
            continue
        mine: dict[Path, str] = {}
        for file in found:
            real = real_path(file)
            tops = where.top_level(real)
            if lint_included or tops == [real]:
                mine.setdefault(real, str(file))
            for top in tops:
                if top != real:
                    mine.setdefault(top, _display(top, absolute=path.is_absolute()))
        for real, shown in sorted(mine.items(), key=lambda item: Path(item[1])):
            out.setdefault(real, shown)
    return list(out.values())


def _display(path: Path, *, absolute: bool) -> str:
    """`path` relative to the working directory when it is below it (and the
    user named relative paths), else absolute."""
    if not absolute:
        try:
            return str(path.relative_to(Path.cwd().resolve()))
        except ValueError:
            pass
    return str(path)
