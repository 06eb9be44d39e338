"""penzai models: parameters keyed by their labels, named arrays seen through.

A penzai model is a pytree of `pz.Struct`s, but its weights live in
`pz.Parameter`s (and its mutable state in `pz.StateVariable`s): mutable
objects that are deliberately not pytree nodes, so JAX sees each as one
opaque leaf. Each has a `label` that names it across the model, such as
`transformer/block_0/attention/query.weights`: what penzai prints, what
`pz.unbind_params` and checkpoints key parameters by, and what penzai
requires to be unique (two variables with one label are an error there).

So shardrules keys a variable by its label rather than by the attributes
leading to it (`body/sublayers/1/sublayers/0/delta/sublayers/1/...`):

- the path of a variable, live (`Parameter`, `StateVariable`) or frozen
  (`ParameterValue`, `StateVariableValue`, as `pz.unbind_params(...,
  freeze=True)` gives them), is the path to the outermost penzai object
  holding it followed by its label: `transformer/...` for a model passed
  whole, `model/transformer/...` for a model under the key `model`,
  `0/mu/3/transformer/...` in an optimizer state over frozen values (a path
  that already ends with the label, as in a dict keyed by labels, gets it
  once);
- a variable whose label is not a string (a `StateVariable`'s automatic
  label), or whose label another variable of the same model shares, is a box
  like NNX's `Variable`: it adds no segment to its attribute path;
- `pz.nx.NamedArray` and `NamedArrayView` are boxes: their positional data
  array is the leaf, and they add no segment.

A live variable stays one leaf of the tree (its entry in `sr.specs` is the
spec of its array); the array planned and placed is its value's one array,
and `apply` puts new variables of the same label and metadata, holding the
placed values, where the old ones were (one new variable for each old one,
however often it appears). penzai is never imported here: without
`penzai.core.variables` in `sys.modules` there is nothing to do.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import jax

KeyPath = tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class LabelKey:
    """A key-path entry standing for a penzai variable's label (a `/`-joined path itself)."""

    label: str

    def __str__(self) -> str:
        return self.label


def _attr(module: str, name: str) -> type | None:
    found = getattr(sys.modules.get(module), name, None)
    return found if isinstance(found, type) else None


def named_types() -> tuple[type, ...]:
    """penzai's named arrays: boxes of one positional data array."""
    found = (
        _attr("penzai.core.named_axes", "NamedArray"),
        _attr("penzai.core.named_axes", "NamedArrayView"),
    )
    return tuple(t for t in found if t is not None)


def variable_types() -> tuple[tuple[type, ...], tuple[type, ...], tuple[type, ...]]:
    """`(live, frozen, roots)`: penzai's mutable variables (leaves to JAX), their
    frozen values (pytree nodes), and every penzai object (where a model
    starts); all empty when penzai is not loaded."""
    live = _attr("penzai.core.variables", "AbstractVariable")
    frozen = _attr("penzai.core.variables", "AbstractVariableValue")
    struct = _attr("penzai.core.struct", "Struct")
    if live is None or frozen is None:
        return (), (), ()
    roots = (live, struct) if struct is not None else (live, frozen)
    return (live,), (frozen,), roots


def is_live(leaf: Any) -> bool:
    """A mutable variable: a leaf whose state is a pytree (`pz.Parameter`, `pz.StateVariable`)."""
    live = variable_types()[0]
    return bool(live) and isinstance(leaf, live)


def is_variable(node: Any) -> bool:
    """A penzai variable, live or frozen."""
    live, frozen, _ = variable_types()
    return bool(live) and isinstance(node, (*live, *frozen))


def names_itself(prefix: str | None, variable: Any, keypath: KeyPath) -> bool:
    """Whether the path to `variable`, an outermost penzai object, already ends
    with its label, the first key of `keypath` (the key path of one of its
    leaves): a dict keyed by labels, `{p.label: p}`, names each variable once."""
    if not prefix or not keypath or not isinstance(keypath[0], LabelKey) or not is_variable(variable):
        return False
    label = keypath[0].label
    return prefix == label or prefix.endswith("/" + label)


