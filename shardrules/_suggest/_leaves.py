"""The arrays of a tree as `suggest` sees them: one `Kind` per path pattern.

Leaves whose paths differ only in layer or expert numbers, and that have the
same shape and dtype, are one kind: a 61-layer, 384-expert model's 70,000
expert matrices are three kinds. A number is read as an index where it is a
whole path segment (`layers.3`, `experts/17`) or follows a layer-container word
(`layers_3`, `decoder_block_0`, `block_2`); numbers that are part of a name
(`fc1`, `wi_0`, `Dense_1`) tell different layers apart and are kept. Only ASCII
digits are numbers, as rule patterns' `\\d` matches them alone (`layers.٣` is a
name). A `*` or `\\` of the path itself is written `\\*`, `\\\\` in a kind's key,
so that `*` always stands for an index.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from typing import Any

import jax
import numpy as np

from .._interop._leaves import signatures
from .._interop._paths import leaf_paths
from .._interop._quantized import containers

INDEX = "*"
"""How a normalised path writes a layer or expert number."""

CONTAINERS = (
    "layers?|blocks?|block|h|decoder_block|encoder_block|decoder_layer|encoder_layer|transformer_block"
    "|res_block|blk|stage|experts?|expert|layer_block|resblocks?"
)
_NUMBERS = re.compile(rf"(?:(?<=^)|(?<=[./]))(?:((?:{CONTAINERS})_)?)[0-9]+(?=[./]|$)", re.I | re.ASCII)
_SPLIT = re.compile(r"([./])")


@dataclasses.dataclass(frozen=True)
class Kind:
    """Leaves that share a normalised path, a shape and a dtype.

    - `key`: the path with its indices written `*` (`model.layers.*.mlp.up_proj.weight`).
    - `tokens`: `key` split at `/` and `.`; `seps`: the separator after each token
      but the last.
    - `count`: how many leaves; `example`: the first leaf's path.
    """

    key: str
    tokens: tuple[str, ...]
    seps: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    count: int
    example: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def leaf_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """All its leaves' bytes."""
        return self.leaf_bytes * self.count

    @property
    def lower(self) -> tuple[str, ...]:
        return tuple(t.lower() for t in self.tokens)

    @property
    def indexed(self) -> bool:
        """Whether its paths hold layer or expert numbers (each leaf is one layer's)."""
        return any(has_index(t) for t in self.tokens)


def normalised(path: str) -> str:
    """`path` with its layer and expert numbers written `*` (and its own `*`
    and `\\` escaped with a `\\`)."""
    escaped = path.replace("\\", "\\\\").replace(INDEX, "\\" + INDEX)
    return _NUMBERS.sub(lambda m: (m.group(1) or "") + INDEX, escaped)


_DIGITS = bytes.maketrans(b"0123456789", b"0000000000")
_DIGIT = re.compile("[0-9]")


class Normaliser:
    """`normalised`, with one regular-expression search per form of path.
    Paths that differ only in the values of their ASCII digits
    (`layers.3.experts.17.w`, `layers.58.experts.201.w`) have their numbers
    at the same places, and which of them are indices `_NUMBERS` decides from
    those places and the text around them alone: the first path of a form
    finds them, every other one is cut at the same places (a form all of
    whose numbers are indices has one key, returned as it is)."""

    def __init__(self) -> None:
        # form → its key when it holds no number, else where its indices are (digits' start, end)
        self._forms: dict[bytes, str | list[tuple[int, int]]] = {}

    def __call__(self, path: str) -> str:
        escaped = path.replace("\\", "\\\\").replace(INDEX, "\\" + INDEX)
        form = escaped.encode("utf-8", "surrogatepass").translate(
            _DIGITS
        )  # ASCII digits never inside a character
        found = self._forms.get(form)
        if found is None:
            cuts = [
                (m.start() if m.group(1) is None else m.end(1), m.end()) for m in _NUMBERS.finditer(escaped)
            ]
            key = _cut(escaped, cuts)
            found = self._forms[form] = cuts if _DIGIT.search(key) else key
            return key
        return found if isinstance(found, str) else _cut(escaped, found)


def _cut(escaped: str, cuts: list[tuple[int, int]]) -> str:
    """`escaped` with the digits between each of `cuts` written `*`."""
    pieces, at = [], 0
    for start, end in cuts:
        pieces += (escaped[at:start], INDEX)
        at = end
    pieces.append(escaped[at:])
    return "".join(pieces)


def parts(token: str) -> list[str | None]:
    """A token of a key as its literal text and its indices (`None`):
    `layers_*` → `["layers_", None]`, `a\\*b` → `["a*b"]`."""
    out: list[str | None] = []
    text = ""
    i = 0
    while i < len(token):
        char = token[i]
        if char == "\\" and i + 1 < len(token):
            text += token[i + 1]
            i += 2
            continue
        if char == INDEX:
            if text:
                out.append(text)
            out.append(None)
            text = ""
        else:
            text += char
        i += 1
    if text:
        out.append(text)
    return out


def has_index(token: str) -> bool:
    """Whether a token of a key holds an index."""
    return None in parts(token)


def split(key: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`key`'s tokens and the separators between them."""
    pieces = _SPLIT.split(key)
    return tuple(pieces[0::2]), tuple(pieces[1::2])


def holds_haliax(tree: Any) -> bool:
    """Whether `tree` holds haliax named arrays (`haliax.core.NamedArray`, a
    box `_paths.box_types` knows; haliax is not imported here)."""
    core = sys.modules.get("haliax.core")
    named = getattr(core, "NamedArray", None)
    if not isinstance(named, type):
        return False
    return any(
        isinstance(x, named) for x in jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, named))
    )


def kinds_of(tree: Any) -> list[Kind]:
    """The kinds of `tree`'s array leaves that a rule has to lay out: scalars,
    size-1 arrays and PRNG keys are replicated without one, and leaves that
    are not arrays pass through. In order of first appearance.

    A quantized parameter (`_interop/_quantized.py`) is one kind under its
    float parameter's path (`mlp/up/kernel` for `mlp/up/kernel/array/qvalue`):
    the rule drafted for that path lays out its values as the kernel, and its
    scales along the dimensions they share (the planner's `_quantized`), so
    the scales are no kind of their own."""
    leaves = jax.tree_util.tree_leaves(tree)
    paths = leaf_paths(tree)
    sigs = signatures(leaves)
    quantized = containers(paths, sigs)
    found: dict[tuple[str, tuple[int, ...], Any], list[Any]] = {}
    normalise = Normaliser()
    for i, (path, sig) in enumerate(zip(paths, sigs, strict=True)):
        if type(sig) is not tuple:
            continue
        part = quantized.get(i)
        if part is not None:
            if part.companion:
                continue
            path = part.parameter
        shape, dtype = sig
        if not isinstance(dtype, np.dtype) or math.prod(shape) <= 1:
            continue  # a PRNG key (key dtype), a scalar or a size-1 array
        key = (normalise(path), shape, dtype)
        entry = found.get(key)
        if entry is None:
            found[key] = [1, path]
        else:
            entry[0] += 1
    out = []
    for (key, shape, dtype), (count, example) in found.items():
        tokens, seps = split(key)
        out.append(Kind(key, tokens, seps, shape, dtype, count, example))
    return out
