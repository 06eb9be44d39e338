"""torchax tensors in and out of the public API.

A `torch.nn.Module` moved to the `jax` device holds `torchax.tensor.Tensor`s:
torch tensors that wrap a `jax.Array`. `shardrules` plans and moves the wrapped
arrays and, where it returns arrays (`apply`), wraps them back in torchax
tensors of the same environment, so a sharded `state_dict()` goes straight into
`model.load_state_dict(..., assign=True)` or `torch.func.functional_call`.

torch and torchax are never imported here: a tree can only hold their tensors
if the user has imported them already, so without `torch` in `sys.modules`
there is nothing to do and the tree is returned as it is.

```python
with torchax.default_env():
    model.to("jax")
    state = shardrules.apply(model.state_dict(), rules, mesh)
    model.load_state_dict(state, assign=True)
```
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ._paths import flatten, path_strs

Restore = Callable[[Any], Any]


def _types() -> tuple[type | None, type | None]:
    """`(torch.Tensor, torchax.tensor.Tensor)`, each `None` when not imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None, None
    torchax_tensor = sys.modules.get("torchax.tensor")
    return getattr(torch, "Tensor", None), getattr(torchax_tensor, "Tensor", None)


def to_jax(tree: Any, *, plain_torch: str = "abstract", what: str = "apply") -> tuple[Any, Restore | None]:
    """Swap torchax tensors in `tree` for the `jax.Array`s they wrap.

    **Arguments:**

    - `tree`: any pytree.
    - `plain_torch`: what to do with torch tensors that are not torchax tensors
      (a model still on the `cpu` device): `"abstract"` replaces them with a
      `jax.ShapeDtypeStruct` of their shape and dtype (enough to plan), `"error"`
      raises a `TypeError` naming them and saying how to move the model.
    - `what`: the calling function's name, for the error message.

    **Returns:** `(tree, restore)`: the tree with jax arrays in place of torch
    tensors, and a function that wraps the arrays of an output tree of the same
    structure back in torchax tensors (the environment of each input tensor),
    or `None` when the tree held no torch tensors (then `tree` is the input
    itself).

    ```python
    tree, restore = to_jax(model.state_dict())
    out = jax.device_put(tree, sharding)
    state = restore(out) if restore else out
    ```
    """
    torch_tensor, torchax_tensor = _types()
    if torch_tensor is None:
        return tree, None
    try:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
    except (ValueError, TypeError):  # not a pytree JAX can flatten: the caller's SR109 explains it
        return tree, None
    wrapped: dict[int, Any] = {}
    plain: list[int] = []
    for i, leaf in enumerate(leaves):
        if torchax_tensor is not None and isinstance(leaf, torchax_tensor):
            wrapped[i] = leaf
        elif isinstance(leaf, torch_tensor):
            plain.append(i)
    if not wrapped and not plain:
        return tree, None
    if plain and plain_torch == "error":
        raise _plain_torch_error(tree, plain, leaves, what)
    out = list(leaves)
    for i, leaf in wrapped.items():
        out[i] = leaf.jax()
    for i in plain:
        out[i] = jax.ShapeDtypeStruct(tuple(leaves[i].shape), torch_dtype(leaves[i].dtype))

    def restore(result: Any) -> Any:
        got = treedef.flatten_up_to(result)
        for i, leaf in wrapped.items():
            if isinstance(got[i], jax.Array):
                got[i] = type(leaf)(got[i], leaf._env)
        return jax.tree_util.tree_unflatten(treedef, got)

    return jax.tree_util.tree_unflatten(treedef, out), restore


def torch_dtype(dtype: Any) -> np.dtype:
    """The NumPy dtype of a `torch.dtype` (`torch.bfloat16` → `bfloat16`)."""
    name = str(dtype).removeprefix("torch.")
    try:
        return jax.numpy.dtype(name)
    except TypeError:
        raise TypeError(f"torch dtype {dtype} has no JAX equivalent") from None


def _plain_torch_error(tree: Any, plain: list[int], leaves: list[Any], what: str) -> TypeError:
    keyed, _ = flatten(tree)
    paths = path_strs([keypath for keypath, _ in keyed])
    shown = [f"    {paths[i] or '(the tree itself)'}  on {leaves[i].device}" for i in plain[:10]]
    if len(plain) > 10:
        shown.append(f"    ... and {len(plain) - 10} more")
    return TypeError(
        f"{what} moves jax arrays, but {len(plain)} "
        f"{'leaf is a torch tensor' if len(plain) == 1 else 'leaves are torch tensors'} "
        "not on the `jax` device:\n" + "\n".join(shown) + "\n"
        '  hint: move the model to JAX first (`pip install "shardrules[torchax]"`, then '
        "`with torchax.default_env(): model.to('jax')`) and pass its state_dict(); "
        "shardrules.specs/shardings/plan accept torch tensors on any device"
    )
