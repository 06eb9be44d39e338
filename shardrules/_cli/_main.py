"""The `shardrules` command line."""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import re
import stat
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._errors import ShardRulesError
from .._language._files import MAX_FILE_BYTES
from .._language._format import format_text
from .._version import __version__
from . import _lint, _render

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardrules",
        description="Declarative sharding rules for JAX pytrees.",
    )
    parser.add_argument("--version", action="version", version=f"shardrules {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    fmt = commands.add_parser(
        "fmt",
        help="rewrite rule files in the canonical layout",
        description="Rewrite .shard files in the canonical layout (aligned arrows, comments kept).",
    )
    fmt.add_argument(
        "files", nargs="+", type=Path, metavar="FILE", help="rule files, or folders to search for *.shard"
    )
    fmt.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    fmt.add_argument("--diff", action="store_true", help="change nothing; print what would change")
    fmt.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="skip files and folders matching GLOB when searching folders (repeatable); "
        "also read from [tool.shardrules] exclude in pyproject.toml",
    )
    fmt.set_defaults(run=_fmt)

    lint = commands.add_parser(
        "lint",
        help="check rule files against a mesh and shapes, with no devices",
        description="Check rule files: syntax, names and axes for every group; given --shapes, the plan "
        "for --group (ranks, divisibility, unmatched leaves, memory, dead or shadowed rules).",
    )
    lint.add_argument("rules", nargs="+", metavar="RULES", help="rule files (.shard)")
    _plan_options(lint)
    lint.add_argument(
        "--format",
        choices=("text", "json", "github"),
        default="text",
        help="text (default), json (a list of findings) or github (workflow annotations)",
    )
    lint.set_defaults(run=_lint_command)

    explain = commands.add_parser(
        "explain",
        help="show the plan: every leaf's spec, rule and bytes per device",
        description="Show how the rules lay out the shapes on the mesh, leaf by leaf, with totals.",
    )
    explain.add_argument("rules", metavar="RULES", help="the rule file (.shard)")
    _plan_options(explain, shapes_required=True)
    explain.add_argument("--path", metavar="REGEX", help="show only leaves whose path this regex matches")
    explain.set_defaults(run=_explain_command)
    return parser


def _plan_options(parser: argparse.ArgumentParser, shapes_required: bool = False) -> None:
    parser.add_argument(
        "--mesh",
        metavar="AXIS=SIZE,...",
        help="axis sizes, e.g. fsdp=32,model=8 (default: the sizes in the file's mesh line)",
    )
    parser.add_argument(
        "--shapes",
        metavar="SOURCE",
        required=shapes_required,
        help="module:function (run under jax.eval_shape), a .safetensors file, a *.index.json, "
        "or a .json file of {path: [shape, dtype]}; only headers are read",
    )
    parser.add_argument("--group", help="the rules group to plan (default: params)")
    parser.add_argument(
        "--hosts",
        type=int,
        metavar="N",
        help="the mesh's devices are spread over N hosts (consecutive devices in mesh order per host); "
        "report bytes per host as well as per device",
    )
    parser.add_argument(
        "--device-memory", metavar="SIZE", help="per-device budget, e.g. 80GiB; more is an error (SR110)"
    )
    parser.add_argument(
        "--replicated-threshold",
        metavar="SIZE",
        default="64MiB",
        help="warn about fully replicated arrays this large or larger (default: 64MiB)",
    )


# Folders never searched when a folder is given (name it to search it anyway).
_SKIPPED = {"node_modules", "site-packages", "__pycache__"}


