"""`suggest(search=True)`'s arguments checked and the search run: what the
Python API and the command line share."""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from .._costs._targets import parse_target
from .._language._sizes import byte_size
from .._planning._plan import format_bytes
from .._planning._shapes import import_callable
from .._suggest._strategy import STRATEGIES
from ._probe import StepError
from ._report import written
from ._search import Search, search


@dataclasses.dataclass(frozen=True)
class Searched:
    """A search's written file and the search itself."""

    text: str
    search: Search


class NoneFitsError(ValueError):
    """Every candidate the search compiled has a peak over the memory."""

    def __init__(self, message: str, found: Search) -> None:
        super().__init__(message)
        self.search = found


def searched(
    tree: Any,
    mesh: Any,
    strategy: str,
    *,
    step: Any,
    devices: int | None,
    target: str | None,
    hbm: int | str | None,
    hbm_headroom: float,
    budget: float | None,
    progress: Callable[[str], None] | None,
    head_dim: int | None,
    min_bytes: int,
    embedding: str | None,
    others: dict[str, Any],
    command: str = "sr.suggest(search=True)",
) -> Searched:
    """Check `suggest(search=True, ...)`'s arguments, search, write the file.

    **Raises:** `TypeError` for arguments a search does not take, `ValueError`
    for values it cannot use, `StepError` for a step it cannot call,
    `NoneFitsError` when no candidate's peak fits."""
    if tree is not None or mesh is not None:
        raise TypeError(
            "a search drafts from the step's own arguments and chooses the mesh: pass step= and devices= "
            "instead of a tree and a mesh (sr.suggest(search=True, step=make_step, devices=8))"
        )
    for name, value in others.items():
        if value:
            raise TypeError(f"{name} is not taken by a search; leave it out")
    if step is None:
        raise TypeError("a search needs step=: a function (rules, mesh) -> (sr.jit step, example arguments)")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    chosen = parse_target(target) if target is not None else None
    chips = math.prod(chosen.shape) if chosen is not None and chosen.shape else None
    if devices is None:
        if chosen is not None and chips is None:
            raise TypeError(
                f"target {chosen.name!r} names a GPU, not how many: a search needs devices= (how many GPUs "
                "to lay the step out on)"
            )
        if chips is None:
            raise TypeError("a search needs devices= (how many devices to lay the step out on)")
        devices = chips
    if chips is not None and devices != chips:
        raise ValueError(
            f"devices={devices} and target {chosen.name!r} has {chips} chips: leave devices out (the "  # type: ignore[union-attr]
            "topology's chips are searched), or name a topology of that many chips"
        )
    if not isinstance(devices, int) or devices < 2:
        raise ValueError(f"devices must be an int of at least 2, not {devices!r}")
    if not 0 <= hbm_headroom < 1:
        raise ValueError(f"hbm_headroom must be a share from 0 to under 1, not {hbm_headroom!r}")
    if budget is not None and budget <= 0:
        raise ValueError(f"budget must be a positive number of seconds, not {budget!r}")
    name = step if isinstance(step, str) else getattr(step, "__name__", "step")
    factory = import_callable(step, "train:make_step") if isinstance(step, str) else step
    if not callable(factory):
        raise StepError(f"step {name!r} is not callable: give a function (rules, mesh) -> (step, arguments)")
    found = search(
        factory,
        devices,
        name=name,
        target=chosen,
        hbm=None if hbm is None else byte_size(hbm),
        headroom=hbm_headroom,
        budget=budget,
        progress=progress,
        strategy=None if strategy == "auto" else strategy,
        head_dim=head_dim,
        min_bytes=min_bytes,
        embedding=embedding,
    )
    if found.chosen is None:
        raise NoneFitsError(_none(found), found)
    return Searched(written(found, command), found)


def _none(found: Search) -> str:
    """Why no candidate was chosen: the lowest peak, or the reasons candidates were set aside."""
    costed = [r for r in found.rows if r.cost is not None]
    kept = f"{found.headroom:.0%} of the memory kept free"
    if costed:
        low = min(costed, key=lambda r: r.cost.peak_bytes_per_device)  # type: ignore[union-attr]
        peak = format_bytes(low.cost.peak_bytes_per_device)  # type: ignore[union-attr]
        return (
            f"no candidate fits: the lowest peak is {peak} per device ({low.shape.text}, "
            f"{low.shape.strategy}), over the {format_bytes(found.usable or 0)} a device may use ({kept}); "
            "give more devices, a chip with more memory, or a smaller batch"
        )
    if found.stopped:
        return f"no candidate was compiled: {found.stopped}; give a larger budget"
    reasons = Counter(re.sub(r"\d+", "N", r.why.split(":")[0]) for r in found.rows)
    common = "; ".join(f"{n} x {why}" for why, n in reasons.most_common(3))
    batch = ""
    if any(r.why.startswith("the batch of") for r in found.rows):
        batch = f"; a global batch that divides by {found.devices} lets every mesh split it"
    return f"no candidate could be compiled: {len(found.rows)} set aside, most often because: {common}{batch}"
