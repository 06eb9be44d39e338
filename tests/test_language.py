"""The rule language: what parses, what each construct means, and every load-time error."""

from __future__ import annotations

from pathlib import Path

import jax
import pytest

import shardrules as sr

# The reference example of the design, exactly as written there.
DESIGN_EXAMPLE = (Path(__file__).parent / "data" / "design_example.txt").read_text()


@pytest.fixture
def design_rules(tmp_path) -> sr.RuleSet:
    (tmp_path / "common.shard").write_text('rules params:\n  "rope/freqs" -> replicated\n')
    path = tmp_path / "llama.shard"
    path.write_text(DESIGN_EXAMPLE)
    return sr.load(path)


def test_design_example_loads_as_written(design_rules):
    rules = design_rules
    assert rules.group_names == ("params", "activations", "inputs")
    assert rules.mesh is not None and rules.mesh.names == ("data", "fsdp", "model")
    params = rules.group("params")
    # The included rule comes first: includes are expanded where they stand.
    assert [r.pattern for r in params] == [
        "rope/freqs",
        "embed/embedding",
        "attn/(q|k|v)_proj/kernel",
        "attn/o_proj/kernel",
        "norm/scale$",
        "lm_head/kernel",
    ]
    assert rules.defaults["params"] is not None
    assert dict(rules.aliases) == {"batch": ("data", "fsdp"), "embed": ("fsdp",), "heads": ("model",)}


def test_rule_locations_point_at_their_file(design_rules, tmp_path):
    first, second = design_rules.group("params")[:2]
    assert first.span.file.endswith("common.shard") and first.span.line == 2
    assert second.span.file.endswith("llama.shard") and second.span.line == 11
    assert second.span.col == 3


def test_alias_chains_resolve_to_axes():
    rules = sr.loads("mesh a, b\nalias x = y\nalias y = (a, b)\nalias z = x\n")
    assert dict(rules.aliases) == {"x": ("a", "b"), "y": ("a", "b"), "z": ("a", "b")}


def test_group_not_found_names_the_groups():
    rules = sr.loads('mesh x\nrules params:\n  "a" -> (x)\n')
    with pytest.raises(sr.GroupNotFoundError) as info:
        rules.group("parms")
    assert isinstance(info.value, KeyError)
    assert "params" in str(info.value)


def test_same_group_in_two_blocks_appends_in_order():
    rules = sr.loads('mesh x\nrules p:\n  "a" -> (x)\nrules q:\n  "b" -> (x)\nrules p:\n  "c" -> (x)\n')
    assert [r.pattern for r in rules.group("p")] == ["a", "c"]


def test_comments_and_blank_lines_anywhere():
    text = (
        '# top\n\nmesh x  # axes\n\n# between\nrules p:   # group\n  # inside\n\n  "a" -> (x)  # trailing\n'
    )
    assert [r.pattern for r in sr.loads(text).group("p")] == ["a"]


def test_patterns_keep_backslashes_and_quotes():
    rules = sr.loads('mesh x\nrules p:\n  "layers_\\d+/\\"q\\"" -> (x)\n')
    (rule,) = rules.group("p")
    assert rule.regex.search('layers_12/"q"')


