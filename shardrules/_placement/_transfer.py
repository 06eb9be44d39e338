"""`shardrules.transfer`: a reusable plan for moving a tree between two
layouts (a trainer's mesh and a rollout's, on the same devices, others, or
some of both), run under a cap on the memory in flight.

Planning (once per tree structure and shapes, no data): both layouts are
compiled, each array cut into the pieces each device of the new layout needs
(`_pieces`), and the pieces cut into chunks for a cap (`_schedule`, cached
per cap). Running (`_carry`, `_crossing`): the chunks move one after another,
each waited for, so no device ever holds more than the cap plus one piece in
flight; with `donate` each source is deleted as soon as its array is
finished; with `verify` every piece is checked where it arrived.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from .._errors import error_for
from .._interop._penzai import arrays_of
from .._interop._torchax import to_jax
from .._planning import _mesh
from .._planning._api import RulesLike, as_rules
from .._planning._check import DEFAULT_REPLICATED_TOLERANCE, warn_about
from .._planning._compile import compile_leaves
from .._planning._concrete import unconstrained_diagnostics
from .._planning._plan import Plan, format_bytes, spec_repr
from . import _meeting, _multihost, _schedule
from ._inputs import check_inputs, mesh_text
from ._moving import MovedLeaf, Moves, layout_of, run_moves
from ._moving import cap as checked_cap


class Transfer:
    """A plan for moving trees of one structure from a source layout to a
    target layout, made by `shardrules.transfer`; `run` it on every refit.

    **Attributes** (of the tree planned last, or given as `shapes`):

    - `leaves`: a `MovedLeaf` per array.
    - `bytes_moved`: the bytes that change device (pieces that stay are not
      counted, and are copied only on their own device).
    - `pieces`: how many pieces move.

    Methods: `run`, `plan_for`, `peak_bytes_per_device`, `peaks`,
    `in_flight_per_device`.
    """

    def __init__(
        self,
        source: RulesLike | Plan,
        target: RulesLike,
        source_mesh: jax.sharding.Mesh | None,
        target_mesh: jax.sharding.Mesh | None,
        group: str,
        target_group: str,
    ) -> None:
        if isinstance(source, Plan):
            self._source_plan: Plan | None = source
            self._source_rules = source.rules
            mesh = source_mesh if source_mesh is not None else source.mesh
            if not isinstance(mesh, jax.sharding.Mesh):
                raise TypeError(
                    "transfer from a Plan needs the plan's devices: make the plan on a jax.sharding.Mesh "
                    "(shardrules.plan(tree, rules, mesh)) or pass source_mesh="
                )
            self._source_mesh = mesh
        else:
            self._source_plan = None
            self._source_rules = as_rules(source)
            self._source_mesh = _concrete(source_mesh, self._source_rules, "transfer's source_mesh")
        self._target_rules = as_rules(target)
        self._target_mesh = _concrete(target_mesh, self._target_rules, "transfer's target_mesh")
        self.group = group
        self.target_group = target_group
        self._layouts: dict[Any, Moves] = {}
        self._last: Moves | None = None

    # -- planning -------------------------------------------------------------------------------

    def _signature(self, leaves: list[Any], treedef: Any) -> Any:
        return (treedef, tuple((getattr(x, "shape", None), str(getattr(x, "dtype", ""))) for x in leaves))

    def plan_for(self, tree: Any) -> Transfer:
        """Plan for trees like `tree` (arrays or `jax.ShapeDtypeStruct`s) now,
        as `shapes=` does; kept for every later `run` of such a tree. The
        attributes then describe this tree. Returns the transfer itself."""
        self._planned(tree)
        return self

    def _planned(self, tree: Any) -> Moves:
        """The moves for trees like `tree`, planned on first use and kept."""
        flat, treedef = jax.tree_util.tree_flatten(tree)
        key = self._signature(flat, treedef)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = self._plan(tree)
        self._last = layout
        return layout

    def _plan(self, tree: Any) -> Moves:
        if self._source_plan is not None:
            source = self._source_plan
        else:
            source, _ = compile_leaves(tree, self._source_rules, self._source_mesh, self.group)
        target, _ = compile_leaves(tree, self._target_rules, self._target_mesh, self.target_group)
        if source.errors:  # each file's findings with its own text (two rule strings are both "<string>")
            raise error_for(source.errors, self._source_rules.sources)
        problems = list(target.errors) or unconstrained_diagnostics(target)
        if problems:
            raise error_for(problems, self._target_rules.sources)
        # what the target layout would do silently (rules matching nothing, bytes left whole), as
        # `apply` and `reshard` say it; once per plan
        # (stacklevel: `_plan`, `_planned`, then `run`, `plan_for` or `transfer`, then their caller)
        warn_about(target, DEFAULT_REPLICATED_TOLERANCE, stacklevel=5)
        if len(source.leaves) != len(target.leaves):
            raise ValueError(
                f"the source plan has {len(source.leaves)} leaves and the tree {len(target.leaves)}: "
                "plan the source for this tree"
            )
        sources = [
            None if old.spec is None else jax.sharding.NamedSharding(self._source_mesh, old.spec)
            for old in source.leaves
        ]
        targets = [
            None if new.spec is None else jax.sharding.NamedSharding(self._target_mesh, new.spec)
            for new in target.leaves
        ]
        spans = [lp.rule.span if lp.rule is not None else None for lp in source.leaves]
        return layout_of(target, sources, targets, source_spans=spans)

    def _current(self) -> Moves:
        if self._last is None:
            raise ValueError(
                "this transfer has not been planned for a tree yet: pass shapes= to shardrules.transfer, "
                "or call .plan_for(tree) or .run(tree) first"
            )
        return self._last

    @property
    def leaves(self) -> list[MovedLeaf]:
        return list(self._current().leaves)

    @property
    def bytes_moved(self) -> int:
        return sum(leaf.bytes_moved for leaf in self._current().leaves)

    @property
    def pieces(self) -> int:
        return sum(1 for p in self._current().pieces if not p.stays)

    def _blocks(self, layout: Moves) -> tuple[dict[int, dict[int, int]], dict[int, dict[int, int]]]:
        sources, targets = {}, {}
        for i in layout.moving:
            leaf = layout.leaves[i]
            assert leaf.shape is not None and leaf.dtype is not None  # a leaf that moves is an array
            for sharding, out in ((layout.sources[i], sources), (layout.targets[i], targets)):
                assert sharding is not None  # a leaf that moves has both
                size = int(np.prod(sharding.shard_shape(leaf.shape), dtype=np.int64)) * leaf.dtype.itemsize
                out[i] = {d.id: size for d in sharding.device_set}
        return sources, targets

    def peak_bytes_per_device(
        self, max_bytes_in_flight: int | str | None = None, *, donate: bool = False
    ) -> int:
        """The most memory any device holds during `run` with this cap: the
        sources it holds (with `donate`, only those of arrays not yet
        finished), the new arrays made so far, and the pieces in flight.
        Arrays that do not move are not counted."""
        return max(self.peaks(max_bytes_in_flight, donate=donate).values(), default=0)

    def peaks(self, max_bytes_in_flight: int | str | None = None, *, donate: bool = False) -> dict[int, int]:
        """`peak_bytes_per_device` for each device (by id)."""
        layout = self._current()
        sources, targets = self._blocks(layout)
        return _schedule.peaks(layout.chunks(checked_cap(max_bytes_in_flight)), sources, targets, donate)

    def in_flight_per_device(self, max_bytes_in_flight: int | str | None = None) -> int:
        """The most bytes in flight on any device at once with this cap: at
        most the cap, or one piece where a piece is larger."""
        most = 0
        for chunk in self._current().chunks(checked_cap(max_bytes_in_flight)):
            held: dict[int, int] = {}
            for piece in chunk.pieces:
                for d, b in _schedule.in_flight(piece).items():
                    held[d] = held.get(d, 0) + b
            most = max(most, *held.values()) if held else most
        return most

    # -- running --------------------------------------------------------------------------------

    def run(
        self,
        tree: Any,
        *,
        max_bytes_in_flight: int | str | None = None,
        donate: bool = False,
        verify: bool = False,
    ) -> Any:
        """Move `tree` (its arrays in the source layout) to the target layout.

        **Arguments:**

        - `tree`: a pytree like the one planned, whose arrays are live
          `jax.Array`s in the source layout (placed by `apply`, loaded, or a
          jitted step's outputs).
        - `max_bytes_in_flight`: the most bytes in flight on any device at
          once (an int or a size such as `"64MiB"`); a piece larger than the
          cap moves alone. `None`: no cap (every piece at once).
        - `donate`: delete each source array once its new array is made; the
          input tree is unusable afterwards.
        - `verify`: compare a checksum of every piece where it arrived with
          its checksum at the source; `PlacementError` (SR132) naming the
          array if one differs.

        **Returns:** the tree with every array in its target layout (arrays
        already there returned as they are).
        """
        if not isinstance(donate, bool) or not isinstance(verify, bool):
            raise TypeError(f"donate and verify must be True or False, not {donate!r} and {verify!r}")
        cap = checked_cap(max_bytes_in_flight)
        what = "transfer.run"
        with _multihost.joining_on_error(jax.process_count() > 1, what=what):
            tree, restore = to_jax(tree, plain_torch="error", what="transfer")
            layout = self._planned(tree)
            flat = jax.tree_util.tree_leaves(tree)
            arrays, rewrap = arrays_of(flat)
            self._check_inputs(layout, arrays)
        if jax.process_count() > 1:
            _meeting.agree_on_layouts(what, self._target_mesh, self._layouts_compared(layout))
        out = run_moves(
            layout,
            arrays,
            cap,
            donate,
            verify,
            lambda flat: self._rebuild(tree, flat, rewrap, restore),
            self._target_rules,
        )
        return self._rebuild(tree, out, rewrap, restore)

    @staticmethod
    def _rebuild(tree: Any, flat: list[Any], rewrap: Any, restore: Any) -> Any:
        flat = rewrap(flat) if rewrap is not None else flat
        result = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(tree), flat)
        return restore(result) if restore is not None else result

    def _check_inputs(self, layout: Moves, arrays: list[Any]) -> None:
        check_inputs(layout, arrays, self._source_mesh, self._source_rules, self._target_rules)

    def _layouts_compared(self, layout: Moves) -> list[_meeting.Layout]:
        from ._fingerprint import mesh_fingerprint

        _, described = mesh_fingerprint(self._source_mesh)
        rows: list[_meeting.Layout] = [("<source mesh>", None, None, str(described))]
        for leaf in layout.leaves:
            rows.append((leaf.path, leaf.shape or None, leaf.dtype, leaf.target))
            rows.append((leaf.path + " (source)", leaf.shape or None, leaf.dtype, spec_repr(leaf.source)))
        return rows

    def __repr__(self) -> str:
        if self._last is None:
            return f"Transfer(group={self.group!r}, not planned yet)"
        return (
            f"Transfer(group={self.group!r}, {len(self._last.moving)} of {len(self._last.leaves)} arrays move, "
            f"{format_bytes(self.bytes_moved)} in {self.pieces} pieces)"
        )

    def __str__(self) -> str:
        if self._last is None:
            return repr(self)
        lines = [
            repr(self),
            f"  from {mesh_text(self._source_mesh)} to {mesh_text(self._target_mesh)}",
        ]
        width = max((len(leaf.path) for leaf in self._last.leaves), default=4)
        for leaf in self._last.leaves:
            if leaf.source is None:
                continue
            lines.append(
                f"  {leaf.path:<{width}}  {spec_repr(leaf.source)} -> {spec_repr(leaf.target)}  "
                f"{format_bytes(leaf.bytes_moved)} in {sum(1 for p in leaf.pieces if not p.stays)} pieces"
            )
        return "\n".join(lines)


def _concrete(mesh: jax.sharding.Mesh | None, rules: Any, what: str) -> jax.sharding.Mesh:
    resolved = _mesh.resolve(mesh, rules, concrete=True, what=what)
    assert isinstance(resolved, jax.sharding.Mesh)
    return resolved


def transfer(
    source: RulesLike | Plan,
    target: RulesLike,
    source_mesh: jax.sharding.Mesh | None = None,
    target_mesh: jax.sharding.Mesh | None = None,
    *,
    group: str = "params",
    target_group: str | None = None,
    shapes: Any = None,
) -> Transfer:
    """Plan moving a tree from one layout to another once, to run on every refit.

    The two layouts are compiled (no data moves), each array is cut into the
    pieces that each device of the target layout needs, taken from a device
    that holds them in the source layout (itself where it can: such pieces
    stay), and `Transfer.run` moves them in chunks under a memory cap. The
    meshes may share devices, or not (a trainer on devices 0-5 and a rollout
    on 6-7), and may span several processes.

    **Arguments:**

    - `source`: the rules (a `RuleSet` or a rule file's path) that laid the
      tree out, or the `Plan` they made (then `source_mesh` defaults to the
      plan's mesh).
    - `target`: the rules of the new layout.
    - `source_mesh`, `target_mesh`: the two `jax.sharding.Mesh`es; by default
      JAX's ambient mesh (`jax.set_mesh`), else the rule file's `mesh` line
      over `jax.devices()`.
    - `group`: the rules' group for both layouts (`"params"`); `target_group`
      another group for the target layout.
    - `shapes`: a tree like the one to move (arrays or
      `jax.ShapeDtypeStruct`s) to plan now, so that `bytes_moved` and
      `peak_bytes_per_device` can be read before anything runs; otherwise the
      first `run` plans (once per tree structure and shapes).

    **Returns:** a `Transfer`.

    **Raises:** the errors of `shardrules.plan` for either layout (every
    array is planned before anything moves); `TypeError` for a mesh without
    devices.

    ```python
    t = shardrules.transfer(train_rules, rollout_rules, train_mesh, rollout_mesh, shapes=params)
    print(t.bytes_moved, t.peak_bytes_per_device("64MiB", donate=True))
    rollout_params = t.run(params, max_bytes_in_flight="64MiB")  # on every refit
    ```
    """
    t = Transfer(source, target, source_mesh, target_mesh, group, target_group or group)
    if shapes is None and isinstance(source, Plan):
        shapes = jax.tree_util.tree_unflatten(
            source.treedef,
            [0 if lp.shape is None else jax.ShapeDtypeStruct(lp.shape, lp.dtype) for lp in source.leaves],
        )
    if shapes is not None:
        t._planned(shapes)  # (not `plan_for`: its warnings point at the caller of `transfer`)
    return t
