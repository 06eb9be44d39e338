"""`shardrules convert FORMAT SOURCE`: a rule file from another project's rules.

The work is `_convert`'s; this module reads the source the command line names
(a file, `-` for standard input, or `module:attr`), writes the rule file (to
`-o FILE` or standard output) and says on standard error what did not convert
exactly. Exit 0: everything converted; 1: written, with notes; 2: the source
could not be read or converted, or the command line is wrong.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._convert._common import Conversion, SourceError
from .._convert._flax import convert_flax
from .._convert._hf import convert_hf, parse_json
from .._convert._maxtext import convert_maxtext, parse_yaml
from .._convert._regex import convert_regex
from ._lint import UsageError

FORMATS = {
    "maxtext": "a MaxText YAML config (base.yml, custom_mesh_and_rule/NAME.yml), or - for standard input",
    "flax": "module:attr naming Flax logical_axis_rules: (logical name, mesh axes) pairs",
    "hf": "a transformers tensor-parallel plan: a JSON object of module name -> style, or a "
    "config.json holding base_model_tp_plan; - for standard input",
    "regex": "module:attr naming EasyLM/scalax (regex, PartitionSpec) pairs",
}


def add_parser(commands: Any) -> None:
    """The `convert` command's parser, under `commands` (argparse's subparsers)."""
    convert = commands.add_parser(
        "convert",
        help="write a rule file from another project's sharding rules",
        description="Write a rule file from MaxText, Flax, transformers (hf) or EasyLM/scalax (regex) "
        "sharding rules. What cannot be converted exactly is said on standard error and in comments at "
        "the top of the file. Exit 0 when everything converted, 1 when some of it did not (the file is "
        "written all the same), 2 when the source cannot be read.",
        epilog="SOURCE, by format: " + "; ".join(f"{name}: {what}" for name, what in FORMATS.items()) + ".",
    )
    convert.add_argument("format", choices=tuple(FORMATS), metavar="FORMAT", help=", ".join(FORMATS))
    convert.add_argument("source", metavar="SOURCE", help="what to convert (see below)")
    convert.add_argument("-o", "--output", metavar="FILE", help="where to write it (default, or -: stdout)")
    convert.add_argument(
        "--axis",
        metavar="AXIS",
        help="hf: the mesh axis tensor parallelism splits over (default: model)",
    )
    convert.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Convert, write, report; the exit status."""
    if args.axis is not None and args.format != "hf":
        raise UsageError(f"--axis is for the hf format, not {args.format}")
    try:
        conversion = _convert(args)
    except (SourceError, ValueError) as err:
        raise UsageError(str(err)) from None
    except FileNotFoundError:
        raise UsageError(f"{args.source}: no such file") from None
    except OSError as err:
        raise UsageError(f"{args.source}: cannot read: {err.strerror or err}") from None
    except ImportError as err:
        raise UsageError(str(err)) from None
    if args.output in (None, "-"):
        sys.stdout.write(conversion.text)
        sys.stdout.flush()
    else:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(conversion.text)
        except OSError as err:
            raise UsageError(f"-o {args.output}: cannot write: {err.strerror or err}") from None
    for note in conversion.notes:
        print(f"{conversion.source}: not converted exactly: {note}", file=sys.stderr)
    return 0 if conversion.exact else 1


def _convert(args: argparse.Namespace) -> Conversion:
    source = args.source
    stdin = source == "-"
    if args.format == "maxtext":
        if stdin:
            return convert_maxtext(parse_yaml(sys.stdin.read(), "<stdin>"), source="<stdin>")
        return convert_maxtext(source)
    if args.format == "hf":
        axis = args.axis or "model"
        if stdin:
            return convert_hf(parse_json(sys.stdin.read(), "<stdin>"), axis=axis, source="<stdin>")
        return convert_hf(source, axis=axis)
    if stdin or ":" not in source:
        raise UsageError(f"{args.format}: SOURCE is module:attr, e.g. mymodel.sharding:RULES; got {source!r}")
    if args.format == "flax":
        return convert_flax(source)
    return convert_regex(source)