# --------------------------------------------------------------------------- errors
# (text, error class, code, line, col, a fragment of the message or hint)
ERRORS = [
    ('rules params:\n  "a" -> (x,\n', sr.RuleSyntaxError, "SR001", 2, 13, "expected"),
    ('mesh x\nrules p:\n  "a" -> x)\n', sr.RuleSyntaxError, "SR001", 3, 10, "in parentheses: (x)"),
    ("mesh x\nrules p\n", sr.RuleSyntaxError, "SR001", 2, 8, "`:`"),
    ('mesh x\nrules p:\n  "a(b" -> (x)\n', sr.RuleSyntaxError, "SR002", 3, 5, "missing )"),
    (
        'mesh x\nrules p:\n  "a" -> auto(x, min_bytes=3QB)\n',
        sr.RuleSyntaxError,
        "SR003",
        3,
        28,
        "did you mean",
    ),
    ("mesh x=0\n", sr.RuleSyntaxError, "SR003", 1, 8, "positive whole number"),
    ('mesh x\n"a" -> (x)\n', sr.RuleDefinitionError, "SR007", 2, 1, "rules params:"),
    ("mesh data, model\nalias b = dta\n", sr.RuleDefinitionError, "SR010", 2, 11, "did you mean `data`?"),
    ("mesh x\nalias a = b\nalias b = a\n", sr.RuleDefinitionError, "SR011", 2, 1, "a -> b -> a"),
    ("mesh x\nalias a = x\nalias a = x\n", sr.RuleDefinitionError, "SR012", 3, 1, "first at"),
    ("mesh x\nalias x = x\n", sr.RuleDefinitionError, "SR013", 2, 1, "rename the alias"),
    ("mesh x, x\n", sr.RuleDefinitionError, "SR014", 1, 9, "twice"),
    ("mesh x\nmesh y\n", sr.RuleDefinitionError, "SR014", 2, 1, "mesh"),
    (
        "mesh x\nrules p:\n  default -> (x)\n  default -> replicated\n",
        sr.RuleDefinitionError,
        "SR015",
        4,
        3,
        "first",
    ),
    ('mesh x\nrules p:\n  "a" -> (..., x, ...)\n', sr.RuleDefinitionError, "SR016", 3, 19, "once"),
    ('mesh x\nrules p:\n  "a" -> auto(x, size=3)\n', sr.RuleDefinitionError, "SR016", 3, 18, "min_bytes"),
    ('mesh data, model\nrules p:\n  "a" -> (modle)\n', sr.RuleDefinitionError, "SR010", 3, 11, "`model`"),
    ('include "nope.shard"\n', sr.IncludeNotFoundError, "SR005", 1, 1, "not found"),
    ("alias b = (_, data)\n", sr.RuleDefinitionError, "SR010", 1, 12, "`_` (unsharded)"),
    (
        "mesh x\nrules p:\n  default -> auto(x, min_bytes=1B, min_bytes=2B)\n",
        sr.RuleDefinitionError,
        "SR016",
        3,
        36,
        "twice",
    ),
    ('mesh x\nrules p:\n  "a" -> auto(x?)\n', sr.RuleDefinitionError, "SR016", 3, 15, "no meaning"),
]


@pytest.mark.parametrize(("text", "cls", "code", "line", "col", "fragment"), ERRORS)
def test_load_errors(text, cls, code, line, col, fragment):
    with pytest.raises(cls) as info:
        sr.loads(text, name="bad.shard")
    err = info.value
    assert isinstance(err, sr.ShardRulesError)
    assert err.code == code, str(err)
    assert err.span is not None
    assert (err.span.file, err.span.line, err.span.col) == ("bad.shard", line, col), str(err)
    rendered = str(err)
    assert rendered.startswith(f"bad.shard:{line}:{col}: {code} ")
    assert fragment in rendered
    # The offending source line is quoted, with a caret under the column.
    source_line = text.splitlines()[line - 1]
    assert f"  {line} | {source_line}" in rendered
    caret_line = rendered.splitlines()[2]
    assert caret_line.index("^") - caret_line.index("|") - 2 == col - 1


def test_syntax_error_lists_what_was_expected():
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads('mesh x\nrules p:\n  "a" => (x)\n')
    assert "expected `->`" in str(info.value)


def test_lark_types_do_not_leak():
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads('rules p:\n  "a" -> ((\n')
    chain = []
    exc: BaseException | None = info.value
    while exc is not None:
        chain.append(type(exc).__module__)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    assert not any(m.startswith("lark") for m in chain), chain


# --------------------------------------------------------------------------- includes
def test_include_is_relative_to_the_including_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "base.shard").write_text('include "leaf.shard"\nrules p:\n  "b" -> replicated\n')
    (tmp_path / "sub" / "leaf.shard").write_text('rules p:\n  "a" -> replicated\n')
    (tmp_path / "top.shard").write_text('include "sub/base.shard"\nrules p:\n  "c" -> replicated\n')
    rules = sr.load(tmp_path / "top.shard")
    assert [r.pattern for r in rules.group("p")] == ["a", "b", "c"]


def test_include_cycle_is_an_error(tmp_path):
    (tmp_path / "a.shard").write_text('include "b.shard"\n')
    (tmp_path / "b.shard").write_text('\ninclude "a.shard"\n')
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.load(tmp_path / "a.shard")
    err = info.value
    assert err.code == "SR004"
    assert err.span is not None and err.span.file.endswith("b.shard") and err.span.line == 2
    assert "a.shard" in str(err)


def test_diamond_include_is_read_once(tmp_path):
    (tmp_path / "common.shard").write_text('rules p:\n  "x" -> replicated\n')
    (tmp_path / "l.shard").write_text('include "common.shard"\n')
    (tmp_path / "r.shard").write_text('include "common.shard"\n')
    (tmp_path / "top.shard").write_text('include "l.shard"\ninclude "r.shard"\n')
    assert [r.pattern for r in sr.load(tmp_path / "top.shard").group("p")] == ["x"]


