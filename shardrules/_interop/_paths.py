"""Pytree leaves and their paths.

A leaf's path is its key path rendered with `/`: a dict key as `str(key)`, an
attribute by its name, a sequence index as its number. Wrappers that only box
a value (such as Flax's `Partitioned`, NNX's `Variable`, penzai's
`NamedArray` or haliax's `NamedArray`) add no segment; a penzai variable is keyed by its label
(`_penzai`).

An array leaf is anything with a tuple `shape` and a NumPy `dtype`, or a PRNG
key array (`jax.random.key`: its shape leaves out the key data's trailing
dimension, its dtype is `key<fry>`, whose item size is the key data's).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from .._errors import Diagnostic, error_for
from . import _penzai

KeyPath = tuple[Any, ...]


def key_str(key: Any) -> str:
    """One path segment for one key-path entry."""
    if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
    if isinstance(key, jax.tree_util.GetAttrKey):
        return key.name
    if isinstance(key, jax.tree_util.SequenceKey):
        return str(key.idx)
    if isinstance(key, jax.tree_util.FlattenedIndexKey):
        return str(key.key)
    return str(key)


def path_str(keypath: Sequence[Any]) -> str:
    """`(DictKey('layers'), SequenceKey(0), DictKey('kernel'))` → `"layers/0/kernel"`."""
    return "/".join(key_str(k) for k in keypath)


def path_strs(keypaths: Sequence[Sequence[Any]]) -> list[str]:
    """`path_str` of many key paths, rendering each distinct key once."""
    seen: dict[Any, str] = {}
    out = []
    for keypath in keypaths:
        parts = []
        for key in keypath:
            # Keys equal across types (0, 0.0 and False) render differently: keep the type in the key.
            memo = (type(key), type(getattr(key, "key", None)), key)
            try:
                text = seen.get(memo)
            except TypeError:  # an unhashable key
                text, memo = None, None
            if text is None:
                text = key_str(key)
                if memo is not None:
                    seen[memo] = text
            parts.append(text)
        out.append("/".join(parts))
    return out


@dataclasses.dataclass(frozen=True)
class LeafInfo:
    """What the compiler needs to know of one leaf."""

    path: str
    shape: tuple[int, ...] | None  # None: not an array
    dtype: np.dtype | None  # a PRNG key array's is JAX's extended key dtype (`.name`, `.itemsize`)

    @property
    def is_array(self) -> bool:
        return self.shape is not None

    @property
    def size(self) -> int:
        return math.prod(self.shape) if self.shape is not None else 0

    @property
    def nbytes(self) -> int:
        if self.shape is None or self.dtype is None:
            return 0
        return self.size * self.dtype.itemsize


def leaf_info(path: str, leaf: Any) -> LeafInfo:
    """Classify a leaf. Arrays are anything with a tuple `shape` and a `dtype`:
    `jax.Array`, `numpy.ndarray`, NumPy scalars, `jax.ShapeDtypeStruct`, PRNG
    key arrays. Python numbers, strings, functions and other objects are not
    arrays."""
    if isinstance(leaf, type):
        return LeafInfo(path, None, None)
    found = array_of(getattr(leaf, "shape", None), getattr(leaf, "dtype", None))
    return LeafInfo(path, None, None) if found is None else LeafInfo(path, *found)


def array_of(shape: Any, dtype: Any) -> tuple[tuple[int, ...], Any] | None:
    """`(shape, dtype)` of an array leaf (not a class) whose `shape` and `dtype`
    these are, as `leaf_info` reads them, or `None` when they are not an array's."""
    if isinstance(shape, tuple) and dtype is not None:
        try:
            dims = tuple(int(d) for d in shape)
        except TypeError:  # symbolic dimensions
            return None
        try:
            return dims, np.dtype(dtype)
        except TypeError:
            if is_key_dtype(dtype):
                return dims, dtype
    return None


def is_key_dtype(dtype: Any) -> bool:
    """Whether `dtype` is a PRNG key dtype (`jax.random.key(0).dtype`, `key<fry>`)."""
    try:
        return bool(jax.numpy.issubdtype(dtype, jax.dtypes.prng_key))
    except TypeError:
        return False


def flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> tuple[list[tuple[KeyPath, Any]], Any]:
    """`jax.tree_util.tree_flatten_with_path`, with a clear error for trees JAX
    cannot flatten (such as dicts whose keys cannot be sorted)."""
    try:
        keyed, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
    except (ValueError, TypeError) as err:
        raise error_for(
            [
                Diagnostic(
                    "SR109",
                    "error",
                    f"cannot flatten the input as a pytree: {err}",
                    hint="dict keys of one dict must be comparable with each other (all str, or all int)",
                )
            ]
        ) from err
    boxes = (*box_types(), *_penzai.named_types())
    roots = _penzai.variable_types()[2]
    if (boxes or roots) and keyed:
        keyed = _unboxed(tree, keyed, boxes, roots, is_leaf)
    return keyed, treedef


def box_types() -> tuple[type, ...]:
    """The wrapper types that only box a value, add no path segment and may
    carry logical axis names (`_logical`): Flax linen's `Partitioned` (and
    `LogicallyPartitioned`), NNX's `Variable` and haliax's `NamedArray` (its
    `axis_names`; JAX keys its one child, the `array`, `FlattenedIndexKey(0)`).
    (penzai's named arrays are boxes too: `flatten` adds
    `_penzai.named_types()`.) Neither library is imported here: if it is not
    loaded, no such box can exist."""
    found: list[type] = []
    meta = sys.modules.get("flax.core.meta")
    if meta is not None and isinstance(getattr(meta, "Partitioned", None), type):
        found.append(meta.Partitioned)
    variables = sys.modules.get("flax.nnx.variablelib")
    if variables is not None and isinstance(getattr(variables, "Variable", None), type):
        found.append(variables.Variable)
    core = sys.modules.get("haliax.core")
    if core is not None and isinstance(getattr(core, "NamedArray", None), type):
        found.append(core.NamedArray)
    return tuple(found)


def _unboxed(
    tree: Any,
    keyed: list[tuple[KeyPath, Any]],
    boxes: tuple[type, ...],
    roots: tuple[type, ...],
    is_leaf: Callable[[Any], bool] | None,
) -> list[tuple[KeyPath, Any]]:
    """`keyed` with the key of each box's one child (`value`) left out of the
    paths, and penzai's variables keyed by their labels (`_penzai.paths_within`)."""
    # Every box (and penzai object) but a live variable adds an attribute key,
    # or (haliax's `NamedArray`, a class flattening itself) a flattened index.
    attr = (jax.tree_util.GetAttrKey, jax.tree_util.FlattenedIndexKey)
    if not any(isinstance(k, attr) for keypath, _ in keyed for k in keypath) and not (
        roots and any(isinstance(leaf, roots) for _, leaf in keyed)
    ):
        return keyed
    # The common case (a path walker hands over one box at a time): the box's
    # leaves all sit under its one child; drop that key, unless more boxes follow.
    first = keyed[0][0][:1]
    if (
        first
        and isinstance(tree, boxes)
        and (is_leaf is None or not is_leaf(tree))
        and all(keypath[:1] == first for keypath, _ in keyed)
    ):
        inner = [(keypath[1:], leaf) for keypath, leaf in keyed]
        if not any(isinstance(k, attr) for keypath, _ in inner for k in keypath):
            return inner

    def stop(x: Any) -> bool:
        return isinstance(x, (*boxes, *roots)) or (is_leaf is not None and bool(is_leaf(x)))

    outer = jax.tree_util.tree_flatten_with_path(tree, is_leaf=stop)[0]
    paths: list[KeyPath] = []
    for keypath, node in outer:
        if not isinstance(node, boxes):
            if isinstance(node, roots) and (is_leaf is None or not is_leaf(node)):  # a penzai model
                within = _penzai.paths_within(node, is_leaf, lambda x: [k for k, _ in flatten(x, is_leaf)[0]])
                prefix = path_str(keypath)
                for sub in within:
                    if _penzai.names_itself(prefix, node, sub):  # {label: variable}: the label once
                        paths.append((_penzai.LabelKey(prefix), *sub[1:]))
                    else:
                        paths.append((*keypath, *sub))
            else:
                paths.append(keypath)
            continue
        children = jax.tree_util.tree_flatten(node, is_leaf=lambda x, node=node: x is not node)[0]
        if len(children) == 1:  # a box of one value: its contents, keyed from the box
            inner = flatten(children[0], is_leaf)[0]
        else:  # not only a box after all: keep JAX's paths
            inner = jax.tree_util.tree_flatten_with_path(node, is_leaf=is_leaf)[0]
        paths.extend((*keypath, *sub) for sub, _ in inner)
    if len(paths) != len(keyed):  # cannot happen for pytrees JAX flattens consistently
        return keyed
    return [(path, leaf) for path, (_, leaf) in zip(paths, keyed, strict=True)]


