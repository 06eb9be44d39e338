"""The names a rule file declares: its `mesh` line and its aliases.

Aliases resolve to mesh axes, through other aliases if need be (`alias batch =
(data, fsdp)`, `alias embed = fsdp`). Everything here needs no mesh at hand: a
`mesh` line, if there is one, says which names are axes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

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
        if axis.name == "unconstrained":
            errors.error(
                "SR014",
                "`unconstrained` is a spec keyword and cannot name a mesh axis",
                axis.span,
                "rename the axis (JAX's own name for it does not matter to the rules, only to the file)",
            )
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
    alias_decls: list[Alias],
    mesh: MeshDecl | None,
    errors: Findings,
    alternatives: dict[str, tuple[tuple[str, ...], ...]] | None = None,
) -> dict[str, tuple[str, ...]]:
    """Each alias of one alternative that resolves → the mesh axes it stands
    for, following aliases of aliases. A name defined twice (SR012), named like
    a mesh axis or `_` (SR013), in a cycle (SR011) or pointing at an unknown name
    or at an alias with alternatives (SR010) is reported in `errors` and left
    out, as is every alias that uses it.

    Aliases with alternatives (`alias embed = (fsdp, expert) | fsdp | _`) go
    into `alternatives` instead, in the order of their `alias` lines: each
    alternative's mesh axes (see `_alternatives`)."""
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
        if alias.name == "unconstrained":
            errors.error("SR013", "`unconstrained` is a spec keyword and cannot be an alias", alias.span)
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
        if alias.more:  # an alias with alternatives stands for no fixed axes
            errors.error(
                "SR010",
                f"alias `{name}` has alternatives, so it cannot be named in the target of alias `{trail[-1]}`",
                next((r.span for r in decls[trail[-1]].target if r.name == name), None),
                f"name mesh axes or aliases of one alternative here, or give `{trail[-1]}` "
                "alternatives of its own",
            )
            failed.add(trail[-1])
            return None
        if name in trail:
            loop = trail[trail.index(name) :]
            failed.update(loop)
            cycle = " -> ".join([*loop, name])
            errors.error("SR011", f"alias cycle: {cycle}", alias.span, "an alias must end in mesh axes")
            return None
        out: list[str] = []
        for ref in alias.target:
            if ref.name == "unconstrained":
                errors.error(
                    "SR010",
                    "`unconstrained` cannot be what an alias stands for",
                    ref.span,
                    "write `unconstrained` in the spec itself, e.g. `(batch, unconstrained)`",
                )
                failed.add(name)
                return None
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
                unknown_name(ref, lambda name=name: [*axes, *(n for n in decls if n != name)], errors)
                failed.add(name)
                return None
            else:
                out.append(ref.name)
        resolved[name] = tuple(out)
        return resolved[name]

    for name in decls:
        try:
            if decls[name].more:
                if alternatives is not None:
                    _alternatives(decls[name], decls, resolve, alternatives, errors)
                continue
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


def _alternatives(
    alias: Alias,
    decls: dict[str, Alias],
    resolve: Callable[[str, tuple[str, ...]], tuple[str, ...] | None],
    out: dict[str, tuple[tuple[str, ...], ...]],
    errors: Findings,
) -> None:
    """Resolve each alternative of `alias` into `out[alias.name]`: its mesh
    axes, through aliases of one alternative; `()` for `_`. A name that is
    neither an alias nor an axis of the `mesh` line is kept, not SR010: that
    alternative never applies on such a mesh (lint's SR209 says so), as in
    MaxText's rules for meshes without some axes. An alias with alternatives
    named in one is SR010."""
    found: list[tuple[str, ...]] = []
    for alt in alias.alternatives:
        names: list[str] = []
        for ref in alt.target:
            if ref.name == "unconstrained":
                errors.error(
                    "SR010",
                    f"`unconstrained` cannot be an alternative of alias `{alias.name}`",
                    ref.span,
                    "write `unconstrained` in the spec itself, e.g. `(batch, unconstrained)`; an "
                    "alternative names mesh axes, or `_` to leave the dimension unsharded",
                )
                return
            if ref.name == "_" and len(alt.target) > 1:
                errors.error(
                    "SR010",
                    "`_` (unsharded) cannot be one of several axes in an alias",
                    ref.span,
                    "list only mesh axes or aliases in the tuple, or write `_` as an alternative of its own",
                )
                return
            if ref.name in decls and decls[ref.name].more:
                what = (
                    "itself" if ref.name == alias.name else f"alias `{ref.name}`, which has alternatives too"
                )
                errors.error(
                    "SR010",
                    f"an alternative of alias `{alias.name}` names {what}",
                    ref.span,
                    "an alternative names mesh axes or aliases of one alternative; "
                    f"write the alternatives of `{ref.name}` out here",
                )
                return
            if ref.name in decls:
                sub = resolve(ref.name, (alias.name,))
                if sub is None:
                    return
                names.extend(sub)
            else:  # a mesh axis, or a name this mesh lacks (see above)
                names.append(ref.name)
        found.append(tuple(names))
    out[alias.name] = tuple(found)


MAX_SUGGESTED = 100
"""Errors a load may have before SR010 stops looking for the closest name.
Each look takes as long as the names known, so a file of thousands of unknown
names over thousands of axes would take minutes; past this many errors the
hint says where names come from instead."""

_LISTED = 20
"""The most known names a hint lists."""

_COMPARED = 5_000
"""The most known names compared with an unknown one for a `did you mean`."""


def unknown_name(ref: AxisRef, known: Callable[[], Iterable[str]], errors: Findings) -> None:
    """Report SR010 for `ref`, a name that is neither a mesh axis nor an alias,
    with the closest of the `known` names (mesh axes and aliases; asked for
    only while the load has fewer than `MAX_SUGGESTED` errors) or `_` for
    `None` as the hint."""
    if ref.name in ("None", "none", "null"):
        errors.error(
            "SR010",
            f"unknown name `{ref.name}`: not a mesh axis or an alias",
            ref.span,
            "write `_` for a dimension that is not sharded",
        )
        return
    if did_you_mean(ref.name.lower(), ["unconstrained"]):  # JAX's `P.UNCONSTRAINED`, or a slip of the keyword
        errors.error(
            "SR010",
            f"unknown name `{ref.name}`: not a mesh axis or an alias",
            ref.span,
            "did you mean `unconstrained` (the spec keyword, lower case), for a dimension the compiler lays out?",
        )
        return
    names = sorted(set(known())) if len(errors) < MAX_SUGGESTED else []
    listed = ", ".join(names[:_LISTED]) + (f", ... ({len(names):,} in all)" if len(names) > _LISTED else "")
    close = did_you_mean(ref.name, names) if len(names) <= _COMPARED else ""
    hint = close or (f"known names: {listed}" if names else "declare it in the mesh line or as an alias")
    errors.error("SR010", f"unknown name `{ref.name}`: not a mesh axis or an alias", ref.span, hint)
