"""Which dimensions of an operation's operands each dimension of its result
comes from, and the layout that keeps them: how shardrules lays out a result
on Explicit axes where JAX leaves it undecided (or would drop an axis its
operands carried).

For each result dimension, `sources` lists the operand dimensions it is made
from, in order of preference, as `(operand, dimension)`: a gather's batch
dimensions come from its indices' (and, for batched gathers, from the
operand's batching dimensions), its offset dimensions from the operand's
whole (unsliced) dimensions; a contraction's from its batch and free
dimensions; a reshape's merged dimension from the major dimension of the
group it merges, a split dimension's major part from the dimension it
splits; a reduction keeps the dimensions it does not reduce; a convolution's
batch from the input's, its features from the kernel's output features (or
the input's, for a depthwise one); anything else, each operand dimension of
the same rank and size in place (element-wise operations, concatenate, pad,
slices, sort, cumulative operations, scatters' operands).

`propagate` turns that into a spec: each result dimension takes the mesh axes
of its first sharded source; an axis already used by an earlier dimension is
dropped (a spec names an axis once), and so are the trailing axes of a
dimension whose size they do not divide. A gather's batch dimensions claim
their axes before its offset dimensions, wherever they stand: the indices are
the data (a batch of tokens), the operand a table that FSDP splits for
storage, so where both carry an axis the batch keeps it (penzai's embedding
lookup puts the table's dimension first, `(embedding, batch, seq)`). An axis that another dimension of
the result uses still splits the work; one the result does not use at all
is lost, and is kept with the spec, with why: that is what `SR210` warns
about.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from jax.sharding import PartitionSpec

from .._planning._blocks import entry_axes
from .._pspec import entries as spec_entries
from .._pspec import entry as spec_entry

Source = tuple[int, int]  # (operand index, operand dimension)


class Propagated(NamedTuple):
    """The layout of one result: `spec`, and the axes `dropped` from what its
    sources carried that the result does not use at all, as `(dimension,
    axis, why)` (`why`: "does not divide"); `known`: whether the primitive's dimensions are known
    here (for another, every operand dimension of the same size is taken to
    be in place, which is only a guess)."""

    spec: PartitionSpec
    dropped: tuple[tuple[int, str, str], ...]
    known: bool = True


def _shape(x: Any) -> tuple[int, ...] | None:
    shape = getattr(x, "shape", None)
    return None if shape is None else tuple(int(d) for d in shape)


def _same_size(shapes: Sequence[tuple[int, ...] | None], out: tuple[int, ...]) -> list[list[Source]]:
    """Each operand of the result's rank, dimension by dimension, where its
    size is the result's (a size-1 dimension that broadcasts is not)."""
    found: list[list[Source]] = [[] for _ in out]
    for i, shape in enumerate(shapes):
        if shape is None or len(shape) != len(out):
            continue
        for d, (a, b) in enumerate(zip(shape, out, strict=True)):
            if a == b:
                found[d].append((i, d))
    return found


def _gather(shapes: Sequence[Any], params: Mapping[str, Any], out: tuple[int, ...]) -> list[list[Source]]:
    dn = params["dimension_numbers"]
    operand, indices = shapes[0], shapes[1]
    found: list[list[Source]] = [[] for _ in out]
    offset = tuple(dn.offset_dims)
    operand_batching = tuple(getattr(dn, "operand_batching_dims", ()) or ())
    indices_batching = tuple(getattr(dn, "start_indices_batching_dims", ()) or ())
    # the operand's dimensions that become offset dimensions, in order
    kept = [d for d in range(len(operand)) if d not in dn.collapsed_slice_dims and d not in operand_batching]
    slice_sizes = tuple(params["slice_sizes"])
    for o, d in zip(offset, kept, strict=False):
        if slice_sizes[d] == operand[d] == out[o]:  # a whole dimension, not a window of it
            found[o].append((0, d))
    # the result's other dimensions are the indices' batch dimensions (all but the last, the index vector)
    batch = [d for d in range(len(out)) if d not in offset]
    for o, d in zip(batch, range(len(indices) - 1), strict=False):
        if indices[d] == out[o]:
            found[o].append((1, d))
            if d in indices_batching:
                found[o].append((0, operand_batching[indices_batching.index(d)]))
    return found


