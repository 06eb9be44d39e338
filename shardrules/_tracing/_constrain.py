"""Sharding constraints from rules: `constrain` (by path or by name) and
`auto_constrain` (on every named scope's output, without touching model code)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, PartitionSpec

from .._errors import Diagnostic, error_for
from .._interop._modules import module_scopes
from .._interop._paths import flatten, path_str
from .._planning import _mesh
from .._planning._api import RulesLike, as_rules
from .._planning._compile import compile_flat
from ._compat import DuplicateSpecError, ShardingTypeError, mesh_context, trace_replicated
from ._explicit import Decision, closed_over_error, is_explicit, untyped
from ._memo import Found, TraceMemo
from ._seen import ScopeOutput


@dataclasses.dataclass
class Traced:
    """What one trace of a step found: its layout decisions (Explicit axes),
    every scope output with its rule, the activation rules that matched
    none (SR211), the shapes of the step's output (`out_shape`), and the
    parameter names of its auto-named scopes with the operations no scope
    reaches (`reach`, a `_reach.Reach`)."""

    decisions: list[Decision] = dataclasses.field(default_factory=list)
    scopes: list[ScopeOutput] = dataclasses.field(default_factory=list)
    unmatched: list[Diagnostic] = dataclasses.field(default_factory=list)
    out_shape: Any = None
    reach: Any = None


# What each leaf of a call's positional arguments is, for messages: a label
# (`argument `params`, leaf `layers/w``) and the rule that laid it out, or `None`.
Origins = Callable[[tuple[Any, ...]], Sequence[tuple[str, Any]]]


def _origin(
    args: tuple[Any, ...], kwargs: dict[str, Any], index: dict[int, int], origins: Origins | None
) -> Callable[[Any], tuple[str, Any] | None]:
    """Which argument leaf a traced value is (`index`: a value's `id` to its
    leaf's position among the leaves of `(args, kwargs)`), said by `origins`
    or else by its position and path; `None` for any other value."""

    def origin(value: Any) -> tuple[str, Any] | None:
        k = index.get(id(value))
        if k is None:
            return None
        if origins is not None and not kwargs:
            return origins(args)[k]
        keypath = jax.tree_util.tree_flatten_with_path((args, kwargs))[0][k][0]
        inner = path_str(keypath[2:])
        named = f"argument {path_str(keypath[1:2])}"
        return (f"{named}, leaf `{inner}`" if inner else named), None

    return origin


def _leaf_paths(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    dynamic: Sequence[int],
    groups: Sequence[Any] | None = None,
) -> list[str | None]:
    """The path of each traced leaf of `(args, kwargs)` (`dynamic`: their
    positions among the leaves) in its argument, as `params` rules match it
    (`params/mlp/gating_einsum`); a lone array argument by its name; `None`
    for a leaf of an argument `groups` (one per positional argument) gives
    the `inputs` group: the batch, no parameter."""
    from ._groups import param_names

    keyed = jax.tree_util.tree_flatten_with_path((args, kwargs))[0]
    names = param_names(fn, len(args))
    batch = _batch_leaves(args, groups)
    out: list[str | None] = []
    for i in dynamic:
        keypath = keyed[i][0]
        if i in batch:
            out.append(None)
            continue
        inner = path_str(keypath[2:])
        if not inner:
            head = keypath[1] if len(keypath) > 1 else None
            position = getattr(head, "idx", None)
            inner = names[position] if isinstance(position, int) and position < len(names) else ""
            inner = inner or path_str(keypath[1:2])
        out.append(inner or None)
    return out


def _batch_leaves(args: tuple[Any, ...], groups: Sequence[Any] | None) -> set[int]:
    """The positions, among the leaves of `(args, kwargs)`, of the leaves of
    the positional arguments (or tuple elements) `groups` gives `inputs`."""
    found: set[int] = set()
    start = 0

    def walk(tree: Any, group: Any) -> None:
        nonlocal start
        if isinstance(group, (tuple, list)) and isinstance(tree, (tuple, list)) and len(group) == len(tree):
            for part, inner in zip(tree, group, strict=True):
                walk(part, inner)
            return
        count = len(jax.tree_util.tree_leaves(tree))
        if group == "inputs":
            found.update(range(start, start + count))
        start += count

    for k, arg in enumerate(args):
        walk(arg, groups[k] if groups is not None and k < len(groups) else None)
    return found


def _resolved(mesh: Mesh | None, rules: Any, what: str) -> Mesh | AbstractMesh:
    """`mesh`, else JAX's ambient mesh, else the rule file's `mesh` line."""
    resolved = mesh if mesh is not None else _mesh.ambient_mesh()
    if resolved is None:
        resolved = _mesh.resolve(None, rules, concrete=True, what=what)
    if not isinstance(resolved, (Mesh, AbstractMesh)):
        raise TypeError(f"{what} needs a jax.sharding.Mesh, not {type(resolved).__name__}")
    return resolved


def _target(
    mesh: Mesh | None, rules: Any, what: str
) -> tuple[dict[str, int], Callable[[PartitionSpec], Any]]:
    """Axis sizes, and how to turn a spec into what `_mesh.pin` takes: a
    `NamedSharding`, or an `Unsettled` layout for unconstrained dimensions on
    a mesh without Auto axes (see `_mesh.sharding_for`)."""
    resolved = _resolved(mesh, rules, what)
    if isinstance(resolved, Mesh):
        concrete = resolved
        return _mesh.sizes_of(concrete), lambda spec: _mesh.sharding_for(concrete, spec)
    return _mesh.sizes_of(resolved), lambda spec: spec  # inside `jax.set_mesh`: a bare spec uses it


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
    fn: Callable[..., Any],
    rules: RulesLike,
    mesh: Mesh | None = None,
    *,
    group: str = "activations",
    strict: bool = False,
) -> Callable[..., Any]:
    """Wrap `fn` so that the output of every named scope matching a rule is constrained.

    Scopes are `jax.named_scope`s and what frameworks name with them: Flax
    linen module calls (e.g. `Model/block_0/up`), and Flax NNX module calls,
    named by their path in the model (e.g. `blocks/0/up`) for NNX modules
    passed as arguments. A scope's outputs are the values made inside one
    use of it (each time code enters it: a Python loop over the same
    `jax.named_scope` is several uses) and used after that use; a use's
    single output is matched as the scope's path, several as `PATH/0`,
    `PATH/1`, ... in the order they are made (a rule matching `PATH` but none
    of those is warned about: SR201, a `ShardRulesWarning`). An output takes
    the first rule whose pattern matches its name and whose guard holds for
    its shape and dtype, else the group's `default` where its guard holds.
    Scopes that match
    no rule are left alone, and so is the gradient; a rule that matches no
    scope output of the traced function is warned about (SR211, a
    `ShardRulesWarning`, once per trace, with the closest names seen). Nothing in `fn` changes: the
    wrapper traces it, then evaluates the trace with the constraints added.

    **Arguments:**

    - `fn`: the function; its array arguments are traced, other arguments
      (Python numbers, strings, functions) are held fixed; it must return
      arrays (any pytree of them).
    - `rules`, `mesh`: as for `shardrules.constrain`.
    - `group`: the rules group matched against scope paths.

    - `strict`: on a mesh with `Explicit` axes, make a result layout that JAX
      cannot decide and no rule gives an error (SR117) instead of inferring it.

    On a mesh with `Explicit` axes (`jax.make_mesh`'s default), the rules also
    settle what JAX leaves ambiguous: a contraction whose result becomes a
    matched scope output (through element-wise operations or a transpose)
    gets the rule's spec, in its own dimension order, as its `out_sharding`
    (an `unconstrained` entry: the layout JAX, or the inference, gives that
    dimension), and a layout no rule gives is inferred (see
    [Explicit and Auto axes](explicit-axes.md)).

    **Returns:** a function with `fn`'s signature. Wrap it in `jax.jit` (or use
    `shardrules.jit`); the constraints cost no retracing.

    **Raises:** when called, `PlanError` (SR103) naming the scope, its output's
    shape and the rule's line if a matched output's rank does not fit the rule;
    `PlanError` (SR117) where JAX cannot lay a result out (see `strict`);
    `PlanError` (SR207) for a rule over an Explicit and an Auto axis of the
    mesh at once.

    ```python
    step = jax.jit(shardrules.auto_constrain(model.apply, rules))
    ```
    """
    return constrained(fn, as_rules(rules), mesh, group, strict, None)


def constrained(
    fn: Callable[..., Any],
    ruleset: Any,
    mesh: Mesh | None,
    group: str | None,
    strict: bool,
    record: Traced | None,
    origins: Origins | None = None,
    in_groups: Callable[[int], Sequence[Any] | None] | None = None,
    memo: TraceMemo | None = None,
) -> Callable[..., Any]:
    """`auto_constrain`'s wrapper (`group=None`: no rules, for explicit axes'
    result layouts alone); what each call's trace finds is added to `record`
    when given; `origins` says what each leaf of the positional arguments is
    (`sr.jit`: the argument, the leaf and its rule) where a message names one;
    `in_groups(n)`, the group of each of `n` positional arguments (`sr.jit`'s:
    an `inputs` argument holds no parameters, see `_reach`); `memo` keeps
    the replicated trace of each signature (`_memo`), which the wrapper's
    `trace_shapes(*args)` makes without evaluating it (the output's shapes).
    Each call's findings replace what `record` held."""
    if group is not None:
        ruleset.group(group)

    def prepare(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The leaves of `(args, kwargs)`, their structure, which are traced,
        `fn` of those alone, and their values."""
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        dynamic = [i for i, leaf in enumerate(leaves) if _is_dynamic(leaf)]

        def flat_fn(*values: Any) -> Any:
            full = list(leaves)
            for i, v in zip(dynamic, values, strict=True):
                full[i] = v
            a, kw = jax.tree_util.tree_unflatten(treedef, full)
            with module_scopes((a, kw)):
                return fn(*a, **kw)

        return leaves, treedef, dynamic, flat_fn, [leaves[i] for i in dynamic]

    def replicated(
        args: tuple[Any, ...], kwargs: dict[str, Any], resolved: Any
    ) -> tuple[Found, list[Any], list[int]]:
        """The trace of `fn` for `(args, kwargs)` without layouts (on Explicit
        axes, every value replicated, so JAX cannot refuse what the rules
        will settle; under the mesh's abstract form, so that layouts the
        model's code states work), from `memo` where it holds one; the
        traced values and their positions among the leaves."""
        leaves, treedef, dynamic, flat_fn, values = prepare(args, kwargs)
        explicit = is_explicit(resolved)
        shapes = [untyped(v) for v in values] if explicit else values
        key = TraceMemo.key(treedef, leaves, dynamic, shapes) if memo is not None else None
        found = memo.get(key) if memo is not None else None
        if found is not None:
            return found, values, dynamic
        if explicit:
            with mesh_context(resolved):
                try:
                    trace = jax.make_jaxpr(flat_fn, return_shape=True)
                    closed, out_shape = trace_replicated(trace, shapes, resolved.abstract_mesh)
                except (ShardingTypeError, DuplicateSpecError) as err:
                    raise closed_over_error(fn, err, ruleset) from None
        else:
            closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*values)
        # The jaxpr's reader (and `_outputs`, which imports `jax.extend`) loads with the first trace.
        from ._reach import find

        groups = in_groups(len(args)) if in_groups is not None else None
        found = Found(closed, out_shape, find(closed.jaxpr, _leaf_paths(fn, args, kwargs, dynamic, groups)))
        return (memo.put(key, found) if memo is not None else found), values, dynamic

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        resolved = _resolved(mesh, ruleset, "auto_constrain")
        sizes, sharding = _target(resolved if isinstance(resolved, Mesh) else None, ruleset, "auto_constrain")
        explicit = is_explicit(resolved)
        (closed, out_shape, reach), values, dynamic = replicated(args, kwargs, resolved)
        from ._scopes import Constrainer, interpret

        abstract = resolved.abstract_mesh if isinstance(resolved, Mesh) else resolved
        constrainer = Constrainer(
            ruleset, group, sizes, sharding, explicit=explicit, strict=strict,
            abstract_mesh=abstract if explicit else None,
            origin=_origin(args, kwargs, dict(zip(map(id, values), dynamic, strict=True)), origins),
            reach=reach,
        )  # fmt: skip
        results = interpret(constrainer, closed.jaxpr, closed.consts, values)
        if group is not None:
            constrainer.seen.warn_unmatched()
        if record is not None:
            record.decisions[:] = constrainer.decisions
            record.scopes[:] = constrainer.seen.scope_outputs(constrainer.output_rule)
            record.unmatched[:] = constrainer.seen.unmatched() if group is not None else ()
            record.reach = reach
            record.out_shape = out_shape
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), results)

    def trace_shapes(*args: Any, **kwargs: Any) -> Any:
        """The output's shapes, from the replicated trace alone (kept in `memo`)."""
        return replicated(args, kwargs, _resolved(mesh, ruleset, "auto_constrain"))[0].out_shape

    wrapped.trace_shapes = trace_shapes  # type: ignore[attr-defined]
    return wrapped
