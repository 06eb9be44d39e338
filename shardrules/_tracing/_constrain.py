"""Sharding constraints from rules: `constrain` (by path or by name) and
`auto_constrain` (on every named scope's output, without touching model code)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from .._errors import error_for
from .._interop._nnx import module_scopes
from .._interop._paths import flatten, path_str
from .._planning import _mesh
from .._planning._api import RulesLike, as_rules
from .._planning._compile import compile_flat
from ._scopes import Constrainer, interpret


def _target(
    mesh: Mesh | None, rules: Any, what: str
) -> tuple[dict[str, int], Callable[[PartitionSpec], Any]]:
    """Axis sizes, and how to turn a spec into what `with_sharding_constraint` takes."""
    resolved = mesh if mesh is not None else _mesh.ambient_mesh()
    if resolved is None:
        resolved = _mesh.resolve(None, rules, concrete=True, what=what)
    if isinstance(resolved, Mesh):
        concrete = resolved
        return _mesh.sizes_of(concrete), lambda spec: NamedSharding(concrete, spec)
    if isinstance(resolved, AbstractMesh):  # inside `jax.set_mesh`: a bare spec uses it
        return _mesh.sizes_of(resolved), lambda spec: spec
    raise TypeError(f"{what} needs a jax.sharding.Mesh, not {type(resolved).__name__}")


def constrain(
    tree: Any,
    rules: RulesLike,
    mesh: Mesh | None = None,
    *,
    group: str | None = None,
    name: str | None = None,
) -> Any:
    """Pin the sharding of every array in `tree` as the rules say.

    Inside `jax.jit` this adds `jax.lax.with_sharding_constraint`s, giving
    exactly the shardings `shardrules.apply` gives outside (use it on gradients,
    updated parameters and optimizer state in a train step). Outside `jit` it
    moves the arrays.

    **Arguments:**

    - `tree`: an array or a pytree of arrays; other leaves pass through.
    - `rules`: a `RuleSet`, or the path of a rule file.
    - `mesh`: a `jax.sharding.Mesh`; by default JAX's ambient mesh
      (`jax.set_mesh`), else the rule file's `mesh` line over `jax.devices()`.
    - `group`: the rules group; `"params"` by default, `"activations"` when
      `name` is given.
    - `name`: match by name instead of by path: the array is matched as `name`
      (a pytree's leaves as `name/PATH`), e.g. `name="block_3/attn"`. A name
      no rule matches is left unconstrained, so model code can name every
      activation and the rule file picks which to pin.

    **Returns:** `tree`, constrained.

    **Raises:** `PlanError` (rank mismatch, dimension that does not divide,
    unmatched leaves when matching by path), `MeshError`.

    ```python
    @jax.jit
    def step(params, batch):
        grads = jax.grad(loss)(params, batch)
        grads = shardrules.constrain(grads, rules)         # same layout as params
        h = shardrules.constrain(h, rules, name="block_3/attn")
    ```
    """
    ruleset = as_rules(rules)
    group = group or ("activations" if name is not None else "params")
    sizes, sharding = _target(mesh, ruleset, "constrain")
    keyed, treedef = flatten(tree)
    if name is not None:
        paths = [f"{name}/{path_str(kp)}" if kp else name for kp, _ in keyed]
        keyed = [((jax.tree_util.DictKey(p),), leaf) for p, (_, leaf) in zip(paths, keyed, strict=True)]
    the_plan = compile_flat(keyed, treedef, ruleset, sizes, group)
    if name is not None:  # names the rules do not mention are left as they are
        errors = [d for d in the_plan.errors if d.code != "SR105"]
        if errors:
            raise error_for(errors, ruleset.sources)
    else:
        the_plan.raise_for_errors()
    out = []
    for (_, leaf), lp in zip(keyed, the_plan.leaves, strict=True):
        if lp.spec is None:
            out.append(leaf)
        else:
            out.append(_mesh.pin(leaf, sharding(lp.spec)))
    return jax.tree_util.tree_unflatten(treedef, out)


def _is_dynamic(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)) or hasattr(
        leaf, "aval"
    )


def auto_constrain(
    fn: Callable[..., Any], rules: RulesLike, mesh: Mesh | None = None, *, group: str = "activations"
) -> Callable[..., Any]:
    """Wrap `fn` so that the output of every named scope matching a rule is constrained.

    Scopes are `jax.named_scope`s and what frameworks name with them: Flax
    linen module calls (e.g. `Model/block_0/up`), and Flax NNX module calls,
    named by their path in the model (e.g. `blocks/0/up`) for NNX modules
    passed as arguments. A scope's outputs are the values
    made inside it and used after it; a single output is matched as the
    scope's path, several as `PATH/0`, `PATH/1`, ... in the order they are made.
    Scopes that match no rule are left alone. Nothing in `fn` changes: the
    wrapper traces it, then evaluates the trace with the constraints added.

    **Arguments:**

    - `fn`: the function; its array arguments are traced, other arguments
      (Python numbers, strings, functions) are held fixed; it must return
      arrays (any pytree of them).
    - `rules`, `mesh`: as for `shardrules.constrain`.
    - `group`: the rules group matched against scope paths.

    **Returns:** a function with `fn`'s signature. Wrap it in `jax.jit` (or use
    `shardrules.jit`); the constraints cost no retracing.

    **Raises:** when called, `PlanError` (SR103) naming the scope, its output's
    shape and the rule's line if a matched output's rank does not fit the rule.

    ```python
    step = jax.jit(shardrules.auto_constrain(model.apply, rules))
    ```
    """
    ruleset = as_rules(rules)
    ruleset.group(group)

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        dynamic = [i for i, leaf in enumerate(leaves) if _is_dynamic(leaf)]

        def flat_fn(*values: Any) -> Any:
            full = list(leaves)
            for i, v in zip(dynamic, values, strict=True):
                full[i] = v
            a, kw = jax.tree_util.tree_unflatten(treedef, full)
            with module_scopes((a, kw)):
                return fn(*a, **kw)

        values = [leaves[i] for i in dynamic]
        closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*values)
        sizes, sharding = _target(mesh, ruleset, "auto_constrain")
        constrainer = Constrainer(ruleset, group, sizes, sharding)
        results = interpret(constrainer, closed.jaxpr, closed.consts, values)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), results)

    return wrapped
