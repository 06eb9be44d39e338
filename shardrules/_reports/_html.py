"""A plan as one self-contained HTML page (inline CSS and one small inline
script, nothing fetched): the mesh, memory per device, a step's cost when
given (its collectives by rule line, each rule's arrays behind a
`<details>`), the group's rules with the leaves and bytes each covers, every
leaf in a table sorted naturally by path (`layers.2` before `layers.10`)
with a box that filters it, and a device grid per largest array. Behind
`Plan._repr_html_` and `shardrules explain --html`.

Every text that comes from the plan (paths, rule locations, axis names) is
escaped; the script is a constant that holds none of it. Without scripts (a
notebook that is not trusted) the filter box stays disabled and the table
still lists every leaf.
"""

from __future__ import annotations

import math
import re
from html import escape
from typing import TYPE_CHECKING, Any

from .._planning._mesh import sizes_of
from . import _byrule
from ._costfile import cost_rows, recorded
from ._picture import device_text, grid_of

if TYPE_CHECKING:
    from .._planning._plan import LeafPlan, Plan

_CSS = """
.sr-plan{font-family:system-ui,sans-serif;font-size:13px;color:#222}
.sr-plan table{border-collapse:collapse;margin:4px 0 12px}
.sr-plan th,.sr-plan td{border:1px solid #ccc;padding:2px 6px;text-align:left}
.sr-plan td.num{text-align:right;white-space:nowrap}
.sr-plan table.sr-by-rule td{vertical-align:top}
.sr-plan table.sr-by-rule code{white-space:nowrap}
.sr-plan table.grid td{text-align:center;font-family:monospace;font-size:11px;background:#eef4ff}
.sr-plan table.sr-leaves td:first-child{font-family:monospace}
.sr-plan input.sr-filter{width:32em;max-width:100%;padding:2px 4px}
.sr-plan code{font-family:monospace}
"""

# The filter box: a constant (no text of the plan), bound once per box, also
# when a notebook shows several plans. A row stays shown when its text holds
# every word typed, in any case.
_SCRIPT = """
(function () {
  function filter(event) {
    var box = event.target, plan = box.closest("div.sr-plan");
    var rows = plan.querySelectorAll("table.sr-leaves > tbody > tr");
    if (!plan.srTexts) {
      plan.srTexts = [];
      for (var i = 0; i < rows.length; i++) plan.srTexts.push(rows[i].textContent.toLowerCase());
    }
    var words = box.value.toLowerCase().split(/\\s+/).filter(Boolean), shown = 0;
    for (var j = 0; j < rows.length; j++) {
      var text = plan.srTexts[j];
      var keep = words.every(function (word) { return text.indexOf(word) >= 0; });
      rows[j].hidden = !keep;
      if (keep) shown++;
    }
    plan.querySelector(".sr-shown").textContent = shown + " of " + rows.length + " leaves shown";
  }
  var boxes = document.querySelectorAll("div.sr-plan input.sr-filter");
  for (var k = 0; k < boxes.length; k++) {
    if (boxes[k].getAttribute("data-ready")) continue;
    boxes[k].setAttribute("data-ready", "1");
    boxes[k].disabled = false;
    boxes[k].addEventListener("input", filter);
  }
})();
"""

_DIGITS = re.compile(r"([0-9]+)")


def natural_key(path: str) -> tuple[tuple[object, ...], str]:
    """Sorts paths as people count: `layers.2` before `layers.10`. Runs of
    digits compare by value (as text of their length, so a run of any length
    is fine), the rest as text; equal keys (`01`, `1`) by the path itself."""
    parts = _DIGITS.split(path)  # text, digits, text, ...: the same kind at each position
    key = tuple((len(p.lstrip("0")), p.lstrip("0")) if i % 2 else p for i, p in enumerate(parts))
    return key, path


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
    header: tuple[str, ...],
    rows: list[tuple[str, ...]],
    numeric: frozenset[int] | set[int] = frozenset(),
    css: str = "",
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
    kind = f' class="{css}"' if css else ""
    return f"<table{kind}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _rule_text(leaf: LeafPlan) -> str:
    if leaf.where:
        return leaf.where
    if leaf.rule is not None and leaf.why in ("rule", "default"):
        return leaf.rule.location
    return leaf.why


