"""The HTML report of a plan: `Plan._repr_html_` and `shardrules explain --html`."""

from __future__ import annotations

import html.parser
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import shardrules as sr
from shardrules._cli._main import main
from shardrules._planning._html import page
from shardrules._planning._plan import format_bytes

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
    assert "<script>" not in text and "&lt;script&gt;" in text
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
