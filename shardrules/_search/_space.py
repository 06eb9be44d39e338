"""The meshes a search tries: every way of laying `N` devices out over the
axes each strategy uses.

| strategy | axes (in mesh order) |
|---|---|
| `dp` | `data` |
| `fsdp` | `data`?, `fsdp` |
| `tp` | `data`?, `model` |
| `fsdp+tp` | `data`?, `fsdp`, `model` |
| `ep` | `data`?, `fsdp`?, `expert`, `model`? (models with experts only) |

An axis marked `?` may be left out; every axis in a mesh has a size of at
least 2 (an axis of size 1 splits nothing: the mesh without it is another
candidate), and the sizes multiply to `N`. `data` splits only the batch (the
weights whole along it, as DDP and MaxText's `data` axis); it joins a mesh
only where the batch divides over it and the other batch axes together.
The axes are named as the `suggest` strategies know them (`_strategy`), so the
drafted rules of each candidate are `suggest`'s own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

AXES = ("data", "fsdp", "expert", "model")
"""Every axis a searched mesh may have, in the order a mesh line lists them
(the tensor-parallel axis last: on a TPU slice the innermost, fastest links)."""

_PLANS: dict[str, tuple[tuple[str, bool], ...]] = {  # (axis, required) per strategy
    "dp": (("data", True),),
    "fsdp": (("data", False), ("fsdp", True)),
    "tp": (("data", False), ("model", True)),
    "fsdp+tp": (("data", False), ("fsdp", True), ("model", True)),
    "ep": (("data", False), ("fsdp", False), ("expert", True), ("model", False)),
}
STRATEGIES = tuple(_PLANS)
"""The strategies a search tries, in the order they are listed."""


@dataclasses.dataclass(frozen=True)
class Shape:
    """One mesh of the search space: a strategy and its axes' sizes, in mesh order."""

    strategy: str
    sizes: tuple[tuple[str, int], ...]

    @property
    def mesh(self) -> dict[str, int]:
        return dict(self.sizes)

    @property
    def text(self) -> str:
        """As a mesh line writes it: `fsdp=32, model=8`."""
        return ", ".join(f"{name}={size}" for name, size in self.sizes)

    def size(self, axis: str) -> int:
        return self.mesh.get(axis, 1)


def divisors(n: int) -> list[int]:
    """The divisors of `n` of at least 2, smallest first."""
    return [d for d in range(2, n + 1) if n % d == 0]


def _splits(n: int, count: int) -> Iterator[tuple[int, ...]]:
    """Every ordered way of writing `n` as a product of `count` factors, each at least 2."""
    if count == 1:
        if n >= 2:
            yield (n,)
        return
    for first in divisors(n):
        for rest in _splits(n // first, count - 1):
            yield (first, *rest)


def shapes(devices: int, *, experts: bool, only: str | None = None) -> list[Shape]:
    """Every candidate mesh of `devices` devices: each strategy's axes (those
    marked optional present or not) with sizes of at least 2 multiplying to
    `devices`; `ep` only for a model with `experts`; `only`: that strategy's
    alone. In the table's order: by strategy, then by the sizes of the axes
    in mesh order."""
    if devices < 2:
        raise ValueError(f"a search needs at least 2 devices, not {devices}")
    out: list[Shape] = []
    for strategy, plan in _PLANS.items():
        if (only is not None and strategy != only) or (strategy == "ep" and not experts):
            continue
        optional = [axis for axis, required in plan if not required]
        found: list[Shape] = []
        for mask in range(1 << len(optional)):
            present = {a for i, a in enumerate(optional) if mask >> i & 1}
            axes = [axis for axis, required in plan if required or axis in present]
            found += [
                Shape(strategy, tuple(zip(axes, split, strict=True))) for split in _splits(devices, len(axes))
            ]
        out += sorted(found, key=lambda s: [s.size(a) for a in AXES])
    return out


def batch_product(shape: Shape, batch_axes: tuple[str, ...]) -> int:
    """The devices the batch is split over: the product of `batch_axes`' sizes."""
    return math.prod(shape.size(a) for a in batch_axes)
