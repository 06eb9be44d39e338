"""`suggest(search=True)`: the mesh and the rules chosen by what they cost.

The space is every mesh of the devices over each strategy's axes (`_space`),
each drafted by `suggest` with the step's groups (`_candidates`). Before
anything is compiled, a candidate is set aside when its batch does not
divide, its draft is refused (most of the weights whole), its plan has an
error, its arguments alone do not fit the chip's memory, or its layout is
another candidate's. The rest are compiled with `step.cost`, in the order of
their arguments' bytes per device: on the target (a TPU topology: after a
screen of every candidate on simulated CPU devices, with the chip's figures,
only the best few are compiled by the TPU compiler), or on simulated CPU
devices. Of those whose peak fits, the one with the lowest estimated step
time wins (without a target: the fewest FLOPs per device, then the fewest
collective bytes, then the lowest peak). `_report` writes the file.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable
from typing import Any

from .._costs._cost import StepCost
from .._costs._screen import screened
from .._costs._step import step_cost
from .._costs._targets import MeshSizes, Target, parse_target, target_mesh, tpu_devices
from .._planning._plan import format_bytes
from .._quiet import quiet
from .._suggest._facts import facts_of
from .._suggest._leaves import kinds_of
from .._suggest._suggest import DEFAULT_MIN_BYTES
from . import _probe as P
from ._candidates import Candidate, draft
from ._space import shapes

HEADROOM = 0.1
"""The share of the chip's memory a search keeps free by default."""
CONFIRM = 3
"""How many of the screened candidates (the best by the screen's estimate)
the TPU compiler compiles, with any within `CLOSE` of the best."""
CLOSE = 0.1
SAME_FLOPS = 0.05
"""Without a target, FLOPs per device within this share of the fewest count as equal."""


@dataclasses.dataclass
class Row:
    """One candidate in the search's table."""

    candidate: Candidate
    cost: StepCost | None = None  # compiled for the target (or the mesh, without one)
    screen: StepCost | None = None  # screened on CPU devices with the target's figures
    status: str = ""  # "chosen", "compiled", "screened", "rejected", "not compiled"
    why: str = ""

    @property
    def shape(self) -> Any:
        return self.candidate.shape


@dataclasses.dataclass
class Search:
    """A search's outcome: every row, the chosen one (`None`: none fits),
    and what it was asked for."""

    rows: list[Row]
    chosen: Row | None
    devices: int
    target: Target | None
    usable: int | None  # bytes per device a peak may take
    headroom: float
    ideal_flops: float | None  # the one-device step's FLOPs per device
    seconds: float
    stopped: str = ""  # why it stopped early, or ""


