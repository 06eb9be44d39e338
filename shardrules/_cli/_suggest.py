"""`shardrules suggest`: a first rule file for a model, from its shapes.

Reads the shapes (`--shapes`, any source `load_shapes` reads) and the mesh
(`--mesh`, or the `mesh` line of `--rules FILE`), drafts the file with
`_suggest` and writes it (`-o FILE`, or standard output). Exit 0: written;
1: written, but over `--max-bytes-per-device`; 2: usage, or shapes or a mesh
that cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._errors import ShardRulesError
from .._language._load import load
from .._language._sizes import byte_size
from .._planning._plan import format_bytes, plural
from .._suggest._draft import EMBEDDINGS
from .._suggest._largest import DIMS
from .._suggest._strategy import STRATEGIES, StrategyError
from .._suggest._suggest import DEFAULT_MIN_BYTES, drafted
from .._suggest._text import counted
from . import _options, _search
from ._lint import UsageError, parse_mesh, read_shapes, sizes_for, write_output


def add_parser(commands: Any) -> None:
    """The `suggest` command's parser, under `commands` (argparse's subparsers)."""
    suggest = commands.add_parser(
        "suggest",
        help="draft a rule file for a model from its shapes and names",
        description="Draft a rule file for the shapes on the mesh: one rule per role (embedding, attention, "
        "MLP, experts, router, norms, ...) through aliases for the logical dimensions, laid out by "
        "--strategy. Leaves whose names are not recognised are left to `default -> auto(...)` and listed "
        "in a comment. Exit 0 when written, 1 when written but over --max-bytes-per-device, 2 on error.",
    )
    suggest.add_argument(
        "--shapes",
        metavar="SOURCE",
        help=_options.SHAPES_HELP,
    )
    suggest.add_argument(
        "--mesh", metavar="AXIS=SIZE,...", help="axis sizes in mesh order, e.g. fsdp=32,model=8"
    )
    suggest.add_argument(
        "--rules",
        metavar="FILE",
        help="take the mesh from the mesh line of this rule file (every axis sized); --mesh wins",
    )
    suggest.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="auto",
        help="auto (default: by the mesh's axis names and the model's size), dp, fsdp, tp, fsdp+tp or ep",
    )
    suggest.add_argument("-o", "--output", metavar="FILE", help="where to write it (default, or -: stdout)")
    suggest.add_argument(
        "--max-bytes-per-device",
        metavar="SIZE",
        help="a budget for the weights on each device, e.g. 16GiB: auto prefers a strategy that meets it, "
        "and the file says whether it does",
    )
    suggest.add_argument(
        "--head-dim",
        type=int,
        metavar="N",
        help="the width of an attention head, to count the heads of (heads x width, hidden) weights "
        "(default: read from the shapes where they show it, else 128)",
    )
    suggest.add_argument(
        "--min-bytes",
        metavar="SIZE",
        default=None,
        help="leaves not recognised and smaller than this stay whole (default: 1MiB); with --fsdp-dim "
        "largest, every array smaller than this stays whole",
    )
    suggest.add_argument(
        "--fsdp-dim",
        choices=DIMS,
        default="embed",
        help="the dimension --strategy fsdp splits: embed (default: the hidden size, as MaxText) or largest "
        "(each array's largest dimension that divides, as kauldron's FSDPSharding; with --min-bytes "
        "4194305 its layout exactly)",
    )
    suggest.add_argument(
        "--embedding",
        choices=EMBEDDINGS,
        default=None,
        help="the token embedding's vocabulary where the strategy splits the vocabulary: vocab (split: "
        "vocab-parallel) or whole (default: whole for transformers' names with a separate lm_head, as "
        "transformers' tp plans do, its rule acknowledging SR204 where it is large, unless most of the "
        "weights would then be whole (SR116) or a budget missed; else vocab)",
    )
    _search.add_arguments(suggest)
    suggest.set_defaults(run=run)


def _size(text: str | None, flag: str, default: int | None) -> int | None:
    if text is None:
        return default
    try:
        return byte_size(text)
    except ValueError as err:
        raise UsageError(f"{flag} {text!r}: {err}") from None


def _mesh(args: argparse.Namespace) -> dict[str, int]:
    if args.mesh:
        return parse_mesh(args.mesh)
    if not args.rules:
        raise UsageError("give the mesh: --mesh AXIS=SIZE,... (or --rules FILE with a mesh line)")
    try:
        rules = load(args.rules)
    except FileNotFoundError:
        raise UsageError(f"--rules {args.rules}: no such file") from None
    except ShardRulesError as err:
        raise UsageError(f"--rules {args.rules}: {err}") from None
    sizes = sizes_for(rules, None)
    if sizes is None:
        raise UsageError(
            f"--rules {args.rules}: its mesh line does not give every axis a size (or it has none); "
            "pass --mesh AXIS=SIZE,..."
        )
    return sizes


def run(args: argparse.Namespace) -> int:
    """Draft (or search), write, report; the exit status."""
    _search.check(args)
    if args.search:
        min_bytes = _size(args.min_bytes, "--min-bytes", DEFAULT_MIN_BYTES)
        assert min_bytes is not None
        return _search.run(args, min_bytes)
    sizes = _mesh(args)
    budget = _size(args.max_bytes_per_device, "--max-bytes-per-device", None)
    min_bytes = _size(args.min_bytes, "--min-bytes", DEFAULT_MIN_BYTES)
    assert min_bytes is not None
    if args.head_dim is not None and args.head_dim < 1:
        raise UsageError(f"--head-dim {args.head_dim}: give a positive width")
    tree = read_shapes(args.shapes)
    try:
        found = drafted(
            tree,
            sizes,
            args.strategy,
            max_bytes_per_device=budget,
            head_dim=args.head_dim,
            min_bytes=min_bytes,
            embedding=args.embedding,
            fsdp_dim=args.fsdp_dim,
        )
    except StrategyError as err:  # said with the command's flags
        raise UsageError(err.cli or str(err)) from None
    except (ValueError, TypeError) as err:
        raise UsageError(str(err)) from None
    write_output(found.text, args.output)
    if args.output not in (None, "-"):
        shape = (
            f"; {counted(found.by_shape, 'array')} left to `default` (listed in it)" if found.by_shape else ""
        )
        print(
            f"wrote {args.output}: {plural(found.rules, 'rule')} ({found.strategy}) for "
            f"{counted(found.arrays, 'array')}, {format_bytes(found.bytes_per_device)} per device{shape}"
        )
    if found.over_budget:
        print(
            f"shardrules suggest: {format_bytes(found.bytes_per_device)} per device, over the budget of "
            f"{format_bytes(budget or 0)}: see the comments at the top of the file",
            file=sys.stderr,
        )
        return 1
    return 0
