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
        "report bytes per host as well as per device, and with --shapes what load_checkpoint reads on each "
        "host (SR220: slices read in many small pieces)",
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


TARGET_HELP = (
    "with --step: cost the step for the chips it will run on: a TPU topology as JAX names it "
    "(v5e:4x4, v5p:8x8x4, v4:2x2x2, v6e:8x8; compiled by the TPU compiler with no TPU: "
    'pip install "shardrules[tpu]"), or an NVIDIA GPU (h100, h200, b200, a100-80g; compiled on '
    "simulated CPU devices, devices from the mesh); says whether the peak fits the chip's memory and "
    "estimates the step time. The mesh's sizes must multiply to the topology's chips"
)


def chip_option(parser: argparse.ArgumentParser) -> None:
    """`--target NAME`: the chips a `--step` is costed for (also `target` in `[tool.shardrules]`)."""
    parser.add_argument("--target", metavar="NAME", default=None, help=TARGET_HELP)


def cost_options(parser: argparse.ArgumentParser, lint: bool) -> None:
    """`--cost` (explain), or the budgets `--max-flops-ratio`, `--max-peak-bytes`,
    `--max-step-time`, `--hbm-headroom`, `--max-collective-bytes` and
    `--max-collective-increase` against a `--baseline` (lint), of a
    `--step`; `--target` for both."""
    chip_option(parser)
    if not lint:
        parser.add_argument(
            "--cost",
            action="store_true",
            help="with --step: compile the step for the mesh (simulated devices, or --target's chips) and "
            "print what it costs each device: FLOPs against the one-device ideal, bytes, peak memory, "
            "collectives and the rule lines they come from; with --target, whether it fits and its "
            "estimated step time",
        )
        parser.add_argument(
            "--by",
            choices=("rule", "array", "scope"),
            default=None,
            help="with --step (implies --cost): show the collectives by the rule line that laid out what "
            "they move or sum, with its arrays (rule, the default), by array, or each kind with the scopes "
            "it comes from (scope)",
        )
        return
    parser.add_argument(
        "--cost",
        action="store_true",
        help="with --step: compile the step for the mesh (simulated devices, or --target's chips) and "
        "report layouts that waste communication or memory (SR216-SR219) with their rule lines",
    )
    parser.add_argument(
        "--max-step-time",
        type=_positive_float,
        metavar="SECONDS",
        default=None,
        help="with --step and --target: fail (SR128) when the estimated time of one step on the target "
        "is longer, e.g. 2.0",
    )
    parser.add_argument(
        "--hbm-headroom",
        type=fraction,
        metavar="PCT",
        default=None,
        help="with --step and --target: the share of the chip's memory to keep free, e.g. 10%% or 0.1 "
        "(default 0); a peak above the rest fails (SR127)",
    )
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
    parser.add_argument(
        "--max-collective-bytes",
        metavar="SIZE",
        default=None,
        help="with --step: fail (SR129) when the step's collectives move more than SIZE per device per "
        "step (every kind, each loop trip counted), e.g. 64MiB; names the rule lines that move most",
    )
    parser.add_argument(
        "--max-collective-increase",
        type=increase,
        metavar="PCT",
        default=None,
        help="with --step and --baseline: fail (SR130) when the step's collective bytes per device grew "
        "by more than PCT over the baseline's, e.g. 10%% or 0.1; names the rule lines that grew most",
    )
    parser.add_argument(
        "--baseline",
        metavar="FILE",
        default=None,
        help="the plan file --max-collective-increase compares with: one written by "
        "`shardrules dump RULES --step MODULE:FUNCTION` (e.g. the main branch's, checked in)",
    )


def fraction(text: str) -> float:
    """A share from 0 to just under 1, written `10%` or `0.1`, for argparse."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share; write e.g. 10% or 0.1") from None
    if 1 <= value < 100 and not raw.endswith("%"):
        raise argparse.ArgumentTypeError(f"{text!r}: a share is written {value:g}% or {value / 100:g}")
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a share from 0% to under 100%, e.g. 10% or 0.1")
    return value


def increase(text: str) -> float:
    """A growth of 0 or more, written `10%` (any percentage) or `0.1` (a
    fraction under 1), for argparse and `[tool.shardrules]`."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share; write e.g. 10% or 0.1") from None
    if value >= 1 and not raw.endswith("%"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: an increase of 1 or more is written as a percentage, e.g. {value * 100:g}% (or {value:g}% if you meant that)"
        )
    if not 0 <= value < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r}: give an increase of 0% or more, e.g. 10% or 0.1")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number above 0, e.g. 1.2")
    return value