def search(
    factory: P.Factory,
    devices: int,
    *,
    name: str = "step",
    target: str | Target | None = None,
    hbm: int | None = None,
    headroom: float = HEADROOM,
    budget: float | None = None,
    progress: Callable[[str], None] | None = None,
    exhaustive: bool = False,
    strategy: str | None = None,
    head_dim: int | None = None,
    min_bytes: int = DEFAULT_MIN_BYTES,
    embedding: str | None = None,
) -> Search:
    """Search the meshes of `devices` devices and their drafted rules for the
    step `factory` makes, by what each costs. `exhaustive`: compile every
    candidate that can run for the target itself (no screen), to measure
    what the screen gives up; `strategy`: that strategy's meshes only."""
    start = time.monotonic()
    say = progress or (lambda _text: None)
    chosen_target = None if target is None else target if isinstance(target, Target) else parse_target(target)
    memory = hbm if hbm is not None else chosen_target.chip.hbm_bytes if chosen_target else None
    usable = None if memory is None else int(memory * (1 - headroom))
    tpu = chosen_target is not None and chosen_target.compiler == "tpu"
    if tpu:
        tpu_devices(chosen_target.name)  # type: ignore[union-attr]  # SR126 now, without libtpu
    cpu = _cpu_devices() >= devices
    if not cpu and not tpu:
        raise P.StepError(
            f"a search over {devices} devices needs {devices} CPU devices and JAX has {_cpu_devices()}: set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={devices} (or jax_num_cpu_devices) before "
            "JAX starts, or give a TPU target"
        )
    mesh_of = _meshes(chosen_target if not cpu else None)
    from .._language._load import loads

    nothing = loads("rules params:\n  default -> replicated\n", name="<search probe>")
    with quiet():
        step, args = P.made(factory, nothing, mesh_of({"data": devices}), name)
    found = P.probe(step, args)
    first_args = args
    tree = P.params_tree(found)
    kinds = kinds_of(tree)
    options = {"head_dim": head_dim, "min_bytes": min_bytes, "embedding": embedding}
    count = facts_of(kinds, head_dim).experts if kinds else None
    if strategy == "ep" and count is None:
        raise P.StepError(
            "strategy ep: no experts recognised in the weights (stacked `experts` arrays, or a router); "
            "search fsdp, fsdp+tp or tp, or every strategy (auto)"
        )
    rows = [
        Row(Candidate(shape, rejected=f"expert={shape.size('expert')} does not divide the {count} experts"))
        if count and count % shape.size("expert")
        else Row(draft(shape, found, tree, options))
        for shape in shapes(devices, experts=count is not None, only=strategy)
    ]
    seen: dict[Any, Row] = {}
    for row in rows:
        c = row.candidate
        if not c.rejected and usable is not None and c.argument_bytes > usable:
            c.rejected = (
                f"its arguments alone take {format_bytes(c.argument_bytes)} per device, over "
                f"{format_bytes(usable)}"
            )
        if not c.rejected and tpu:
            c.rejected = _unplaced(chosen_target, c.shape.mesh)  # type: ignore[arg-type]
        if not c.rejected and c.key in seen:
            c.rejected = f"the same layout as {seen[c.key].shape.text} ({seen[c.key].shape.strategy})"
        if c.rejected:
            row.status, row.why = "rejected", c.rejected
        else:
            seen[c.key] = row
    live = sorted((r for r in rows if not r.status), key=lambda r: r.candidate.argument_bytes)
    say(
        f"search: {len(rows)} candidates for {devices} devices, {len(live)} to compile "
        f"({len(rows) - len(live)} set aside before compiling)"
    )
    clock = _Clock(start, budget)
    ideal: dict[str, Any] = {"tried": False, "flops": None}  # the one-device step's, compiled once

    def cost(row: Row, how: str) -> None:
        c = row.candidate
        with quiet():
            step, args = P.made(factory, c.rules, mesh_of(c.shape.mesh), name)
            if P.signature(args) != found.signature:
                raise P.StepError(
                    f"the step {name} made {P.changed(args, first_args)} for the mesh {c.shape.text} than for "
                    f"the first, data={devices}: a search compares one step's layouts, so its arguments (the "
                    "global batch too) must not change with the mesh"
                )
            if how == "screen":
                row.screen = screened(step, args, chosen_target)
            elif not ideal["tried"] or tpu:  # the first compiles the one-device ideal too
                row.cost = step_cost(step, args, ideal=not ideal["tried"], target=chosen_target)
                if not ideal["tried"]:
                    ideal["tried"], ideal["flops"] = True, row.cost.ideal_flops_per_device
            else:  # on CPU devices: step.cost's figures, compiled for them alone (no attribution)
                row.cost = screened(step, args, chosen_target)

    stopped = ""
    if tpu and cpu and not exhaustive and len(live) > CONFIRM:
        stopped = _run(live, "screen", cost, clock, say)
        ranked = sorted((r for r in live if r.screen is not None), key=lambda r: _time(r.screen))
        best = _time(ranked[0].screen) if ranked else 0.0
        compiled = 0
        for i, r in enumerate(ranked):  # the best few by the screen, past any the TPU compiler refuses
            if stopped or (compiled >= CONFIRM and _time(r.screen) > best * (1 + CLOSE)):
                break
            stopped = _run([r], "target", cost, clock, say, (i + 1, len(ranked)), lambda: ideal["flops"])
            compiled += r.cost is not None
        for r in ranked:
            if r.cost is None and not r.status:
                r.status = "screened"
                r.why = f"{_time(r.screen) / best:.2f}x the best screened time" if best else ""
    else:
        stopped = _run(
            live, "target" if chosen_target else "mesh", cost, clock, say, None, lambda: ideal["flops"]
        )
    for r in live:
        if r.cost is not None and ideal["flops"] and r.cost.ideal_flops_per_device is None:
            r.cost = dataclasses.replace(r.cost, ideal_flops_per_device=ideal["flops"])
    chosen = _choose([r for r in live if r.cost is not None], usable, chosen_target is not None)
    if chosen is None and not any(r.cost for r in live):  # the budget ran out while screening
        chosen = min((r for r in live if r.screen is not None), key=lambda r: _time(r.screen), default=None)
    for r in live:
        if r is chosen:
            r.status = "chosen"
        elif r.cost is not None:
            r.status = "compiled"
            r.why = _lost(r.cost, chosen, usable, chosen_target is not None)
        elif not r.status:
            r.status = "not compiled" if r.screen is None else "screened"
    return Search(
        rows, chosen, devices, chosen_target, usable, headroom, ideal["flops"], clock.elapsed(), stopped
    )


