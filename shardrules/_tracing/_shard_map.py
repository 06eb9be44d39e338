"""`shardrules.shard_map`: `jax.shard_map` whose `in_specs` and `out_specs`
come from a rule file, with inputs moved to those layouts first."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from .._errors import Diagnostic, ShardRulesError, error_for
from .._interop._paths import path_str
from .._language._rules import RuleSet
from .._planning import _mesh
from .._planning._api import RulesLike, as_rules, placement_specs
from .._planning._blocks import entry_axes
from .._planning._compile import compile_plan
from .._pspec import entries, padded
from . import _jit
from . import _shard_map_errors as _errors
from ._compat import explicit_mesh_context, trace_state_clean
from ._groups import for_groups, moved, param_names, signature

Groups = str | PartitionSpec | None | Sequence["Groups"]


def shard_map(
    fn: Callable[..., Any],
    rules: RulesLike,
    mesh: Mesh | None = None,
    *,
    in_groups: Sequence[Groups],
    out_groups: Groups,
    check_vma: bool = True,
) -> RuleShardMap:
    """`jax.shard_map` with `in_specs` and `out_specs` from the rules.

    On the first call with given argument shapes, each argument's specs are
    planned from its group, the outputs' from theirs, and `fn` is wrapped in
    `jax.shard_map`. Inputs not laid out as their specs say (NumPy arrays,
    arrays on one device or laid out otherwise) are moved first, so a mesh with
    `Explicit` axes, where `in_specs` must match the inputs' types, works as an
    `Auto` one does; inside `jax.jit` they are resharded (or constrained).

    **Arguments:**

    - `fn`: the per-device function, as for `jax.shard_map`: it sees each
      device's blocks and may use collectives (`jax.lax.psum(x, "model")`).
    - `rules`: a `RuleSet`, or the path of a rule file.
    - `mesh`: a `jax.sharding.Mesh`; by default the ambient mesh, else the rule
      file's `mesh` line over `jax.devices()`.
    - `in_groups`: one entry per positional argument: a group name (the
      argument's leaves get that group's specs; a lone array is matched as its
      parameter's name), `None` (replicated: every device gets it whole), a
      `PartitionSpec` for the whole argument, or a sequence for an argument
      that is a tuple. One group name alone (`in_groups="params"`) is that
      group for every argument.
    - `out_groups`: the same for the output: one entry for the whole output,
      or a sequence for a tuple output. An output leaf's spec is the one its
      group's rule gives the output's global shape (each device's block
      times the blocks the spec makes). A lone array output has no path: its
      group's rules are matched against `""` (return a dict to name it).
    - `check_vma`: passed to `jax.shard_map`; with it (the default) an output
      that varies along axes its out spec does not shard it over is SR118.

    **Returns:** a callable; `f(*args)` runs it, `f.specs(*args)` gives the
    `(in_specs, out_specs)` used for arguments of those shapes.

    **Raises:** `PlanError` when the rules or a `PartitionSpec` given do not
    fit an argument or an output (naming the leaf and the rule), or an output
    varies where its spec replicates (SR118); `GroupNotFoundError` (SR018);
    `TypeError` when `in_groups`/`out_groups` do not fit the arguments or the
    output, or `mesh` is not a `Mesh`.

    ```python
    step = shardrules.shard_map(local_sgd, rules, mesh, in_groups=("params", "inputs"),
                                out_groups=("params", None))
    params, loss = step(params, batch)   # the loss replicated: one value on every device
    ```
    """
    if isinstance(in_groups, PartitionSpec) or not isinstance(in_groups, Sequence):
        raise TypeError(
            f"in_groups must have one entry per positional argument of the function (or be one group "
            f"name for all of them), e.g. in_groups=({in_groups!r},); got {in_groups!r}"
        )
    _errors.check_groups(in_groups if isinstance(in_groups, str) else tuple(in_groups), "in_groups")
    _errors.check_groups(out_groups, "out_groups")
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError(f"shard_map needs a jax.sharding.Mesh with devices, got {type(mesh).__name__}")
    groups = in_groups if isinstance(in_groups, str) else tuple(in_groups)
    return RuleShardMap(fn, as_rules(rules), mesh, groups, out_groups, check_vma)


def _specs_for(tree: Any, groups: Groups, rules: RuleSet, mesh: Mesh, what: str, name: str = "") -> Any:
    """The spec pytree (a prefix of `tree`) that `groups` gives `tree`: `None`
    is replicated, a `PartitionSpec` is taken as it is."""

    def plan(subtree: Any, group: str) -> Any:
        return placement_specs(subtree, rules, mesh, group=group)

    return for_groups(tree, groups, plan, what, name, none=PartitionSpec(), literal=PartitionSpec)


def _blocks(spec: PartitionSpec, rank: int, sizes: dict[str, int]) -> list[int]:
    out = []
    for entry in entries(padded(spec, rank)):
        out.append(math.prod(sizes[a] for a in entry_axes(entry)))
    return out


def _global_out(local: Any, groups: Groups, rules: RuleSet, mesh: Mesh) -> Any:
    """Global output shapes from each device's block: a spec is planned for
    the block scaled by the whole mesh (its rule's spec depends on the rank,
    and an `auto` one on which dimensions are largest, which scaling keeps),
    then the block is multiplied by the blocks that spec makes. A leaf that no
    rule fits keeps its block's shape: planning the outputs says what is wrong
    with the shape that is known."""
    sizes = _mesh.sizes_of(mesh)
    devices = math.prod(sizes.values())

    def scaled(x: Any) -> Any:
        return jax.ShapeDtypeStruct(tuple(d * devices for d in x.shape), x.dtype)

    def guessed(subtree: Any, group: str) -> Any:  # no error raised: the leaves that fail keep None
        the_plan = compile_plan(subtree, rules, mesh, group)
        return jax.tree_util.tree_unflatten(the_plan.treedef, [leaf.spec for leaf in the_plan.leaves])

    def globalised(x: Any, spec: Any) -> Any:
        if not isinstance(spec, PartitionSpec):
            return x
        blocks = _blocks(spec, len(x.shape), sizes)
        return jax.ShapeDtypeStruct(tuple(d * b for d, b in zip(x.shape, blocks, strict=True)), x.dtype)

    guess = for_groups(
        jax.tree.map(scaled, local),
        groups,
        guessed,
        "out_groups",
        none=PartitionSpec(),
        literal=PartitionSpec,
    )
    return jax.tree.map(
        lambda spec, sub: jax.tree.map(lambda x: globalised(x, spec), sub), guess, local, is_leaf=_is_spec
    )


def _local_out(rsm: RuleShardMap, mesh: Mesh, in_specs: Any, shapes: Any) -> tuple[Any, Any]:
    """Each device's output blocks (`ShapeDtypeStruct`s) and the mesh axes each
    may vary along, from one trace of the function as `jax.shard_map` runs it."""
    seen: list[Any] = []

    def body(*args: Any) -> tuple[()]:
        seen.append(jax.tree.map(jax.typeof, rsm.fn(*args)))
        return ()  # no output to check: the checks are ours, with the specs from the rules

    probe = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=(), check_vma=rsm.check_vma)
    jax.eval_shape(probe, *shapes)
    avals = seen[-1]
    local = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type), avals)
    return local, jax.tree.map(_errors.varying_axes, avals)


def _out_specs(rsm: RuleShardMap, outputs: Any, mesh: Mesh) -> Any:
    """The out spec pytree for the global `outputs`; every out_groups entry's
    problems in one error, SR105 naming the outputs."""
    where = {id(sub): w for w, _, (sub,) in _errors.entries(rsm.out_groups, outputs)}
    failed: list[ShardRulesError] = []

    def plan(sub: Any, group: str) -> Any:
        try:
            return placement_specs(sub, rsm.rules, mesh, group=group)
        except ShardRulesError as err:
            failed.append(
                _errors.unmatched_outputs(err, sub, where.get(id(sub), ()), group, _name(rsm), rsm.rules)
            )
            return jax.tree.map(lambda _: PartitionSpec(), sub)

    out_specs = for_groups(
        outputs, rsm.out_groups, plan, "out_groups", none=PartitionSpec(), literal=PartitionSpec
    )
    if len(failed) == 1:
        raise failed[0]
    if failed:
        raise error_for([d for err in failed for d in err.diagnostics], rsm.rules.sources)
    return out_specs


def _name(rsm: RuleShardMap) -> str:
    return getattr(rsm.fn, "__name__", "the function")


class _Entry(NamedTuple):
    mapped: Any
    in_specs: tuple[Any, ...]
    out_specs: Any
    in_shardings: tuple[Any, ...]  # in_specs as NamedShardings of the mesh
    refused: tuple[Diagnostic, ...]  # SR118: outputs that vary where their out specs replicate
    mesh: Mesh


class RuleShardMap:
    """The function `shardrules.shard_map` returns: call it like `fn` on the
    whole arrays."""

    def __init__(
        self,
        fn: Callable[..., Any],
        rules: RuleSet,
        mesh: Mesh | None,
        in_groups: str | tuple[Groups, ...],
        out_groups: Groups,
        check_vma: bool,
    ):
        self.fn, self.rules, self.mesh = fn, rules, mesh
        self.in_groups, self.out_groups, self.check_vma = in_groups, out_groups, check_vma
        self._compiled: dict[Any, _Entry] = {}  # per argument signature
        self._agreed: set[Any] = set()  # signatures the processes have compared plans for
        functools.update_wrapper(self, fn)

    def _mesh(self) -> Any:
        """`mesh`, else JAX's ambient mesh (inside a trace, such as `sr.jit`'s,
        its abstract form), else the rule file's `mesh` line."""
        mesh = self.mesh if self.mesh is not None else _mesh.ambient_mesh()
        if isinstance(mesh, AbstractMesh) and not trace_state_clean():
            return mesh  # inside `jax.jit` / `sr.jit` under `jax.set_mesh`: the mesh the trace has
        if not isinstance(mesh, Mesh):
            mesh = _mesh.resolve(None, self.rules, concrete=True, what="shard_map")
        assert isinstance(mesh, Mesh)
        return mesh

    def _build(self, args: tuple[Any, ...]) -> _Entry:
        mesh = self._mesh()
        key = (signature(args), mesh)  # the ambient mesh can differ between calls
        found = self._compiled.get(key)
        if found is not None:
            return found
        fn = _name(self)
        groups = (self.in_groups,) * len(args) if isinstance(self.in_groups, str) else self.in_groups
        if len(groups) != len(args):
            raise TypeError(
                f"in_groups has {len(groups)} entries for {len(args)} arguments: give one entry "
                f"per positional argument of `{fn}`"
            )
        names = param_names(self.fn, len(args))
        in_specs = tuple(
            _specs_for(a, g, self.rules, mesh, "in_groups", n)
            for a, g, n in zip(args, groups, names, strict=True)
        )
        sizes = _mesh.sizes_of(mesh)
        _raise(
            self,
            _errors.literal_problems(
                args,
                groups,
                sizes,
                "in_groups",
                divide=True,
                describe=lambda w, p: _errors.argument_name(w, p, fn, names),
            ),
        )
        in_specs = jax.tree.map(lambda s: PartitionSpec() if s is None else s, in_specs, is_leaf=_is_spec)
        in_shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), in_specs, is_leaf=_is_spec)
        shapes = tuple(  # typed with their layouts: on Explicit axes in_specs must match the types
            jax.tree.map(
                lambda sharding, x: jax.tree.map(lambda leaf: _typed(leaf, sharding), x),
                shardings,
                arg,
                is_leaf=lambda s: isinstance(s, NamedSharding),
            )
            for shardings, arg in zip(in_shardings, args, strict=True)
        )
        local, varying = _local_out(self, mesh, in_specs, shapes)
        _raise(
            self,
            _errors.literal_problems(
                local,
                self.out_groups,
                sizes,
                "out_groups",
                divide=False,
                describe=lambda w, p: _errors.output_name(w, p, fn),
            ),
        )
        outputs = _global_out(local, self.out_groups, self.rules, mesh)
        out_specs = _out_specs(self, outputs, mesh)
        refused = _errors.varying_outputs(fn, outputs, varying, self.out_groups, out_specs, mesh)
        mapped = jax.shard_map(
            self.fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=self.check_vma
        )
        entry = _Entry(
            mapped, in_specs, out_specs, in_shardings, tuple(refused) if self.check_vma else (), mesh
        )
        self._compiled[key] = entry
        return entry

    def specs(self, *args: Any) -> tuple[Any, Any]:
        """`(in_specs, out_specs)` for arguments shaped like `args`."""
        entry = self._build(args)
        return entry.in_specs, entry.out_specs

    def _layouts(self, args: tuple[Any, ...]) -> tuple[Mesh, list[tuple[str, Any, Any, Any]]]:
        """The mesh and each planned in and out spec, as the processes compare them."""
        entry = self._build(args)
        planned = {"in": entry.in_specs, "out": entry.out_specs}
        keyed = jax.tree_util.tree_flatten_with_path(planned, is_leaf=_is_spec)[0]
        return entry.mesh, [(path_str(k), None, None, s) for k, s in keyed if isinstance(s, PartitionSpec)]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise TypeError(
                f"pass the arguments of `{_name(self)}` by position (in_groups has one entry per "
                f"positional argument), not as {', '.join(kwargs)}="
            )
        if _jit.agreement() is not None and jax.process_count() > 1 and trace_state_clean():
            key = signature(args)
            if key not in self._agreed:  # before its inputs first move: the processes compare plans
                _jit.agreement()(f"shard_map({_name(self)})", lambda: self._layouts(args))  # type: ignore[misc]
                self._agreed.add(key)
        entry = self._build(args)
        _raise(self, list(entry.refused))  # SR118: JAX's check_vma would refuse these outputs
        # inputs not laid out as their specs say are moved first (inside jit: resharded)
        placed = tuple(
            moved(arg, shardings, _mesh.pin) for arg, shardings in zip(args, entry.in_shardings, strict=True)
        )
        try:
            with explicit_mesh_context(entry.mesh):  # JAX 0.8: on Explicit axes, only inside set_mesh
                return entry.mapped(*placed)
        except ValueError as err:
            found = _errors.from_jax(err, _name(self))  # JAX's check_vma error, should ours miss one
            if not found:
                raise
            raise error_for(found, self.rules.sources) from None


def _raise(rsm: RuleShardMap, found: list[Diagnostic]) -> None:
    if found:
        raise error_for(found, rsm.rules.sources)


def _typed(leaf: Any, sharding: NamedSharding) -> Any:
    """A `ShapeDtypeStruct` of `leaf` laid out by `sharding`; a Python scalar as it is."""
    if not hasattr(leaf, "dtype"):
        return leaf
    return jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype, sharding=sharding)


def _is_spec(x: Any) -> bool:
    return isinstance(x, PartitionSpec) or x is None
