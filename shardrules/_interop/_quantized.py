"""Quantized parameters: the arrays a quantization library puts where a float one was.

Quantizing a model replaces a float parameter (`mlp/up/kernel`) by a
container of arrays: the quantized values and what dequantizes them.

- qwix's `QArray` has `qvalue` (the kernel's shape, an integer or packed
  sub-byte dtype), `scale` and maybe `zero_point`; an NNX model quantized by
  qwix holds it as the `array` field of a `WithAux`, so its leaves are
  `mlp/up/kernel/array/qvalue` and `mlp/up/kernel/array/scale`.
- AQT's `QTensor` has `qvalue`, lists of scales `scale` and `scale_t`,
  `bias` and `sparsity_mask`: `mlp/up/kernel/qvalue`, `mlp/up/kernel/scale/0`.

A container is recognised by its leaves' paths alone (neither library is
imported; an NNX state holds the same fields as nested dicts): a node holding
an array `qvalue` is one, and its arrays named `scale`, `scale_t`,
`zero_point`, `bias` or `sparsity_mask` (or an item of a list of that name)
are the values' companions. The float parameter's path is the container's,
less a trailing `array` segment (qwix's `WithAux`). Planning matches a rule
against that path too (`_planning/_quantized.py`), and `suggest` names the
values' role by it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from operator import methodcaller
from typing import Any

VALUES = "qvalue"
COMPANIONS = frozenset({"scale", "scale_t", "zero_point", "bias", "sparsity_mask"})
_BOX = "array"  # qwix's `WithAux` field holding the `QArray`


@dataclasses.dataclass(frozen=True)
class Quantized:
    """One leaf of a quantized parameter."""

    parameter: str  # the float parameter's path (`mlp/up/kernel`)
    values: int  # the position of the container's `qvalue` leaf
    companion: bool  # a scale, zero point, bias or mask (False: the values themselves)


def parameter_path(container: str) -> str:
    """The float parameter's path for a container at `container` (its path, no
    trailing `/`): the same, less a trailing `array` segment."""
    if container == _BOX:
        return ""
    if container.endswith("/" + _BOX):
        return container[: -len(_BOX) - 1]
    return container


def _array(signature: Any) -> bool:
    return isinstance(signature, tuple)


def containers(paths: Sequence[str], signatures: Sequence[Any]) -> dict[int, Quantized]:
    """The leaves of quantized containers, by position: `paths` are the
    leaves' paths, `signatures` their `_leaves.signatures` (an array's is a
    `(shape, dtype)` tuple). Empty, after one pass over the paths' ends, for
    a tree without a `qvalue`."""
    if not any(map(methodcaller("endswith", VALUES), paths)):
        return {}
    found: dict[str, int] = {}  # container path with its trailing "/" ("" at the root) → values
    for i, path in enumerate(paths):
        if (path == VALUES or path.endswith("/" + VALUES)) and _array(signatures[i]):
            found[path[: -len(VALUES)]] = i
    out: dict[int, Quantized] = {}
    for prefix, i in found.items():
        out[i] = Quantized(parameter_path(prefix[:-1]), i, False)
    if not found:
        return out
    for i, path in enumerate(paths):
        head, _, last = path.rpartition("/")
        if last.isdigit():
            head, _, last = head.rpartition("/")
        if last not in COMPANIONS or not _array(signatures[i]):
            continue
        prefix = f"{head}/" if head else ""
        values = found.get(prefix)
        if values is not None:
            out[i] = Quantized(parameter_path(head), values, True)
    return out
