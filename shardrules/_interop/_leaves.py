"""What each leaf of a tree is to the planner, and the leaves it cannot see inside.

JAX flattens a tree into leaves. `signatures` says, for each, what is planned:
the `(shape, dtype)` of an array (`_paths.leaf_info`: NumPy, JAX, abstract,
PRNG keys), of a live penzai variable's one array (`_penzai`), `None` for a
leaf that is not an array (a function, a number, a string: it passes through
untouched), or an `Unseen` for a leaf that is neither: an object that holds
arrays JAX does not see as leaves. Planning one as "not an array" would leave
its arrays where they are without a word, so each is reported, naming its type
and path and how to make its arrays visible:

- SR121 (an error): an object that says it is an array (`__jax_array__`) but
  has no shape and dtype shardrules can read. Placing it would turn it into a
  bare `jax.Array`, or leave it unplaced.
- SR213 (a warning; the leaf is passed over): an object with `shape` and
  `dtype` that are not an array's (a tensor of another library); an object
  whose attributes hold arrays (a wrapper class not registered as a pytree
  node); a penzai variable whose value is not one array; a registered pytree
  node that keeps arrays in its static (auxiliary) data, where no rule can
  reach them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from itertools import repeat
from typing import Any

import jax
import numpy as np

from .._errors import Diagnostic
from . import _penzai
from ._paths import leaf_info, path_str

Signature = Any  # (shape, dtype) of an array, an `Unseen`, or None (not an array)

_PLAIN = (int, float, bool, complex, str, bytes, type(None))
_PLAIN_TYPES = frozenset(_PLAIN)
_MISSING = object()
_SHOWN = 3  # attribute names shown in a message
_REGISTER = (
    "register `{kind}` as a pytree node so that its arrays are leaves "
    "(`jax.tree_util.register_dataclass`, `jax.tree_util.register_pytree_with_keys`), "
    "or take the arrays out of it before planning"
)


@dataclasses.dataclass(frozen=True)
class Unseen:
    """What is wrong with one kind of leaf: the same for every leaf of one type
    and cause, so that one finding can name them all."""

    code: str  # SR121 or SR213
    kind: str  # the leaf's type, `module.Class`
    what: str  # the cause, after "is a `kind` that"
    fix: str


def signatures(leaves: list[Any]) -> list[Signature]:
    """`signature` of every leaf, worked out once per distinct (shape, dtype) of
    the arrays and once per object of the others (one activation function in
    every layer is looked at once)."""
    return _signatures(leaves)[0]


def _signatures(leaves: list[Any]) -> tuple[list[Signature], bool]:
    """`signatures`, and whether each follows from the leaf's type, `shape` and
    `dtype` alone: every leaf an array `leaf_info` reads, or of a plain type."""
    seen: dict[Any, Signature] = {}
    others: dict[int, Signature] = {}
    out = []
    plain = True
    for leaf in leaves:  # arrays first: nearly every leaf is one (no plain type has a tuple shape)
        shape = getattr(leaf, "shape", None)
        if type(shape) is tuple and not isinstance(leaf, type):
            key = (shape, getattr(leaf, "dtype", None))
            try:
                found = seen[key]
            except KeyError:
                found = seen[key] = _array(leaf)
                if found is None:  # not a plain array (a penzai variable's, symbolic dimensions)
                    plain = False
                    found = seen[key] = signature(leaf)
            except TypeError:  # an unhashable dtype
                found = _array(leaf)
                if found is None:
                    plain = False
                    found = signature(leaf)
        elif type(leaf) in _PLAIN_TYPES:
            found = None
        else:
            plain = False
            found = others.get(id(leaf), _MISSING)
            if found is _MISSING:
                found = others[id(leaf)] = signature(leaf)
        out.append(found)
    return out, plain


def _array(leaf: Any) -> Signature:
    """`(shape, dtype)` of a leaf `leaf_info` reads as an array, else `None`."""
    info = leaf_info("", leaf)
    return None if info.shape is None or info.dtype is None else (info.shape, info.dtype)


class Looks:
    """What a plan cached for a tree of this structure must have been made for,
    leaf by leaf: each leaf's type and its `shape` and `dtype` (and the
    dtype's type: NumPy finds `float64` equal to `None`), read and compared a
    list at a time (no Python code runs per leaf), and its signature only
    where those do not settle it (a leaf that is neither an array `leaf_info`
    reads nor of a plain type: its signature depends on more)."""

    __slots__ = ("_leaves", "_read", "_signatures")

    def __init__(self, leaves: list[Any]):
        self._leaves = leaves
        self._read: tuple[list[Any], ...] | None = None
        self._signatures: tuple[list[Signature], bool] | None = None

    def _attributes(self) -> tuple[list[Any], ...] | None:
        """Each leaf's type, shape, dtype and dtype's type; `None` where a
        property raises (then signatures are compared)."""
        if self._read is None:
            leaves = self._leaves
            try:
                shapes = list(map(getattr, leaves, repeat("shape"), repeat(None)))
                dtypes = list(map(getattr, leaves, repeat("dtype"), repeat(None)))
            except Exception:
                return None
            self._read = (list(map(type, leaves)), shapes, dtypes, list(map(type, dtypes)))
        return self._read

    def signatures(self) -> list[Signature]:
        """`signatures` of the leaves."""
        if self._signatures is None:
            self._signatures = _signatures(self._leaves)
        return self._signatures[0]

    def seen(self) -> tuple[Any, Any]:
        """What to keep with a plan made for these leaves, for `fits`: their
        attributes where those settle every signature, else the signatures."""
        self.signatures()
        assert self._signatures is not None
        found, plain = self._signatures
        read = self._attributes()
        return (read, None) if plain and read is not None else (None, found)

    def fits(self, seen: tuple[Any, Any]) -> bool:
        """Whether a plan made for leaves that looked like `seen` (`seen()` of
        theirs) is one for these: the same types, shapes and dtypes (equal
        ones make equal signatures: `leaf_info` reads nothing else), or the
        same signatures."""
        read, found = seen
        try:
            if read is None:
                return found == self.signatures()
            return self._attributes() == read
        except Exception:  # an `==` that raises (symbolic dimensions): not the same
            return False


def signature(leaf: Any) -> Signature:
    """`(shape, dtype)` of an array leaf (see `leaf_info`) or of the one array a
    live penzai variable holds; else an `Unseen` (a leaf hiding arrays) or
    `None` (not an array)."""
    info = leaf_info("", leaf)
    if info.shape is not None and info.dtype is not None:
        return info.shape, info.dtype
    live, array = _penzai.held(leaf)
    if live and array is not None:
        info = leaf_info("", array)
        if info.shape is not None and info.dtype is not None:
            return info.shape, info.dtype
        return unseen(array)
    return unseen(leaf)


def _type_name(x: Any) -> str:
    kind = type(x)
    module = kind.__module__
    return kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"


def _is_array(x: Any) -> bool:
    """A numeric array (NumPy or JAX), of the kind a wrapper would hide."""
    if isinstance(x, jax.Array):
        return True
    return isinstance(x, np.ndarray) and x.dtype.kind in "biufc"


def _held_arrays(x: Any) -> list[str]:
    """The names of `x`'s attributes that are arrays (shallow: `__dict__` and `__slots__`)."""
    try:
        attributes = dict(vars(x))
    except TypeError:
        attributes = {}
    for name in getattr(type(x), "__slots__", ()):
        if isinstance(name, str) and name not in attributes and hasattr(x, name):
            attributes[name] = getattr(x, name)
    return [name for name, value in attributes.items() if _is_array(value)]


