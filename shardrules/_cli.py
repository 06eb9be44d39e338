"""The `shardrules` command line."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from pathlib import Path

from ._errors import ShardRulesError
from ._format import format_text

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    from . import __version__

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
    fmt.set_defaults(run=_fmt)
    return parser


# Folders never searched when a folder is given (name it to search it anyway).
_SKIPPED = {"node_modules", "site-packages", "__pycache__"}


def _shard_files(paths: Sequence[Path]) -> list[Path]:
    """The files named, and every `*.shard` under the folders named, skipping
    hidden folders (`.git`, `.venv`, ...) and installed packages."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = (p for p in path.rglob("*.shard") if p.is_file())
            out.extend(
                sorted(
                    p
                    for p in found
                    if not any(
                        part.startswith(".") or part in _SKIPPED for part in p.relative_to(path).parts[:-1]
                    )
                )
            )
        else:
            out.append(path)
    return out


def _lines(text: str) -> list[str]:
    """The lines of `text`, each with its newline, split at `\\n` only:
    `str.splitlines` would also split a comment at `\\f` or `\\u2028`."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def _fmt(args: argparse.Namespace) -> int:
    changed = errors = 0
    for path in _shard_files(args.files):
        try:
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