def leaf_paths(tree: Any) -> list[str]:
    """The `/`-joined path of every leaf of `tree`, in `jax.tree_util` order.

    Plain dicts, lists, tuples, namedtuples and `None` (the bulk of large
    parameter trees) are walked here directly; every other node is handed to
    `jax.tree_util.tree_flatten_with_path`, so the result is always JAX's. A
    type that JAX turns out to treat as a leaf (arrays, `ShapeDtypeStruct`) is
    remembered for the rest of the walk and not handed over again.
    """
    out: list[str] = []
    append = out.append
    leaf_types: set[type] = set()

    def walk(node: Any, prefix: str | None) -> None:
        kind = type(node)
        if kind in leaf_types:
            append(prefix or "")
            return
        if kind is dict:
            try:
                keys = sorted(node)
            except TypeError:
                keys = None
            if keys is not None:
                for key in keys:
                    child = node[key]
                    segment = key if type(key) is str else str(key)
                    path = segment if prefix is None else f"{prefix}/{segment}"
                    if type(child) in leaf_types:  # most children: no call needed
                        append(path)
                    else:
                        walk(child, path)
                return
        elif kind is list or kind is tuple:
            for i, child in enumerate(node):
                walk(child, str(i) if prefix is None else f"{prefix}/{i}")
            return
        elif node is None:
            return
        elif isinstance(node, tuple) and hasattr(kind, "_fields") and kind.__bases__ == (tuple,):
            for name, child in zip(kind._fields, node, strict=True):
                walk(child, _join(prefix, name))
            return
        _other(node, prefix, out, leaf_types)

    walk(tree, None)
    return out


def flat_keys(treedef: Any) -> list[str] | None:
    """The keys of a tree that is one dict of leaves keyed by `str`s (what
    `load_shapes` reads from a file), in JAX's order, read from its `treedef`;
    `None` for any other tree. No two such trees with equal treedefs differ in
    their keys' types, and unless a leaf is a penzai object (see
    `flat_paths`) the keys are the leaves' paths."""
    if treedef.num_nodes != treedef.num_leaves + 1 or not treedef.num_leaves:
        return None  # a node inside, or a `None` value (a node without leaves)
    data = treedef.node_data()
    if data is None or data[0] is not dict:
        return None
    keys = list(data[1])
    return keys if set(map(type, keys)) == {str} else None


def flat_paths(treedef: Any, leaves: list[Any]) -> list[str] | None:
    """`leaf_paths` of a tree that is one dict of leaves keyed by `str`s,
    without walking it: its keys (`flat_keys`). `None` for any other tree, and
    where a leaf is a penzai object, which is keyed by its label."""
    keys = flat_keys(treedef)
    if keys is None:
        return None
    roots = _penzai.variable_types()[2]
    if roots and any(isinstance(leaf, roots) for leaf in leaves):
        return None
    return keys


def _join(prefix: str | None, segment: str) -> str:
    return segment if prefix is None else f"{prefix}/{segment}"


def _other(node: Any, prefix: str | None, out: list[str], leaf_types: set[type]) -> None:
    """Paths under a node that JAX flattens with a rule of its own, or of a leaf
    of a type not seen before."""
    kind = type(node)
    keyed, _ = flatten(node)
    for keypath, _ in keyed:
        if _penzai.names_itself(prefix, node, keypath):  # {label: variable}: the label once
            out.append(_join(prefix, path_str(keypath[1:])) if len(keypath) > 1 else prefix or "")
        elif keypath:
            out.append(_join(prefix, path_str(keypath)))
        else:  # `node` is itself a leaf
            out.append(prefix or "")
    if len(keyed) == 1 and not keyed[0][0] and keyed[0][1] is node and not _penzai.is_live(node):
        leaf_types.add(kind)  # JAX has no flatten rule for this type: its values are leaves
