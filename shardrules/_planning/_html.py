"""A plan as one self-contained HTML page (inline CSS, no scripts, nothing
fetched): the mesh, memory per device, the group's rules with the leaves and
bytes each covers, the largest leaves, and a device grid per largest array.
Behind `Plan._repr_html_` and `shardrules explain --html`."""

from __future__ import annotations

import math
from html import escape
from typing import TYPE_CHECKING

from ._mesh import sizes_of
from ._picture import device_text, grid_of

if TYPE_CHECKING:
    from ._plan import LeafPlan, Plan

_CSS = """
.sr-plan{font-family:system-ui,sans-serif;font-size:13px;color:#222}
.sr-plan table{border-collapse:collapse;margin:4px 0 12px}
.sr-plan th,.sr-plan td{border:1px solid #ccc;padding:2px 6px;text-align:left}
.sr-plan td.num{text-align:right}
.sr-plan table.grid td{text-align:center;font-family:monospace;font-size:11px;background:#eef4ff}
.sr-plan code{font-family:monospace}
"""


def grid(leaf: LeafPlan, sizes: dict[str, int]) -> str:
    """A `<table>` of the blocks of the leaf's last two dimensions (one for a
    1-D array), each cell naming the mesh-axis indices holding it and the
    devices (in mesh order) that do, or a text description when the grid would
    be too large or the leaf has no spec."""
    found = grid_of(leaf, sizes)
    if found is None:
        return "<p>not planned</p>" if leaf.spec is None else "<p>scalar: replicated</p>"
    rows, cols = found.shape
    if found.too_large:
        return f"<p>{rows}×{cols} blocks; {escape(found.note())}</p>"
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{escape(label)}<br>{escape('devices ' + device_text(devices))}</td>"
            for label, devices in zip(label_row, device_row, strict=True)
        )
        + "</tr>"
        for label_row, device_row in zip(found.labels, found.devices, strict=True)
    )
    return f'<table class="grid">{body}</table><p>{escape(found.note())}</p>'


def _table(
    header: tuple[str, ...], rows: list[tuple[str, ...]], numeric: frozenset[int] | set[int] = frozenset()
) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{escape(c)}</td>' if i in numeric else f"<td>{escape(c)}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _rule_text(leaf: LeafPlan) -> str:
    if leaf.where:
        return leaf.where
    if leaf.rule is not None and leaf.why in ("rule", "default"):
        return leaf.rule.location
    return leaf.why


def fragment(plan: Plan, top: int = 20) -> str:
    """The report as a `<div>` with its own `<style>`."""
    from ._check import replicated_share
    from ._plan import format_bytes, plural, spec_str

    sizes = sizes_of(plan.mesh) if plan.mesh is not None else {}
    arrays = [leaf for leaf in plan.leaves if leaf.is_array]
    share, replicated, _ = replicated_share(plan)
    parts = [f"<style>{_CSS}</style>", f"<h2>Plan of group <code>{escape(plan.group)}</code></h2>"]
    parts.append("<h3>Mesh</h3>")
    parts.append(
        _table(("axis", "size"), [(k, str(v)) for k, v in sizes.items()], {1})
        if sizes
        else "<p>no mesh sizes</p>"
    )
    parts.append("<h3>Memory</h3>")
    parts.append(
        _table(
            ("", "value"),
            [
                ("arrays", str(len(arrays))),
                ("devices", str(math.prod(sizes.values()) if sizes else 1)),
                ("bytes per device", format_bytes(plan.bytes_per_device)),
                ("total (counted once)", format_bytes(plan.total_bytes)),
                ("fully replicated", f"{format_bytes(replicated)} ({share:.0%})"),
            ],
            {1},
        )
    )
    covered: dict[int, tuple[int, int]] = {}
    for leaf in arrays:
        if leaf.rule is not None:
            n, b = covered.get(id(leaf.rule), (0, 0))
            covered[id(leaf.rule)] = (n + 1, b + leaf.nbytes)
    groups = dict(plan.rules.groups)
    rules = list(groups.get(plan.group, ()))
    default = dict(plan.rules.defaults).get(plan.group)
    if default is not None:
        rules.append(default)
    rows = []
    for rule in rules:
        n, b = covered.get(id(rule), (0, 0))
        pattern = ("default" if rule.pattern is None else rule.pattern) + (
            f" {rule.guard}" if rule.guard else ""
        )
        rows.append((rule.location, pattern, plural(n, "leaf", "leaves"), format_bytes(b)))
    parts.append(f"<h3>Rules of <code>{escape(plan.group)}</code></h3>")
    parts.append(_table(("rule", "pattern", "leaves", "bytes"), rows, {2, 3}) if rows else "<p>no rules</p>")
    largest = sorted(arrays, key=lambda leaf: -leaf.nbytes)[:top]
    parts.append(f"<h3>Largest {plural(len(largest), 'array')}</h3>")
    parts.append(
        _table(
            ("path", "shape", "dtype", "rule", "spec", "bytes", "per device"),
            [
                (
                    leaf.path,
                    str(leaf.shape),
                    str(leaf.dtype),
                    _rule_text(leaf),
                    spec_str(leaf.spec),
                    format_bytes(leaf.nbytes),
                    format_bytes(leaf.bytes_per_device),
                )
                for leaf in largest
            ],
            {5, 6},
        )
    )
    parts.append("<h3>Device grids</h3>")
    for leaf in largest:
        parts.append(f"<h4><code>{escape(leaf.path)}</code> {escape(spec_str(leaf.spec))}</h4>")
        parts.append(grid(leaf, sizes))
    return '<div class="sr-plan">' + "".join(parts) + "</div>"


def page(plan: Plan, top: int = 20) -> str:
    """The report as a whole HTML document."""
    title = escape(f"shardrules plan: {plan.rules.name} ({plan.group})")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{title}</title></head><body>{fragment(plan, top)}</body></html>\n"
    )
