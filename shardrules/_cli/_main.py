"""The `shardrules` command line."""

from __future__ import annotations

import argparse
import difflib
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._errors import ShardRulesError
from .._language._files import MAX_FILE_BYTES
from .._language._format import format_text
from .._version import __version__
from . import (
    _budget,
    _config,
    _convert,
    _discover,
    _explain,
    _lint,
    _options,
    _plans,
    _render,
    _step,
    _suggest,
)

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
    fmt.add_argument(
        "--force-exclude",
        action="store_true",
        help="skip excluded files even when named (for pre-commit, which names every changed file)",
    )
    fmt.set_defaults(run=_fmt)

    lint = commands.add_parser(
        "lint",
        help="check rule files against a mesh and shapes, with no devices",
        description="Check rule files: syntax, names and axes for every group; given --shapes, the plan "
        "for --group (ranks, divisibility, unmatched leaves, memory, dead or shadowed rules).",
    )
    lint.add_argument(
        "rules",
        nargs="*",
        metavar="RULES",
        help="rule files (.shard), or folders to search for top-level *.shard files "
        "(a file that another rule file includes is checked through it); default: the current folder",
    )
    _options.plan_options(lint)
    _options.step_option(lint, "warn about each layout no activation rule gives (SR208)")
    _options.cost_options(lint, lint=True)
    lint.add_argument(
        "--strict",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="warnings fail the run too: exit 1 on any warning (notes never fail it)",
    )
    lint.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="skip files and folders matching GLOB when searching folders (repeatable); "
        "also read from [tool.shardrules] exclude in pyproject.toml",
    )
    lint.add_argument(
        "--force-exclude",
        action="store_true",
        help="skip excluded files even when named (for pre-commit, which names every changed file)",
    )
    lint.add_argument(
        "--format",
        choices=("text", "json", "github"),
        default="text",
        help="text (default), json (a list of findings) or github (workflow annotations)",
    )
    lint.add_argument(
        "--all-leaves",
        action="store_true",
        help="list every leaf of a finding about many leaves (default: the first few, and how many more)",
    )
    lint.add_argument(
        "--statistics",
        action="store_true",
        help="print how many findings (and leaves) each code has instead of the findings (text or json)",
    )
    lint.set_defaults(run=_lint_command)

    explain = commands.add_parser(
        "explain",
        help="show the plan: every leaf's spec, rule and bytes per device",
        description="Show how the rules lay out the shapes on the mesh, leaf by leaf, with totals.",
    )
    explain.add_argument("rules", metavar="RULES", help="the rule file (.shard)")
    _options.plan_options(explain)
    _options.step_option(explain, "show how each contraction's result layout is decided")
    _options.cost_options(explain, lint=False)
    explain.add_argument("--path", metavar="REGEX", help="show only leaves whose path this regex matches")
    explain.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text (default), or json: one object with the plan's leaves, totals, findings and, with "
        "--step, the step's scope outputs, decisions and (--cost) cost",
    )
    explain.add_argument(
        "--html", metavar="FILE", help="also write the plan as a self-contained HTML page to FILE"
    )
    explain.add_argument(
        "--pictures",
        metavar="N",
        type=_options.count,
        default=3,
        help="draw which devices hold which blocks of the N largest arrays shown (default 3; 0: none)",
    )
    explain.set_defaults(run=_explain_command)

    dump = commands.add_parser(
        "dump",
        help="write the plan as JSON, one leaf per line (for git, review and golden tests)",
        description="Write the plan of a rule file for the shapes on the mesh as versioned JSON: "
        "the mesh, the group, and every leaf's shape, dtype, spec, rule and bytes per device, sorted by path.",
    )
    dump.add_argument("rules", metavar="RULES", help="the rule file (.shard)")
    _plans.add_options(dump)
    dump.add_argument(
        "--step",
        dest="cost_step",  # not filled from [tool.shardrules]: a plan file records a cost only when asked
        metavar="MODULE:FUNCTION",
        help="also record in the file what this train step costs each device under the rules "
        "(version 2's step_cost: FLOPs against the one-device ideal, peak memory, collectives), compiled "
        "on simulated devices, so that a golden plan catches a cost regression; FUNCTION(rules, mesh) "
        "returns a shardrules.jit step and a tuple of example arguments",
    )
    _options.chip_option(dump)
    dump.add_argument("-o", "--output", metavar="FILE", help="where to write it (default, or -: stdout)")
    dump.set_defaults(run=_plans.run_dump)

    diff = commands.add_parser(
        "diff",
        help="compare two plans (rule files or dumps); exit 1 if they differ",
        description="Compare plan A with plan B, each a rule file (planned for --shapes on the mesh) "
        "or a file written by `shardrules dump`: changed leaves by spec and rule, leaves only in one, "
        "bytes to move and memory per device. Exit 0 when equal, 1 when different, 2 on error.",
    )
    diff.add_argument("a", metavar="A", help="a rule file (.shard) or a plan file (.json)")
    diff.add_argument("b", metavar="B", help="a rule file (.shard) or a plan file (.json)")
    _plans.add_options(diff, sides=True)
    diff.add_argument("--format", choices=("text", "json"), default="text", help="text (default) or json")
    _options.step_option(
        diff,
        "compare what it costs each device under A's and B's rules (FLOPs, memory, collectives); "
        "without --shapes, compare the plans of each group its sr.jit names for its example arguments",
    )
    _options.chip_option(diff)
    diff.set_defaults(run=_plans.run_diff)

    _convert.add_parser(commands)
    _suggest.add_parser(commands)
    return parser