@dataclasses.dataclass
class _Clock:
    start: float
    budget: float | None

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def out(self) -> bool:
        return self.budget is not None and self.elapsed() >= self.budget


def _run(
    rows: list[Row],
    how: str,
    cost: Callable[[Row, str], None],
    clock: _Clock,
    say: Any,
    place: tuple[int, int] | None = None,
    ideal: Callable[[], float | None] = lambda: None,
) -> str:
    """Cost `rows` in order until the budget runs out; why it stopped, or ""
    (`place`: the first row's number and the count, for the progress lines;
    `ideal`: the one-device step's FLOPs per device, once known)."""
    first, count = place or (1, len(rows))
    for i, row in enumerate(rows):
        if clock.out():
            left = count - (first + i) + 1
            return (
                f"the budget of {clock.budget:g} s ran out after {clock.elapsed():.0f} s, with {left} "
                f"of {count} candidates not {'screened' if how == 'screen' else 'compiled'}"
            )
        try:
            cost(row, "screen" if how == "screen" else "cost")
        except P.StepError:
            raise
        except Exception as err:  # a layout the compiler refuses is a rejected candidate, not a failed search
            row.status, row.why = "rejected", f"{how} failed: {type(err).__name__}: {_first_line(err)}"
        found = row.screen if how == "screen" else row.cost
        said = _said(found, ideal()) if found is not None else row.why
        shape = f"{row.shape.text} ({row.shape.strategy})"
        say(f"  [{how} {first + i}/{count}] {shape}: {said} ({clock.elapsed():.0f} s)")
    return ""


def _said(cost: StepCost, ideal: float | None) -> str:
    time_s = f"{seconds(cost.time_estimate_s)}, " if cost.time_estimate_s is not None else ""
    flops = cost.ideal_flops_per_device or ideal
    work = f"FLOPs {cost.flops_per_device / flops:.3f}x" if flops else f"{cost.flops_per_device:.3g} FLOPs"
    return (
        f"{time_s}peak {format_bytes(cost.peak_bytes_per_device)}, {work}, "
        f"collectives {format_bytes(collective_bytes(cost))}"
    )


def seconds(value: float) -> str:
    """`0.408 s`, `1.91 ms`, `0.173 ms`: three significant figures."""
    return f"{value:.3g} s" if value >= 1e-3 else f"{value * 1e3:.3g} ms"


def _first_line(err: BaseException) -> str:
    line = str(err).strip().split("\n", 1)[0]
    return line if len(line) <= 160 else line[:157] + "..."


def _time(cost: StepCost | None) -> float:
    return float("inf") if cost is None or cost.time_estimate_s is None else cost.time_estimate_s


def collective_bytes(cost: StepCost) -> int:
    return sum(c.bytes_per_device for c in cost.collectives)


