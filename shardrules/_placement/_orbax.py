"""Restoring Orbax checkpoints straight into the planned shardings.

Orbax restores each array into whatever sharding its target says: given
`jax.ShapeDtypeStruct(shape, dtype, sharding=...)` targets, every device reads
only its own part of the checkpoint. `load_orbax` builds those targets from the
rules (for the checkpoint's own shapes, read from its metadata, or for a target
tree you pass), so a checkpoint saved on one mesh loads onto another, laid out
as the rules say for that mesh. Orbax is imported only when called.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from .._interop._paths import leaf_info
from .._planning import _check, _mesh
from .._planning._api import RulesLike, as_rules, placement_shardings
from .._planning._compile import compile_plan
from ._exchange import join_timeout
from ._meeting import CHECKPOINT_FIX, agree_on_layouts, plan_layouts
from ._multihost import joining_on_error, require_every_process

EXTRA_HINT = 'pip install "shardrules[orbax]"'


def _orbax() -> Any:
    try:
        import orbax.checkpoint as ocp
    except ImportError as err:
        raise ImportError(
            f"shardrules.load_orbax needs Orbax ({err}); install it with: {EXTRA_HINT}"
        ) from err
    return ocp


def load_orbax(
    path: str | os.PathLike[str],
    rules: RulesLike,
    mesh: Mesh | None = None,
    *,
    group: str = "params",
    target: Any = None,
) -> Any:
    """Restore an Orbax checkpoint with every array in its planned sharding.

    The rules are compiled for the checkpoint's arrays (their shapes and dtypes
    come from its metadata, or from `target`) and the mesh, before anything is
    read; then `orbax.checkpoint.StandardCheckpointer` restores into
    `jax.ShapeDtypeStruct` targets carrying those shardings, so each device
    reads only its own shards. The mesh need not be the one the checkpoint was
    saved from.

    **Arguments:**

    - `path`: a checkpoint written by `StandardCheckpointer.save` (for a
      `CheckpointManager`, the item's directory, such as `ckpt/100/default`).
    - `rules`, `mesh`, `group`: as for `shardrules.apply`; arrays are matched by
      their path in the saved tree (`params/layers/0/kernel`); a saved NNX
      state, whose Variables Orbax writes as `{"value": array}`, through that
      level, as `apply` matches the live state (`up/kernel`, not
      `up/kernel/value`).
    - `target`: optional tree with the checkpoint's structure whose array
      leaves give shapes and dtypes (arrays, `jax.ShapeDtypeStruct`s, such as
      `jax.eval_shape(init)`); by default the checkpoint's metadata. Non-array
      leaves are passed to Orbax as they are.

    **Returns:** the restored tree: sharded `jax.Array`s, and scalars saved as
    Python numbers returned as Python numbers. Then, as `apply` does, a
    `ShardRulesWarning` names each rule of the group that matches no array
    (SR201) and a plan over the replicated tolerance (SR116).

    **Raises:** `ImportError` naming the `orbax` extra when Orbax is missing;
    `TypeError` for a mesh without devices; the errors of
    `shardrules.shardings` (before anything is read); Orbax's
    own errors for a missing or mismatched checkpoint. In a multi-process
    run, `ProcessMismatchError` (SR112) on every process, before anything is
    read, when their arrays (paths, shapes, dtypes), planned specs or meshes
    differ, or when another process stopped on an error of its own (that one
    raises its own error); SR114 for a process that does not come.

    ```python
    params = shardrules.load_orbax("ckpt/100/default", rules, mesh)
    ```
    """
    what = f"load_orbax({os.fspath(path)!r})"
    # In a multi-process run, a process that fails here alone still meets the others
    # (as one that failed): it raises its own error, they SR112, and nothing is read.
    with joining_on_error(True, what=what):
        ocp = _orbax()
        ruleset = as_rules(rules)
        resolved = _mesh.resolve(mesh, ruleset, concrete=True, what="load_orbax")
        assert isinstance(resolved, Mesh)
        require_every_process(resolved, what)
        checkpointer = ocp.StandardCheckpointer()
        path = os.path.abspath(os.fspath(path))  # Orbax wants absolute paths
        matched = target  # the tree whose paths the rules match
        if target is None:
            metadata = checkpointer.metadata(path)
            target = getattr(metadata, "item_metadata", metadata)
            target = getattr(target, "tree", target)
            target = jax.tree.map(_python_scalar, target)
            matched = through_values(target)
        planned = placement_shardings(matched, ruleset, resolved, group=group)
        the_plan = compile_plan(matched, ruleset, resolved, group)  # the one just made, cached
        multi = jax.process_count() > 1
        if multi:
            join_timeout()  # a bad SHARDRULES_JOIN_TIMEOUT is this process's own error
        layouts = plan_layouts(the_plan) if multi else []
    # Every process has the same arrays, plans the same specs and uses the same mesh,
    # or every one stops (SR112) before Orbax reads anything.
    agree_on_layouts(
        what,
        resolved,
        layouts,
        fix=CHECKPOINT_FIX,
        cause="the checkpoint may be missing or unreadable there, Orbax missing, or its rules differ: "
        "every process must read the same checkpoint with the same rules",
    )
    leaves, treedef = jax.tree_util.tree_flatten(target)
    # `matched` has `target`'s leaves in the same order (an NNX box held one leaf).
    shardings = jax.tree_util.tree_structure(matched).flatten_up_to(planned)
    targets = [
        jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype, sharding=sharding)
        if sharding is not None
        else leaf
        for leaf, sharding in zip(leaves, shardings, strict=True)
    ]
    restored = checkpointer.restore(path, jax.tree_util.tree_unflatten(treedef, targets))
    _check.warn_about(the_plan, stacklevel=3)  # as `apply` does: rules that match nothing, SR116
    return restored


def through_values(tree: Any) -> Any:
    """`tree` read as `apply` reads a live NNX state: each `{"value": array}`
    that Orbax saved an NNX `Variable` as replaced by its array, so that rules
    match `up/kernel`, not `up/kernel/value`; only when every array of the
    tree is in such a box (as in a saved `nnx.state(...)`), else `tree` itself
    (a leaf of another tree may be named `value`)."""
    arrays = sum(1 for leaf in jax.tree_util.tree_leaves(tree) if _is_array(leaf))
    boxes = [x for x in jax.tree_util.tree_leaves(tree, is_leaf=_is_box) if _is_box(x)]
    if not arrays or len(boxes) != arrays:
        return tree
    return jax.tree.map(lambda x: x["value"] if _is_box(x) else x, tree, is_leaf=_is_box)


def _is_box(node: Any) -> bool:
    return isinstance(node, dict) and len(node) == 1 and "value" in node and _is_array(node["value"])


def _is_array(leaf: Any) -> bool:
    return leaf_info("", leaf).shape is not None


def _python_scalar(meta: Any) -> Any:
    """Orbax's metadata of a Python number (saved as such) → a number of its kind,
    so it is restored as a Python number; anything else as it is."""
    if type(meta).__name__ != "ScalarMetadata":
        return meta
    info = leaf_info("", meta)
    if info.dtype is None:
        return meta
    return np.zeros((), info.dtype).item()