@pytest.mark.parametrize("target", ["../outside.shard", "/etc/passwd"])
def test_include_cannot_leave_its_root(tmp_path, target):
    inner = tmp_path / "inner"
    inner.mkdir()
    (tmp_path / "outside.shard").write_text("")
    (inner / "top.shard").write_text(f'include "{target}"\n')
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.load(inner / "top.shard")
    assert info.value.code == "SR006"
    assert info.value.span is not None and info.value.span.line == 1


def test_include_root_can_be_widened(tmp_path):
    inner = tmp_path / "inner"
    inner.mkdir()
    (tmp_path / "outside.shard").write_text('rules p:\n  "o" -> replicated\n')
    (inner / "top.shard").write_text('include "../outside.shard"\n')
    rules = sr.load(inner / "top.shard", include_root=tmp_path)
    assert [r.pattern for r in rules.group("p")] == ["o"]


def test_missing_included_file_points_at_the_include_line(tmp_path):
    (tmp_path / "top.shard").write_text('mesh x\n\ninclude "gone.shard"\n')
    with pytest.raises(sr.IncludeNotFoundError) as info:
        sr.load(tmp_path / "top.shard")
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.span is not None and info.value.span.line == 3


def test_missing_top_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        sr.load(tmp_path / "nope.shard")
    assert isinstance(info.value, sr.ShardRulesError)
    assert info.value.code == "SR005"


def test_missing_top_file_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(sr.IncludeNotFoundError) as info:
        sr.load("sharding/model.shard")
    err = info.value
    assert f"(looked for {tmp_path / 'sharding' / 'model.shard'})" in err.diagnostics[0].message
    assert f"the folder {tmp_path / 'sharding'} does not exist" in err.hint
    assert f"current directory, {tmp_path}" in err.hint
    (tmp_path / "sharding").mkdir()
    (tmp_path / "sharding" / "model.shard").write_text("")
    with pytest.raises(sr.IncludeNotFoundError) as info:
        sr.load("sharding/modle.shard")
    assert info.value.hint == "did you mean `sharding/model.shard`?"


@pytest.mark.parametrize(
    "text",
    ["rules params:\n  default -> replicated\n", 'rules params: "w" -> (x)', "mesh data, model"],
)
def test_rule_text_given_as_a_path_points_at_loads(tmp_path, monkeypatch, text):
    monkeypatch.chdir(tmp_path)
    for call in (lambda: sr.load(text), lambda: sr.specs({"w": jax.ShapeDtypeStruct((8,), "float32")}, text)):
        with pytest.raises(sr.IncludeNotFoundError) as info:
            call()
        assert info.value.code == "SR005"
        assert "this is rule text, not the path of a rule file" in str(info.value)
        assert "`shardrules.loads(text)`" in info.value.hint


def test_long_rule_text_or_a_nul_given_as_a_path_is_reported_short():
    text = "rules params:\n" + '  "w" -> replicated\n' * 400  # longer than a file name may be
    with pytest.raises(sr.IncludeNotFoundError) as info:
        sr.load(text)
    assert len(str(info.value)) < 400 and "`shardrules.loads(text)`" in info.value.hint
    with pytest.raises(sr.IncludeNotFoundError) as info:
        sr.load("model\x00.shard")
    assert "NUL" in info.value.hint


def test_a_real_file_whose_name_looks_like_rules_still_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("mesh data").write_text('rules params:\n  "w" -> replicated\n')
    assert sr.load("mesh data").group_names == ("params",)


def test_every_unreadable_top_file_has_a_hint(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "latin1.shard").write_bytes("# café\n".encode("latin-1"))
    for path, fragment in [(tmp_path / "folder", "name the rule file"), (tmp_path / "latin1.shard", "UTF-8")]:
        with pytest.raises(sr.IncludeNotFoundError) as info:
            sr.load(path)
        assert fragment in info.value.hint, str(info.value)


@pytest.mark.parametrize(
    ("text", "col", "hint"),
    [
        (
            "mesh x\nrules p:\n  'w$' -> (x)\n",
            3,
            'patterns and include paths are written in double quotes: "w$"',
        ),
        ("mesh x\ninclude 'c.shard'\n", 9, 'written in double quotes: "c.shard"'),
        ("mesh x\nrules p:\n  \u201ca/b\u201d -> (x)\n", 3, 'written in double quotes: "a/b"'),
        ("mesh x\nrules 'params':\n", 7, "names are written without quotes: params"),
        ("mesh x\nrules p:\n  'w -> (x)\n", 3, 'written in double quotes: "attn/kernel"'),
    ],
)
def test_other_quotes_get_a_hint(text, col, hint):
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads(text, name="bad.shard")
    assert info.value.code == "SR001" and info.value.span is not None and info.value.span.col == col
    assert hint in info.value.hint, info.value.hint


