"""Which mesh a call uses, and its axis sizes.

A mesh comes from, in order: the `mesh=` argument; JAX's ambient mesh
(`jax.set_mesh`); the rule file's `mesh` line laid over `jax.devices()`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

import jax
from jax.sharding import AbstractMesh, AxisType, Mesh, PartitionSpec

from .._errors import Diagnostic, error_for
from .._language._rules import RuleSet
from .._language._syntax import MeshDecl
from .._pspec import entries, with_entries
from ._blocks import entry_axes

MeshLike = Mesh | AbstractMesh | Mapping[str, int]

MAX_DEVICES = 2**20
"""The most devices a mesh given by its sizes alone (a plan file, `--mesh`, a
rule file's `mesh` line on the command line) may have: a million, beyond any
machine JAX runs on. The reports that look at every device (bytes to move,
bytes per host, device pictures) hold a number or two per device."""


def sizes_of(mesh: MeshLike) -> dict[str, int]:
    """Axis name → size for a `Mesh`, an `AbstractMesh` or a mapping."""
    if isinstance(mesh, (Mesh, AbstractMesh)):
        return {str(k): int(v) for k, v in mesh.shape.items()}
    if isinstance(mesh, Mapping):
        out = {}
        for name, size in mesh.items():
            if not isinstance(size, numbers.Integral) or isinstance(size, bool) or size < 1:
                raise TypeError(f"mesh axis sizes must be positive ints; got {name}={size!r}")
            out[str(name)] = int(size)
        return out
    raise TypeError(
        f"mesh must be a jax.sharding.Mesh, an AbstractMesh or a dict of axis sizes, "
        f"not {type(mesh).__name__}"
    )


def absent_axes(rules: RuleSet, sizes: Mapping[str, int] | None) -> frozenset[str]:
    """The axes the file's `mesh` line writes `NAME?` that the mesh (its
    `sizes`) lacks: taken to be of size 1, so the dimensions they would shard
    stay unsharded (`_spec`), and not reported missing (SR101). None without
    a mesh."""
    if sizes is None or rules.mesh is None:
        return frozenset()
    return frozenset(a for a in rules.mesh.optional if a not in sizes)


def ambient_mesh() -> Mesh | AbstractMesh | None:
    """JAX's current mesh (`jax.set_mesh`), concrete if there is one."""
    try:
        concrete = jax.sharding.get_mesh()
    except ValueError:  # inside jax.jit only the abstract mesh is known
        concrete = None
    if concrete is not None and not concrete.empty:
        return concrete
    abstract = jax.sharding.get_abstract_mesh()
    if not abstract.empty:
        return abstract
    return None


def declared_sizes(
    decl: MeshDecl, n_devices: int | None, sources: Mapping[str, str]
) -> dict[str, int] | None:
    """Sizes from a `mesh` line, `*` taking what the others leave of `n_devices`.

    With `n_devices=None` (planning without devices) a line whose sizes are
    all numbers is taken as written, and `None` is returned for a line that
    lacks sizes. With a device count, the line must fill exactly that many.
    An axis written `NAME?` with no size is left out (a mesh may lack it).
    """
    sizes = {a.name: a.size for a in decl.axes if not (a.optional and a.size is None)}
    unsized = [n for n, s in sizes.items() if s is None]
    if len(sizes) == 1 and unsized:
        sizes = {unsized[0]: "*"}
    elif unsized:
        if n_devices is None:
            return None
        example = ", ".join(f"{n}={s or 2}" for n, s in sizes.items())
        raise _mesh_error(
            f"the mesh line gives no size for {', '.join(unsized)}, and no mesh was given",
            decl,
            f"pass mesh=jax.make_mesh(...), use `with jax.set_mesh(mesh):`, or give sizes: `mesh {example}`",
            sources,
        )
    star = [n for n, s in sizes.items() if s == "*"]
    if n_devices is None:
        if not star:
            return {n: int(s) for n, s in sizes.items()}  # type: ignore[arg-type]
        n_devices = jax.device_count()
    fixed = math.prod(s for s in sizes.values() if isinstance(s, int))
    out: dict[str, int] = {}
    for name, size in sizes.items():
        if size == "*":
            if n_devices % fixed:
                raise _mesh_error(
                    f"`{name}=*` cannot fill {n_devices} devices: the other axes take {fixed}, "
                    f"which does not divide {n_devices}",
                    decl,
                    "change the fixed sizes so their product divides the device count",
                    sources,
                )
            out[name] = n_devices // fixed
        else:
            assert isinstance(size, int)
            out[name] = size
    total = math.prod(out.values())
    if total != n_devices:
        raise _mesh_error(
            f"the mesh line needs {total} devices, but {n_devices} are available",
            decl,
            "size one axis `*` to take the rest, or pass mesh=",
            sources,
        )
    return out