def label_of(variable: Any) -> str | None:
    label = getattr(variable, "label", None)
    return label if isinstance(label, str) and label else None


def state_of(variable: Any) -> Any:
    """A live variable's frozen state (a pytree: `ParameterValue` for a `Parameter`)."""
    return variable.__get_state_as_jax_pytree__()


def held(leaf: Any) -> tuple[bool, Any]:
    """`(True, x)` when `leaf` is a live variable whose state holds exactly one
    leaf `x` (its array); `(True, None)` for a live variable holding several
    leaves or none; `(False, None)` for anything else."""
    if not is_live(leaf):
        return False, None
    try:
        leaves = jax.tree_util.tree_leaves(state_of(leaf))
    except Exception:  # a variable that cannot give its state: nothing to see
        return True, None
    return True, leaves[0] if len(leaves) == 1 else None


def paths_within(
    root: Any, is_leaf: Callable[[Any], bool] | None, inner: Callable[[Any], list[KeyPath]]
) -> list[KeyPath]:
    """The key paths of the leaves of `root`, an outermost penzai object, relative
    to it: each variable's leaves under its label (`inner(value)` keys what is
    inside a frozen value, boxes included), unless the label is missing or
    shared by another variable; other leaves as JAX keys them, boxes dropped."""
    live, frozen, _ = variable_types()
    variables = live + frozen
    boxes = named_types()

    def stop(x: Any) -> bool:
        if x is root:
            return False
        return isinstance(x, (*variables, *boxes)) or (is_leaf is not None and bool(is_leaf(x)))

    outer = (
        [((), root)]
        if isinstance(root, variables)
        else jax.tree_util.tree_flatten_with_path(root, is_leaf=stop)[0]
    )
    # Per place: (paths by attribute, the label, the variable's identity, paths below the label).
    places: list[tuple[list[KeyPath], str | None, Any, list[KeyPath]]] = []
    for keypath, node in outer:
        if isinstance(node, live):
            places.append(([keypath], label_of(node), id(node), [()]))
        elif isinstance(node, (*frozen, *boxes)):
            children = jax.tree_util.tree_flatten(node, is_leaf=lambda x, node=node: x is not node)[0]
            if len(children) == 1:
                below = inner(children[0])
            else:  # not a box of one value after all: keep JAX's keys
                below = [k for k, _ in jax.tree_util.tree_flatten_with_path(node, is_leaf=is_leaf)[0]]
            label = label_of(node) if isinstance(node, frozen) else None
            places.append(([(*keypath, *sub) for sub in below], label, (len(places),), below))
        else:
            places.append(([keypath], None, None, []))
    owners: dict[str, set[Any]] = {}
    for _, label, owner, _ in places:
        if label is not None:
            owners.setdefault(label, set()).add(owner)
    paths: list[KeyPath] = []
    for by_attribute, label, _, below in places:
        if label is not None and len(owners[label]) == 1:
            paths.extend((LabelKey(label), *sub) for sub in below)
        else:
            paths.extend(by_attribute)
    return paths


def arrays_of(leaves: list[Any]) -> tuple[list[Any], Callable[[list[Any]], list[Any]] | None]:
    """`leaves` with each live variable holding one array replaced by that array,
    and a function that puts new variables back around the arrays of a list
    like it (`None` when there is no variable: `leaves` is then returned as it is).

    A new variable has the label and metadata of the old one
    (`unfreeze_as_copy`); a variable that appears more than once becomes one new
    variable, in every place it was."""
    if not variable_types()[0]:
        return leaves, None
    found: dict[int, Any] = {}
    out = list(leaves)
    for i, leaf in enumerate(leaves):
        live, array = held(leaf)
        if live and array is not None:
            found[i] = leaf
            out[i] = array
    if not found:
        return leaves, None

    def restore(arrays: list[Any]) -> list[Any]:
        back = list(arrays)
        made: dict[int, Any] = {}
        for i, variable in found.items():
            new = made.get(id(variable))
            if new is None:
                state = state_of(variable)
                placed = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(state), [arrays[i]])
                new = made[id(variable)] = placed.__jax_pytree_state_to_new_variable__()
            back[i] = new
        return back

    return out, restore