def unseen(leaf: Any) -> Unseen | None:
    """Why `leaf`, which is not an array, should have been one (`None`: it
    should not; it passes through). Call it only for leaves `leaf_info` finds
    are not arrays, and with a live variable's array already looked for."""
    if isinstance(leaf, (*_PLAIN, type)):
        return None
    try:
        return _unseen(leaf)
    except Exception:  # an object whose attributes cannot be read: nothing to tell
        return None


def _unseen(leaf: Any) -> Unseen | None:
    kind = _type_name(leaf)
    live, _ = _penzai.held(leaf)
    if live:
        count = len(jax.tree_util.tree_leaves(_penzai.state_of(leaf)))
        if not count:
            return None
        return Unseen(
            "SR213",
            kind,
            f"holds {count} leaves rather than one array",
            "plan its frozen value, which is a pytree: `pz.unbind_variables(model, freeze=True)` "
            "(or `variable.freeze()`)",
        )
    if hasattr(leaf, "__jax_array__"):
        return Unseen(
            "SR121",
            kind,
            "converts to a JAX array (`__jax_array__`) but has no shape and dtype shardrules can read",
            f"convert it first (`jnp.asarray(x)`); or {_REGISTER.format(kind=kind)}",
        )
    if getattr(leaf, "shape", None) is not None and getattr(leaf, "dtype", None) is not None:
        return Unseen(
            "SR213",
            kind,
            "has a shape and dtype but is not an array shardrules can read (neither NumPy nor JAX)",
            f"convert it to a NumPy or JAX array first; or {_REGISTER.format(kind=kind)}",
        )
    names = _held_arrays(leaf)
    if names:
        shown = ", ".join(f"`{n}`" for n in names[:_SHOWN]) + (", ..." if len(names) > _SHOWN else "")
        return Unseen(
            "SR213",
            kind,
            f"holds arrays ({shown}) but is not a pytree node, so JAX sees it as one leaf",
            _REGISTER.format(kind=kind),
        )
    return None


