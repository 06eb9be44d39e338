"""Creating arrays directly in their planned layout: sharded initialisation and
streaming checkpoint loading. Neither ever holds a whole unsharded copy."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from .._interop import _nnx
from .._planning import _mesh
from .._planning._api import RulesLike, as_rules, shardings
from .._planning._plan import format_bytes
from .._planning._shapes import _SAFETENSORS_DTYPES, ShapeSourceError, read_header
from ._multihost import agree_on_shapes


def init(
    init_fn: Callable[..., Any],
    rules: RulesLike,
    mesh: Mesh | None = None,
    *,
    group: str = "params",
    static_argnums: int | tuple[int, ...] = (),
    chunk_bytes: int | None = None,
) -> Callable[..., Any]:
    """Wrap an initialiser so that its arrays are created already sharded.

    The returned function runs `jax.eval_shape(init_fn, ...)` to learn the
    shapes, compiles the rules for them, then runs `init_fn` under `jax.jit`
    with those `out_shardings`: each device computes only its own shards, and no
    unsharded copy of the parameters ever exists.

    **Arguments:**

    - `init_fn`: returns a pytree (e.g. `lambda key: model.init(key, x)`, or an
      Equinox module); its leaves that are not arrays (functions, Python
      numbers, strings) are returned as it made them, and only its arrays are
      created under `jax.jit`. Or it builds a Flax NNX module (`lambda: Model(rngs=nnx.Rngs(0))`): then its
      `nnx.State` is created sharded and merged into the module returned.
    - `rules`: a `RuleSet`, or the path of a rule file.
    - `mesh`: a `jax.sharding.Mesh`; by default the ambient mesh, else the rule
      file's `mesh` line over `jax.devices()`.
    - `group`: the rules group for the result.
    - `static_argnums`: arguments that are not arrays (sizes, configs), as for
      `jax.jit`.
    - `chunk_bytes`: create the leaves in groups of at most this many bytes,
      one compiled call per group, largest leaves first, so that the
      initialiser's temporaries exist for one group at a time. They matter:
      JAX's random number generator needs about 3x the bytes it makes in
      temporaries, so the peak is about the model plus 3x the largest group.
      By default a model over 256 MiB is made in groups of 1/16 of it (a leaf
      larger than that alone), a smaller one in one call. XLA drops the leaves
      a group does not return, so each is computed once.

    **Returns:** a function taking `init_fn`'s arguments and returning its
    pytree, sharded as planned.

    **Raises:** `TypeError` at once for a `mesh` without devices; the errors
    of `shardrules.shardings` when called.

    ```python
    params = shardrules.init(lambda key: model.init(key, x), rules, mesh)(jax.random.key(0))
    ```
    """
    ruleset = as_rules(rules)
    if mesh is not None:  # a mesh given is checked now; the ambient one when called
        _mesh.resolve(mesh, ruleset, concrete=True, what="init")

    def run(*args: Any) -> Any:
        resolved = _mesh.resolve(mesh, ruleset, concrete=True, what="init")
        assert isinstance(resolved, Mesh)
        make, merge = init_fn, None
        made = _Split(make, static_argnums, args)
        if _nnx.is_module(made.abstract):  # an NNX model: create its state sharded, then merge it in
            make, merge = _nnx.state_initialiser(init_fn)
            made = _Split(make, static_argnums, args)
        targets = made.treedef.flatten_up_to(shardings(made.abstract, ruleset, resolved, group=group))
        array_targets = [t for t, is_array in zip(targets, made.mask, strict=True) if is_array]
        results: list[Any] = [None] * len(made.shapes)
        for part in _chunks([s.size * s.dtype.itemsize for s in made.shapes], chunk_bytes):

            def some(*a: Any, part: list[int] = part) -> list[Any]:
                arrays = made.arrays(*a)
                return [arrays[i] for i in part]

            out = jax.jit(
                some, static_argnums=static_argnums, out_shardings=[array_targets[i] for i in part]
            )(*args)
            for i, array in zip(part, out, strict=True):
                results[i] = array
        tree = made.rebuild(results)
        return merge(tree) if merge is not None else tree

    return run


class _Split:
    """An initialiser's output as its arrays (what `jax.jit` makes) and the rest
    (functions, Python numbers, strings: kept as the initialiser made them, as
    `equinox.filter_jit` does), learnt from one abstract trace."""

    def __init__(
        self, init_fn: Callable[..., Any], static_argnums: int | tuple[int, ...], args: tuple[Any, ...]
    ):
        self.init_fn = init_fn
        self.treedef: Any = None  # these three are set by each trace of `arrays`
        self.mask: list[bool] = []
        self.others: list[Any] = []
        traced = jax.jit(self.arrays, static_argnums=static_argnums).eval_shape(*args)
        self.shapes: list[jax.ShapeDtypeStruct] = list(traced)
        self.abstract = self.rebuild(self.shapes)

    def arrays(self, *args: Any) -> list[Any]:
        """The array leaves of `init_fn(*args)`; notes the tree and the other leaves."""
        leaves, self.treedef = jax.tree_util.tree_flatten(self.init_fn(*args))
        self.mask = [isinstance(leaf, (jax.Array, np.ndarray, np.generic)) for leaf in leaves]
        self.others = [None if is_array else leaf for leaf, is_array in zip(leaves, self.mask, strict=True)]
        return [leaf for leaf, is_array in zip(leaves, self.mask, strict=True) if is_array]

    def rebuild(self, arrays: list[Any]) -> Any:
        """The initialiser's tree with `arrays` in the array leaves' places."""
        given = iter(arrays)
        leaves = [
            next(given) if is_array else other for is_array, other in zip(self.mask, self.others, strict=True)
        ]
        return jax.tree_util.tree_unflatten(self.treedef, leaves)


def _chunks(sizes: list[int], chunk_bytes: int | None) -> list[list[int]]:
    """Leaf indices in groups of at most `chunk_bytes` (a leaf larger than that
    alone), the largest leaves first: a group's temporaries then come on top of
    as few finished leaves as possible."""
    total = sum(sizes)
    if chunk_bytes is None:
        chunk_bytes = total if total <= _SMALL else max(total // _GROUPS, 1)
    groups: list[list[int]] = [[]]
    filled = 0
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        size = sizes[i]
        if groups[-1] and filled + size > chunk_bytes:
            groups.append([])
            filled = 0
        groups[-1].append(i)
        filled += size
    return [g for g in groups if g]


_SMALL = 256 * 2**20  # models up to this size are initialised in one piece
_GROUPS = 16  # larger ones in groups of 1/16 of the model


def _checkpoint_files(path: Path) -> dict[str, tuple[Path, dict[str, Any], int]]:
    """Tensor name → (file, header entry, offset of the file's data region)."""
    if path.name.endswith(".index.json"):
        try:
            weight_map = json.loads(path.read_text())["weight_map"]
        except (KeyError, TypeError, json.JSONDecodeError) as err:
            raise ShapeSourceError(f"{path}: not a checkpoint index with a `weight_map` ({err})") from None
        files = sorted({path.parent / f for f in weight_map.values()})
    else:
        files = [path]
    out: dict[str, tuple[Path, dict[str, Any], int]] = {}
    for file in files:
        _, header, start = read_header(file)  # validated, with clear errors
        for name, info in header.items():
            out[name] = (file, info, start)
    return out


def _reader(data: np.ndarray) -> Callable[[Any], np.ndarray]:
    """The callback reading one tensor's slices: each distinct slice once, even
    when several devices of this process hold it (partly replicated specs)."""
    seen: dict[Any, np.ndarray] = {}

    def read(index: Any) -> np.ndarray:
        key = tuple((s.start, s.stop, s.step) for s in index)
        if key not in seen:
            seen[key] = np.asarray(data[index])
        return seen[key]

    return read


def _check_size(file: Path, key: str, info: dict[str, Any], shape: jax.ShapeDtypeStruct) -> None:
    """Raise `ShapeSourceError` unless a tensor's bytes in the file fit its shape and dtype."""
    start, end = info["data_offsets"]
    if end - start != int(np.prod(shape.shape, dtype=np.int64)) * shape.dtype.itemsize:
        raise ShapeSourceError(
            f"{file}: tensor {key!r} has {end - start} bytes for shape {tuple(shape.shape)} {shape.dtype}; "
            "the header does not match the data: the file is damaged or was written by a broken tool"
        )


def load_checkpoint(
    path: str | os.PathLike[str],
    rules: RulesLike,
    mesh: Mesh | None = None,
    *,
    group: str = "params",
    rename: Callable[[str], str | None] | None = None,
    progress: bool | None = None,
) -> dict[str, jax.Array]:
    """Load a `.safetensors` checkpoint straight into its planned shardings.

    Each array is built with `jax.make_array_from_callback`: every device's
    shard is read from the file on its own (through a memory map, so only the
    bytes of that slice are read), and no process ever holds a whole tensor
    it does not need. Dtypes are kept as stored (bfloat16 and float8 included).

    **Arguments:**

    - `path`: a `.safetensors` file, or a sharded checkpoint's
      `model.safetensors.index.json`.
    - `rules`, `mesh`, `group`: as for `shardrules.apply`; tensors are matched
      by their name in the checkpoint (`model.layers.0.mlp.up_proj.weight`).
    - `rename`: maps a checkpoint name to the key to use in the result (and to
      match rules against), or to `None` to skip the tensor.
    - `progress`: print a progress line to stderr as tensors load; by default
      only when stderr is a terminal and the checkpoint is over 1 GiB.

    **Returns:** a flat dict of key → sharded `jax.Array`.

    **Raises:** the errors of `shardrules.shardings` (every tensor is planned
    before anything is read), `ValueError` for a malformed checkpoint,
    `FileNotFoundError`, `TypeError` for a mesh without devices. In a
    multi-process run, `ProcessMismatchError` (SR112) when the processes'
    tensors differ, or when another process stopped on an error of its own
    (that process raises its own error; every process joins the comparison
    either way, so none waits for another).

    ```python
    params = shardrules.load_checkpoint("llama/model.safetensors.index.json", rules, mesh)
    ```
    """
    what = f"load_checkpoint({str(path)!r})"
    shapes: dict[str, jax.ShapeDtypeStruct] | None = None
    try:  # all that this process does on its own, before the processes compare their checkpoints
        ruleset = as_rules(rules)
        resolved = _mesh.resolve(mesh, ruleset, concrete=True, what="load_checkpoint")
        assert isinstance(resolved, Mesh)
        tensors: dict[str, tuple[Path, dict[str, Any], int]] = {}
        for name, entry in _checkpoint_files(Path(path)).items():
            key = rename(name) if rename is not None else name
            if key is not None:
                tensors[key] = entry
        shapes = {
            key: jax.ShapeDtypeStruct(
                tuple(info["shape"]), jax.numpy.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
            )
            for key, (_, info, _) in tensors.items()
        }
        for key, (file, info, _) in tensors.items():
            _check_size(file, key, info, shapes[key])
        targets = shardings(shapes, ruleset, resolved, group=group)  # plan everything before reading
    except Exception:
        # The other processes wait for this one in the exchange: join it as failed, so that they
        # raise SR112 naming this process at once, then raise this process's own error.
        agree_on_shapes(shapes, what, failed=True)
        raise
    agree_on_shapes(shapes, what)  # every process: the same tensors
    total = sum(s.size * s.dtype.itemsize for s in shapes.values())
    if progress is None:
        progress = total > 2**30 and sys.stderr.isatty()
    done = 0
    out: dict[str, jax.Array] = {}
    for n, (key, (file, info, base)) in enumerate(tensors.items(), 1):
        shape, dtype = shapes[key].shape, shapes[key].dtype
        start, end = info["data_offsets"]
        data = (
            np.memmap(file, dtype=dtype, mode="r", offset=base + start, shape=shape)
            if end > start
            else np.zeros(shape, dtype)
        )
        out[key] = jax.make_array_from_callback(shape, targets[key], _reader(data))
        done += end - start
        if progress:
            sys.stderr.write(
                f"\rloading {n}/{len(tensors)} tensors, {format_bytes(done)} of {format_bytes(total)}"
                + ("\n" if n == len(tensors) else "")
            )
            sys.stderr.flush()
    return out
