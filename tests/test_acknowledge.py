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


# ------------------------------------------------------------------ files that share a name


def _two_commons(root: Path) -> None:
    """`common.shard` twice: at the top, and in `deep/`, which `main.shard`
    reaches as `link/../common.shard` (`link` a symbolic link to `deep/dir`):
    shown joined and normalised, both paths are `common.shard`. The top one
    draws SR204 on its line 2 and acknowledges nothing; the other acknowledges
    SR204 on its own line 2."""
    (root / "deep" / "dir").mkdir(parents=True)
    (root / "link").symlink_to(root / "deep" / "dir", target_is_directory=True)
    (root / "common.shard").write_text('rules params:\n  "embed" -> replicated\n')
    (root / "deep" / "common.shard").write_text('rules params:\n  "lm_head" -> replicated  # noqa: SR204\n')
    (root / "deep" / "dir" / "inner.shard").write_text('include "../common.shard"\n')
    (root / "main.shard").write_text(
        'mesh model\ninclude "common.shard"\ninclude "link/inner.shard"\nrules params:\n  default -> (model, _)\n'
    )


def test_a_noqa_acknowledges_only_its_own_file_when_another_is_shown_under_its_name(tmp_path) -> None:
    _two_commons(tmp_path)
    rules = sr.load(tmp_path / "main.shard")
    whole = {"embed": S((32000, 4096), F16), "lm_head": S((32000, 4096), F16), "w": S((1 << 18, 4096), F16)}
    found = sr.check(whole, rules, {"model": 8})
    assert [(d.code, d.path) for d in found] == [("SR204", "embed")]
    (warning,) = found
    assert warning.span is not None and warning.span.line == 2
    # each file read has a name of its own: its text, not the other's, is shown under the warning
    other = str((tmp_path / "deep" / "common.shard").resolve())
    assert rules.files == (str(tmp_path / "main.shard"), str(tmp_path / "common.shard"),
                           str(tmp_path / "link" / "inner.shard"), other)  # fmt: skip
    assert '  2 |   "embed" -> replicated' in warning.render(rules.sources)
    assert rules.acknowledged == {(other, 2): frozenset({"SR204"})}
    assert dict(rules.real_file_items)[warning.span.file] == str((tmp_path / "common.shard").resolve())
    # as the CLI sees it, from the rule file's folder
    plan = sr.plan(whole, rules, {"model": 8})
    assert [(d.code, d.path) for d in plan.diagnostics] == [("SR204", "embed")]


def test_lint_reports_the_warning_of_the_file_that_does_not_acknowledge_it(tmp_path, capsys) -> None:
    _two_commons(tmp_path)
    shapes = tmp_path / "shapes.json"
    whole = [[32000, 4096], "float16"]
    shapes.write_text(json.dumps({"embed": whole, "lm_head": whole, "w": [[1 << 18, 4096], "float16"]}))
    code = main(["lint", str(tmp_path / "main.shard"), "--shapes", str(shapes), "--mesh", "model=8"])
    out = capsys.readouterr().out
    assert code == 0 and out.count(": SR204 ") == 1 and "Found 0 errors and 1 warning." in out
    assert f"{tmp_path / 'common.shard'}:2:14: SR204 `embed`" in out


def test_text_loaded_under_the_name_of_a_file_it_includes_keeps_its_own_noqa(tmp_path) -> None:
    """`loads(text, name="common.shard")` including the file `common.shard`:
    two files, one name as given; the file is shown by its resolved path."""
    (tmp_path / "common.shard").write_text('rules params:\n  "embed" -> replicated\n')
    text = 'mesh model\nrules params:\n  "lm_head" -> replicated  # noqa: SR204\ninclude "common.shard"\n'
    rules = sr.loads(text, name="common.shard", include_root=tmp_path)
    tree = {"embed": S((32000, 4096), F16), "lm_head": S((32000, 4096), F16)}
    found = sr.check(tree, rules, {"model": 8})
    assert [(d.code, d.path, d.span and d.span.file) for d in found if d.code == "SR204"] == [
        ("SR204", "embed", str((tmp_path / "common.shard").resolve()))
    ]
    assert rules.acknowledged == {("common.shard", 3): frozenset({"SR204"})}


# A campaign: include trees whose files are all named `common.shard`, in
# different folders, reached directly or through symbolic links whose `..`
# makes their joined names collide; each file draws SR204 (a whole array) and
# SR201 (a rule that matches nothing) on the same lines as the others, and
# acknowledges a random few of them.

