"""`shardrules.shard_map`: `jax.shard_map` whose `in_specs` and `out_specs`
come from a rule file, with inputs moved to those layouts first."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._errors import Diagnostic, error_for
from .._language._rules import RuleSet
from .._planning import _mesh
from .._planning._api import RulesLike, as_rules, specs
from .._planning._blocks import entry_axes
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
      that is a tuple.
    - `out_groups`: the same for the output: one entry for the whole output,
      or a sequence for a tuple output. An output leaf's spec is the one its
      group's rule gives the output's global shape (each device's block
      times the blocks the spec makes).
    - `check_vma`: passed to `jax.shard_map`.

    **Returns:** a callable; `f(*args)` runs it, `f.specs(*args)` gives the
    `(in_specs, out_specs)` used for arguments of those shapes.

    **Raises:** `PlanError` when the rules do not fit an argument or an output
    (naming the leaf and the rule); `TypeError` when `in_groups` does not fit
    the arguments.

    ```python
    step = shardrules.shard_map(local_sgd, rules, mesh, in_groups=("params", "inputs"),
                                out_groups=("params", None))
    params, loss = step(params, batch)   # the loss replicated: one value on every device
    ```
    """
    return RuleShardMap(fn, as_rules(rules), mesh, tuple(in_groups), out_groups, check_vma)


def _specs_for(tree: Any, groups: Groups, rules: RuleSet, mesh: Mesh, what: str, name: str = "") -> Any:
    """The spec pytree (a prefix of `tree`) that `groups` gives `tree`: `None`
    is replicated, a `PartitionSpec` is taken as it is."""

    def plan(subtree: Any, group: str) -> Any:
        return specs(subtree, rules, mesh, group=group)

    return for_groups(tree, groups, plan, what, name, none=PartitionSpec(), literal=PartitionSpec)


def _blocks(spec: PartitionSpec, rank: int, sizes: dict[str, int]) -> list[int]:
    entries = list(spec) + [None] * (rank - len(spec))
    out = []
    for entry in entries:
        out.append(math.prod(sizes[a] for a in entry_axes(entry)))
    return out


def _global_out(local: Any, groups: Groups, rules: RuleSet, mesh: Mesh) -> Any:
    """Global output shapes from each device's block: a spec is planned for
    the block scaled by the whole mesh (its rule's spec depends on the rank,
    and an `auto` one on which dimensions are largest, which scaling keeps),
    then the block is multiplied by the blocks that spec makes."""
    sizes = _mesh.sizes_of(mesh)
    devices = math.prod(sizes.values())

    def scaled(x: Any) -> Any:
        return jax.ShapeDtypeStruct(tuple(d * devices for d in x.shape), x.dtype)

    def globalised(x: Any, spec: Any) -> Any:
        if not isinstance(spec, PartitionSpec):
            return x
        blocks = _blocks(spec, len(x.shape), sizes)
        return jax.ShapeDtypeStruct(tuple(d * b for d, b in zip(x.shape, blocks, strict=True)), x.dtype)

    guess = _specs_for(jax.tree.map(scaled, local), groups, rules, mesh, "out_groups")
    if isinstance(guess, PartitionSpec):  # one spec for the whole output
        return jax.tree.map(lambda x: globalised(x, guess), local)
    return jax.tree.map(globalised, local, guess, is_leaf=lambda s: s is None)


class _Entry(NamedTuple):
    mapped: Any
    in_specs: tuple[Any, ...]
    out_specs: Any
    in_shardings: tuple[Any, ...]  # in_specs as NamedShardings of the mesh


