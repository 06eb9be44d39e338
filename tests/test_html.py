"""The HTML report of a plan: `Plan._repr_html_` and `shardrules explain --html`."""

from __future__ import annotations

import html.parser
import json
import re
import shutil
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardrules as sr
from shardrules._cli._main import main
from shardrules._planning._plan import format_bytes
from shardrules._reports._html import _SCRIPT, natural_key, page

RULES = """mesh fsdp, model

rules params:
  "w$"    -> (fsdp, model)
  "b$"    -> (model)
  default -> replicated
"""
VOID = {"meta", "br", "hr", "img", "input", "link"}


class _Balance(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


class _Report(html.parser.HTMLParser):
    """The scripts of a page, and the rows of its leaf table (cell texts, and
    whether the row is hidden)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.scripts: list[str] = []
        self.rows: list[tuple[list[str], bool]] = []
        self.inputs: list[dict[str, str | None]] = []
        self._script: list[str] | None = None
        self._leaves = self._body = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        found = dict(attrs)
        if tag == "script":
            self._script = []
        elif tag == "input":
            self.inputs.append(found)
        elif tag == "table":
            self._leaves = "sr-leaves" in (found.get("class") or "")
        elif tag == "tbody" and self._leaves:
            self._body = True
        elif tag == "tr" and self._body:
            self.rows.append(([], "hidden" in found))
        elif tag == "td" and self._body:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._script is not None:
            self.scripts.append("".join(self._script))
            self._script = None
        elif tag == "td" and self._cell is not None:
            self.rows[-1][0].append("".join(self._cell))
            self._cell = None
        elif tag == "tbody":
            self._body = False
        elif tag == "table":
            self._leaves = False

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self._script.append(data)
        if self._cell is not None:
            self._cell.append(data)


def _report(text: str) -> _Report:
    parser = _Report()
    parser.feed(text)
    parser.close()
    return parser


def _scripts(text: str) -> list[str]:
    return _report(text).scripts


def _balanced(text: str) -> str:
    parser = _Balance()
    parser.feed(text)
    parser.close()
    assert not parser.problems, parser.problems
    assert not parser.stack, parser.stack
    return "".join(parser.text)


@pytest.fixture
def plan(tmp_path: Path) -> sr.Plan:
    (tmp_path / "m.shard").write_text(RULES)
    tree = {
        "a": {"w": np.zeros((64, 32), np.float32), "b": np.zeros((32,), np.float32)},
        "<script>alert(1)</script>": np.zeros((8,), np.float32),
    }
    return sr.plan(tree, sr.load(tmp_path / "m.shard"), {"fsdp": 2, "model": 4})


def test_page_is_well_formed_and_has_the_numbers(plan: sr.Plan) -> None:
    text = page(plan)
    shown = _balanced(text)
    assert format_bytes(plan.bytes_per_device) in shown
    assert format_bytes(plan.total_bytes) in shown
    assert "a/w" in shown and "a/b" in shown
    assert "m.shard:4:3" in shown  # the rule's location
    assert "fsdp=1 model=3" in shown  # a grid cell of a/w
    assert "devices 7" in shown  # the device holding it, in mesh order
    assert "devices 0,4" in shown  # a/b's first block, on model=0 of both fsdp rows
    assert "<script>alert" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert _scripts(text) == [_SCRIPT]  # the one script is the constant filter: no text of the plan
    assert not re.search(r"https?://", text)


def test_repr_html(plan: sr.Plan) -> None:
    fragment = plan._repr_html_()
    assert fragment.startswith('<div class="sr-plan">')
    assert format_bytes(plan.bytes_per_device) in _balanced(fragment)


def test_explain_html(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    Path("m.shard").write_text(RULES)
    Path("s.json").write_text(json.dumps({"x/w": [[64, 32], "float32"], "x/b": [[32], "float32"]}))
    status = main(
        ["explain", "m.shard", "--mesh", "fsdp=2,model=4", "--shapes", "s.json", "--html", "p.html"]
    )
    assert status == 0, capsys.readouterr()
    text = Path("p.html").read_text()
    assert text.startswith("<!DOCTYPE html>")
    shown = _balanced(text)
    assert "x/w" in shown and "1.0 KiB" in shown
    assert not re.search(r"https?://", text)


def test_in_a_headless_browser(plan: sr.Plan, tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    path = tmp_path / "plan.html"
    path.write_text(page(plan), encoding="utf-8")
    run = subprocess.run(
        [
            chromium,
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--enable-logging=stderr",
            "--v=0",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert format_bytes(plan.bytes_per_device) in run.stdout
    assert "a/w" in run.stdout
    bad = [line for line in run.stderr.splitlines() if "Uncaught" in line or "ERROR:CONSOLE" in line]
    assert not bad, bad


def _hf_plan(layers: int = 80) -> sr.Plan:
    """A 723-leaf plan named as a Hugging Face checkpoint names its tensors."""
    S = jax.ShapeDtypeStruct
    shapes = {
        "model.embed_tokens.weight": S((1024, 64), jnp.bfloat16),
        "model.norm.weight": S((64,), jnp.float32),
    }
    shapes["lm_head.weight"] = S((1024, 64), jnp.bfloat16)
    for i in range(layers):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[f"model.layers.{i}.self_attn.{name}.weight"] = S((64, 64), jnp.bfloat16)
        for name in ("up_proj", "down_proj", "gate_proj"):
            shapes[f"model.layers.{i}.mlp.{name}.weight"] = S((64, 64), jnp.bfloat16)
        shapes[f"model.layers.{i}.input_layernorm.weight"] = S((64,), jnp.float32)
        shapes[f"model.layers.{i}.post_attention_layernorm.weight"] = S((64,), jnp.float32)
    rules = sr.loads(
        'mesh fsdp, model\nrules params:\n  "proj" -> (model, fsdp)\n  default -> replicated\n',
        name="hf.shard",
    )
    return sr.plan(shapes, rules, {"fsdp": 2, "model": 4})


def test_every_leaf_is_listed_in_natural_order() -> None:
    plan = _hf_plan()
    assert len(plan) == 723
    report = _report(page(plan))
    paths = [cells[0] for cells, _ in report.rows]
    assert sorted(paths) == sorted(leaf.path for leaf in plan)  # every leaf, once
    assert paths == sorted(paths, key=natural_key)
    assert paths.index("model.layers.2.mlp.down_proj.weight") < paths.index(
        "model.layers.10.mlp.down_proj.weight"
    )
    assert paths.index("model.layers.9.self_attn.v_proj.weight") < paths.index(
        "model.layers.10.mlp.down_proj.weight"
    )
    q_proj = [cells for cells in (c for c, _ in report.rows) if "q_proj" in cells[0]]
    assert len(q_proj) == 80 and q_proj[0] == [
        "model.layers.0.self_attn.q_proj.weight", "(64, 64)", "bfloat16", "P('model', 'fsdp')", "hf.shard:3:3",
        "8.0 KiB", "1.0 KiB",
    ]  # fmt: skip
    assert not any(hidden for _, hidden in report.rows)  # all shown until something is typed
    [box] = report.inputs
    assert box["class"] == "sr-filter" and box["type"] == "search"
    assert report.scripts == [_SCRIPT]
    assert "723 leaves" in _balanced(page(plan))


def test_natural_key() -> None:
    paths = ["layers.10", "layers.2", "layers.1/b", "layers.1", "layers.01", "a", "", "layers.x", "9" * 5000]
    assert sorted(paths, key=natural_key) == [
        "", "9" * 5000, "a", "layers.01", "layers.1", "layers.1/b", "layers.2", "layers.10", "layers.x",
    ]  # fmt: skip


def test_every_text_of_the_plan_is_escaped() -> None:
    """Paths that would close the script, open a comment or leave an attribute
    are shown as written, and the one script is still the constant."""
    hostile = [
        "</script><script>alert(1)</script>",
        '" onmouseover="alert(1)',
        "<!-- a",
        "a&amp;b",
        "<img src=x onerror=alert(1)>",
        "]]>",
    ]
    rules = sr.loads("rules params:\n  default -> (data, ...)\n", name="<evil>.shard")
    plan = sr.plan({path: np.zeros((8,), np.float32) for path in hostile}, rules, {"data": 2})
    text = page(plan)
    report = _report(text)
    assert sorted(cells[0] for cells, _ in report.rows) == sorted(hostile)
    assert report.scripts == [_SCRIPT]
    assert len(report.inputs) == 1
    assert "<img" not in text and "<evil>" not in text and "&lt;evil&gt;" in text
    _balanced(text)


def test_a_plan_read_from_a_dump_shows_its_report() -> None:
    plan = _hf_plan(layers=3)
    back = sr.Plan.from_json(plan.to_json())
    fragment = back._repr_html_()
    report = _report(fragment)
    assert sorted(cells[0] for cells, _ in report.rows) == sorted(leaf.path for leaf in plan)
    shown = _balanced(fragment)
    assert "hf.shard:3" in shown and "21 leaves" in shown  # the rules, by the location the file gives
    assert format_bytes(plan.bytes_per_device) in shown


def _chromium_dom(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    path = tmp_path / "plan.html"
    path.write_text(text, encoding="utf-8")
    return subprocess.run(
        [
            chromium, "--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr", "--v=0",
            f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip


def test_the_filter_box_in_a_headless_browser(tmp_path: Path) -> None:
    """Typing `q_proj` into the box leaves the 80 query projections of 723 leaves shown."""
    typing = (
        "<script>var box = document.querySelector('input.sr-filter'); box.value = 'Q_PROJ layers.1';"
        "box.dispatchEvent(new Event('input'));</script>"
    )
    text = page(_hf_plan()).replace("</body>", typing + "</body>")
    run = _chromium_dom(text, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    report = _report(run.stdout)
    shown = [cells[0] for cells, hidden in report.rows if not hidden]
    assert len(report.rows) == 723
    # every word, in any case: layers 1 and 10 to 19
    assert shown == [f"model.layers.{i}.self_attn.q_proj.weight" for i in [1, *range(10, 20)]]
    assert "11 of 723 leaves shown" in run.stdout
    assert "disabled" not in report.inputs[0]
    bad = [line for line in run.stderr.splitlines() if "Uncaught" in line or "ERROR:CONSOLE" in line]
    assert not bad, bad


def _costed(folder: Path) -> sr.StepCost:
    """A step's cost whose collectives are attributed: a rule line of a file in
    `folder` (written by its absolute path), and `inferred` for an activation
    whose name needs escaping."""
    Share = sr.Share
    rule = f"{folder / 'sharding' / 'step.shard'}:4"
    gathers, sums, other = (
        Share("all-gather", 2, 4096),
        Share("all-reduce", 1, 1024),
        Share("all-reduce", 1, 8),
    )
    return sr.StepCost(
        8, 2e9, 1e9, 4e9, 3 * 2**20, 2**20, 2**20, 2**20,
        (sr.Collective("all-gather", 2, 4096, ("mlp",)), sr.Collective("all-reduce", 2, 1032, ("mlp (backward)",))),
        by_rule=(
            sr.RuleCost(rule, '"w$" -> (fsdp, model)', (gathers, sums), ("a/w", "a/w (gradient)")),
            sr.RuleCost("inferred", "", (other,), ("activation <b>x</b>",)),
        ),
        by_array=(
            sr.ArrayCost("a/w", rule, '"w$" -> (fsdp, model)', (gathers,)),
            sr.ArrayCost("a/w (gradient)", rule, '"w$" -> (fsdp, model)', (sums,)),
            sr.ArrayCost("activation <b>x</b>", "inferred", "", (other,)),
        ),
    )  # fmt: skip


def test_a_cost_by_rule_is_a_table_grouped_by_rule(plan: sr.Plan, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    text = page(plan, cost=_costed(tmp_path))
    shown = _balanced(text)
    assert str(tmp_path / "sharding") not in shown  # the rule's file, relative to the working directory
    assert (
        "<td><code>sharding/step.shard:4</code></td><td><code>&quot;w$&quot; -&gt; (fsdp, model)</code></td>"
        '<td class="num">5.0 KiB</td><td class="num">2 / 4.0 KiB</td><td class="num">1 / 1.0 KiB</td>'
        "<td><details><summary>2 arrays</summary>"
    ) in text
    assert (
        '<tr><td><code>a/w (gradient)</code></td><td class="num">1.0 KiB</td><td class="num">-</td>' in text
    )
    assert "activation &lt;b&gt;x&lt;/b&gt;" in text and "<b>x" not in text
    assert '<tfoot><tr><td>total</td><td></td><td class="num">5.0 KiB</td>' in text
    assert "<th>from</th>" not in text  # the kinds without their scopes: the table by rule says whom
    assert _scripts(text) == [_SCRIPT]


def test_the_cost_by_rule_in_a_headless_browser(plan: sr.Plan, tmp_path: Path, monkeypatch) -> None:
    """Each rule's arrays open (`<details>`) in a real browser, with no script error."""
    monkeypatch.chdir(tmp_path)
    opening = (
        "<script>document.querySelectorAll('table.sr-by-rule details')"
        ".forEach(function (d) { d.open = true; });</script>"
    )
    text = page(plan, cost=_costed(tmp_path)).replace("</body>", opening + "</body>")
    run = _chromium_dom(text, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count('<details open="">') == 2
    assert "<code>sharding/step.shard:4</code>" in run.stdout and "a/w (gradient)" in run.stdout
    assert "activation &lt;b&gt;x&lt;/b&gt;" in run.stdout
    assert format_bytes(plan.bytes_per_device) in run.stdout  # the plan is still there, below
    bad = [line for line in run.stderr.splitlines() if "Uncaught" in line or "ERROR:CONSOLE" in line]
    assert not bad, bad