def _shard_files(
    paths: Sequence[Path], exclude: Sequence[str] = (), force_exclude: bool = False
) -> list[Path]:
    """The files named and every `*.shard` under the folders named (see
    `_discover.shard_files`: hidden folders, installed packages, `--exclude`
    and `[tool.shardrules] exclude` are skipped)."""
    return _discover.shard_files(paths, exclude, force_exclude)


def _lines(text: str) -> list[str]:
    """The lines of `text`, each with its newline, split at `\\n`, where the
    parser ends lines (`str.splitlines` also splits at `\\f` or `\\u2028`,
    which no file that formats holds)."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def _fmt(args: argparse.Namespace) -> int:
    changed = errors = 0
    for path in _shard_files(args.files, args.exclude, args.force_exclude):
        try:
            mode = path.stat().st_mode
            if not stat.S_ISREG(mode):  # a FIFO would block the read; a device never ends
                raise OSError("not a regular file (a FIFO, a device or a socket)")
            if path.stat().st_size > MAX_FILE_BYTES:
                raise OSError(f"larger than {MAX_FILE_BYTES >> 20} MiB; rule files are small text files")
            # As `load` reads it, line ends as they are: the parser refuses a lone `\r` as `load` does.
            text = path.read_bytes().decode("utf-8")
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
        # It parsed, so each `\r` ends a `\r\n`: a file that differs by those alone is formatted.
        text = text.replace("\r\n", "\n")
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


_Inputs = tuple[Any, dict[str, int] | None, int | None, int, float]


def _origin(args: argparse.Namespace, option: str, flag: str) -> str:
    """Where an option's value came from, for messages: the flag, or the config key."""
    return getattr(args, "origins", {}).get(option, flag)


def _inputs(args: argparse.Namespace) -> _Inputs:
    """The shapes tree, mesh sizes, memory budget, replication threshold and
    replicated tolerance asked for (on the command line, else in the config)."""
    from .._language._sizes import byte_size
    from .._planning._check import DEFAULT_REPLICATED_TOLERANCE

    if isinstance(args.mesh, dict):  # from the config, checked there
        mesh: dict[str, int] | None = args.mesh
    else:
        mesh = _lint.parse_mesh(args.mesh) if args.mesh else None
    try:
        budget = byte_size(args.device_memory) if args.device_memory is not None else None
    except ValueError as err:
        raise _lint.UsageError(f"{_origin(args, 'device_memory', '--device-memory')}: {err}") from None
    try:
        threshold = byte_size(args.replicated_threshold if args.replicated_threshold is not None else "64MiB")
    except ValueError as err:
        raise _lint.UsageError(
            f"{_origin(args, 'replicated_threshold', '--replicated-threshold')}: {err}"
        ) from None
    tolerance = args.replicated_tolerance
    if tolerance is None:
        tolerance = DEFAULT_REPLICATED_TOLERANCE
    elif isinstance(tolerance, str):  # the flag; the config's is checked already
        tolerance = _config.parse_tolerance(tolerance)
    tree = _lint.read_shapes(args.shapes, _origin(args, "shapes", "--shapes")) if args.shapes else None
    return tree, mesh, budget, threshold, tolerance


