"""Replica groups as an optimised HLO text writes them, and the mesh axes a
collective runs over (`axes_of`)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np


def nested_groups(text: str) -> tuple[tuple[int, ...], ...]:
    groups = (tuple(int(d) for d in g.split(",") if d.strip()) for g in re.findall(r"\{([0-9,\s]*)\}", text))
    return tuple(g for g in groups if g)


def _iota(text: str) -> np.ndarray:
    """`[4,2]T(1,0)`: `numpy.arange` reshaped to the dims, transposed."""
    m = re.fullmatch(r"\[([0-9,]*)\](?:T\(([0-9,]*)\))?", text.strip())
    if m is None:
        raise ValueError(f"device ids not understood: {text}")
    shape = [int(d) for d in m[1].split(",") if d]
    ids = np.arange(math.prod(shape)).reshape(shape)
    return ids.transpose([int(d) for d in m[2].split(",")]) if m[2] else ids


def _mesh_groups(text: str) -> tuple[tuple[int, ...], ...]:
    """`mesh['a'=4,'b'=2] {'a'}`: the devices numbered in the mesh's order
    (or as its `device_ids=(...)` list them), grouped over the named axes."""
    sizes = [(n, int(s)) for n, s in re.findall(r"'([^']*)'=(\d+)", text.split("]", 1)[0])]
    listed = re.search(r"device_ids=\((?P<ids>.*)\)\s*\{", text)
    chosen = re.findall(r"'([^']*)'", text[text.rindex("{") :])
    factors = [n for _, n in sizes]
    picked = [d for d, (name, _) in enumerate(sizes) if name in chosen]
    ids = np.arange(math.prod(factors))
    if listed is not None:
        given = listed["ids"]
        ids = _iota(given).ravel() if given.startswith("[") else np.array([int(d) for d in given.split(",")])
    ids = ids.reshape(factors)
    rest = [d for d in range(len(factors)) if d not in picked]
    width = math.prod(factors[d] for d in picked)
    return tuple(tuple(int(d) for d in g) for g in ids.transpose(rest + picked).reshape(-1, width))


def parse_groups(text: str) -> tuple[tuple[int, ...], ...] | None:
    """Replica groups as the HLO writes them: `{{0,1},{2,3}}`, the iota
    form `[2,4]<=[4,2]T(1,0)` (`numpy.arange` reshaped to the dims after
    `<=`, transposed, and reshaped to the groups' shape before it), or a
    mesh's axes; `None` for `{}`."""
    if text.startswith("mesh"):
        return _mesh_groups(text)
    if text.startswith("["):
        shape, ids = text.split("<=", 1)
        return tuple(tuple(int(d) for d in g) for g in _iota(ids).reshape(int(shape[1:].split(",")[0]), -1))
    return nested_groups(text) or None


def axes_of(groups: Sequence[Sequence[int]] | None, shape: Sequence[int]) -> tuple[int, ...]:
    """The mesh dimensions (indices into `shape`, the mesh's axis sizes in
    order) that vary inside `groups`: the axes a collective runs over.
    Device `d` sits at `numpy.unravel_index(d, shape)`; `None` groups (all
    devices) vary every dimension larger than 1."""
    if groups is None:
        return tuple(d for d, n in enumerate(shape) if n > 1)
    varies = np.zeros(len(shape), bool)
    for group in (g for g in groups if len(g) > 1):
        where = np.array(np.unravel_index(np.asarray(group), tuple(shape)))
        varies |= (where != where[:, :1]).any(axis=1)
    return tuple(int(d) for d in np.flatnonzero(varies))
