"""`fsdp_dim="largest"`: FSDP along each array's largest dimension that divides.

The layout of kauldron's `FSDPSharding` (and of other FSDP implementations
that shard "the largest dimension"): an array smaller than `min_bytes` is
whole on every device; a larger one is split over the FSDP axes along its
largest dimension whose size they divide, of equal ones the last (kauldron
tries the dimensions in `numpy.argsort(shape)[::-1]` order, which puts the
last of equal sizes first); where none divides, it is whole. `default ->
auto(...)` takes the first of equal dimensions instead, so a leaf not
recognised by name whose choice differs (two largest dimensions of one size)
gets a rule of its own (`TIE`), and the file gives every leaf kauldron's
choice.

Each dimension chosen is written by its logical name where it has one (the
aliases `embed`, `heads`, `mlp`, `vocab`, `experts`, `norm` then all stand for
the FSDP axes), else by the axes themselves (a head's width, stacked layers).
"""

from __future__ import annotations

import math

from .._planning._plan import format_bytes
from ._dims import Dims
from ._strategy import Axes, Layout

DIMS = ("embed", "largest")
"""What `fsdp_dim=` may ask: the hidden size (`embed`, MaxText's) or the largest dimension."""
ALIASES = ("embed", "heads", "mlp", "vocab", "experts", "norm")
_NAMED = {"embed": "embed", "heads": "heads", "kv_heads": "heads", "mlp": "mlp", "vocab": "vocab"}
_NAMED |= {"experts": "experts", "norm": "norm"}
TIE = (
    "largest dimensions of one size: the last is split, as kauldron's FSDPSharding does "
    "(`default`'s `auto` would split the first)"
)


def chosen(shape: tuple[int, ...], split: int) -> int | None:
    """The dimension kauldron's order takes: the largest that `split`
    divides, of equal sizes the last; `None` where none divides."""
    for i in sorted(range(len(shape)), key=lambda i: (shape[i], i), reverse=True):
        if shape[i] % split == 0:
            return i
    return None


def auto_chosen(shape: tuple[int, ...], split: int) -> int | None:
    """The dimension `auto(...)` takes: the largest that divides, of equal sizes the first."""
    for i in sorted(range(len(shape)), key=lambda i: (-shape[i], i)):
        if shape[i] % split == 0:
            return i
    return None


def split_of(layout: Layout, sizes: dict[str, int]) -> int:
    return math.prod(sizes[a] for a in layout.fallback)


def bounds(min_bytes: int) -> tuple[str, str]:
    """How `min_bytes` reads: the arrays split ("over 4 MiB", "of 1 MiB or
    more") and those kept whole ("of at most 4 MiB", "under 1 MiB")."""
    if min_bytes > 1 and (min_bytes - 1) % 1024 == 0:
        return f"over {format_bytes(min_bytes - 1)}", f"of at most {format_bytes(min_bytes - 1)}"
    return f"of {format_bytes(min_bytes)} or more", f"under {format_bytes(min_bytes)}"


def entries(
    dims: Dims | None,
    shape: tuple[int, ...],
    nbytes: int,
    layout: Layout,
    sizes: dict[str, int],
    min_bytes: int,
) -> tuple[tuple[str, ...], str | None, bool]:
    """An array's entries (one per dimension, `_` where not split), the note
    on its rule, and whether the dimension split is one of stacked layers (then
    written as it is, not as `...`)."""
    whole = ("_",) * len(shape)
    if nbytes < min_bytes:
        small = bounds(min_bytes)[1]
        return whole, f"arrays {small} (min_bytes={min_bytes}): kept whole on every device", False
    at = chosen(shape, split_of(layout, sizes))
    if at is None:
        return (
            whole,
            f"no dimension divides by {_axes(layout.fallback, sizes)}: kept whole on every device",
            False,
        )
    logical = dims.names[at] if dims is not None else None
    alias = _NAMED.get(logical or "")
    entry = layout.names[alias] if alias is not None else _text(layout.fallback)
    return tuple(entry if j == at else "_" for j in range(len(shape))), None, logical == "layers"


def targets(layout: Layout) -> dict[str, tuple[Axes, ...]]:
    """The aliases' targets: each logical dimension may be the one split, over the FSDP axes."""
    out = dict(layout.targets)
    for alias in ALIASES:
        out[alias] = (layout.fallback,)
    return out


def header(layout: Layout, sizes: dict[str, int], min_bytes: int) -> str:
    return (
        f"fsdp_dim=largest: each array {bounds(min_bytes)[0]} is split over "
        f"{_axes(layout.fallback, sizes)} along its largest dimension that divides (of equal ones the last), "
        "as kauldron's FSDPSharding lays arrays out; smaller ones, and those no dimension of which divides, "
        "are whole on every device."
    )


def _text(axes: Axes) -> str:
    return axes[0] if len(axes) == 1 else "(" + ", ".join(axes) + ")"


def _axes(axes: Axes, sizes: dict[str, int]) -> str:
    if len(axes) == 1:
        return f"{axes[0]}={sizes[axes[0]]}"
    return "(" + ", ".join(f"{a}={sizes[a]}" for a in axes) + f") = {math.prod(sizes[a] for a in axes)}"