class RuleShardMap:
    """The function `shardrules.shard_map` returns: call it like `fn` on the
    whole arrays."""

    def __init__(
        self,
        fn: Callable[..., Any],
        rules: RuleSet,
        mesh: Mesh | None,
        in_groups: tuple[Groups, ...],
        out_groups: Groups,
        check_vma: bool,
    ):
        self.fn, self.rules, self.mesh = fn, rules, mesh
        self.in_groups, self.out_groups, self.check_vma = in_groups, out_groups, check_vma
        self._compiled: dict[Any, _Entry] = {}  # per argument signature
        functools.update_wrapper(self, fn)

    def _mesh(self) -> Mesh:
        mesh = self.mesh if self.mesh is not None else _mesh.ambient_mesh()
        if not isinstance(mesh, Mesh):
            mesh = _mesh.resolve(None, self.rules, concrete=True, what="shard_map")
        assert isinstance(mesh, Mesh)
        return mesh

    def _build(self, args: tuple[Any, ...]) -> _Entry:
        key = signature(args)
        found = self._compiled.get(key)
        if found is not None:
            return found
        mesh = self._mesh()
        if len(self.in_groups) != len(args):
            raise TypeError(f"in_groups has {len(self.in_groups)} entries for {len(args)} arguments")
        names = param_names(self.fn, len(args))
        in_specs = tuple(
            _specs_for(a, g, self.rules, mesh, "in_groups", n)
            for a, g, n in zip(args, self.in_groups, names, strict=True)
        )
        in_shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), in_specs, is_leaf=_is_spec)
        shapes = tuple(  # typed with their layouts: on Explicit axes in_specs must match the types
            jax.tree.map(
                lambda sharding, x: jax.tree.map(
                    lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype, sharding=sharding), x
                ),
                shardings,
                arg,
                is_leaf=lambda s: isinstance(s, NamedSharding),
            )
            for shardings, arg in zip(in_shardings, args, strict=True)
        )
        probe = jax.shard_map(
            self.fn, mesh=mesh, in_specs=in_specs, out_specs=PartitionSpec(), check_vma=False
        )
        local = jax.eval_shape(probe, *shapes)  # replicated outputs: each device's block, as is
        out_specs = _specs_for(
            _global_out(local, self.out_groups, self.rules, mesh),
            self.out_groups,
            self.rules,
            mesh,
            "out_groups",
        )
        mapped = jax.shard_map(
            self.fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=self.check_vma
        )
        found = self._compiled[key] = _Entry(mapped, in_specs, out_specs, in_shardings)
        return found

    def specs(self, *args: Any) -> tuple[Any, Any]:
        """`(in_specs, out_specs)` for arguments shaped like `args`."""
        entry = self._build(args)
        return entry.in_specs, entry.out_specs

    def __call__(self, *args: Any) -> Any:
        entry = self._build(args)
        # inputs not laid out as their specs say are moved first (inside jit: resharded)
        placed = tuple(
            moved(arg, shardings, _mesh.pin) for arg, shardings in zip(args, entry.in_shardings, strict=True)
        )
        try:
            return entry.mapped(*placed)
        except ValueError as err:
            varying = _VARYING.search(str(err))
            if varying is None or "out_specs" not in str(err):
                raise
            raise _varying_output(self, varying, err) from None


# JAX's words when an output that out_specs replicates varies over mesh axes
_VARYING = re.compile(
    r"out_specs is (?P<spec>P\(.*?\)) which implies .*? possibly varying over \{(?P<axes>[^}]*)\}", re.S
)


def _varying_output(mapped: RuleShardMap, found: re.Match[str], err: Exception) -> Exception:
    """SR118: an output of the function varies over axes its out spec (from
    `out_groups`) replicates, in our words."""
    axes = [a.strip().strip("'") for a in found["axes"].split(",") if a.strip()]
    name = getattr(mapped.fn, "__name__", "the function")
    listed = ", ".join(f"`{a}`" for a in axes)
    diag = Diagnostic(
        "SR118",
        "error",
        f"an output of `{name}` varies over {listed} across devices, but its out_groups entry lays it "
        f"out as {found['spec']}, the same on every device along {listed}",
        None,
        None,
        f"reduce it over {listed} inside the function (`jax.lax.psum` or `jax.lax.pmean`), or give "
        f"out_groups a group whose rule shards it over {listed}",
        cause="shard_map output varies over replicated axes",
    )
    return error_for([diag], mapped.rules.sources)


def _is_spec(x: Any) -> bool:
    return isinstance(x, PartitionSpec) or x is None