def _rules(plan: Plan, arrays: list[LeafPlan]) -> str:
    """The group's rules with the leaves and bytes each decides; for a plan
    read from a file (no rules, only their locations), each location."""
    from .._planning._plan import format_bytes, plural

    title = f"<h3>Rules of <code>{escape(plan.group)}</code></h3>"
    rules = list(dict(plan.rules.groups).get(plan.group, ()))
    default = dict(plan.rules.defaults).get(plan.group)
    if default is not None:
        rules.append(default)
    if not rules:  # read from a file: the rule of each leaf is its location
        decided: dict[str, tuple[int, int]] = {}
        for leaf in arrays:
            n, b = decided.get(_rule_text(leaf), (0, 0))
            decided[_rule_text(leaf)] = (n + 1, b + leaf.nbytes)
        rows = [(label, plural(n, "leaf", "leaves"), format_bytes(b)) for label, (n, b) in decided.items()]
        rows.sort(key=lambda row: natural_key(row[0]))
        table = _table(("rule", "leaves", "bytes"), rows, {1, 2})
        return title + (table if rows else "<p>no rules</p>")
    covered: dict[int, tuple[int, int]] = {}
    for leaf in arrays:
        if leaf.rule is not None:
            n, b = covered.get(id(leaf.rule), (0, 0))
            covered[id(leaf.rule)] = (n + 1, b + leaf.nbytes)
    rows = []
    for rule in rules:
        n, b = covered.get(id(rule), (0, 0))
        pattern = ("default" if rule.pattern is None else rule.pattern) + (
            f" {rule.guard}" if rule.guard else ""
        )
        rows.append((rule.location, pattern, plural(n, "leaf", "leaves"), format_bytes(b)))
    return title + _table(("rule", "pattern", "leaves", "bytes"), rows, {2, 3})


def _leaves(plan: Plan) -> str:
    """Every leaf, sorted naturally by path, under a box that filters them."""
    from .._planning._plan import format_bytes, plural, spec_str

    leaves = sorted(plan.leaves, key=lambda leaf: natural_key(leaf.path))
    rows = [
        (
            leaf.path,
            "-" if leaf.shape is None else str(leaf.shape),
            "-" if leaf.dtype is None else str(leaf.dtype),
            spec_str(leaf.spec),
            _rule_text(leaf),
            format_bytes(leaf.nbytes),
            format_bytes(leaf.bytes_per_device),
        )
        for leaf in leaves
    ]
    count = plural(len(rows), "leaf", "leaves")
    return (
        f"<h3>Leaves ({escape(count)})</h3>"
        "<p>Every leaf, in path order (<code>layers.2</code> before <code>layers.10</code>). "
        "Type in the box to show only the rows that contain every word typed.</p>"
        '<p><input type="search" class="sr-filter" disabled aria-label="filter the leaves" '
        'placeholder="filter, e.g. q_proj or layers.1 kernel"> '
        f'<span class="sr-shown">{escape(count)}</span></p>'
        + _table(("path", "shape", "dtype", "spec", "rule", "bytes", "per device"), rows, {5, 6}, "sr-leaves")
    )


def _cost(cost: Any) -> str:
    """The step-cost section: `cost` a `StepCost` or its `to_json()` dict
    (with `step`, its `MODULE:FUNCTION`): its figures, each kind of
    collective, and where the cost says whom they are for (`by_rule`), a
    table of them by rule line, each rule's arrays under it (`_by_rule`);
    without that, each kind with the scopes it comes from."""
    data = dict(cost.to_json() if hasattr(cost, "to_json") else cost)
    measures, collectives = cost_rows(recorded(data))
    out = ["<h3>Step cost</h3>", _table(("", "value"), measures, {1})]
    if not collectives:
        out.append("<p>no collectives</p>")
    elif data.get("by_rule"):
        out.append(_table(("collective", "count", "bytes per device"), [c[:3] for c in collectives], {1, 2}))
        out.append(_by_rule(data))
    else:
        out.append(_table(("collective", "count", "bytes per device", "from"), collectives, {1, 2}))
    return "".join(out)