def _choose(rows: list[Row], usable: int | None, timed: bool) -> Row | None:
    """The row whose cost wins (see the module's docstring); `None` when none fits."""
    fits = [r for r in rows if usable is None or r.cost.peak_bytes_per_device <= usable]  # type: ignore[union-attr]
    if not fits:
        return None
    if timed:
        return min(fits, key=lambda r: (_time(r.cost), r.cost.peak_bytes_per_device))  # type: ignore[union-attr]
    fewest = min(r.cost.flops_per_device for r in fits)  # type: ignore[union-attr]
    close = [r for r in fits if r.cost.flops_per_device <= fewest * (1 + SAME_FLOPS)]  # type: ignore[union-attr]
    return min(close, key=lambda r: (collective_bytes(r.cost), r.cost.peak_bytes_per_device))  # type: ignore[arg-type, union-attr]


def _unplaced(target: Target, sizes: dict[str, int]) -> str:
    """Why a mesh of `sizes` cannot be laid out on `target`'s chips, or "".
    `jax.make_mesh` lays each axis over whole dimensions of the topology (an
    axis of 2 on a 4x4x4 slice would split a ring of 4)."""
    from jax.sharding import AxisType

    try:
        target_mesh(target, MeshSizes(sizes, (AxisType.Explicit,) * len(sizes)))
    except Exception:
        dims = target.shape
        products = sorted(
            {math.prod(c) for k in range(1, len(dims) + 1) for c in itertools.combinations(dims, k)}
        )
        bad = [f"{a}={n}" for a, n in sizes.items() if n not in products]
        chips = "x".join(map(str, dims))
        which = f"{', '.join(bad)} is not" if bad else "these sizes together are not"
        return (
            f"jax.make_mesh lays each axis over whole dimensions of {target.name}'s {chips} chips, so an axis "
            f"has {', '.join(map(str, products))} of them; {which}"
        )
    return ""


def _lost(cost: StepCost, chosen: Row | None, usable: int | None, timed: bool) -> str:
    """Why a compiled candidate was not chosen."""
    if usable is not None and cost.peak_bytes_per_device > usable:
        over = cost.peak_bytes_per_device - usable
        return f"its peak is {format_bytes(over)} over the {format_bytes(usable)} a device may use"
    won = chosen.cost if chosen is not None else None
    if won is None:
        return ""
    if timed:
        return f"{times(_time(cost) / _time(won))} the chosen time" if _time(won) else ""
    if cost.flops_per_device > won.flops_per_device * (1 + SAME_FLOPS):
        return f"{times(cost.flops_per_device / won.flops_per_device)} the chosen FLOPs"
    mine, theirs = collective_bytes(cost), collective_bytes(won)
    if mine > theirs:
        return f"{times(mine / theirs)} the chosen collective bytes" if theirs else "more collective bytes"
    return f"the same FLOPs (within {SAME_FLOPS:.0%}) and collective bytes, a higher peak"


def times(ratio: float) -> str:
    """`1.35x`, or `1.004x` where two places would read as a tie."""
    return f"{ratio:.3f}x" if ratio < 1.01 else f"{ratio:.2f}x"


def _cpu_devices() -> int:
    import jax

    try:
        return len(jax.devices("cpu"))
    except RuntimeError:
        return 0


def _meshes(tpu: Target | None) -> Callable[[dict[str, int]], Any]:
    """How a candidate's mesh is made: Explicit axes (as `jax.make_mesh`
    makes them) over simulated CPU devices, or over `tpu`'s chips where
    there are too few CPU devices."""
    import jax
    from jax.sharding import AxisType

    def make(sizes: dict[str, int]) -> Any:
        types = (AxisType.Explicit,) * len(sizes)
        if tpu is not None:
            return target_mesh(tpu, MeshSizes(sizes, types))
        devices = jax.devices("cpu")[: math.prod(sizes.values())]
        return jax.make_mesh(tuple(sizes.values()), tuple(sizes), axis_types=types, devices=devices)

    return make