def _in_aux(aux: Any, depth: int = 2) -> bool:
    """Whether a node's auxiliary data holds a numeric array (a few levels down)."""
    if _is_array(aux):
        return True
    if depth == 0 or isinstance(aux, _PLAIN):
        return False
    if isinstance(aux, dict):
        return any(_in_aux(v, depth - 1) for v in aux.values())
    if isinstance(aux, (tuple, list)):
        return any(_in_aux(v, depth - 1) for v in aux)
    return bool(_held_arrays(aux))


def hidden_in_nodes(tree: Any, text: str) -> list[tuple[str, Unseen]]:
    """`(path, Unseen)` for each registered pytree node of `tree` that keeps
    arrays in its auxiliary (static) data. `text` is `str` of the tree's
    treedef, which shows the auxiliary data: without an array's text in it
    (`array(`, `Array(`), no node is looked at."""
    if "rray(" not in text:
        return []
    found: list[tuple[str, Unseen]] = []

    def hides(x: Any) -> bool:
        try:
            node = jax.tree_util.tree_structure(x, is_leaf=lambda y: y is not x).node_data()
        except Exception:  # pragma: no cover - a node that cannot be flattened on its own
            return False
        return node is not None and node[0] not in (dict, list, tuple) and _in_aux(node[1])

    for keypath, x in jax.tree_util.tree_flatten_with_path(tree, is_leaf=hides)[0]:
        if hides(x):
            kind = _type_name(x)
            found.append(
                (
                    path_str(keypath),
                    Unseen(
                        "SR213",
                        kind,
                        "keeps arrays in its static (auxiliary) data, where no rule reaches them",
                        "make those fields data fields of the node (not `meta_fields`, "
                        "`pytree_node=False` or `static=True`); static data is for hashable settings",
                    ),
                )
            )
    return found


def diagnostics(found: Iterable[tuple[str, Unseen]]) -> list[Diagnostic]:
    """One diagnostic per leaf (`plan.diagnostics` keeps one per leaf; lint and
    raised errors group them by cause)."""
    out = []
    for path, why in found:
        name = f"`{path}`" if path else "the tree itself"
        severity = "error" if why.code == "SR121" else "warning"
        tail = "" if severity == "error" else "; it is passed over, not planned or placed"
        cause = f"is a `{why.kind}` that {why.what}"
        out.append(
            Diagnostic(
                why.code, severity, f"{name} {cause}{tail}", None, path, why.fix, ((path, None),), cause
            )
        )
    return out