def test_regex_error_caret_is_under_the_offending_character():
    text = 'mesh x\nrules p:\n  "layers/(\\d+/w$" -> (x)\n  "a\\"b\\"[c" -> (x)\n'
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads(text, name="bad.shard")
    first, second = info.value.diagnostics
    lines = text.split("\n")
    assert first.code == "SR002" and lines[2][first.span.col - 1] == "("
    assert second.code == "SR002" and lines[3][second.span.col - 1] == "["
    assert "    |           ^\n" in str(info.value)


def test_syntax_error_in_included_file_names_that_file(tmp_path):
    (tmp_path / "inc.shard").write_text('rules p:\n  "a" -> (\n')
    (tmp_path / "top.shard").write_text('include "inc.shard"\n')
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.load(tmp_path / "top.shard")
    assert info.value.span is not None and info.value.span.file.endswith("inc.shard")
    assert '  2 |   "a" -> (' in str(info.value)


def test_rules_are_immutable():
    rules = sr.loads('mesh x\nrules p:\n  "a" -> (x)\n')
    rule = rules.group("p")[0]
    with pytest.raises(AttributeError):
        rule.pattern = "b"  # type: ignore[misc]


def test_a_group_header_without_rules_makes_an_empty_group():
    rules = sr.loads('mesh x\nrules params:\n\nrules inputs:\n  "x" -> (x)\n')
    assert rules.group_names == ("params", "inputs")
    assert rules.group("params") == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1.001KB", 1001), ("1.5KiB", 1536), ("2MiB", 2 << 20), ("0.5GB", 500_000_000), ("7B", 7), ("12", 12)],
)
def test_byte_sizes_are_exact(text, expected):
    rules = sr.loads(f"rules p:\n  default -> auto(x, min_bytes={text})\n")
    assert rules.defaults["p"].spec.min_bytes == expected


def test_rule_sets_pickle_and_copy(tmp_path):
    import copy
    import pickle

    import jax

    rules = sr.loads('mesh x\nrules params:\n  "w" -> (x)\n', name="r.shard")
    sr.specs({"w": jax.ShapeDtypeStruct((4,), "float32")}, rules, {"x": 2})  # fills the plan cache
    for clone in (pickle.loads(pickle.dumps(rules)), copy.deepcopy(rules), copy.copy(rules)):
        assert clone == rules
        assert clone.group("params")[0].span == rules.group("params")[0].span
        assert sr.specs({"w": jax.ShapeDtypeStruct((4,), "float32")}, clone, {"x": 2})[
            "w"
        ] == jax.sharding.PartitionSpec("x")


def test_a_failed_alias_is_reported_once_not_at_every_use():
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads(
            'mesh data, fsdp\nalias embed = fdsp\nrules params:\n  "w" -> (embed, _)\n  "v" -> (embed)\n'
        )
    assert [d.code for d in info.value.diagnostics] == ["SR010"]
    assert "did you mean `fsdp`?" in str(info.value)


def test_a_mesh_axis_written_with_a_question_mark_may_be_missing():
    """`mesh fsdp, model?`: the mesh may lack `model` (it is then size 1). The
    `?` of a spec entry (`model?`: dropped where the dimension does not divide)
    is another thing, and both read as before."""
    rules = sr.loads('mesh fsdp=8, model?=2 auto\nrules params:\n  "w" -> (fsdp, model?)\n', name="o.shard")
    assert rules.mesh is not None
    assert rules.mesh.names == ("fsdp", "model") and rules.mesh.optional == ("model",)
    assert [a.size for a in rules.mesh.axes] == [8, 2] and rules.mesh.axis_types == (None, "auto")
    (rule,) = rules.groups["params"]
    (_, model) = rule.spec.entries
    assert model.groups[0].optional  # the spec entry's own `?`: divisibility, unchanged
    plain = sr.loads("mesh fsdp, model\n")
    assert plain.mesh is not None and plain.mesh.optional == ()
    with pytest.raises(sr.RuleSyntaxError):
        sr.loads("mesh fsdp, model=2?\n")  # the `?` follows the name
    with pytest.raises(sr.RuleDefinitionError, match="SR014"):  # two different mesh lines
        sr.loads("mesh fsdp, model?\nmesh fsdp, model\n")
