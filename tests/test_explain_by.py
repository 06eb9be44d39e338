"""`shardrules explain --step --cost --by rule|array|scope`: a step's collectives
by the rule line that laid out what they move or sum (with its arrays), by
array, or by scope; the same in `--format json`, in the HTML report, and in
`str(StepCost)`. On `examples/transformer`, run from the repository root as
the cookbook runs it."""

from __future__ import annotations

import contextlib
import html.parser
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from shardrules._cli import _step
from shardrules._cli._main import main
from shardrules._costs._attribute import INFERRED, MODEL
from shardrules._costs._cost import cost_from_json
from shardrules._planning._units import format_bytes, shown_location
from shardrules._reports._byrule import ARRAYS_SHOWN

ROOT = Path(__file__).resolve().parents[1]
RULES = "examples/transformer/transformer.shard"
STEP = "examples.transformer.train:check_step"


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each view of the transformer step's cost, run from the repository root:
    the rule file named by its absolute path (text and HTML show it relative
    all the same; JSON as the StepCost says it). Each run traces the step;
    the step is compiled for its cost once (what takes seconds), and each
    later run is handed that cost."""
    page = tmp_path_factory.mktemp("html") / "cost.html"
    found: dict[str, Any] = {}
    compiled: list[Any] = []

    def once(*args: Any) -> Any:
        if not compiled:
            compiled.append(costed(*args))
        return compiled[0]

    costed = _step._cost
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        patch.setattr(_step, "_cost", once)
        absolute = str(ROOT / RULES)
        for view, extra in (("default", ()), ("array", ("--by", "array")), ("scope", ("--by", "scope"))):
            status, out, err = _run("explain", absolute, "--step", STEP, "--cost", *extra)
            assert status == 0, err
            found[view] = out[out.index("step cost:") :]
        status, out, err = _run(
            "explain", absolute, "--step", STEP, "--by", "rule", "--format", "json", "--html", str(page)
        )
        assert status == 0, err
        found["json"] = json.loads(out)["step_cost"]
        found["html"] = page.read_text(encoding="utf-8")
    return found


def _table(text: str, title: str) -> list[list[str]]:
    """The rows of the plain-text table after the line starting with `title`,
    cut where the header's columns start (each row's indentation kept in its
    first cell; an empty cell is `""`)."""
    lines = text[text.index(title) :].splitlines()[1:]
    lines = lines[: next((i for i, line in enumerate(lines) if not line.strip()), len(lines))]
    starts = [m.start() for m in re.finditer(r"(?:^|(?<=  ))\S", lines[0])]
    ends = [*starts[1:], None]
    return [[line[a:b].rstrip() for a, b in zip(starts, ends, strict=True)] for line in lines]


def _rule_line(pattern: str) -> str:
    for n, text in enumerate((ROOT / RULES).read_text().splitlines(), 1):
        if text.strip().startswith(f'"{pattern}"'):
            return f"{RULES}:{n}"
    raise AssertionError(pattern)


def test_by_rule_is_the_default_and_names_each_rule_line_relative_to_here(runs) -> None:
    text, cost = runs["default"], runs["json"]
    assert "collectives by rule line" in text
    assert str(ROOT) not in text  # the rule file was named by its absolute path
    rows = _table(text, "collectives by rule line")
    header, body, total = rows[0], rows[1:-1], rows[-1]
    assert header[:3] == ["rule", "written as", "bytes per device"]
    kinds = [c["kind"] for c in cost["collectives"]]
    assert header[3:] == kinds
    rules = [r for r in body if not r[0].startswith(" ")]
    moving = [r for r in cost["by_rule"] if r["bytes_per_device"]]  # not those that own matrix products alone
    assert [r[0] for r in rules] == [shown_location(r["rule"]) for r in moving]
    o = _rule_line("attn/o/kernel$")
    (row,) = [r for r in rules if r[0] == o]
    assert row[1] == '"attn/o/kernel$" -> (heads, embed)'  # the rule as written, aligned spaces closed up
    # the arrays under it: its parameters and their gradients, most bytes first
    under = body[body.index(row) + 1 :]
    arrays = [r[0].strip() for r in under[: next(i for i, r in enumerate(under) if not r[0].startswith(" "))]]
    assert arrays[:2] == ["params/blocks/0/attn/o/kernel", "params/blocks/1/attn/o/kernel"]
    assert "params/blocks/0/attn/o/kernel (gradient)" in arrays
    # the kinds above the table: today's totals, without the scopes
    assert "  all-reduce: " in text and "; from " not in text
    # the total row is the step's, and the rule rows add up to it
    step_bytes = sum(c["bytes_per_device"] for c in cost["collectives"])
    assert sum(r["bytes_per_device"] for r in cost["by_rule"]) == step_bytes > 0
    assert [r[2] for r in rules] == [format_bytes(r["bytes_per_device"]) for r in moving]
    assert total[:3] == ["total", "", format_bytes(step_bytes)]
    assert total[3:] == [f"{c['count']} / {format_bytes(c['bytes_per_device'])}" for c in cost["collectives"]]


def test_a_rule_with_many_arrays_shows_the_first_few_and_how_many_more(runs) -> None:
    text, cost = runs["default"], runs["json"]
    qkv = next(r for r in cost["by_rule"] if r["rule"].endswith(_rule_line("attn/(q|k|v)/kernel$")))
    assert len(qkv["arrays"]) > ARRAYS_SHOWN  # 2 layers x 3 kernels, and their gradients
    rows = _table(text, "collectives by rule line")
    start = next(i for i, r in enumerate(rows) if r[0] == _rule_line("attn/(q|k|v)/kernel$"))
    shown = [r[0].strip() for r in rows[start + 1 : start + 1 + ARRAYS_SHOWN]]
    assert shown == qkv["arrays"][:ARRAYS_SHOWN]
    rest = qkv["arrays"][ARRAYS_SHOWN:]
    more = rows[start + 1 + ARRAYS_SHOWN]
    assert more[0].strip() == f"... and {len(rest)} more"
    sizes = {a["array"]: a["bytes_per_device"] for a in cost["by_array"] if a["rule"] == qkv["rule"]}
    assert more[2] == format_bytes(sum(sizes[a] for a in rest))
    assert f"the {ARRAYS_SHOWN} arrays that move the most" in text


def test_by_array_lists_every_array_with_its_rule(runs) -> None:
    text, cost = runs["array"], runs["json"]
    rows = _table(text, "collectives by array")
    header, body, total = rows[0], rows[1:-1], rows[-1]
    assert header[:3] == ["array", "rule", "bytes per device"]
    assert [(r[0], r[1]) for r in body] == [(a["array"], shown_location(a["rule"])) for a in cost["by_array"]]
    assert ("params/blocks/0/attn/o/kernel", _rule_line("attn/o/kernel$")) in [(r[0], r[1]) for r in body]
    assert total[0] == "total"
    assert sum(a["bytes_per_device"] for a in cost["by_array"]) == sum(
        c["bytes_per_device"] for c in cost["collectives"]
    )


def test_by_scope_is_each_kind_with_the_scopes_it_comes_from(runs) -> None:
    text = runs["scope"]
    assert "collectives by" not in text and "by rule line" not in text
    assert re.search(r"^  all-gather: \d+ \(.* per device; from block_\d/", text, re.M)


def test_json_has_the_lists_by_rule_and_by_array(runs) -> None:
    cost = runs["json"]
    for r in cost["by_rule"]:
        assert set(r) == {
            "rule",
            "text",
            "collectives",
            "arrays",
            "bytes_per_device",
            "matmul_flops_per_device",
        }
        # as the StepCost says it: the file as the rules were loaded (here by its absolute path)
        assert r["rule"] in (INFERRED, MODEL) or re.fullmatch(
            rf"{re.escape(str(ROOT / RULES))}:\d+", r["rule"]
        )
        assert r["bytes_per_device"] == sum(s["bytes_per_device"] for s in r["collectives"])
        assert all(set(s) == {"kind", "count", "bytes_per_device"} for s in r["collectives"])
    for a in cost["by_array"]:
        assert set(a) == {"array", "rule", "text", "collectives", "bytes_per_device"}
    assert {a["array"] for a in cost["by_array"]} == {name for r in cost["by_rule"] for name in r["arrays"]}


def test_str_of_a_step_cost_names_the_rule_lines_that_cost_most(runs) -> None:
    cost = cost_from_json(runs["json"])
    lines = cost.lines()
    start = lines.index("by rule line (collective bytes per device per step, most first):")
    top = lines[start + 1 : start + 6]
    moving = [r for r in cost.by_rule if r.bytes_per_device]  # not those that own matrix products alone
    for line, r in zip(top, moving, strict=False):
        assert line.startswith(f"  {shown_location(r.rule)}") and format_bytes(r.bytes_per_device) in line
    rest = moving[5:]
    assert lines[start + 6] == (
        f"  ... and {len(rest)} more rule lines ({format_bytes(sum(r.bytes_per_device for r in rest))})"
    )
    assert str(cost).splitlines() == lines
    assert any(line.startswith("all-reduce: ") and "; from " in line for line in lines)  # the scopes, kept


class _Cells(html.parser.HTMLParser):
    """The page's table by rule (`table.sr-by-rule`): for each row of its
    body, the texts of its own cells and the rows of the arrays table
    (`table.sr-arrays`) inside it; its footer's cells; its `<details>`."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rules: list[tuple[list[str], list[list[str]]]] = []
        self.total: list[str] = []
        self.details = 0
        self._tables: list[str] = []  # the classes of the tables the parser is in
        self._part = ""  # thead, tbody or tfoot of the table by rule
        self._arrays = False  # in the body of an arrays table

    def _in(self, css: str) -> bool:
        return bool(self._tables) and self._tables[-1] == css

    def handle_starttag(self, tag: str, attrs: list) -> None:
        css = dict(attrs).get("class") or ""
        if tag == "table":
            self._tables.append(css)
        elif tag in ("thead", "tbody", "tfoot") and self._in("sr-by-rule"):
            self._part = tag
        elif tag in ("thead", "tbody") and self._in("sr-arrays"):
            self._arrays = tag == "tbody"
        elif tag == "details" and "sr-by-rule" in self._tables:
            self.details += 1
        elif tag == "tr" and self._in("sr-by-rule") and self._part == "tbody":
            self.rules.append(([], []))
        elif tag == "tr" and self._in("sr-arrays") and self._arrays:
            self.rules[-1][1].append([])
        elif tag == "td" and self._in("sr-by-rule") and self._part in ("tbody", "tfoot"):
            (self.rules[-1][0] if self._part == "tbody" else self.total).append("")
        elif tag == "td" and self._in("sr-arrays") and self.rules and self.rules[-1][1]:
            self.rules[-1][1][-1].append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self._tables:
            self._arrays = self._arrays and self._tables.pop() != "sr-arrays"

    def handle_data(self, data: str) -> None:
        if self._in("sr-arrays") and self.rules and self.rules[-1][1] and self.rules[-1][1][-1]:
            self.rules[-1][1][-1][-1] += data
        elif self._in("sr-by-rule") and self._part == "tbody" and self.rules and self.rules[-1][0]:
            self.rules[-1][0][-1] += data
        elif self._in("sr-by-rule") and self._part == "tfoot" and self.total:
            self.total[-1] += data