def _scatter(shapes: Sequence[Any], params: Mapping[str, Any], out: tuple[int, ...]) -> list[list[Source]]:
    found = _same_size(shapes[:1], out)
    dn = params["dimension_numbers"]
    updates = shapes[-1]
    operand_batching = tuple(getattr(dn, "operand_batching_dims", ()) or ())
    kept = [d for d in range(len(out)) if d not in dn.inserted_window_dims and d not in operand_batching]
    for u, d in zip(dn.update_window_dims, kept, strict=False):
        if updates is not None and updates[u] == out[d]:
            found[d].append((len(shapes) - 1, u))
    return found


def _reshape(operand: tuple[int, ...], out: tuple[int, ...]) -> list[list[Source]]:
    """A merged dimension keeps its group's major dimension's axes; a split one
    gives its axes to the major part of the split (where they divide it)."""
    found: list[list[Source]] = [[] for _ in out]
    i = j = 0
    while i < len(operand) and j < len(out):
        if operand[i] == out[j]:
            found[j].append((0, i))
            i, j = i + 1, j + 1
            continue
        # one group: operand[i:i2] and out[j:j2] with the same product
        i2, j2, a, b = i + 1, j + 1, operand[i], out[j]
        while a != b:
            if a < b and i2 < len(operand):
                a, i2 = a * operand[i2], i2 + 1
            elif b < a and j2 < len(out):
                b, j2 = b * out[j2], j2 + 1
            else:
                return found
        major_in = next((k for k in range(i, i2) if operand[k] != 1), i)
        major_out = next((k for k in range(j, j2) if out[k] != 1), j)
        found[major_out].append((0, major_in))
        i, j = i2, j2
    return found


def _dot(shapes: Sequence[Any], params: Mapping[str, Any], out: tuple[int, ...]) -> list[list[Source]]:
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    lhs, rhs = shapes[0], shapes[1]
    found: list[list[Source]] = [[(0, a), (1, b)] for a, b in zip(lb, rb, strict=True)]
    found += [[(0, d)] for d in range(len(lhs)) if d not in lc and d not in lb]
    found += [[(1, d)] for d in range(len(rhs)) if d not in rc and d not in rb]
    return found[: len(out)]


def _conv(shapes: Sequence[Any], params: Mapping[str, Any], out: tuple[int, ...]) -> list[list[Source]]:
    dn = params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    lhs, rhs = shapes[0], shapes[1]
    found: list[list[Source]] = [[] for _ in out]
    if params.get("batch_group_count", 1) == 1:
        found[out_spec[0]].append((0, lhs_spec[0]))
    found[out_spec[1]].append((1, rhs_spec[0]))
    groups = params.get("feature_group_count", 1)
    if groups > 1 and groups == lhs[lhs_spec[1]] == out[out_spec[1]]:  # depthwise: a feature per group
        found[out_spec[1]].append((0, lhs_spec[1]))
    for k in range(2, len(out_spec)):
        if lhs[lhs_spec[k]] == out[out_spec[k]]:  # a spatial dimension the window keeps the size of
            found[out_spec[k]].append((0, lhs_spec[k]))
    del rhs
    return found


def sources(
    name: str, shapes: Sequence[Any], params: Mapping[str, Any], out: Sequence[int]
) -> list[list[Source]]:
    """For each dimension of a result of shape `out` of primitive `name` (its
    operands' shapes `shapes`, `None` for a non-array), the operand dimensions
    it is made from, in order of preference (see the module's docstring)."""
    out = tuple(int(d) for d in out)
    try:
        if name == "dot_general":
            return _dot(shapes, params, out)
        if name == "gather":
            return _gather(shapes, params, out)
        if name.startswith("scatter"):
            return _scatter(shapes, params, out)
        if name == "broadcast_in_dim":
            found: list[list[Source]] = [[] for _ in out]
            for d, o in enumerate(params["broadcast_dimensions"]):
                if shapes[0][d] == out[o]:
                    found[o].append((0, d))
            return found
        if name == "reshape" and shapes[0] is not None:
            return _reshape(shapes[0], out)
        if name == "transpose":
            return [[(0, p)] for p in params["permutation"]]
        if name == "squeeze" and shapes[0] is not None:
            kept = [d for d in range(len(shapes[0])) if d not in params["dimensions"]]
            return [[(0, d)] for d in kept]
        if name in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                    "reduce_xor", "argmax", "argmin") and "axes" in params and shapes[0] is not None:  # fmt: skip
            kept = [d for d in range(len(shapes[0])) if d not in params["axes"]]
            return [[(0, d)] for d in kept]
        if name == "top_k":
            return [[(0, d)] for d in range(len(out) - 1)] + [[]]
        if name == "conv_general_dilated":
            return _conv(shapes, params, out)
        if name in ("dynamic_slice", "dynamic_update_slice", "pad", "concatenate", "slice", "split"):
            return _same_rank(shapes, out, name)
    except (KeyError, AttributeError, IndexError, TypeError):  # parameters of another JAX: in place
        pass
    return _same_size(shapes, out)


