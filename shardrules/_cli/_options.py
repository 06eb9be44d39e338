"""Command-line options that several `shardrules` commands share."""

from __future__ import annotations

import argparse

SHAPES_HELP = (
    "module:function (run under jax.eval_shape), a .safetensors file, a *.index.json, "
    "or a .json file of {path: [shape, dtype]}; only headers are read"
)


def target_options(parser: argparse.ArgumentParser, *, sides: bool = False) -> None:
    """`--mesh`, `--shapes` and `--group`: what to plan for (`sides`: also
    `--mesh-a` and `--mesh-b`, for `diff`). Each may also be set in
    `[tool.shardrules]` (see `_config`), which is why none has a default here."""
    parser.add_argument(
        "--mesh",
        metavar="AXIS=SIZE,...",
        help="axis sizes, e.g. fsdp=32,model=8 (default: the sizes in the file's mesh line)",
    )
    if sides:
        parser.add_argument(
            "--mesh-a", metavar="AXIS=SIZE,...", help="axis sizes for A only (default: --mesh)"
        )
        parser.add_argument(
            "--mesh-b", metavar="AXIS=SIZE,...", help="axis sizes for B only (default: --mesh)"
        )
    parser.add_argument(
        "--shapes",
        metavar="SOURCE",
        help=SHAPES_HELP,
    )
    parser.add_argument("--group", help="the rules group to plan (default: params)")


def plan_options(parser: argparse.ArgumentParser) -> None:
    """What `lint` and `explain` plan for (`target_options`) and check it against."""
    target_options(parser)
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
        help="warn about fully replicated arrays this large or larger (default: 64MiB)",
    )
    parser.add_argument(
        "--replicated-tolerance",
        metavar="FRACTION",
        help="the largest share of the planned bytes that may be fully replicated, e.g. 0.25 or 25%% "
        "(default: 25%%); more is an error (SR116)",
    )


def count(text: str) -> int:
    """A count of 0 or more, for argparse (which names the option on an error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 or more")
    return value


def step_option(parser: argparse.ArgumentParser, what: str) -> None:
    """`--step MODULE:FUNCTION`: a train step to trace on Explicit mesh axes."""
    parser.add_argument(
        "--step",
        metavar="MODULE:FUNCTION",
        help=f"also trace a step on Explicit mesh axes and {what}: FUNCTION(rules, mesh) returns a "
        "shardrules.jit step and a tuple of example arguments (arrays or jax.ShapeDtypeStruct); "
        "the mesh has the --mesh or mesh-line sizes, the axis types the mesh line states "
        "(Explicit where it states none), and simulated CPU devices",
    )


def cost_options(parser: argparse.ArgumentParser, lint: bool) -> None:
    """`--cost` (explain), or the budgets `--max-flops-ratio` and `--max-peak-bytes` (lint), of a `--step`."""
    if not lint:
        parser.add_argument(
            "--cost",
            action="store_true",
            help="with --step: compile the step for the mesh (simulated devices) and print what it costs "
            "each device: FLOPs against the one-device ideal, bytes, peak memory, collectives",
        )
        return
    parser.add_argument(
        "--max-flops-ratio",
        type=_positive_float,
        metavar="X",
        default=None,
        help="with --step: fail (SR122) when each device runs more than X times its share of the "
        "one-device step's FLOPs, e.g. 1.2",
    )
    parser.add_argument(
        "--max-peak-bytes",
        metavar="SIZE",
        default=None,
        help="with --step: fail (SR123) when a device holds more than SIZE at once, e.g. 16GiB",
    )


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number above 0, e.g. 1.2")
    return value