def _mesh_error(message: str, decl: MeshDecl, hint: str, sources: Mapping[str, str]) -> Exception:
    return error_for([Diagnostic("SR108", "error", message, decl.span, hint=hint)], sources)


def no_mesh_error(what: str) -> Exception:
    return error_for(
        [
            Diagnostic(
                "SR108",
                "error",
                f"{what} needs a mesh, but none was given, none is set, and the rules have no `mesh` line",
                hint="pass mesh=jax.make_mesh((4, 2), ('data', 'model')), or run inside "
                "`with jax.set_mesh(mesh):`, or add a mesh line with sizes to the rule file",
            )
        ]
    )


def declared_types(decl: MeshDecl) -> tuple[AxisType, ...]:
    """The `AxisType` of each axis of a `mesh` line; `Auto` where it states none."""
    return tuple(AxisType.Explicit if t == "explicit" else AxisType.Auto for t in decl.axis_types)


def axis_types_text(mesh: Any, rules: RuleSet | None = None) -> str | None:
    """`Explicit axes`, `Auto axes` or `axis types: data Explicit, model Auto`
    for a mesh with types (a `Mesh` or `AbstractMesh`), else for the types
    the rule file's `mesh` line states for every axis; `None` when unknown."""
    types: tuple[str, ...] | None = None
    names: tuple[str, ...] = ()
    if isinstance(mesh, (Mesh, AbstractMesh)):
        names, types = tuple(mesh.axis_names), tuple(t.name for t in mesh.axis_types)
    elif rules is not None and rules.mesh is not None and all(rules.mesh.axis_types):
        sizes = sizes_of(mesh) if mesh is not None else {}
        if not sizes or list(sizes) == list(rules.mesh.names):
            names = rules.mesh.names
            types = tuple(str(t).capitalize() for t in rules.mesh.axis_types)
    if not types:
        return None
    if len(set(types)) == 1:
        return f"{types[0]} axes"
    return "axis types: " + ", ".join(f"{n} {t}" for n, t in zip(names, types, strict=True))


def resolve(mesh: MeshLike | None, rules: RuleSet, *, concrete: bool, what: str) -> MeshLike | None:
    """The mesh a call uses: the argument, else the ambient mesh, else the
    rule file's mesh line, else `None`.

    Without `concrete` (planning), a mesh line is used for its sizes only: as
    written when all are numbers, `*` filled from the local device count, and
    not at all when sizes are missing.

    With `concrete`, the result has devices (a `jax.sharding.Mesh`); a mesh
    built from the file's line has the axis types it declares (`explicit`,
    `auto`), `AxisType.Auto` where it declares none.
    """
    if mesh is None:
        mesh = ambient_mesh()
        if concrete and isinstance(mesh, AbstractMesh):
            mesh = None
    if mesh is None and rules.mesh is not None:
        if not concrete:
            return declared_sizes(rules.mesh, None, rules.sources)
        devices = jax.devices()
        sizes = declared_sizes(rules.mesh, len(devices), rules.sources)
        assert sizes is not None
        return jax.make_mesh(
            tuple(sizes.values()),
            tuple(sizes),
            axis_types=declared_types(rules.mesh),
            devices=devices,
        )
    if mesh is None:
        if concrete:
            raise no_mesh_error(what)
        return None
    if concrete and not isinstance(mesh, Mesh):
        raise TypeError(f"{what} needs a jax.sharding.Mesh with devices, not {type(mesh).__name__}")
    sizes_of(mesh)  # validates mappings
    return mesh