# Primitives whose results keep their operands' dimensions in place (besides
# the element-wise ones, which `known` asks `_outputs` for).
_IN_PLACE = {
    "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "sort", "rev", "select_n", "clamp",
    "convert_element_type", "reduce_precision", "copy", "copy_p", "integer_pow", "square",
}  # fmt: skip
_MAPPED = {
    "dot_general", "gather", "broadcast_in_dim", "reshape", "transpose", "squeeze", "reduce_sum",
    "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "reduce_xor", "argmax",
    "argmin", "top_k", "conv_general_dilated", "dynamic_slice", "dynamic_update_slice", "pad",
    "concatenate", "slice", "split",
}  # fmt: skip


def known(name: str) -> bool:
    """Whether `sources` knows how `name`'s dimensions map (rather than guessing)."""
    from ._outputs import elementwise

    return name in _MAPPED or name in _IN_PLACE or name.startswith("scatter") or name in elementwise()


def _same_rank(shapes: Sequence[Any], out: tuple[int, ...], name: str) -> list[list[Source]]:
    """Operations that keep every dimension in place, resized (a slice, a pad,
    a concatenation): each array operand of the result's rank, in place;
    `dynamic_update_slice`'s update and `pad`'s value only where sizes match."""
    found: list[list[Source]] = [[] for _ in out]
    for i, shape in enumerate(shapes):
        if shape is None or len(shape) != len(out):
            continue
        for d in range(len(out)):
            if i == 0 or name == "concatenate" or shape[d] == out[d]:
                found[d].append((i, d))
    return found


def _claim_order(name: str, params: Mapping[str, Any], n: int) -> list[int]:
    """The order in which the first `n` result dimensions of `name` claim their
    sources' axes: a gather's batch dimensions (from the indices) before its
    offset dimensions (from the operand), else the result's own order."""
    if name == "gather":
        try:
            offset = {int(d) for d in params["dimension_numbers"].offset_dims}
        except (KeyError, AttributeError, TypeError):  # parameters of another JAX: in order
            return list(range(n))
        return [d for d in range(n) if d not in offset] + [d for d in range(n) if d in offset]
    return list(range(n))


def propagate(
    name: str,
    operands: Sequence[tuple[tuple[int, ...] | None, PartitionSpec | None]],
    params: Mapping[str, Any],
    out: Sequence[int],
    sizes: Mapping[str, int],
) -> Propagated:
    """The layout of a result of shape `out` of primitive `name` whose operands
    have the shapes and specs `operands` (`(None, None)` for a non-array), on
    a mesh whose axis sizes are `sizes` (see the module's docstring)."""
    shapes = [shape for shape, _ in operands]
    specs = [spec for _, spec in operands]
    out = tuple(int(d) for d in out)
    used: set[str] = set()
    entries: list[Any] = [None] * len(out)
    dropped: list[tuple[int, str, str]] = []
    found_all = sources(name, shapes, params, out)
    for d in _claim_order(name, params, len(found_all)):
        found = found_all[d]
        carried: tuple[str, ...] = ()
        for i, k in found:
            spec = specs[i]
            if spec is not None and entry_axes(spec_entry(spec, k)):
                carried = tuple(entry_axes(spec_entry(spec, k)))
                break
        kept: list[str] = []
        for axis in carried if out[d] > 1 else ():  # a size-1 dimension is split by no axis
            if axis in used:
                dropped.append((d, axis, "used twice"))
            elif out[d] % (math.prod(sizes.get(a, 1) for a in kept) * sizes.get(axis, 1)) != 0:
                dropped.append((d, axis, "does not divide"))
            else:
                kept.append(axis)
        used.update(kept)
        entries[d] = None if not kept else kept[0] if len(kept) == 1 else tuple(kept)
    # an axis another dimension uses still splits the work: only one the result lacks is lost
    lost = tuple(d for d in dropped if d[1] not in used)
    return Propagated(PartitionSpec(*entries), lost, known(name))


def axes_of(spec: Any) -> set[str]:
    """The mesh axes a spec names."""
    return {a for entry in (spec_entries(spec) if spec else ()) for a in entry_axes(entry)}
