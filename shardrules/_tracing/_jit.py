"""`shardrules.jit`: `jax.jit` with in/out shardings and activation constraints
taken from a rule file."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
from jax.sharding import Mesh

from .._language._rules import RuleSet
from .._planning import _mesh
from .._planning._api import RulesLike, as_rules, placement_shardings
from .._quiet import quiet
from . import _recorded, _slips
from ._compare import Comparison, compare_outputs, on_one_device, one_device_mesh, shapes_only
from ._compat import mesh_context
from ._constrain import Traced, constrained
from ._explicit import Decision, is_explicit
from ._groups import for_groups, moved, param_names, signature, typed
from ._memo import TraceMemo
from ._seen import ScopeOutput

if TYPE_CHECKING:
    from .._costs._cost import StepCost

Groups = str | None | Sequence["Groups"]
# Before a step first runs with an argument signature in a multi-process run,
# every process compares what `RuleJit._layouts` says (SR112 where they differ):
# placement's `_meeting.agree_on_step`, set by `shardrules/__init__.py` (tracing
# does not import placement).
Agreement = Callable[[str, Callable[[], tuple[Mesh, list[tuple[str, Any, Any, Any]]]]], None]
_agreement: Agreement | None = None


def set_agreement(agreement: Agreement | None) -> None:
    """Set what a step calls before its first run with each signature
    when there are several processes (`None`: nothing)."""
    global _agreement
    _agreement = agreement


def agreement() -> Agreement | None:
    """What a step (`jit`, `shard_map`) calls before it first moves inputs with
    each signature when there are several processes, or `None`."""
    return _agreement


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def jit(
    fn: Callable[..., Any],
    rules: RulesLike,
    mesh: Mesh | None = None,
    *,
    in_groups: Groups | Sequence[Groups] | None = None,
    out_groups: Groups = None,
    donate: Sequence[int] = (),
    activations: str | None = "activations",
    strict: bool = False,
) -> RuleJit:
    """`jax.jit` whose shardings come from the rules.

    On the first call with given argument shapes, the rules are compiled for
    the arguments (`in_groups`) and for the outputs (`out_groups`, shapes from
    `jax.eval_shape`), and `fn` is wrapped in `shardrules.auto_constrain` for
    the `activations` group. Later calls with the same shapes reuse the
    compiled function.

    **Arguments:**

    - `fn`: the function; its positional arguments are pytrees of arrays.
    - `rules`: a `RuleSet`, or the path of a rule file.
    - `mesh`: a `jax.sharding.Mesh`; by default the mesh ambient at each call
      (`jax.set_mesh`; planned and compiled once per argument shapes and
      mesh, as `jax.jit` follows the ambient mesh), else the rule file's
      `mesh` line over `jax.devices()`.
    - `in_groups`: one entry per positional argument: a group name (its
      leaves get that group's shardings; a lone array is matched as its
      parameter's name, e.g. `x`), `None` (JAX decides), or a sequence for an
      argument that is a tuple. One group name alone (`in_groups="params"`)
      is that group for every argument. `None` for all: JAX decides everywhere.
    - `out_groups`: the same, for the output (one string for the whole output,
      or a sequence for a tuple output).
    - `donate`: positions of arguments whose buffers may be reused (e.g. the
      parameters and optimizer state of a train step).
    - `activations`: the group used for activation constraints, or `None` for
      none. A file without that group gets none.
    - `strict`: on a mesh with `Explicit` axes, a result layout that JAX
      cannot decide and no activation rule gives is an error (SR117) rather
      than inferred.

    Meshes with `Explicit` axes (`jax.make_mesh`'s default) and `Auto` ones
    both work. On explicit axes the activation rules also give the result
    layouts of the contractions that make the scope outputs they match (in
    the forward pass: the gradient follows it), and what JAX leaves
    ambiguous elsewhere is inferred (`decisions` lists every choice); the
    function is traced inside `jax.set_mesh(mesh)`. See
    [Explicit and Auto axes](explicit-axes.md).

    **Returns:** the compiled function; call it like `fn`.

    ```python
    step = shardrules.jit(train_step, rules, in_groups=("params", "opt", "inputs"),
                          out_groups=("params", "opt", None), donate=(0, 1))
    params, opt_state, loss = step(params, opt_state, batch)
    ```
    """
    return RuleJit(fn, as_rules(rules), mesh, in_groups, out_groups, tuple(donate), activations, strict)


class _Entry(NamedTuple):
    jitted: Any
    in_shardings: tuple[Any, ...] | None
    mesh: Mesh
    out_shardings: Any = None
    # The step's replicated trace for this signature, and what evaluating it
    # with the layouts found (filled by `jitted`'s trace), where it has them.
    memo: TraceMemo | None = None
    record: Traced | None = None


class RuleJit:
    """The function `shardrules.jit` returns: call it like the wrapped function;
    `.lower(*args)` gives what `jax.jit(...).lower` would."""

    def __init__(
        self,
        fn: Callable[..., Any],
        rules: RuleSet,
        mesh: Mesh | None,
        in_groups: Groups | Sequence[Groups] | None,
        out_groups: Groups,
        donate: tuple[int, ...],
        activations: str | None,
        strict: bool = False,
    ):
        self.fn, self.rules, self.mesh = fn, rules, mesh
        self.in_groups, self.out_groups, self.donate = in_groups, out_groups, donate
        self.activations = (
            activations if activations is not None and activations in rules.group_names else None
        )
        self.strict = strict
        self._compiled: dict[Any, _Entry] = {}  # per argument signature and ambient mesh (`_key`)
        self._agreed: set[Any] = set()  # the keys every process has planned alike
        # `cost`'s programs, per argument signature and mesh compiled for (`_costs._step`)
        self._programs: dict[Any, Any] = {}
        functools.update_wrapper(self, fn)

    def _mesh(self) -> Mesh:
        mesh = (
            self.mesh if self.mesh is not None else _mesh.resolve(None, self.rules, concrete=True, what="jit")
        )
        if not isinstance(mesh, Mesh):
            raise TypeError(
                f"sr.jit(..., mesh={type(mesh).__name__}(...)): a mesh without devices is costed only for a TPU "
                "topology (`step.cost(*args, target='v5p:8x8x4')`); to run the step, give a `jax.sharding.Mesh`"
            )
        return mesh

    def _key(self, args: tuple[Any, ...]) -> Any:
        """What selects the planned and compiled step for a call: the arguments'
        signature and, without a `mesh` of its own, the ambient mesh of this
        call (each call runs on the mesh it is made under, as `jax.jit`'s do)."""
        if self.mesh is not None:
            return signature(args), None
        ambient = _mesh.ambient_mesh()
        return signature(args), ambient if isinstance(ambient, Mesh) else None

    def _constrains(self, mesh: Mesh) -> bool:
        """Whether the step's body evaluates its trace with the rules (on
        Explicit axes, or with activation rules), rather than being `fn`."""
        return is_explicit(mesh) or self.activations is not None

    def _body(
        self, mesh: Mesh, record: Traced | None = None, memo: TraceMemo | None = None
    ) -> Callable[..., Any]:
        """`fn` with its activation constraints (and, on explicit axes, its
        result layouts) from the rules; what the trace finds goes to `record`;
        the replicated trace is kept in `memo`."""
        if self._constrains(mesh) or record is not None:

            def origins(args: tuple[Any, ...]) -> list[tuple[str, Any]]:
                return _slips.leaf_origins(self.fn, args, self._in_groups(len(args)), self.rules, mesh)

            return constrained(
                self.fn,
                self.rules,
                mesh,
                self.activations,
                self.strict,
                record,
                origins,
                self._in_groups,
                memo,
            )
        return self.fn

    def _context(self, mesh: Mesh) -> contextlib.AbstractContextManager[Any]:
        """`jax.set_mesh(mesh)` for explicit axes, unless it is JAX's mesh already;
        inside another trace (`jax.jit(step)`), where `set_mesh` is refused, the
        mesh's abstract form with its devices (`mesh_context`). `jax.grad(step)`
        still needs the caller's `jax.set_mesh(mesh)`: outside it JAX refuses
        the gradient ("Length of device assignment 1 is not equal to the size
        of the mesh"), as it does `jax.grad(jax.jit(f))`."""
        if not is_explicit(mesh) or _mesh.ambient_mesh() in (mesh, mesh.abstract_mesh):
            return contextlib.nullcontext()
        return mesh_context(mesh)

    def decisions(self, *args: Any) -> list[Decision]:
        """On a mesh with `Explicit` axes, how the layout of each contraction,
        and of each result JAX could not lay out alone, is chosen for
        arguments like `args` (traced, not run): a list of `Decision`s with the
        scope, the operation, its operands' shapes and specs, the result's
        spec, and `by` ("rule" with the rule's location, "model", "jax",
        "inferred" or "auto_axes"). Empty on a mesh with `Auto` axes."""
        cached = self._compiled.get(self._key(args))
        if not is_explicit(cached.mesh if cached is not None else self._mesh()):
            self._entry(args)  # what is wrong with the groups, said as a call says it
            return []
        return self._traced(args).decisions

    def scopes(self, *args: Any) -> list[ScopeOutput]:
        """Every output of a named scope the step makes for arguments like
        `args` (traced, not run), in the order they are made: a list of
        `ScopeOutput`s with the name the `activations` rules are matched
        against, its shapes and dtype, and the rule that lays it out (or
        `None`). Write activation rules from these names.

        ```python
        for s in step.scopes(params, batch):
            print(s.name, s.shapes, s.rule and s.rule.pattern)
        ```
        """
        return self._traced(args).scopes

    def traced(self, *args: Any) -> Traced:
        """One trace of the step for arguments like `args` (nothing runs):
        its decisions, scope outputs and the activation rules that match
        none of them (SR211 diagnostics). The step is traced once: the
        output's shapes that `out_groups` are planned for come from this trace."""
        return self._traced(args)

    def _traced(self, args: tuple[Any, ...]) -> Traced:
        """`traced`, `decisions` and `scopes`' trace, warnings shown where they are called."""
        return _recorded.traced_of(self, args)

    def jitted(self, *args: Any) -> Any:
        """The `jax.jit`-wrapped function for arguments shaped like `args`."""
        return self._entry(args).jitted

    def _in_groups(self, count: int) -> tuple[Groups, ...] | None:
        """The group of each of `count` positional arguments (one group name
        alone is that group for all of them), or `None` (JAX decides)."""
        if self.in_groups is None:
            return None
        groups = (self.in_groups,) * count if isinstance(self.in_groups, str) else tuple(self.in_groups)
        if len(groups) != count:
            raise TypeError(
                f"in_groups has {len(groups)} entries for {count} arguments of `{_name(self.fn)}`: give one "
                "entry per positional argument (a group name, None, or a sequence for a tuple argument), "
                "or one group name for all of them"
            )
        return groups

    def _inputs(self, args: tuple[Any, ...], stacklevel: int) -> tuple[Mesh, Any, Any]:
        """The mesh, the arguments' shardings and their groups (SR212 for an
        argument given none that a group would shard, shown `stacklevel` up)."""
        mesh = self._mesh()
        in_shardings = None
        groups = self._in_groups(len(args))
        if groups is not None:
            names = param_names(self.fn, len(args))

            def plan(tree: Any, group: str) -> Any:
                return placement_shardings(tree, self.rules, mesh, group=group)

            in_shardings = tuple(
                for_groups(a, g, _slips.planned(plan, self.rules, mesh, "in_groups", i, n), "in_groups", n)
                for i, (a, g, n) in enumerate(zip(args, groups, names, strict=True))
            )
            _slips.warn_ungrouped(args, groups, names, self.rules, mesh, stacklevel + 1)
        return mesh, in_shardings, groups

    def _store(self, key: Any, args: tuple[Any, ...], mesh: Mesh, ins: Any, out_shape: Any) -> _Entry:
        """The entry for `key`: the arguments' shardings `ins`, the output's from
        `out_groups` for the shapes `out_shape` (`None`: the step's replicated
        trace's, kept for `jitted` to evaluate, or `jax.eval_shape`'s where
        the body is `fn` itself)."""
        memo = record = None
        body = self.fn
        if self._constrains(mesh):
            memo, record = TraceMemo(), Traced()
            body = self._body(mesh, record, memo)
            if out_shape is None and self.out_groups is not None:
                with self._context(mesh):  # as `jitted`'s trace makes it
                    out_shape = body.trace_shapes(*args)  # type: ignore[attr-defined]
        out = _slips.out_shardings(self.fn, args, self.out_groups, self.rules, mesh, out_shape)
        jitted = jax.jit(body, in_shardings=ins, out_shardings=out, donate_argnums=self.donate)
        found = self._compiled[key] = _Entry(jitted, ins, mesh, out, memo, record)
        return found

    def _entry(self, args: tuple[Any, ...], stacklevel: int = 3) -> _Entry:
        """The compiled function, argument shardings and mesh for arguments
        shaped like `args`, made on the first call with their signature under
        each ambient mesh (what it warns about shown `stacklevel` frames up)."""
        key = self._key(args)
        found = self._compiled.get(key)
        if found is not None:
            return found
        mesh, in_shardings, groups = self._inputs(args, stacklevel)
        found = self._store(key, args, mesh, in_shardings, None)
        _slips.warn_about_groups(self.fn, args, groups, self.rules, mesh, stacklevel=stacklevel)
        return found

    def _layouts(self, args: tuple[Any, ...]) -> tuple[Mesh, list[tuple[str, Any, Any, Any]]]:
        """What the processes compare before the step first runs with `args` (`_recorded.layouts_of`)."""
        return _recorded.layouts_of(self, args)

    def __call__(self, *args: Any) -> Any:
        if _agreement is not None and jax.process_count() > 1 and self._key(args) not in self._agreed:
            _agreement(f"jit({_name(self.fn)})", lambda: self._layouts(args))
            self._agreed.add(self._key(args))
        entry = self._entry(args)
        if entry.in_shardings is not None and is_explicit(entry.mesh):
            # On Explicit axes the layout is the arguments' type: one not yet laid out
            # as its group says (a NumPy array, an array on one device) is moved first.
            args = tuple(moved(a, s) for a, s in zip(args, entry.in_shardings, strict=True))
        with self._context(entry.mesh):
            return entry.jitted(*args)

    def cost(self, *args: Any, ideal: bool = True, target: str | None = None) -> StepCost:
        """What one call with arguments like `args` (arrays or shapes) costs
        each device: a `StepCost` (FLOPs, bytes, peak memory, collectives, a
        loop's body per trip) and, with `ideal`, the one-device step's FLOPs
        over the devices, their `ratio`, the scopes over it (`repeated`).
        With `target`, for the chips it names: a TPU topology (`"v5p:8x8x4"`,
        by the TPU compiler with no TPU: `pip install "shardrules[tpu]"`) or
        a GPU (`"h100"`); the cost says whether it `fits` and estimates its
        time (`time_estimate_s`). Compiled once per argument shapes, mesh and
        target: a second call compiles nothing. **Raises:** `TargetError` (SR126).

        ```python
        cost = step.cost(params, batch, target="v5e:2x4")
        print(cost.ratio, cost.fits, cost.time_estimate_s)   # 1.04 True 0.00021
        ```
        """
        from .._costs._step import step_cost  # the stage above: what a step costs

        return step_cost(self, args, ideal=ideal, target=target)

    def compare(self, *args: Any, rtol: float = 1e-5, atol: float = 1e-6) -> Comparison:
        """Run the step on its mesh and on one device with the same inputs
        (neither donates them) and compare the outputs leaf by leaf: a
        `Comparison` whose `ok` says whether every output array is
        `numpy.allclose` under `rtol`/`atol`, with each leaf's largest absolute
        and relative difference and the `worst` leaf. This shows that a
        layout, or a `shard_map` kernel, did not change the math.

        ```python
        result = step.compare(params, batch, rtol=1e-4)
        assert result.ok, result
        ```
        """
        mesh = self._entry(args).mesh
        with quiet():  # told once already, when the step was traced for its mesh
            sharded = self._like(mesh)(*args)
            one = one_device_mesh(mesh)
            single = on_one_device(self._like(one), args, one)
        return compare_outputs(sharded, single, rtol, atol)

    def _like(self, mesh: Mesh) -> RuleJit:
        """This step on `mesh`, donating nothing."""
        return RuleJit(
            self.fn, self.rules, mesh, self.in_groups, self.out_groups, (), self.activations, self.strict
        )

    def lower(self, *args: Any) -> Any:
        """`jax.jit(...).lower(*args)` for the function calls with these shapes
        use, with each argument laid out as a call lays it out (arrays or
        `jax.ShapeDtypeStruct`s)."""
        entry = self._entry(args)
        if entry.in_shardings is not None and is_explicit(entry.mesh):
            # on Explicit axes a layout is part of the type: lowered as a call moves them
            args = tuple(typed(a, s) for a, s in zip(shapes_only(args), entry.in_shardings, strict=True))
        with self._context(entry.mesh):
            return entry.jitted.lower(*args)
