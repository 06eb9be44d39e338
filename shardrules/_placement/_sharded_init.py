"""`shardrules.init`: create a model's arrays directly in their planned layout.

The initialiser runs under `jax.jit` with the planned `out_shardings`, the
largest leaves first and in groups, so no device ever holds a whole unsharded
copy and the initialiser's temporaries stay bounded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from .._interop import _nnx
from .._planning import _mesh
from .._planning._api import RulesLike, as_rules, placement_shardings
from .._planning._compile import compile_plan
from ._exchange import join_timeout
from ._meeting import agree_on_layouts, plan_layouts
from ._multihost import joining_on_error, require_every_process


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
    of `shardrules.shardings` when called. In a multi-process run, when
    called: `ProcessMismatchError` (SR112) on every process when their
    planned specs or meshes differ, or when another process stopped on an
    error of its own (that one raises its own error), before anything is
    computed; SR114 for a process that does not come.

    ```python
    params = shardrules.init(lambda key: model.init(key, x), rules, mesh)(jax.random.key(0))
    ```
    """
    what = f"init(group={group!r})"
    # In a multi-process run, a process that fails here alone still meets the
    # others (as one that failed), so that their call of the function stops too.
    with joining_on_error(True, what=what):
        ruleset = as_rules(rules)
        if mesh is not None:  # a mesh given is checked now; the ambient one when called
            _mesh.resolve(mesh, ruleset, concrete=True, what="init")

    def run(*args: Any) -> Any:
        with joining_on_error(True, what=what):  # everything this process does on its own
            resolved = _mesh.resolve(mesh, ruleset, concrete=True, what="init")
            assert isinstance(resolved, Mesh)
            require_every_process(resolved, what)  # before the initialiser is traced
            make, merge = init_fn, None
            made = _Split(make, static_argnums, args)
            if _nnx.is_module(made.abstract):  # an NNX model: create its state sharded, then merge it in
                make, merge = _nnx.state_initialiser(init_fn)
                made = _Split(make, static_argnums, args)
            planned = placement_shardings(made.abstract, ruleset, resolved, group=group)
            multi = jax.process_count() > 1
            if multi:
                join_timeout()  # a bad SHARDRULES_JOIN_TIMEOUT is this process's own error
            layouts = plan_layouts(compile_plan(made.abstract, ruleset, resolved, group)) if multi else []
        # Every process plans the same layouts on the same mesh, or every one stops (SR112).
        agree_on_layouts(what, resolved, layouts, cause=_FAILED_ALONE)
        targets = made.treedef.flatten_up_to(planned)
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


_FAILED_ALONE = (
    "its initialiser or its plan failed there: a rule file, group or mesh that differs between the hosts; "
    "every process must call the initialiser with the same rules, mesh and arguments"
)
_SMALL = 256 * 2**20  # models up to this size are initialised in one piece
_GROUPS = 16  # larger ones in groups of 1/16 of the model
