"""What `shardrules.shard_map` says when its groups, specs or outputs are wrong,
in place of JAX's errors: outputs that vary where their spec replicates
(SR118), outputs no rule matches (SR105, named as outputs), and `PartitionSpec`s
given in `in_groups`/`out_groups` that do not fit the mesh or the array."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, PartitionSpec

from .._errors import Diagnostic, Shape, ShardRulesError, did_you_mean, error_for
from .._interop._paths import leaf_paths
from .._planning._blocks import entry_axes
from .._planning._plan import spec_repr
from .._pspec import entries as spec_entries
from .._pspec import tags

Where = tuple[int, ...]  # positions in a tuple argument or output, one per nested sequence


def check_groups(groups: Any, what: str) -> None:
    """A `TypeError` for an entry of `in_groups`/`out_groups` that is not a group
    name, `None`, a `PartitionSpec` or a sequence of these."""
    if groups is None or isinstance(groups, (str, PartitionSpec)):
        return
    if not isinstance(groups, (tuple, list)):
        raise TypeError(
            f"{what}: {groups!r} is not a group: give a group name (str), None (replicated), "
            "a PartitionSpec, or a tuple of these for a tuple"
        )
    for entry in groups:
        check_groups(entry, what)


def entries(groups: Any, *trees: Any, where: Where = ()) -> Iterator[tuple[Where, Any, tuple[Any, ...]]]:
    """`(where, group, subtrees)` for every group entry, walking `trees` (the
    first one decides the structure) as `for_groups` does; a sequence that does
    not fit is skipped (`for_groups` says what is wrong)."""
    if groups is None or isinstance(groups, (str, PartitionSpec)):
        yield where, groups, trees
        return
    first = trees[0]
    if not isinstance(first, (tuple, list)) or len(first) != len(groups):
        return
    for i, group in enumerate(groups):
        yield from entries(group, *(t[i] for t in trees), where=(*where, i))


def output_name(where: Where, path: str, fn: str) -> str:
    """`the output of `f``, `output [1] of `f``, `output [0] `up/kernel` of `f``."""
    parts = (
        ["output"] + (["".join(f"[{i}]" for i in where)] if where else []) + ([f"`{path}`"] if path else [])
    )
    return ("the output" if len(parts) == 1 else " ".join(parts)) + f" of `{fn}`"


def argument_name(where: Where, path: str, fn: str, names: Sequence[str]) -> str:
    """`argument 0 (`x`) of `f``, with the positions and leaf path inside it."""
    head = f"argument {where[0]}" + (f" (`{names[where[0]]}`)" if names[where[0]] else "")
    rest = (["".join(f"[{i}]" for i in where[1:])] if where[1:] else []) + ([f"`{path}`"] if path else [])
    return " ".join([head, *rest]) + f" of `{fn}`"


def _group_text(group: Any) -> str:
    if group is None:
        return "out_groups entry None"
    if isinstance(group, str):
        return f"group `{group}`"
    return "given in out_groups"


def _listed(axes: Sequence[str]) -> str:
    named = [f"`{a}`" for a in axes]
    return named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"


def _one(code: str, message: str, hint: str, path: str, shape: Shape | None, cause: str) -> Diagnostic:
    return Diagnostic(
        code, "error", message, None, path or None, hint, ((path, shape),) if path else (), cause
    )


# --------------------------------------------------------------------- SR118


def varying_axes(aval: Any) -> frozenset[str]:
    """The mesh axes a traced value inside `shard_map` may differ along (its
    varying, unreduced and reduced axes; older JAX: `vma`)."""
    mat = getattr(aval, "mat", None)
    if mat is not None:
        return frozenset(mat.varying) | frozenset(mat.unreduced) | frozenset(mat.reduced)
    return frozenset(getattr(aval, "vma", ()))


def _spec_axes(spec: PartitionSpec) -> set[str]:
    unreduced, reduced = tags(spec)
    return {a for entry in spec_entries(spec) for a in entry_axes(entry)} | unreduced | reduced


def varying_outputs(
    fn: str, outputs: Any, varying: Any, groups: Any, out_specs: Any, mesh: Mesh
) -> list[Diagnostic]:
    """SR118 for every output leaf that may differ along mesh axes its out spec
    does not shard it over (JAX's `check_vma` refuses them), naming the output,
    its spec, the axes and the fixes."""
    manual = set(getattr(jax.sharding.get_abstract_mesh(), "manual_axes", ()))
    found = []
    for where, group, (sub, sub_varying, spec) in entries(groups, outputs, varying, out_specs):
        leaves = jax.tree.leaves(sub)
        specs = [spec] * len(leaves) if isinstance(spec, PartitionSpec) else jax.tree.leaves(spec)
        for path, leaf, axes, leaf_spec in zip(
            leaf_paths(sub), leaves, jax.tree.leaves(sub_varying), specs, strict=True
        ):
            known = _spec_axes(leaf_spec)
            bad = [a for a in mesh.axis_names if a in axes and a not in known and a not in manual]
            if bad:
                name = output_name(where, path, fn)
                found.append(_varying(name, path, tuple(leaf.shape), leaf_spec, _group_text(group), bad))
    return found


def _varying(
    name: str, path: str, shape: Shape | None, spec: Any, source: str, axes: Sequence[str]
) -> Diagnostic:
    listed = _listed(axes)
    over = repr(axes[0]) if len(axes) == 1 else repr(tuple(axes))
    cause = (
        f"varies over {listed} across devices, but its out spec {spec_repr(spec)} ({source}) "
        f"does not shard it over {listed}: it says every device along {listed} holds the same block"
    )
    hint = (
        f"reduce it over {listed} inside the function (`jax.lax.psum(..., {over})` or `jax.lax.pmean`), "
        f"or give it an out_groups group whose rule shards it over {listed}; if it is in fact the same "
        f"on every device along {listed}, pass check_vma=False"
    )
    without_leaf = name.replace(f" `{path}`", "") if path else name
    return _one("SR118", f"{name} {cause}", hint, path, shape, f"{without_leaf} {cause}")


# JAX's words (jax._src.shard_map._inout_vma_error), one bullet per output it refuses;
# JAX 0.8 writes a spec `PartitionSpec(...)`, later ones `P(...)`
_JAX_VARYING = re.compile(
    r"out_specs(?P<path>\S*) is (?P<spec>(?:P|PartitionSpec)\(.*?\)) which implies that the corresponding output value is "
    r"(?:only varying across mesh axes \{[^}]*\} and not \{(?P<axes>[^}]*)\}"
    r"|replicated across mesh axis '(?P<axis>[^']*)')",
    re.S,
)


def from_jax(err: Exception, fn: str) -> list[Diagnostic]:
    """SR118 from the text of JAX's out_specs replication error (`[]` for
    another error): what is left when the check before the call missed it."""
    found = []
    for m in _JAX_VARYING.finditer(str(err)):
        axes = [m["axis"]] if m["axis"] else [a.strip().strip("'") for a in m["axes"].split(",") if a.strip()]
        name = f"output {m['path']} of `{fn}`" if m["path"] else f"an output of `{fn}`"
        found.append(_varying(name, "", None, m["spec"], "from out_groups", axes))  # JAX names no group
    return found


# --------------------------------------------------------------------- SR105


def unmatched_outputs(
    err: ShardRulesError, sub: Any, where: Where, group: str, fn: str, rules: Any
) -> ShardRulesError:
    """`err`, from planning `sub` (the outputs of one out_groups entry, with
    each device's block where no rule gave a spec), with its SR105 findings
    naming the output and its block, and, for a lone array (matched under the
    empty path), how to give it a name."""
    if not any(d.code == "SR105" for d in err.diagnostics):
        return err
    leaves = dict(zip(leaf_paths(sub), jax.tree.leaves(sub), strict=True))
    found = [
        _unmatched(d, leaves, where, group, fn, rules.name) if d.code == "SR105" else d
        for d in err.diagnostics
    ]
    return error_for(found, rules.sources)


def _unmatched(
    d: Diagnostic, leaves: dict[str, Any], where: Where, group: str, fn: str, file: str
) -> Diagnostic:
    path = d.paths[0][0] if d.paths else (d.path or "")
    leaf = leaves.get(path)
    block = "" if leaf is None else f" (each device's block {tuple(leaf.shape)}, {leaf.dtype})"
    cause = f"matches no rule in group `{group}` of {file}"
    if path:
        message = f"array leaf `{path}` of {output_name(where, '', fn)}{block} {cause}"
        return dataclasses.replace(d, message=message)
    message = (
        f"{output_name(where, '', fn)}{block} {cause}: a lone array output has no path of its own, "
        'so the rules were matched against the empty path ""'
    )
    hint = (
        f'return it in a dict to give it a name (`return {{"y": y}}` and a rule for "^y$" under '
        f'`rules {group}:`), or add a rule whose pattern matches the empty path (`"^$" -> ...`) or '
        "a `default` there, or give out_groups None (replicated) or a PartitionSpec for it"
    )
    return dataclasses.replace(d, message=message, hint=hint, cause=cause)


# ------------------------------------------------------- PartitionSpecs given


def literal_problems(
    tree: Any, groups: Any, sizes: dict[str, int], what: str, describe: Any, *, divide: bool
) -> list[Diagnostic]:
    """SR101-SR104 for `PartitionSpec`s given in `groups` that name axes the mesh
    lacks, name an axis twice, are longer than the array's rank, or (`divide`)
    split a dimension the axes do not divide; `describe(where, path)` names a leaf."""
    found = []
    for where, group, (sub,) in entries(groups, tree):
        if not isinstance(group, PartitionSpec):
            continue
        for path, leaf in zip(leaf_paths(sub), jax.tree.leaves(sub), strict=True):
            if hasattr(leaf, "shape"):
                found.extend(
                    _literal(group, tuple(leaf.shape), sizes, what, describe(where, path), path, divide)
                )
    return found


def _literal(
    spec: PartitionSpec, shape: Shape, sizes: dict[str, int], what: str, name: str, path: str, divide: bool
) -> list[Diagnostic]:
    entry = f"{spec_repr(spec)} (the {what} entry for {name})"
    dims = spec_entries(spec)
    axes = [a for e in dims for a in entry_axes(e)]
    mesh = ", ".join(f"{k}={v}" for k, v in sizes.items())
    unknown = [a for a in axes if a not in sizes]
    if unknown:
        hint = did_you_mean(unknown[0], sizes) or f"the mesh has {mesh}"
        return [
            _one(
                "SR101",
                f"mesh axis `{unknown[0]}` of {entry} is not in the mesh ({mesh})",
                hint,
                path,
                shape,
                "",
            )
        ]
    twice = [a for a in axes if axes.count(a) > 1]
    if twice:
        hint = "each mesh axis may split one dimension at most"
        return [_one("SR102", f"mesh axis `{twice[0]}` is used twice in {entry}", hint, path, shape, "")]
    if len(dims) > len(shape):
        rank = f"{len(shape)} dimension{'' if len(shape) == 1 else 's'}"
        message = f"{entry} has {len(dims)} entries but the array has {rank} (shape {shape})"
        hint = f"give at most {len(shape)} entries" if shape else "a scalar takes P()"
        return [_one("SR103", message, hint, path, shape, "")]
    found = []
    for dim, (size, e) in enumerate(zip(shape, dims, strict=False)):
        split = math.prod(sizes[a] for a in entry_axes(e))
        if divide and size % split:
            by = " × ".join(f"`{a}`={sizes[a]}" for a in entry_axes(e))
            message = f"dimension {dim} of {name} (shape {shape}) has size {size}, which does not divide by {split} ({by}) as {spec_repr(spec)} asks"
            hint = "split it over axes that divide it, pad it, or give a group whose rule leaves it unsharded where it does not divide (`data?`)"
            found.append(_one("SR104", message, hint, path, shape, ""))
    return found