def test_the_html_report_groups_the_cost_by_rule_with_the_arrays_under_each(runs) -> None:
    page, cost = runs["html"], runs["json"]
    parser = _Cells()
    parser.feed(page)
    parser.close()
    moving = [r for r in cost["by_rule"] if r["bytes_per_device"]]  # not those that own matrix products alone
    assert len(parser.rules) == len(moving) == parser.details
    kinds = len(cost["collectives"])
    for (cells, arrays), r in zip(parser.rules, moving, strict=True):
        assert cells[:3] == [shown_location(r["rule"]), r["text"], format_bytes(r["bytes_per_device"])]
        assert len(cells) == 3 + kinds + 1  # the last holds the arrays
        assert [a[0] for a in arrays] == r["arrays"]  # every array, most bytes first
    step_bytes = sum(c["bytes_per_device"] for c in cost["collectives"])
    assert parser.total[:3] == ["total", "", format_bytes(step_bytes)]
    # the wall of scope names is gone: the kinds' table has no `from` column
    assert "<th>from</th>" not in page
    assert "<td>block_0/mlp/up" not in page


def test_by_needs_a_step(capsys) -> None:
    assert main(["explain", str(ROOT / RULES), "--shapes", "x.json", "--by", "rule"]) == 2
    assert "--by needs a step to compile" in capsys.readouterr().err


def test_shown_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    inside = os.path.join(os.getcwd(), "rules", "model.shard")
    assert shown_location(f"{inside}:11") == os.path.join("rules", "model.shard") + ":11"
    outside = os.path.join(os.path.dirname(os.getcwd()), "elsewhere.shard")
    assert shown_location(f"{outside}:3") == f"{outside}:3"
    for kept in ("inferred", "the model's code", "<string>:3", "rules/model.shard:4"):
        assert shown_location(kept) == kept