def device_order(mesh: Any) -> tuple[int, ...]:
    return tuple(d.id for d in mesh.devices.flat)


def memory_limit(mesh: Mesh) -> int | None:
    """The smallest memory limit that the devices of the mesh on this process
    report, or `None` (CPUs report none; neither does a mesh none of whose
    devices are this process's: the others' cannot be asked)."""
    limits = []
    me = jax.process_index()
    for device in mesh.devices.flat:
        if device.process_index != me:
            continue
        try:
            stats = device.memory_stats()
        except Exception:  # some backends raise instead of returning None
            return None
        if not stats or "bytes_limit" not in stats:
            return None
        limits.append(int(stats["bytes_limit"]))
    return min(limits) if limits else None


def pin(value: Any, target: Any) -> Any:
    """Give a traced (or concrete) value the sharding `target`: a `NamedSharding`
    (or an `Unsettled` layout, see `sharding_for`), or a bare `PartitionSpec`
    for the ambient mesh.

    `with_sharding_constraint` for meshes whose axes are `Auto`; for `Explicit`
    axes (the default of `jax.make_mesh` in new JAX) the layout is part of the
    type, and `jax.sharding.reshard` is what changes it.

    An unconstrained dimension (`PartitionSpec.UNCONSTRAINED`, from a rule's
    `unconstrained`) is left to the compiler by `with_sharding_constraint`;
    `reshard` needs a concrete layout, so there the dimension keeps the one
    the value has (unsharded if another dimension of `target` uses its axes).
    """
    named = isinstance(target, (jax.sharding.NamedSharding, Unsettled))
    mesh = target.mesh if named else jax.sharding.get_abstract_mesh()
    explicit = set(getattr(mesh, "explicit_axes", ()) or ())
    spec = target.spec if named else target
    used = {a for entry in entries(spec) for a in entry_axes(entry)}
    if explicit and (used & explicit or not used - explicit):
        if any(entry is PartitionSpec.UNCONSTRAINED for entry in entries(spec)):
            spec = _kept(value, spec, used)
            target = jax.sharding.NamedSharding(mesh, spec) if named else spec
        return jax.sharding.reshard(value, target)
    return jax.lax.with_sharding_constraint(value, target)


@dataclasses.dataclass(frozen=True)
class Unsettled:
    """A layout with unconstrained dimensions on a mesh without `Auto` axes, for
    `pin`: JAX refuses it as a `NamedSharding`, and `pin` settles those
    dimensions from the value's own layout."""

    mesh: Mesh | AbstractMesh
    spec: PartitionSpec


def sharding_for(mesh: Mesh | AbstractMesh, spec: PartitionSpec) -> jax.sharding.NamedSharding | Unsettled:
    """What `pin` takes to lay a value out as `spec` on `mesh`: the
    `NamedSharding`, or, for unconstrained dimensions on a mesh with no `Auto`
    axis (a `NamedSharding` JAX refuses), an `Unsettled` layout."""
    unconstrained = any(entry is PartitionSpec.UNCONSTRAINED for entry in entries(spec))
    if unconstrained and AxisType.Auto not in tuple(mesh.axis_types):
        return Unsettled(mesh, spec)
    return jax.sharding.NamedSharding(mesh, spec)


def _kept(value: Any, spec: PartitionSpec, used: set[str]) -> PartitionSpec:
    """`spec` with each unconstrained entry replaced by the value's current
    layout of that dimension, or unsharded where that uses axes `spec` uses."""
    try:
        current = entries(jax.typeof(value).sharding.spec)
    except (AttributeError, TypeError):  # no layout in its type: unsharded
        current = ()
    current += (None,) * (len(entries(spec)) - len(current))
    return with_entries(
        spec,
        (
            (None if set(entry_axes(now)) & used else now) if entry is PartitionSpec.UNCONSTRAINED else entry
            for entry, now in zip(entries(spec), current, strict=False)
        ),
    )
