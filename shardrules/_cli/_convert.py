"""`shardrules convert FORMAT SOURCE`: a rule file from another project's rules.

The work is `_convert`'s; this module reads the source the command line names
(a file, `-` for standard input, or `module:attr`), writes the rule file (to
`-o FILE` or standard output) and says on standard error what did not convert
exactly. Exit 0: everything converted; 1: written, with notes; 2: the source
could not be read or converted (over the bounds of `_convert._documents`, or
its Python code raised or exited), or the command line is wrong, always with
a one-line message. Standard input is read like a source file: at most
`MAX_SOURCE_BYTES`, UTF-8.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from .._convert._common import MAX_SOURCE_BYTES, Conversion, SourceError, one_line
from .._convert._documents import parse_json, parse_yaml
from .._convert._easydel import convert_easydel
from .._convert._flax import convert_flax
from .._convert._hf import convert_hf
from .._convert._hf import from_document as hf_document
from .._convert._maxtext import convert_maxtext
from .._convert._maxtext import from_document as maxtext_document
from .._convert._regex import convert_regex
from ._guest import output_to_stderr
from ._lint import UsageError, write_output

FORMATS = {
    "maxtext": "a MaxText YAML config (base.yml, custom_mesh_and_rule/NAME.yml), or several merged in "
    "order as MaxText merges them (base.yml models/NAME.yml), or - for standard input",
    "flax": "module:attr naming Flax logical_axis_rules: (logical name, mesh axes) pairs",
    "hf": "a transformers tensor-parallel plan: a JSON object of module name -> style, or a "
    "config.json holding base_model_tp_plan; - for standard input",
    "regex": "module:attr naming EasyLM/scalax (regex, PartitionSpec) pairs",
    "easydel": "an EasyDeL model type (llama) or module:attr naming an EasyDeL config, config class or "
    "its (regex, PartitionSpec) rules",
}


def add_parser(commands: Any) -> None:
    """The `convert` command's parser, under `commands` (argparse's subparsers)."""
    convert = commands.add_parser(
        "convert",
        help="write a rule file from another project's sharding rules",
        description="Write a rule file from MaxText, Flax, transformers (hf), EasyLM/scalax (regex) or EasyDeL "
        "sharding rules. What cannot be converted exactly is said on standard error and in comments at "
        "the top of the file. Exit 0 when everything converted, 1 when some of it did not (the file is "
        "written all the same), 2 when the source cannot be read.",
        epilog="SOURCE, by format: " + "; ".join(f"{name}: {what}" for name, what in FORMATS.items()) + ".",
    )
    convert.add_argument("format", choices=tuple(FORMATS), metavar="FORMAT", help=", ".join(FORMATS))
    convert.add_argument(
        "source",
        metavar="SOURCE",
        nargs="+",
        help="what to convert (see below); maxtext takes several configs, merged in order",
    )
    convert.add_argument("-o", "--output", metavar="FILE", help="where to write it (default, or -: stdout)")
    convert.add_argument(
        "--axis",
        metavar="AXIS",
        help="hf: the mesh axis tensor parallelism splits over (default: model)",
    )
    convert.add_argument(
        "--min-size",
        metavar="N",
        type=int,
        help="easydel: leaves a rule matches with fewer elements are replicated, as eformer's "
        "match_partition_rules(min_size=N) (default 0; EasyDeL 0.1 used 16384)",
    )
    convert.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Convert, write, report; the exit status."""
    sources = args.source
    if len(sources) > 1 and (args.format != "maxtext" or "-" in sources):
        what = "standard input (-)" if args.format == "maxtext" else f"the {args.format} format"
        raise UsageError(
            f"{what} takes one SOURCE, not {len(sources)}: {' '.join(sources)} "
            "(several configs are for maxtext, as files: shardrules convert maxtext base.yml models/NAME.yml)"
        )
    args.sources, args.source = sources, sources[-1] if len(sources) == 1 else " + ".join(sources)
    if args.axis is not None and args.format != "hf":
        raise UsageError(f"--axis is for the hf format, not {args.format}")
    if args.min_size is not None and args.format != "easydel":
        raise UsageError(f"--min-size is for the easydel format, not {args.format}")
    try:
        # a module:attr source runs its code: what it prints is not the rule file (`_guest`)
        with output_to_stderr() if args.format in _PYTHON_SOURCES else contextlib.nullcontext():
            conversion = _convert(args)
    except UsageError:
        raise
    except (SourceError, ValueError) as err:
        raise UsageError(str(err)) from None
    except FileNotFoundError as err:
        raise UsageError(f"{_named(err, args)}: no such file") from None
    except OSError as err:
        raise UsageError(f"{_named(err, args)}: cannot read: {err.strerror or err}") from None
    except ImportError as err:
        raise UsageError(str(err)) from None
    except (Exception, SystemExit) as err:
        if args.format not in _PYTHON_SOURCES:
            raise
        # A module:attr source is Python objects: reading one runs its code (a sequence's
        # __len__, a property), which may raise anything or exit.
        what = f"SystemExit: {err.code!r}" if isinstance(err, SystemExit) else f"{type(err).__name__}: {err}"
        raise UsageError(f"{args.source}: reading it raised {one_line(what)[:300]}") from None
    write_output(conversion.text, args.output)
    for note in conversion.notes:
        print(f"{one_line(conversion.source)}: not converted exactly: {one_line(note)}", file=sys.stderr)
    return 0 if conversion.exact else 1


def _named(err: OSError, args: argparse.Namespace) -> str:
    """The file an error is about: its name where the error gives one (one
    of several configs), else the SOURCE given."""
    return err.filename if isinstance(err.filename, str) and err.filename in args.sources else args.source


_PYTHON_SOURCES = ("flax", "regex", "easydel")
"""The formats whose SOURCE is `module:attr`: Python objects, read by running their code."""


def _stdin(what: str) -> str:
    """Standard input as text, at most `MAX_SOURCE_BYTES` (as a source file)."""
    stream = getattr(sys.stdin, "buffer", None)
    data = stream.read(MAX_SOURCE_BYTES + 1) if stream is not None else sys.stdin.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise SourceError(f"<stdin>: larger than {MAX_SOURCE_BYTES >> 20} MiB; {what} is a small text file")
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SourceError(f"<stdin>: not UTF-8 text ({err.reason}); expected {what}") from None


def _convert(args: argparse.Namespace) -> Conversion:
    source = args.source
    stdin = source == "-"
    if args.format == "maxtext":
        if stdin:
            text = _stdin("a MaxText YAML config")
            return maxtext_document(parse_yaml(text, "<stdin>"), "<stdin>")
        return convert_maxtext(args.sources if len(args.sources) > 1 else source)
    if args.format == "hf":
        axis = args.axis or "model"
        if stdin:
            text = _stdin("a JSON tensor-parallel plan")
            return hf_document(parse_json(text, "<stdin>"), axis, "<stdin>")
        return convert_hf(source, axis=axis)
    if args.format == "easydel" and not stdin:
        return convert_easydel(source, min_size=args.min_size or 0)
    if stdin or ":" not in source:
        raise UsageError(f"{args.format}: SOURCE is module:attr, e.g. mymodel.sharding:RULES; got {source!r}")
    if args.format == "flax":
        return convert_flax(source)
    return convert_regex(source)