def _lint_one(path: str, args: argparse.Namespace, inputs: _Inputs) -> _lint.Result:
    """`lint_file` of one rule file with the command line's shapes, mesh and
    options; with `--step`, the step's findings too (its decisions: `args.decisions`)."""
    tree, mesh, budget, threshold, tolerance = inputs
    result = _lint.lint_file(
        path,
        tree,
        mesh,
        group=args.group,
        device_memory=budget,
        replicated_threshold=threshold,
        hosts=args.hosts,
        replicated_tolerance=tolerance,
    )
    if getattr(args, "step", None) and not result.errors:
        _step.add_findings(result, args.step, mesh, args)
    return result


def _lint_command(args: argparse.Namespace) -> int:
    args.rules = args.rules or ["."]  # as ruff: the project in the current folder
    config = _config.for_paths(args.rules)
    _config.apply(args, config)  # flags win; what they leave out comes from [tool.shardrules]
    lint_included = bool(config is not None and config.values.get("lint-included", False))
    files = _discover.lint_files(
        args.rules, args.exclude, lint_included=lint_included, force_exclude=args.force_exclude
    )
    if not files and not args.force_exclude:
        raise _lint.UsageError(f"no rule files (*.shard) in {', '.join(args.rules)}")
    if args.statistics and args.format == "github":
        raise _lint.UsageError("--statistics prints a table (text) or a list (json), not GitHub annotations")
    _budget.check_options(args)  # each budget with what it needs: a step, a target, a baseline
    if args.cost and not args.step:
        raise _lint.UsageError("--cost needs a step to compile: --step MODULE:FUNCTION")
    inputs = _inputs(args)  # shapes are read once for all the files
    results = [_lint_one(path, args, inputs) for path in files]
    if args.statistics and args.format == "json":
        _render.dump_json_statistics(results, sys.stdout)
    elif args.statistics:
        _render.write_statistics(results, sys.stdout)
    elif args.format == "json":
        _render.dump_json(results, sys.stdout, all_leaves=args.all_leaves, hosts=args.hosts is not None)
    elif args.format == "github":
        _render.write_github(results, sys.stdout, all_leaves=args.all_leaves)
    else:
        _render.write_text(results, sys.stdout, all_leaves=args.all_leaves)
    warned = args.strict and any(d.severity == "warning" for r in results for d in r.diagnostics)
    if warned and not any(r.errors for r in results) and args.format == "text":
        print("--strict: warnings fail the run.")
    return EXIT_FINDINGS if any(r.errors for r in results) or warned else EXIT_OK


def _explain_command(args: argparse.Namespace) -> int:
    if args.path:
        try:
            _render.path_matcher(args.path)  # searched as rule patterns are: by RE2, refused alike
        except ValueError as err:
            raise _lint.UsageError(f"--path {args.path!r}: {err}") from None
    _config.apply(args, _config.for_paths([args.rules]))
    said_target = args.target is not None and "target" not in args.origins  # on the command line
    if (args.cost or said_target or args.by) and not args.step:
        flag = "--cost" if args.cost else "--target" if said_target else "--by"
        raise _lint.UsageError(f"{flag} needs a step to compile: --step MODULE:FUNCTION")
    args.cost = args.cost or said_target or bool(args.by)  # settings' `target`: used once a cost is asked for
    if not args.shapes and not args.step:
        raise _lint.UsageError(
            "give the shapes to plan for: --shapes SOURCE, or shapes in [tool.shardrules] "
            "(or a step to trace: --step MODULE:FUNCTION)"
        )
    args.decisions = args.scopes = args.step_cost = args.step_sizes = args.step_plan = args.reach = None
    result = _lint_one(args.rules, args, _inputs(args))
    if args.format == "json":
        _explain.write_json(result, args, sys.stdout)
    else:
        _explain.write_text(result, args, sys.stdout)
    return EXIT_FINDINGS if result.errors else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except _lint.UsageError as err:
        print(f"shardrules {args.command}: {err}", file=sys.stderr)
        return EXIT_USAGE
    except (RecursionError, MemoryError) as err:  # an input deeper or larger than its reader expected
        what = "nested too deeply to read" if isinstance(err, RecursionError) else "too large: out of memory"
        print(f"shardrules {args.command}: an input is {what}; check the files named", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