def _shard_files(paths: Sequence[Path], exclude: Sequence[str] = ()) -> list[Path]:
    """The files named, and every `*.shard` under the folders named, skipping
    hidden folders (`.git`, `.venv`, ...), installed packages, and what
    `--exclude` or `[tool.shardrules] exclude` in the pyproject.toml nearest to
    the folder name."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            patterns = [str(Path(g).resolve()) for g in exclude] + _configured_excludes(path.resolve())
            found = (p for p in path.rglob("*.shard") if p.is_file())
            out.extend(
                sorted(
                    p
                    for p in found
                    if not any(
                        part.startswith(".") or part in _SKIPPED for part in p.relative_to(path).parts[:-1]
                    )
                    and not _excluded(p.resolve(), patterns)
                )
            )
        else:
            out.append(path)
    return out


def _configured_excludes(start: Path) -> list[str]:
    """`[tool.shardrules] exclude` of the nearest pyproject.toml at or above
    `start`, as absolute paths (globs allowed)."""
    for folder in (start, *start.parents):
        config = folder / "pyproject.toml"
        if config.is_file():
            try:
                data = tomllib.loads(config.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                return []
            globs = data.get("tool", {}).get("shardrules", {}).get("exclude", [])
            return [str(folder / g) for g in globs if isinstance(g, str)]
    return []


def _excluded(path: Path, patterns: Sequence[str]) -> bool:
    """Whether `path` (absolute) or one of its folders matches a pattern."""
    return any(fnmatch.fnmatch(str(c), p) for c in (path, *path.parents) for p in patterns)


def _lines(text: str) -> list[str]:
    """The lines of `text`, each with its newline, split at `\\n` only:
    `str.splitlines` would also split a comment at `\\f` or `\\u2028`."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def _fmt(args: argparse.Namespace) -> int:
    changed = errors = 0
    for path in _shard_files(args.files, args.exclude):
        try:
            mode = path.stat().st_mode
            if not stat.S_ISREG(mode):  # a FIFO would block the read; a device never ends
                raise OSError("not a regular file (a FIFO, a device or a socket)")
            if path.stat().st_size > MAX_FILE_BYTES:
                raise OSError(f"larger than {MAX_FILE_BYTES >> 20} MiB; rule files are small text files")
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            print(f"{path}: cannot read: {err}", file=sys.stderr)
            errors += 1
            continue
        try:
            formatted = format_text(text, str(path))
        except ShardRulesError as err:
            print(err, file=sys.stderr)
            errors += 1
            continue
        if formatted == text:
            continue
        changed += 1
        if args.diff:
            diff = difflib.unified_diff(
                _lines(text), _lines(formatted), f"{path} (original)", f"{path} (formatted)"
            )
            for line in diff:
                sys.stdout.write(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
        elif args.check:
            print(f"would reformat {path}")
        else:
            try:
                path.write_text(formatted, encoding="utf-8")
            except OSError as err:
                print(f"{path}: cannot write: {err}", file=sys.stderr)
                errors += 1
                continue
            print(f"reformatted {path}")
    if errors:
        return EXIT_USAGE
    if changed and (args.check or args.diff):
        return EXIT_FINDINGS
    return EXIT_OK


_Inputs = tuple[Any, dict[str, int] | None, int | None, int]


def _inputs(args: argparse.Namespace) -> _Inputs:
    """The shapes tree, mesh sizes, memory budget and replication threshold asked for."""
    from .._language._parse import byte_size
    from .._planning._shapes import ShapeSourceError, load_shapes

    mesh = _lint.parse_mesh(args.mesh) if args.mesh else None
    try:
        budget = byte_size(args.device_memory) if args.device_memory else None
    except ValueError as err:
        raise _lint.UsageError(f"--device-memory: {err}") from None
    try:
        threshold = byte_size(args.replicated_threshold)
    except ValueError as err:
        raise _lint.UsageError(f"--replicated-threshold: {err}") from None
    tree = None
    if args.shapes:
        try:
            tree = load_shapes(args.shapes)
        except FileNotFoundError as err:
            missing = err.filename or args.shapes
            detail = "" if err.filename else f" ({err})"
            raise _lint.UsageError(f"--shapes: {missing}: no such file{detail}") from None
        except (ShapeSourceError, OSError) as err:
            raise _lint.UsageError(f"--shapes: {err}") from None
    return tree, mesh, budget, threshold


def _lint_one(path: str, args: argparse.Namespace, inputs: _Inputs) -> _lint.Result:
    """`lint_file` of one rule file with the command line's shapes, mesh and options."""
    tree, mesh, budget, threshold = inputs
    return _lint.lint_file(
        path,
        tree,
        mesh,
        group=args.group,
        device_memory=budget,
        replicated_threshold=threshold,
        hosts=args.hosts,
    )


def _lint_command(args: argparse.Namespace) -> int:
    inputs = _inputs(args)  # shapes are read once for all the files
    results = [_lint_one(path, args, inputs) for path in args.rules]
    if args.format == "json":
        _render.dump_json(results, sys.stdout)
    elif args.format == "github":
        _render.write_github(results, sys.stdout)
    else:
        _render.write_text(results, sys.stdout)
    return EXIT_FINDINGS if any(r.errors for r in results) else EXIT_OK


def _explain_command(args: argparse.Namespace) -> int:
    if args.path:
        try:
            re.compile(args.path)
        except re.error as err:
            raise _lint.UsageError(f"--path {args.path!r}: not a regular expression: {err}") from None
    result = _lint_one(args.rules, args, _inputs(args))
    if result.plan is not None:
        rows = _render.explain_rows(result.plan, args.path, args.hosts)
        header = _render.HOST_HEADER if args.hosts is not None else _render.HEADER
        _render.write_table(rows, sys.stdout, _render.use_rich(sys.stdout), header)
        sys.stdout.write("\n" + "\n".join(_render.totals(result.plan, hosts=args.hosts)) + "\n")
    if result.diagnostics:
        sys.stdout.flush()
        _render.write_text([result], sys.stderr)
    return EXIT_FINDINGS if result.errors else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except _lint.UsageError as err:
        print(f"shardrules {args.command}: {err}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