_WHOLE = S((32000, 4096), F16)


@st.composite
def _include_trees(draw) -> tuple[int, list[tuple[int, str]], dict[tuple[int, str], str]]:
    """(how many `common.shard` files, the includes of `main.shard` as
    (file, way), the `noqa` comment ending each acknowledged (file, code))."""
    count = draw(st.integers(1, 4))
    ways = st.sampled_from(["direct", "link", "hop"])
    includes = draw(st.lists(st.tuples(st.integers(0, count - 1), ways), min_size=1, max_size=6))
    spellings = st.sampled_from(["# noqa: {}", "# NOQA:{}", "# kept; noqa: {}", "# noqa: SR202, {}"])
    acknowledged = draw(
        st.dictionaries(st.tuples(st.integers(0, count - 1), st.sampled_from(["SR204", "SR201"])), spellings)
    )
    return count, includes, {k: v.format(k[1]) for k, v in acknowledged.items()}


def _write_tree(root: Path, count: int, includes: list[tuple[int, str]], noqa: dict) -> dict[int, Path]:
    """File `k` is `d{k}/common.shard` (file 0: `common.shard` at the top);
    `l{k}` links to `d{k}/in` (file 0: to `d0/in`, whose `..` is `d0`, so file
    0 then stands for `d0/common.shard`... which is file 0's twin, written too)."""
    files = {}
    for k in range(count):
        folder = root / f"d{k}"
        (folder / "in").mkdir(parents=True)
        (root / f"l{k}").symlink_to(folder / "in", target_is_directory=True)
        (folder / "in" / "hop.shard").write_text('include "../common.shard"\n')
        lines = ["rules params:", f'  "whole{k}" -> replicated', f'  "nothing{k}" -> (model)']
        for code, at in (("SR204", 1), ("SR201", 2)):
            if (k, code) in noqa:
                lines[at] += "  " + noqa[(k, code)]
        (folder / "common.shard").write_text("\n".join(lines) + "\n")
        files[k] = (folder / "common.shard").resolve()
    # at the top, drawn too and never acknowledged
    (root / "common.shard").write_text('rules params:\n  "whole_top" -> replicated\n')
    way_text = {"direct": "d{}/common.shard", "link": "l{}/../common.shard", "hop": "l{}/hop.shard"}
    main_lines = ["mesh model", 'include "common.shard"']
    main_lines += [f'include "{way_text[way].format(k)}"' for k, way in includes]
    main_lines += ["rules params:", "  default -> (model, _)"]
    (root / "main.shard").write_text("\n".join(main_lines) + "\n")
    return files


@settings(deadline=None)
@given(tree=_include_trees())
def test_exactly_the_acknowledged_warnings_go_per_real_file_and_line(tree) -> None:
    import tempfile

    count, includes, noqa = tree
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder).resolve()
        files = _write_tree(root, count, includes, noqa)
        rules = sr.load(root / "main.shard")
        reached = sorted({k for k, _ in includes})
        shapes = {f"whole{k}": _WHOLE for k in range(count)}
        shapes |= {"whole_top": _WHOLE, "w": S((1 << 22, 4096), F16)}
        found = sr.check(shapes, rules, {"model": 8})
        expected = {("SR204", "whole_top")} | {
            (code, f"whole{k}" if code == "SR204" else f"nothing{k}")
            for k in reached
            for code in ("SR204", "SR201")
            if (k, code) not in noqa
        }
        got = set()
        for d in found:
            assert d.code in ("SR204", "SR201") and d.span is not None, d
            named = re.search(r"rule `(\w+)`", d.message)
            rule = d.path if d.code == "SR204" else named and named.group(1)
            assert rule is not None, d
            got.add((d.code, rule))
            # the warning's file and line: the line of that rule in the file it names
            real = Path(dict(rules.real_file_items)[d.span.file])
            k = None if rule == "whole_top" else int(rule.removeprefix("whole").removeprefix("nothing"))
            assert real == (root / "common.shard" if k is None else files[k])
            assert f'"{rule}"' in rules.sources[d.span.file].split("\n")[d.span.line - 1]
            assert f'"{rule}"' in real.read_text().split("\n")[d.span.line - 1]
        assert got == expected
        # one name per file read, and every file of the tree by its own
        assert len(rules.files) == len(set(rules.files)) == len(set(dict(rules.real_file_items).values()))
