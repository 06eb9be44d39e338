"""The file a search writes: the chosen candidate's rule file, a header
saying how it was chosen, and a comment table of every candidate (mesh,
strategy, peak per device, estimated time or FLOPs ratio, collective bytes,
and why each other one lost or was set aside)."""

from __future__ import annotations

from .._language._format import format_text
from .._language._load import loads
from .._planning._plan import format_bytes
from ._search import Row, Search, collective_bytes, seconds

_ORDER = {"chosen": 0, "compiled": 1, "screened": 2, "not compiled": 3, "rejected": 4}


def written(found: Search, command: str = "shardrules suggest --search") -> str:
    """The rule file of `found`'s chosen candidate with the search's header and table."""
    if found.chosen is None:
        raise ValueError("no candidate to write")
    head = [f"# Chosen by `{command}`: {_how(found)}"]
    if found.stopped:
        head.append(f"# Stopped early: {found.stopped}; this is the best found so far.")
    ratio = _ratio(found.chosen, found)
    if ratio is not None and ratio >= 1.5:
        head.append(
            f"# Each device runs {ratio:.2f}x its share of the one-device step: {found.devices} devices "
            "divide few of the model's sizes (a device count with more factors of 2 splits it better)."
        )
    if found.chosen.cost is None:
        head.append(
            "# Only screened (on CPU devices, with the chip's figures): no candidate was compiled for the "
            "target before the budget ran out."
        )
    text = found.chosen.candidate.text.rstrip("\n")
    table = table_lines(found)
    out = "\n".join([*_wrap(head), "", text, "", *table]) + "\n"
    out = format_text(out, "<search>")
    loads(out, name="<search>")  # a bug here, not in the input, if it does not load
    return out


def _how(found: Search) -> str:
    costed = sum(1 for r in found.rows if r.cost is not None)
    where = f"{found.devices} devices"
    if found.target is not None:
        where += f" of {found.target.name} ({found.target.chip.name})"
    memory = ""
    if found.usable is not None:
        memory = f", peaks within {format_bytes(found.usable)} per device ({found.headroom:.0%} kept free)"
    rule = (
        "the lowest estimated step time"
        if found.target is not None
        else "the fewest FLOPs per device (within 5%), then the fewest collective bytes, then the lowest peak"
    )
    return (
        f"{len(found.rows)} candidate meshes and rule files for {where}, {costed} compiled in "
        f"{_duration(found.seconds)}{memory}; {rule}. The table at the end lists them."
    )


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def _wrap(lines: list[str], width: int = 100) -> list[str]:
    out: list[str] = []
    for line in lines:
        words, current = line[2:].split(" "), "#"
        for word in words:
            if len(current) + 1 + len(word) > width and current != "#":
                out.append(current)
                current = "#"
            current += " " + word
        out.append(current)
    return out


def table_lines(found: Search) -> list[str]:
    """The candidates as comment lines, the chosen first, then by estimate."""
    timed = found.target is not None
    rows = sorted(found.rows, key=lambda r: (_ORDER[r.status], _sort(r, timed)))
    header = ["mesh", "strategy", "peak/device", "time" if timed else "FLOPs x", "collectives", "outcome"]
    cells = [header] + [_cells(r, found, timed) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header) - 1)]
    figure = (
        "time: the step's estimated time on the target"
        if timed
        else "FLOPs x: each device's FLOPs over its share of the one-device step's"
    )
    out = [f"# Candidates, per device and step: the peak memory, {figure}, the bytes of its collectives."]
    if any(r.screen is not None for r in found.rows):
        out.append(
            "# `screened`, `(CPU)`: compiled on simulated CPU devices and timed with the chip's figures, "
            "not compiled for the target."
        )
    for c in cells:
        line = "#   " + "  ".join(v.ljust(w) for v, w in zip(c, widths, strict=False)) + "  " + c[-1]
        out.append(line.rstrip())
    return out


def _ratio(row: Row, found: Search) -> float | None:
    cost = row.cost
    return cost.flops_per_device / found.ideal_flops if cost is not None and found.ideal_flops else None


def _sort(row: Row, timed: bool) -> float:
    cost = row.cost or row.screen
    if cost is None:
        return 0.0
    if timed and cost.time_estimate_s is not None:
        return cost.time_estimate_s
    return cost.flops_per_device


def _cells(row: Row, found: Search, timed: bool) -> list[str]:
    cost = row.cost or row.screen
    outcome = row.status + (f": {row.why}" if row.why else "")
    if cost is None:
        return [row.shape.text, row.shape.strategy, "-", "-", "-", outcome]
    if timed and cost.time_estimate_s is not None:
        figure = seconds(cost.time_estimate_s) + (" (CPU)" if row.cost is None else "")
    elif found.ideal_flops:
        figure = f"{cost.flops_per_device / found.ideal_flops:.3f}"
    else:
        figure = f"{cost.flops_per_device:.3g} FLOPs"
    return [
        row.shape.text,
        row.shape.strategy,
        format_bytes(cost.peak_bytes_per_device),
        figure,
        format_bytes(collective_bytes(cost)),
        outcome,
    ]
