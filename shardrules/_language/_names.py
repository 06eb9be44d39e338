"""The names a rule file declares: its `mesh` line and its aliases.

Aliases resolve to mesh axes, through other aliases if need be (`alias batch =
(data, fsdp)`, `alias embed = fsdp`). Everything here needs no mesh at hand: a
`mesh` line, if there is one, says which names are axes.
"""

from __future__ import annotations

from .._errors import Findings, Span, did_you_mean
from ._syntax import Alias, AxisRef, MeshDecl


def check_mesh(meshes: list[MeshDecl], errors: Findings) -> MeshDecl | None:
    """The file's `mesh` line (`None` without one), checked: one line (or
    identical ones), no axis twice, no axis named `_`, at most one `*` size."""
    if not meshes:
        return None
    first = meshes[0]
    for other in meshes[1:]:
        if other != first:
            errors.error(
                "SR014",
                f"a second, different `mesh` line (the first is at {first.span})",
                other.span,
                "keep one mesh line, or make them identical",
            )
    seen: dict[str, Span | None] = {}
    stars = 0
    for axis in first.axes:
        if axis.name in seen:
            errors.error("SR014", f"mesh axis `{axis.name}` listed twice", axis.span)
        if axis.name == "_":
            errors.error("SR014", "`_` means unsharded and cannot name a mesh axis", axis.span)
        seen[axis.name] = axis.span
        stars += axis.size == "*"
    if stars > 1:
        errors.error(
            "SR014",
            "more than one mesh axis sized `*`",
            first.span,
            "`*` takes the devices the other axes leave; give the others numbers",
        )
    return first


def resolve_aliases(
    alias_decls: list[Alias], mesh: MeshDecl | None, errors: Findings
) -> dict[str, tuple[str, ...]]:
    """Each alias that resolves → the mesh axes it stands for, following
    aliases of aliases. A name defined twice (SR012), named like a mesh axis or
    `_` (SR013), in a cycle (SR011) or pointing at an unknown name (SR010) is
    reported in `errors` and left out, as is every alias that uses it."""
    axes = set(mesh.names) if mesh else set()
    decls: dict[str, Alias] = {}
    for alias in alias_decls:
        if alias.name in decls:
            errors.error(
                "SR012",
                f"alias `{alias.name}` defined twice (first at {decls[alias.name].span})",
                alias.span,
                "keep one definition",
            )
            continue
        if alias.name in axes:
            errors.error(
                "SR013",
                f"alias `{alias.name}` has the name of a mesh axis",
                alias.span,
                "rename the alias; a name cannot mean both",
            )
            continue
        if alias.name == "_":
            errors.error("SR013", "`_` means unsharded and cannot be an alias", alias.span)
            continue
        decls[alias.name] = alias

    resolved: dict[str, tuple[str, ...]] = {}
    failed: set[str] = set()

    def resolve(name: str, trail: tuple[str, ...]) -> tuple[str, ...] | None:
        if name in resolved:
            return resolved[name]
        if name in failed:
            return None
        alias = decls[name]
        if name in trail:
            loop = trail[trail.index(name) :]
            failed.update(loop)
            cycle = " -> ".join([*loop, name])
            errors.error("SR011", f"alias cycle: {cycle}", alias.span, "an alias must end in mesh axes")
            return None
        out: list[str] = []
        for ref in alias.target:
            if ref.name == "_" and len(alias.target) > 1:
                errors.error(
                    "SR010",
                    "`_` (unsharded) cannot be one of several axes in an alias",
                    ref.span,
                    "list only mesh axes or aliases in the tuple, or write `alias NAME = _`",
                )
                failed.add(name)
                return None
            if ref.name in decls:
                sub = resolve(ref.name, (*trail, name))
                if sub is None:
                    failed.add(name)
                    return None
                out.extend(sub)
            elif mesh is not None and ref.name not in axes:
                unknown_name(ref, axes, {n: a for n, a in decls.items() if n != name}, errors)
                failed.add(name)
                return None
            else:
                out.append(ref.name)
        resolved[name] = tuple(out)
        return resolved[name]

    for name in decls:
        try:
            resolve(name, ())
        except RecursionError:
            errors.error(
                "SR011",
                f"alias chain too long from `{name}`",
                decls[name].span,
                "point aliases at mesh axes directly, or through a few other aliases",
            )
            break
    return resolved


def unknown_name(
    ref: AxisRef, axes: set[str], aliases: dict[str, Alias] | dict[str, tuple[str, ...]], errors: Findings
) -> None:
    """Report SR010 for `ref`, a name that is neither a mesh axis nor an alias,
    with the closest known name (or `_` for `None`) as the hint."""
    known = sorted(axes | set(aliases))
    if ref.name in ("None", "none", "null"):
        errors.error(
            "SR010",
            f"unknown name `{ref.name}`: not a mesh axis or an alias",
            ref.span,
            "write `_` for a dimension that is not sharded",
        )
        return
    hint = did_you_mean(ref.name, known) or (
        f"known names: {', '.join(known)}" if known else "declare it in the mesh line or as an alias"
    )
    errors.error("SR010", f"unknown name `{ref.name}`: not a mesh axis or an alias", ref.span, hint)
