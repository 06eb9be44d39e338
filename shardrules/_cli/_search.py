"""`shardrules suggest --search`: the mesh and the rules chosen by what the
step costs (`_search`). Its options, their checks, and the run: progress on
standard error, the file to `-o` (or standard output). Exit 0: written
(early, at `--budget`, with the best so far); 1: no candidate fits; 2: usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .._errors import ShardRulesError
from .._planning._plan import format_bytes
from ._guest import output_to_stderr
from ._lint import UsageError, write_output


def add_arguments(suggest: Any) -> None:
    """`--search` and what it takes, on the `suggest` parser."""
    group = suggest.add_argument_group(
        "search",
        "choose the mesh and the strategy by what the step costs: every mesh of --devices over each "
        "strategy's axes is drafted, compiled with step.cost and compared",
    )
    group.add_argument(
        "--search", action="store_true", help="search meshes and strategies by cost (needs --step)"
    )
    group.add_argument(
        "--step",
        metavar="MODULE:FUNCTION",
        help="FUNCTION(rules, mesh) returns (an sr.jit step, its example arguments); the arguments must not "
        "change with the mesh",
    )
    group.add_argument(
        "--devices", type=int, metavar="N", help="how many devices (default: the target's chips)"
    )
    group.add_argument(
        "--target", metavar="NAME", help="the chips: a TPU topology (v5p:8x8x4) or a GPU (h100)"
    )
    group.add_argument(
        "--hbm", metavar="SIZE", help="memory per device (default: the target chip's), e.g. 16GiB"
    )
    group.add_argument(
        "--hbm-headroom",
        type=float,
        default=0.1,
        metavar="SHARE",
        help="the share of each device's memory kept free (default: 0.1)",
    )
    group.add_argument(
        "--budget", type=float, metavar="SECONDS", help="stop after this long, with the best found so far"
    )


def check(args: argparse.Namespace) -> None:
    """`UsageError` for search options without `--search`, or `--search` without what it needs."""
    given = [
        f
        for f, v in (
            ("--step", args.step),
            ("--devices", args.devices),
            ("--hbm", args.hbm),
            ("--budget", args.budget),
            ("--target", args.target),
        )
        if v is not None
    ]
    if not args.search:
        if given:
            raise UsageError(f"{given[0]} is for a search: add --search (or leave {given[0]} out)")
        if args.shapes is None:
            raise UsageError(
                "give the shapes to draft from: --shapes SOURCE (or --search --step MODULE:FUNCTION)"
            )
        return
    if args.step is None:
        raise UsageError(
            "--search needs the step to cost: --step MODULE:FUNCTION (FUNCTION(rules, mesh) -> (step, args))"
        )
    for flag, value in (("--shapes", args.shapes), ("--mesh", args.mesh), ("--rules", args.rules)):
        if value is not None:
            raise UsageError(
                f"--search drafts from the step's own arguments and chooses the mesh: leave {flag} out "
                "(give --devices N, or a --target topology)"
            )
    if args.devices is None and args.target is None:
        raise UsageError("--search needs how many devices: --devices N (or a --target TPU topology)")


def run(args: argparse.Namespace, min_bytes: int) -> int:
    """Search, write, report; the exit status."""
    from .._costs._targets import parse_target
    from .._errors import TargetError
    from .._search._api import NoneFitsError, searched
    from .._search._probe import StepError
    from .._search._report import table_lines
    from ._step import _ensure_devices

    try:
        chips = parse_target(args.target).shape if args.target else ()
    except TargetError as err:
        raise UsageError(f"--target: SR126 {err.diagnostics[0].message}; {err.hint}") from None
    devices = args.devices
    if devices is None:
        if not chips:
            raise UsageError(
                f"--target {args.target} names a GPU, not how many: give --devices N (how many to lay the "
                "step out on)"
            )
        devices = 1
        for n in chips:
            devices *= n
    if args.target and chips:
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    # Each candidate the compiler lays out poorly has it warn on standard error (an "involuntary full
    # rematerialization"): the table says what each candidate costs, so a search keeps XLA's warnings
    # quiet, unless the environment asks for them.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _ensure_devices(devices)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        with output_to_stderr():
            found = searched(
                None,
                None,
                args.strategy,
                step=args.step,
                devices=devices,
                target=args.target,
                hbm=args.hbm,
                hbm_headroom=args.hbm_headroom,
                budget=args.budget,
                progress=say,
                head_dim=args.head_dim,
                min_bytes=min_bytes,
                embedding=args.embedding,
                others={
                    "--max-bytes-per-device": args.max_bytes_per_device,
                    "--fsdp-dim": args.fsdp_dim != "embed",
                },
                command=_command(args),
            )
    except NoneFitsError as err:
        print(f"shardrules suggest: {err}", file=sys.stderr)
        for line in table_lines(err.search):
            print(line, file=sys.stderr)
        return 1
    except TargetError as err:
        raise UsageError(f"--target: SR126 {err.diagnostics[0].message}; {err.hint}") from None
    except (StepError, TypeError, ValueError) as err:
        raise UsageError(f"--search: {err}") from None
    except ShardRulesError:
        raise
    write_output(found.text, args.output)
    chosen = found.search.chosen
    assert chosen is not None
    cost = chosen.cost or chosen.screen
    time_s = f", {cost.time_estimate_s:.3g} s estimated" if cost and cost.time_estimate_s is not None else ""
    peak = f", peak {format_bytes(cost.peak_bytes_per_device)} per device" if cost else ""
    where = args.output if args.output not in (None, "-") else "standard output"
    say(
        f"wrote {where}: mesh {chosen.shape.text} ({chosen.shape.strategy}){time_s}{peak}, of "
        f"{len(found.search.rows)} candidates in {found.search.seconds:.0f} s"
    )
    if found.search.stopped:
        say(f"shardrules suggest: stopped early: {found.search.stopped}; the file has the best found so far")
    return 0


def _command(args: argparse.Namespace) -> str:
    parts = ["shardrules suggest --search", f"--step {args.step}"]
    if args.devices is not None:
        parts.append(f"--devices {args.devices}")
    if args.target:
        parts.append(f"--target {args.target}")
    if args.hbm:
        parts.append(f"--hbm {args.hbm}")
    if args.strategy != "auto":
        parts.append(f"--strategy {args.strategy}")
    return " ".join(parts)
