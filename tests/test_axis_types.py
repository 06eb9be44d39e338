"""Axis types in the `mesh` line (`mesh explicit data=4, model=2`, `mesh data=4 auto`):
parsed, formatted, honoured by a mesh built from the file, shown by `print(plan)`,
`explain` and `dump`, and checked by lint (SR207)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType

import shardrules as sr
from shardrules._cli._main import main


@pytest.mark.parametrize(
    ("text", "types", "formatted"),
    [
        ("mesh explicit data=4, model=2\n", ("explicit", "explicit"), "mesh explicit data=4, model=2\n"),
        ("mesh data=4  auto,model=2\n", ("auto", None), "mesh data=4 auto, model=2\n"),
        ("mesh auto data, model explicit\n", ("auto", "explicit"), "mesh auto data, model explicit\n"),
        ("mesh data, model\n", (None, None), "mesh data, model\n"),
    ],
)
def test_the_mesh_line_states_axis_types(text: str, types: tuple, formatted: str) -> None:
    rules = sr.loads(text)
    assert rules.mesh is not None and rules.mesh.axis_types == types
    assert sr.format_text(text) == formatted
    assert sr.loads(formatted).mesh == rules.mesh


def test_a_type_word_is_not_an_axis_name() -> None:
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads("mesh auto, model\n")
    assert info.value.code == "SR001"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("mesh explicit data=4, model=2", (AxisType.Explicit, AxisType.Explicit)),
        ("mesh data=4 explicit, model=2", (AxisType.Explicit, AxisType.Auto)),
        ("mesh data=4, model=2", (AxisType.Auto, AxisType.Auto)),  # unstated: Auto, as before
    ],
)
def test_a_mesh_built_from_the_file_has_its_types(line: str, expected: tuple) -> None:
    rules = sr.loads(f'{line}\nrules params:\n  "w" -> (data, model)\n')
    placed = sr.apply({"w": jnp.ones((8, 8))}, rules)
    assert placed["w"].sharding.mesh.axis_types == expected


def test_print_plan_shows_the_declared_types() -> None:
    tree = {"w": jax.ShapeDtypeStruct((8, 8), jnp.float32)}
    explicit = sr.loads('mesh explicit data=4, model=2\nrules params:\n  "w" -> (data, model)\n')
    assert "on data=4, model=2 (Explicit axes):" in str(sr.plan(tree, explicit))
    mixed = sr.loads('mesh data=4 explicit, model=2 auto\nrules params:\n  "w" -> (data, model)\n')
    assert "(axis types: data Explicit, model Auto)" in str(sr.plan(tree, mixed))
    unstated = sr.loads('mesh data=4, model=2\nrules params:\n  "w" -> (data, model)\n')
    assert "axes" not in str(sr.plan(tree, unstated)).splitlines()[-1]
    # a mesh passed in shows its own types
    auto = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    assert "(Auto axes)" in str(sr.plan(tree, explicit, auto))


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    Path("m.shard").write_text(
        "mesh data=4 explicit, model=2 auto\n\nrules params:\n"
        '  "w" -> (data, model)\n\nrules activations:\n'
        '  "mlp$"  -> (data, model)\n  "attn$" -> (data, _)\n'
    )
    Path("s.json").write_text(json.dumps({"w": [[8, 8], "float32"]}))
    return tmp_path


def test_explain_and_dump_show_the_types(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "m.shard", "--shapes", "s.json"]) == 0
    out = capsys.readouterr().out
    assert "on data=4, model=2 (8 devices, axis types: data Explicit, model Auto)" in out
    assert main(["dump", "m.shard", "--shapes", "s.json"]) == 0
    dumped = json.loads(capsys.readouterr().out)
    assert [a["type"] for a in dumped["mesh"]] == ["explicit", "auto"]


def test_lint_flags_an_activation_rule_over_both_types(
    files: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`mlp$` names an Explicit and an Auto axis: no JAX call can lay a value out
    so. `attn$` names one type only and passes."""
    assert main(["lint", "m.shard", "--shapes", "s.json", "--format", "json"]) == 0  # a warning
    findings = json.loads(capsys.readouterr().out)
    assert [(f["code"], f["line"]) for f in findings] == [("SR207", 7)]
    assert "Explicit axes (data) and Auto axes (model)" in findings[0]["message"]