def _by_rule(cost: dict[str, Any]) -> str:
    """The collectives by rule line: a row per rule (its `FILE:LINE`, the rule
    as written, bytes per device, `COUNT / BYTES` per kind) whose last cell
    opens (`<details>`) on a table of its arrays, most bytes first; the total
    row is the step's."""
    from .._planning._plan import format_bytes, plural

    kinds = _byrule.kinds(cost)
    head = "".join(f"<th>{escape(h)}</th>" for h in (*_byrule.RULE_HEADER, *kinds, "arrays"))

    def cells(row: _byrule.Row, name: str) -> str:
        figures = (format_bytes(row.bytes_per_device), *row.cells)
        return name + "".join(f'<td class="num">{escape(c)}</td>' for c in figures)

    body = []
    for group in _byrule.groups(cost):
        rule = group.rule
        arrays = "".join(
            f"<tr>{cells(a, f'<td><code>{escape(a.name)}</code></td>')}</tr>" for a in group.arrays
        )
        array_head = "".join(f"<th>{escape(h)}</th>" for h in ("array", "bytes per device", *kinds))
        details = (
            f"<details><summary>{escape(plural(len(group.arrays), 'array'))}</summary>"
            f'<table class="sr-arrays"><thead><tr>{array_head}</tr></thead><tbody>{arrays}</tbody></table></details>'
        )
        name = f"<td><code>{escape(rule.name)}</code></td><td><code>{escape(rule.text)}</code></td>"
        body.append(f"<tr>{cells(rule, name)}<td>{details}</td></tr>")
    whole = _byrule.total(cost)
    foot = f"<tr>{cells(whole, '<td>total</td><td></td>')}<td></td></tr>"
    return (
        "<h4>Collectives by rule line</h4>"
        "<p>Whom each collective is for: the rule line that laid out the array it moves or sums "
        "(<code>inferred</code>: no rule did; <code>the model&#x27;s code</code>: the model states it), "
        "bytes per device per step and <code>COUNT / BYTES</code> of each kind, most bytes first. "
        "Open a rule's arrays to see them, most bytes first.</p>"
        f'<table class="sr-by-rule"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
        f"<tfoot>{foot}</tfoot></table>"
    )


def fragment(plan: Plan, top: int = 20, cost: Any = None) -> str:
    """The report as a `<div>` with its own `<style>` and `<script>`; with
    `cost` (a step's `StepCost`, or its dict), what the step costs each device."""
    from .._planning._check import replicated_share
    from .._planning._plan import format_bytes, plural, spec_str

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
    if cost is not None:
        parts.append(_cost(cost))
    parts.append(_rules(plan, arrays))
    parts.append(_leaves(plan))
    largest = sorted(arrays, key=lambda leaf: (-leaf.nbytes, natural_key(leaf.path)))[:top]
    parts.append(f"<h3>Device grids of the {plural(len(largest), 'largest array')}</h3>")
    for leaf in largest:
        parts.append(f"<h4><code>{escape(leaf.path)}</code> {escape(spec_str(leaf.spec))}</h4>")
        parts.append(grid(leaf, sizes))
    parts.append(f"<script>{_SCRIPT}</script>")
    return '<div class="sr-plan">' + "".join(parts) + "</div>"


def page(plan: Plan, top: int = 20, cost: Any = None) -> str:
    """The report as a whole HTML document (`cost`: see `fragment`)."""
    title = escape(f"shardrules plan: {plan.rules.name} ({plan.group})")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{title}</title></head><body>{fragment(plan, top, cost)}</body></html>\n"
    )
