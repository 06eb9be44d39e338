"""`# noqa: CODE` at the end of a rule file's line acknowledges the warnings of
those codes about that line: `plan`, `check`, `shardrules lint` and the
`ShardRulesWarning`s of `apply` and `jit` no longer report them; everything
else is still reported, and a `noqa` that cannot acknowledge what it names is
SR020 when the file is loaded."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardrules as sr
from shardrules._cli import _lint
from shardrules._cli._main import main
from shardrules._language._acknowledge import ELSEWHERE, WARNING_CODES

S = jax.ShapeDtypeStruct
F16 = np.float16
DOCS = Path(__file__).resolve().parent.parent / "docs" / "diagnostics.md"

# Four lines that each draw one warning of their own, on `model=8` with TREE:
# the mesh line SR205 (axis `data` unused), SR204 (a 250 MiB array whole),
# SR201 (a rule that matches nothing), SR202 (a rule every leaf of which an
# earlier rule takes).
LINES = {
    "SR205": "mesh data, model",
    "SR204": '  "embed" -> replicated',
    "SR201": '  "nothing_here" -> (model)',
    "SR202": '  "mlp/up" -> (_, model)',
}
TREE = {
    "embed": S((32000, 4096), F16),
    "mlp": {"up": S((4096, 11008), F16), "down": S((11008, 4096), F16)},
    "layers": S((32, 4096, 11008), F16),
}
SIZES = {"data": 2, "model": 8}


def _text(acknowledged: dict[str, str] | None = None) -> str:
    """The rule file, with `acknowledged[code]` (a `noqa` comment) ending the line drawing `code`."""
    acknowledged = acknowledged or {}

    def line(code: str) -> str:
        return LINES[code] + (f"  {acknowledged[code]}" if code in acknowledged else "")

    return "\n".join(
        [
            line("SR205"),
            "",
            "rules params:",
            line("SR204"),
            '  "mlp" -> (_, model)',
            line("SR202"),
            line("SR201"),
            '  "layers" -> (_, _, model)',
            "",
        ]
    )


def _codes(diagnostics) -> list[str]:
    return sorted(d.code for d in diagnostics)


def test_the_fixture_draws_one_warning_per_line() -> None:
    found = sr.check(TREE, sr.loads(_text(), name="model.shard"), SIZES)
    assert _codes(found) == sorted(LINES)
    lines = {d.code: d.span.line for d in found}
    assert lines == {"SR205": 1, "SR204": 4, "SR202": 6, "SR201": 7}


def test_every_warning_of_the_catalogue_is_acknowledged_or_said_why_not() -> None:
    documented = set(re.findall(r"^## (SR2\d\d)", DOCS.read_text(), re.M))
    assert documented == WARNING_CODES | set(ELSEWHERE)
    assert not WARNING_CODES & set(ELSEWHERE)


@settings(max_examples=40, deadline=None)
@given(
    chosen=st.sets(st.sampled_from(sorted(LINES))),
    spelling=st.sampled_from(["# noqa: {}", "# NOQA:{}", "# on purpose; noqa: {}", "# noqa: {} (reviewed)"]),
)
def test_exactly_the_acknowledged_warnings_go(chosen, spelling) -> None:
    rules = sr.loads(_text({code: spelling.format(code) for code in chosen}), name="model.shard")
    found = sr.check(TREE, rules, SIZES)
    assert _codes(found) == sorted(set(LINES) - chosen)
    plan = sr.plan(TREE, rules, SIZES)
    assert {d.code for d in plan.diagnostics} == set(LINES) - chosen


def test_another_code_on_the_line_is_not_acknowledged() -> None:
    rules = sr.loads(_text({"SR204": "# noqa: SR201", "SR201": "# noqa: SR204, SR202"}), name="model.shard")
    assert _codes(sr.check(TREE, rules, SIZES)) == sorted(LINES)
    assert rules.acknowledged == {("model.shard", 4): {"SR201"}, ("model.shard", 7): {"SR204", "SR202"}}


def test_errors_are_not_acknowledged() -> None:
    # a 4096-wide dimension over 3 devices: SR104 stays, whatever the line says
    rules = sr.loads('mesh model\nrules params:\n  "w" -> (model)  # noqa: SR204\n')
    plan = sr.plan({"w": S((4096,), F16)}, rules, {"model": 3})
    assert [d.code for d in plan.diagnostics] == ["SR104"]
    with pytest.raises(sr.PlanError, match="SR104"):
        sr.specs({"w": S((4096,), F16)}, rules, {"model": 3})


@pytest.mark.parametrize(
    ("comment", "col", "message"),
    [
        ("# noqa", 28, "`noqa` without codes"),
        ("# kept; noqa", 34, "`noqa` without codes"),
        ("# noqa: SR104", 34, "SR0xx and SR1xx codes are errors"),
        ("# noqa: SR204, SR301", 41, "`noqa: SR301`: no warning has this code"),
        ("# noqa: E501", 34, "`noqa: E501`: no warning has this code"),
        ("# noqa: sr204_x", 34, "`noqa: SR204_X`: no warning has this code"),
        ("# noqa: SR210", 34, "SR210 cannot be acknowledged in a rule file: it is about an operation"),
        (
            "# noqa: SR207",
            34,
            "SR207 cannot be acknowledged in a rule file: `jit` and `auto_constrain` raise",
        ),
        ("# noqa: SR204 SR201", 34, "codes written other than as a list separated by commas"),
        ("# noqa: SR204,,SR201", 34, "codes written other than as a list separated by commas"),
        ("# noqa: SR201-SR204", 34, "codes written other than as a list separated by commas"),
        ("# kept; noqa; noqa: SR204", 34, "`noqa` without codes"),
        ("# noqa SR204", 28, "`noqa` without a colon before its codes"),
    ],
)
def test_a_noqa_that_cannot_acknowledge_is_sr020(comment, col, message) -> None:
    text = f'mesh model\nrules params:\n  "embed" -> replicated  {comment}\n'
    with pytest.raises(sr.RuleDefinitionError) as caught:
        sr.loads(text, name="model.shard")
    (d,) = caught.value.diagnostics
    assert (d.code, d.span.line, d.span.col) == ("SR020", 3, col), d.render()
    assert message in d.message
    assert d.hint


@pytest.mark.parametrize(
    "comment",
    [
        "# see https://example.com/#noqa",
        "# x; noqa is not wanted here",
        "# noqa-ish layout",
        "# the noqa: comments of linters",
        "#",
    ],
)
def test_noqa_in_prose_is_a_comment(comment) -> None:
    rules = sr.loads(f'mesh model\nrules params:\n  "embed" -> replicated  {comment}\n')
    assert rules.acknowledged == {}


@pytest.mark.parametrize(
    ("comment", "codes"),
    [
        ("# noqa: SR204 (reviewed)", {"SR204"}),
        ("#noqa:sr204", {"SR204"}),
        ("# noqa : SR204 ,SR201", {"SR204", "SR201"}),
        ("# kept whole; noqa: SR204; noqa: SR201", {"SR204", "SR201"}),
        ("# a; noqa-like; noqa: SR204", {"SR204"}),
    ],
)
def test_the_ways_to_write_a_noqa(comment, codes) -> None:
    rules = sr.loads(f'mesh model\nrules params:\n  "embed" -> replicated  {comment}\n', name="m.shard")
    assert rules.acknowledged == {("m.shard", 3): codes}


def test_a_noqa_on_a_line_of_its_own_is_sr020() -> None:
    text = 'mesh model\nrules params:\n  # noqa: SR204\n  "embed" -> replicated\n'
    with pytest.raises(sr.RuleDefinitionError, match="SR020") as caught:
        sr.loads(text)
    assert "at the end of the line a warning points at" in caught.value.hint


def test_lint_lists_sr020_with_the_files_other_findings(tmp_path) -> None:
    path = tmp_path / "model.shard"
    path.write_text(_text({"SR204": "# noqa", "SR201": "# noqa: SR201"}))
    result = _lint.lint_file(str(path), TREE, SIZES)
    codes = [d.code for d in result.diagnostics]
    assert "SR020" in codes  # the bare noqa
    assert "SR204" in codes and "SR201" not in codes  # the rest of the file is still checked


def test_apply_does_not_warn_what_the_file_acknowledges() -> None:
    mesh = jax.make_mesh((8,), ("model",))
    params = {"w": np.ones((16, 8), np.float32)}
    text = 'mesh model\nrules params:\n  "w" -> (model, _)\n  "bias" -> replicated{}\n'
    with pytest.warns(sr.ShardRulesWarning, match="SR201"):
        sr.apply(params, sr.loads(text.format("")), mesh)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = sr.apply(params, sr.loads(text.format("  # noqa: SR201")), mesh)
    assert out["w"].sharding.spec == jax.sharding.PartitionSpec("model", None)


def test_jit_does_not_warn_an_acknowledged_activation_rule() -> None:
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    text = 'mesh data\nrules params:\n  "w" -> replicated\nrules activations:\n  "decoder$" -> (data, _){}\n'

    def forward(params, x):
        with jax.named_scope("mlp"):
            return jnp.tanh(x @ params["w"])

    args = ({"w": np.ones((8, 4), np.float32)}, np.ones((16, 8), np.float32))
    with pytest.warns(sr.ShardRulesWarning, match="SR211"):
        sr.jit(forward, sr.loads(text.format("")), mesh, in_groups=("params", None))(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = sr.jit(forward, sr.loads(text.format("  # noqa: SR211")), mesh, in_groups=("params", None))(
            *args
        )
    np.testing.assert_allclose(np.asarray(out), np.tanh(np.ones((16, 8)) @ np.ones((8, 4))), rtol=1e-6)


def test_a_noqa_acknowledges_only_its_own_files_line(tmp_path) -> None:
    (tmp_path / "common.shard").write_text('rules params:\n  "embed" -> replicated  # noqa: SR204\n')
    (tmp_path / "model.shard").write_text(
        'mesh model\ninclude "common.shard"\nrules params:\n  "big" -> replicated\n  default -> (model, _)\n'
    )
    rules = sr.load(tmp_path / "model.shard")
    tree = {"embed": S((32000, 4096), F16), "big": S((32000, 4096), F16), "w": S((1 << 18, 4096), F16)}
    found = sr.check(tree, rules, {"model": 8})
    assert [(d.code, d.path) for d in found] == [("SR204", "big")]
    assert found[0].span.file.endswith("model.shard")


def _lint_cli(path: Path, shapes: Path, capsys, *extra: str) -> tuple[int, str]:
    code = main(["lint", str(path), "--shapes", str(shapes), "--mesh", "data=2,model=8", *extra])
    return code, capsys.readouterr().out


def test_lint_passes_a_file_whose_warnings_are_all_acknowledged(tmp_path, capsys) -> None:
    shapes = tmp_path / "shapes.json"
    flat = {
        "/".join(str(k.key) for k in p): [list(x.shape), "float16"]
        for p, x in jax.tree.leaves_with_path(TREE)
    }
    shapes.write_text(json.dumps(flat))
    path = tmp_path / "model.shard"
    path.write_text(_text())
    code, out = _lint_cli(path, shapes, capsys, "--strict")
    assert code == 1 and "Found 0 errors and 4 warnings." in out
    path.write_text(_text({c: f"# noqa: {c}" for c in LINES}))
    code, out = _lint_cli(path, shapes, capsys, "--strict")
    assert (code, out.strip()) == (0, "All checks passed (1 file).")


def test_fmt_keeps_the_acknowledgement() -> None:
    text = _text({"SR204": "# noqa: SR204"})
    formatted = sr.format_text(text)
    assert "# noqa: SR204" in formatted
    assert sr.format_text(formatted) == formatted
    assert sr.loads(formatted).acknowledged == sr.loads(text).acknowledged


def test_sr204_says_how_to_acknowledge_a_rule_meant_to_replicate() -> None:
    found = {d.code: d for d in sr.check(TREE, sr.loads(_text()), SIZES)}
    assert found["SR204"].hint.endswith("say so at the end of the rule's line: `# noqa: SR204`")
    # from `default`, a whole array is most often a rule that matched nothing: no such advice
    text = 'mesh model\nrules params:\n  "layers" -> (_, _, model)\n  default -> replicated\n'
    whole = [d for d in sr.check(TREE, sr.loads(text), {"model": 8}) if d.code == "SR204"]
    assert whole and all("noqa" not in d.hint for d in whole)
