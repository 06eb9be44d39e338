"""A `PartitionSpec`'s entries, read the same way on every JAX.

Newer JAX lets a spec name `unreduced` and `reduced` axes besides one entry
per dimension: a value holding partial sums along an axis (the gradient of a
weight that is `reduced` along it), or one replicated along an axis whose
cotangent is unreduced. Such a spec refuses to be iterated or indexed
(`P(*spec)`, `spec[0]`, `tuple(spec)` raise a `ValueError` asking for
`spec.partitions`); JAX 0.8 has no `partitions` (its tagged specs iterate).
Every module reads a spec's entries, and makes a spec from another one,
through these functions, so that the tags are neither refused nor dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jax.sharding import PartitionSpec


def entries(spec: PartitionSpec) -> tuple[Any, ...]:
    """The entries of `spec`, one per dimension it names (`spec.partitions`;
    on JAX without it, the spec iterated)."""
    partitions = getattr(spec, "partitions", None)
    if isinstance(partitions, tuple):
        return partitions
    return tuple(spec)


def entry(spec: PartitionSpec, dim: int) -> Any:
    """The entry of `spec` for dimension `dim`: `None` past its end."""
    have = entries(spec)
    return have[dim] if dim < len(have) else None


def tags(spec: PartitionSpec) -> tuple[frozenset[str], frozenset[str]]:
    """The `unreduced` and `reduced` axes of `spec` (empty on JAX without them)."""
    return frozenset(getattr(spec, "unreduced", ())), frozenset(getattr(spec, "reduced", ()))


def with_entries(spec: PartitionSpec, new: Iterable[Any]) -> PartitionSpec:
    """A spec with the entries `new` and the `unreduced` and `reduced` axes
    (and whatever else JAX keeps beside them) of `spec`."""
    new = tuple(new)
    if not any(tags(spec)):
        return PartitionSpec(*new)
    return spec.update(partitions=new)


def cotangent(spec: PartitionSpec) -> PartitionSpec:
    """The layout JAX's transpose gives the cotangent of a value laid out as
    `spec`: its `reduced` axes become `unreduced` (the cotangent holds partial
    sums there) and the reverse (`spec.to_ct_spec()`; without it, the same
    swap made with `spec.update`)."""
    unreduced, reduced = tags(spec)
    if not unreduced and not reduced:
        return spec
    swap = getattr(spec, "to_ct_spec", None)
    if swap is not None:
        return swap()
    return spec.update(unreduced=reduced, reduced=unreduced)


def padded(spec: PartitionSpec, rank: int) -> PartitionSpec:
    """`spec` with `None` entries added up to `rank` (as long as it is already
    when it is not shorter), its tags kept."""
    have = entries(spec)
    if len(have) >= rank:
        return spec
    return with_entries(spec, have + (None,) * (rank - len(have)))


def described(spec: PartitionSpec, entry_text: Any = repr) -> str:
    """`P(...)` as shardrules writes a spec in messages and tables: each entry
    by `entry_text`, then the tags, as JAX writes them (`unreduced={'data'}`)."""
    parts = [entry_text(e) for e in entries(spec)]
    for name, axes in zip(("unreduced", "reduced"), tags(spec), strict=True):
        if axes:
            parts.append(f"{name}={{{', '.join(repr(a) for a in sorted(axes))}}}")
    return "P(" + ", ".join(parts) + ")"
