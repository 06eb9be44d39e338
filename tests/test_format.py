"""The canonical printer (`format_text`): layout, round trips and idempotence."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import shardrules as sr
from shardrules._language._format import byte_size_text
from shardrules._language._parse import parse
from shardrules._language._syntax import Alias, Comment, Item, RuleLine

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def include_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder for `include` lines to resolve in (and stay inside)."""
    root = tmp_path_factory.mktemp("include_root")
    (root / "common.shard").write_text("# shared by the files under test\n", encoding="utf-8")
    return root


def fmt(text: str) -> str:
    return sr.format_text(text)


# ------------------------------------------------------------------ layout


def test_rules_are_indented_and_arrows_aligned() -> None:
    text = 'rules params:\n"a" -> (x)\n"longer/pattern"->(y,z)\ndefault -> replicated\n'
    assert fmt(text) == (
        "rules params:\n"
        '  "a"              -> (x)\n'
        '  "longer/pattern" -> (y, z)\n'
        "  default          -> replicated\n"
    )


def test_a_blank_line_ends_an_arrow_run() -> None:
    text = 'rules p:\n  "a" -> (x)\n  "bbb" -> (y)\n\n  "cccccc" -> (z)\n'
    assert fmt(text) == ('rules p:\n  "a"   -> (x)\n  "bbb" -> (y)\n\n  "cccccc" -> (z)\n')


def test_a_comment_line_does_not_end_an_arrow_run() -> None:
    text = 'rules p:\n  "a" -> (x)\n    # indented note\n# flush-left note\n  "bbbb" -> (y)\n'
    assert fmt(text) == ('rules p:\n  "a"    -> (x)\n  # indented note\n# flush-left note\n  "bbbb" -> (y)\n')


def test_a_header_or_another_statement_ends_an_arrow_run() -> None:
    text = (
        'rules a:\n  "x" -> (m)\n  "xxxxxx" -> (m)\n'
        'rules b:\n  "yy" -> (m)\n'
        'alias q = m\n  "zzzzzzzzz" -> (m)\n  "z" -> (m)\n'
    )
    assert fmt(text) == (
        "rules a:\n"
        '  "x"      -> (m)\n'
        '  "xxxxxx" -> (m)\n'
        "rules b:\n"
        '  "yy" -> (m)\n'
        "alias q = m\n"
        '  "zzzzzzzzz" -> (m)\n'
        '  "z"         -> (m)\n'
    )


def test_alias_equals_aligned_over_a_run() -> None:
    text = "alias b = (data ,fsdp)\nalias embed=fsdp\nalias v =  _\n\nalias longer_name = (x)\n"
    assert fmt(text) == (
        "alias b     = (data, fsdp)\nalias embed = fsdp\nalias v     = _\n\nalias longer_name = (x)\n"
    )


def test_alias_run_goes_through_comment_lines_but_not_other_statements() -> None:
    text = "alias a = x\n# about embed\nalias embed = y\nmesh x, y\nalias ccc = x\nalias d = y\n"
    assert fmt(text) == (
        "alias a     = x\n# about embed\nalias embed = y\nmesh x, y\nalias ccc = x\nalias d   = y\n"
    )


@pytest.mark.parametrize(
    ("written", "canonical"),
    [
        ("( a ,b )", "(a, b)"),
        ("(a,b,c)", "(a, b, c)"),
        ("()", "()"),
        ("(  )", "()"),
        ("(model)", "(model)"),
        ("( ... , embed ,heads )", "(..., embed, heads)"),
        ("(_,_ , ...)", "(_, _, ...)"),
        ("(model ?)", "(model?)"),
        ("( embed, model ? )", "(embed, model?)"),
        ("( ( data ,fsdp ) ? , _ )", "((data, fsdp)?, _)"),
        ("((data ?,fsdp),model)", "((data?, fsdp), model)"),
        ("(( a ))", "((a))"),
        ("replicated", "replicated"),
        ("auto( fsdp )", "auto(fsdp)"),
        ("auto(fsdp,min_bytes = 1048576)", "auto(fsdp, min_bytes=1MiB)"),
        ("auto ( (data,fsdp) , min_bytes=2KB )", "auto((data, fsdp), min_bytes=2KB)"),
    ],
)
def test_spec_spacing_is_normalised(written: str, canonical: str) -> None:
    assert fmt(f'rules p:\n"k" -> {written}\n') == f'rules p:\n  "k" -> {canonical}\n'


@pytest.mark.parametrize(
    ("written", "canonical"),
    [
        ("1048576", "1MiB"),
        ("1MiB", "1MiB"),
        ("1024", "1KiB"),
        ("2048KiB", "2MiB"),
        ("0.5KiB", "512"),
        ("0.5MiB", "512KiB"),
        ("1.5GiB", "1536MiB"),
        ("1073741824", "1GiB"),
        ("1024GiB", "1TiB"),
        ("1000000", "1MB"),
        ("1GB", "1GB"),
        ("1000", "1KB"),
        ("3000", "3KB"),
        ("2.5MB", "2500KB"),
        ("16MB", "16MB"),
        ("16000000", "16MB"),
        ("4096MB", "4096MB"),
        ("1TB", "1TB"),
        ("1000KiB", "1000KiB"),
        ("1024000", "1000KiB"),
        ("1500", "1500"),
        ("1B", "1"),
        ("0", "0"),
        ("7", "7"),
    ],
)
def test_sizes_in_auto_options_are_written_in_the_largest_exact_unit(written: str, canonical: str) -> None:
    text = f"rules p:\n  default -> auto(fsdp, min_bytes={written})\n"
    assert fmt(text) == f"rules p:\n  default -> auto(fsdp, min_bytes={canonical})\n"


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0"),
        (1, "1"),
        (1500, "1500"),
        (2**20, "1MiB"),
        (3 * 2**30, "3GiB"),
        (10**12, "1TB"),
        (2**40, "1TiB"),
        (16 * 10**6, "16MB"),
    ],
)
def test_byte_size_text(n: int, text: str) -> None:
    assert byte_size_text(n) == text


_SCALES = {"": 1, "KB": 10**3, "KiB": 2**10, "MB": 10**6, "MiB": 2**20}
_SCALES |= {"GB": 10**9, "GiB": 2**30, "TB": 10**12, "TiB": 2**40}


@given(
    st.one_of(
        st.integers(0, 2**50),
        st.tuples(st.integers(0, 10**6), st.sampled_from(sorted(_SCALES.values()))).map(
            lambda t: t[0] * t[1]
        ),
    )
)
def test_byte_size_text_is_exact_in_the_largest_unit(n: int) -> None:
    m = re.fullmatch(r"([0-9]+)([A-Za-z]*)", byte_size_text(n))
    assert m is not None
    value, unit = int(m.group(1)), m.group(2)
    assert value * _SCALES[unit] == n
    if n:
        assert all(n % scale for scale in _SCALES.values() if scale > _SCALES[unit])


@pytest.mark.parametrize(
    ("written", "canonical"),
    [
        ("mesh data,fsdp ,  model", "mesh data, fsdp, model"),
        ("mesh  data = 2 ,fsdp=* , model=8", "mesh data=2, fsdp=*, model=8"),
        ("mesh data", "mesh data"),
        ("mesh\tdata=08", "mesh data=8"),
        ("mesh data=2, model", "mesh data=2, model"),
        ("mesh fsdp ,model ?", "mesh fsdp, model?"),  # `model` may be missing from the mesh
        ("mesh data=2, model ?= 4  auto", "mesh data=2, model?=4 auto"),
    ],
)
def test_mesh_line(written: str, canonical: str) -> None:
    assert fmt(written + "\n") == canonical + "\n"


def test_include_and_keyword_statements_start_at_column_one() -> None:
    text = '   include   "common.shard"\n\talias x=y\n  rules   params :\n"k"->( x )\n'
    assert fmt(text) == 'include "common.shard"\nalias x = y\nrules params:\n  "k" -> (x)\n'


def test_patterns_are_kept_verbatim() -> None:
    patterns = [
        r"layers_\d+/attn$",
        r"attn/(q|k|v)_proj/kernel",
        r"^(tokens|targets)$",
        r"a\"b",
        r"has # hash",
        r"  spaced  ",
        r"\\d",
    ]
    text = "rules p:\n" + "".join(f'"{p}"->(_)\n' for p in patterns)
    out = fmt(text)
    assert out == (
        "rules p:\n"
        r'  "layers_\d+/attn$"         -> (_)'
        "\n"
        r'  "attn/(q|k|v)_proj/kernel" -> (_)'
        "\n"
        r'  "^(tokens|targets)$"       -> (_)'
        "\n"
        r'  "a\"b"                     -> (_)'
        "\n"
        r'  "has # hash"               -> (_)'
        "\n"
        r'  "  spaced  "               -> (_)'
        "\n"
        r'  "\\d"                      -> (_)'
        "\n"
    )
    rules = [s for s in parse(out).statements if isinstance(s, RuleLine)]
    assert [r.pattern for r in rules] == patterns


def test_comments_kept_trailing_aligned_blank_lines_collapsed() -> None:
    text = (
        "\n\n# top\n\n\n\n"
        "mesh a,b # axes\n"
        "alias x = a   # one\n"
        "alias yy=b\n"
        "\n\n\n"
        "rules p:   # group   \n"
        '  "k"->(x) # k\n'
        "  # inner\n"
        '  "kk" -> (yy)    #kk\n'
        "\n\n"
    )
    assert fmt(text) == (
        "# top\n"
        "\n"
        "mesh a, b     # axes\n"
        "alias x  = a  # one\n"
        "alias yy = b\n"
        "\n"
        "rules p:       # group\n"
        '  "k"  -> (x)  # k\n'
        "  # inner\n"
        '  "kk" -> (yy)  #kk\n'
    )


def test_a_blank_line_ends_a_trailing_comment_run() -> None:
    text = "mesh a  # m\n\nalias long_alias_name = a # l\n"
    assert fmt(text) == "mesh a  # m\n\nalias long_alias_name = a  # l\n"


def test_comment_text_is_kept_verbatim_except_trailing_space() -> None:
    text = '#no space\t \n#   spaced   out\t\n#\nmesh a #  "x" -> (y) # ä\n'
    assert fmt(text) == '#no space\n#   spaced   out\n#\nmesh a  #  "x" -> (y) # ä\n'


def test_comments_outside_a_rules_block_move_to_column_one() -> None:
    text = "mesh a  # x\n        # continued\n"
    assert fmt(text) == "mesh a  # x\n# continued\n"


def test_line_ends_and_final_newline() -> None:
    assert fmt("mesh a\r\nalias b = a\r\n") == "mesh a\nalias b = a\n"
    assert fmt("mesh a") == "mesh a\n"
    assert fmt("mesh a\n\n\n") == "mesh a\n"


@pytest.mark.parametrize("text", ["", "\n", "\n\n  \n\t\n", "\r\n"])
def test_empty_files_format_to_nothing(text: str) -> None:
    assert fmt(text) == ""


def test_only_comments() -> None:
    assert fmt("\n  # a\n\n\n# b\n\n") == "# a\n\n# b\n"


def test_default_and_keywords_as_names() -> None:
    text = "rules default:\ndefault->(auto,replicated?,mesh)\n"
    assert fmt(text) == "rules default:\n  default -> (auto, replicated?, mesh)\n"


def test_a_byte_order_mark_is_dropped_as_the_loader_drops_it() -> None:
    text = '\ufeffmesh data,model\nrules params:\n"w"->(data,_)\n'
    assert sr.format_text(text) == 'mesh data, model\nrules params:\n  "w" -> (data, _)\n'
    assert sr.format_text("\ufeff") == ""
    # errors after a mark point where the loader's do
    bad = '\ufeffrules p:\n  "kernel" -> (_, model\n'
    with pytest.raises(sr.RuleSyntaxError) as formatting:
        sr.format_text(bad, "bad.shard")
    with pytest.raises(sr.RuleSyntaxError) as loading:
        sr.loads(bad, name="bad.shard")
    assert str(formatting.value) == str(loading.value)
    assert str(formatting.value).startswith("bad.shard:2:24: SR001 ")
    # only a leading mark is one: anywhere else it is a character like any other
    with pytest.raises(sr.RuleSyntaxError):
        sr.format_text("mesh data\n\ufeffrules p:\n")


def test_format_raises_rule_syntax_error_with_location() -> None:
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.format_text('rules p:\n  "kernel" -> (_, model\n', "bad.shard")
    assert info.value.code == "SR001"
    assert str(info.value).startswith("bad.shard:2:24: SR001 ")
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.format_text("rules p:\n  default -> auto(a, min_bytes=1XB)\n")
    assert info.value.code == "SR003"


# ------------------------------------------------------------------ the reference example

# The reference example of the design, exactly as written there.
DESIGN = (Path(__file__).parent / "data" / "design_example.txt").read_text()

DESIGN_FORMATTED = r"""# sharding/llama.shard
mesh data, fsdp, model  # axes these rules may name; sizes come from the runtime mesh
# optional sizes for lint without devices: mesh data=2, fsdp=*, model=8
include "common.shard"  # relative to this file

alias batch = (data, fsdp)  # logical name -> mesh axes (like Flax logical_axis_rules)
alias embed = fsdp
alias heads = model

rules params:                                               # a named group; first matching rule wins, in file order
  "embed/embedding"          -> (model, embed)
  "attn/(q|k|v)_proj/kernel" -> (..., embed, heads)         # `...`: leading dims unsharded (scanned layers)
  "attn/o_proj/kernel"       -> (..., heads, embed)
  "norm/scale$"              -> replicated
  "lm_head/kernel"           -> (embed, model?)             # `?`: only where it divides that dim
  default                    -> auto(fsdp, min_bytes=1MiB)  # FSDP fallback: largest divisible dim

rules activations:  # matched against module paths / jax.named_scope names
  "layers_\d+/attn$" -> (batch, _, embed)

rules inputs:
  "tokens|targets" -> (batch, _)
"""


def test_design_example_formats_and_is_idempotent() -> None:
    out = fmt(DESIGN)
    assert out == DESIGN_FORMATTED
    assert fmt(out) == out
    assert parse(out) == parse(DESIGN)


def test_design_example_loads_the_same_before_and_after_formatting(tmp_path: Path) -> None:
    for folder, text in (("before", DESIGN), ("after", fmt(DESIGN))):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "common.shard").write_text("# nothing shared yet\n", encoding="utf-8")
        (tmp_path / folder / "llama.shard").write_text(text, encoding="utf-8")
    before = sr.load(tmp_path / "before" / "llama.shard")
    after = sr.load(tmp_path / "after" / "llama.shard")

    assert before.mesh is not None and before.mesh.names == ("data", "fsdp", "model")
    assert before.aliases == {"batch": ("data", "fsdp"), "embed": ("fsdp",), "heads": ("model",)}
    assert set(before.group_names) == {"params", "activations", "inputs"}
    assert [r.pattern for r in before.groups["params"]] == [
        "embed/embedding",
        "attn/(q|k|v)_proj/kernel",
        "attn/o_proj/kernel",
        "norm/scale$",
        "lm_head/kernel",
    ]
    assert before.defaults["params"].spec.min_bytes == 2**20
    assert [r.pattern for r in before.groups["activations"]] == [r"layers_\d+/attn$"]

    assert after.mesh == before.mesh
    assert after.alias_items == before.alias_items
    assert after.group_items == before.group_items
    assert after.default_items == before.default_items


# ------------------------------------------------------------------ the .shard files in the repository


INVALID_CORPUS = REPO / "tests" / "data" / "invalid"  # malformed on purpose (test_invalid_corpus.py)


def _repo_shard_files() -> list[Path]:
    return sorted(
        p
        for p in REPO.glob("**/*.shard")
        if ".venv" not in p.relative_to(REPO).parts and not p.is_relative_to(INVALID_CORPUS)
    )


@pytest.mark.parametrize("path", _repo_shard_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_repository_shard_files_are_canonical(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert sr.format_text(text, str(path)) == text


# ------------------------------------------------------------------ properties

AXES = ("data", "fsdp", "model", "tp", "x_1")
ALIASES = ("batch", "embed", "heads", "mlp", "vocab", "kv_2")
GROUPS = ("params", "inputs", "activations", "opt_state")

WS = st.sampled_from(["", "", " ", "  ", "\t", " \t "])  # optional whitespace
WS1 = st.sampled_from([" ", " ", "  ", "\t", " \t "])  # required whitespace (`\f` is a line break)
NEWLINE = st.sampled_from(["\n", "\n", "\n", "\r\n"])

SEGMENTS = st.sampled_from(
    ["attn", "kernel", "embed", "layers", "q_proj", "norm", "scale", "w", "b", "0", "mu"]
)
PIECES = st.sampled_from(
    [r"\d+", "(q|k|v)", "(gate|up)", ".*", "[0-9]+", r"\.", r"\"", r"\w+", "x?", "#", "a b", "-"]
)

SIZES = st.one_of(
    st.integers(0, 2**41).map(str),
    st.tuples(
        st.integers(0, 4096), st.sampled_from(["B", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB"])
    ).map(lambda t: f"{t[0]}{t[1]}"),
    st.tuples(st.integers(0, 64), st.sampled_from(["KiB", "MiB", "GiB"])).map(lambda t: f"{t[0]}.5{t[1]}"),
)

COMMENT_CHARS = st.characters(
    # no line break: `str.splitlines`'s are refused in a comment too (test_line_ends.py)
    codec="utf-8",
    exclude_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029",
    categories=("L", "N", "P", "S", "Zs", "Cc"),
)
COMMENTS = st.text(COMMENT_CHARS, max_size=24).map(lambda s: "#" + s)


@st.composite
def patterns(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.one_of(SEGMENTS, PIECES), min_size=1, max_size=5))
    body = "".join(p + draw(st.sampled_from(["/", "/", "", "_"])) for p in parts)
    return draw(st.sampled_from(["", "", "^"])) + body + draw(st.sampled_from(["", "", "$"]))


@st.composite
def refs(draw: st.DrawFn, names: Sequence[str], optional: bool = True) -> str:
    """`name`, `name?`, `(a, b?)`, `(a, b)?` with irregular spacing."""
    w = lambda: draw(WS)  # noqa: E731
    q = lambda: (w() + "?") if optional and draw(st.booleans()) else ""  # noqa: E731
    if draw(st.integers(0, 3)) > 0:
        return draw(st.sampled_from(names)) + q()
    inner = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
    return "(" + w() + f"{w()},{w()}".join(n + q() for n in inner) + w() + ")" + q()


@st.composite
def specs(draw: st.DrawFn, names: Sequence[str], axes: Sequence[str]) -> str:
    w = lambda: draw(WS)  # noqa: E731
    kind = draw(st.sampled_from(["entries", "entries", "entries", "replicated", "auto"]))
    if kind == "replicated":
        return "replicated"
    if kind == "auto":
        text = "auto" + w() + "(" + w() + draw(refs(axes, optional=False))
        if draw(st.booleans()):
            text += f"{w()},{w()}min_bytes{w()}={w()}{draw(SIZES)}"
        return text + w() + ")"
    entries: list[str] = []
    ellipsis = False
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["axes", "axes", "axes", "_", "...", "unconstrained"]))
        if kind == "..." and not ellipsis:
            ellipsis = True
            entries.append("...")
        elif kind in ("_", "unconstrained"):
            entries.append(kind)
        else:
            entries.append(draw(refs(names)))
    return "(" + w() + f"{w()},{w()}".join(entries) + w() + ")"


DTYPE_NAMES = st.sampled_from(["float32", "bfloat16", "int8", "bool", "float8_e4m3fn", "uint4"])


@st.composite
def guards(draw: st.DrawFn) -> str:
    """`if COND (and COND)*` with irregular spacing: sizes with units for
    `bytes`, counts for `elements`, dtype names alone or in lists."""
    w = lambda: draw(WS)  # noqa: E731
    conditions = []
    for _ in range(draw(st.integers(1, 3))):
        variable = draw(st.sampled_from(["elements", "bytes", "dtype"]))
        if variable == "dtype":
            op = draw(st.sampled_from(["==", "!=", "in", "not in"]))
            if op in ("in", "not in"):
                names = draw(st.lists(DTYPE_NAMES, min_size=1, max_size=3))
                value = "(" + w() + f"{w()},{w()}".join(names) + w() + ")"
            else:
                value = draw(DTYPE_NAMES)
            op = f"{draw(WS1)}{op.replace(' ', draw(WS1))}{draw(WS1)}"  # words: spaces needed
        else:
            op = draw(st.sampled_from(["<", "<=", ">", ">=", "==", "!="]))
            value = draw(SIZES) if variable == "bytes" else str(draw(st.integers(0, 2**40)))
        conditions.append(f"{variable}{w()}{op}{w()}{value}")
    return "if " + w() + f" {w()}and{w()} ".join(conditions)


@st.composite
def rule_files(draw: st.DrawFn) -> str:
    """A random rule file that parses and loads, written with irregular layout."""
    w = lambda: draw(WS)  # noqa: E731
    w1 = lambda: draw(WS1)  # noqa: E731
    axes = draw(st.lists(st.sampled_from(AXES), min_size=1, max_size=4, unique=True))
    statements: list[str] = []

    # aliases: targets name axes or aliases drawn earlier, so there is no cycle;
    # they are then written in any order (forward references are allowed).
    # Some aliases have alternatives (`a | (b, c) | _`), which name axes and
    # aliases of one alternative only.
    alias_names = draw(st.lists(st.sampled_from(ALIASES), max_size=4, unique=True))
    alias_lines = []
    single: list[str] = []  # aliases of one alternative so far
    for name in alias_names:
        targets = axes + single
        count = draw(st.sampled_from([1, 1, 2, 3]))
        alternatives = []
        for _ in range(count):
            form = draw(st.sampled_from(["name", "name", "tuple", "_"]))
            if form == "_":
                alternatives.append("_")
            elif form == "name":
                alternatives.append(draw(st.sampled_from(targets)))
            else:
                inner = draw(st.lists(st.sampled_from(targets), min_size=1, max_size=3, unique=True))
                alternatives.append("(" + w() + f"{w()},{w()}".join(inner) + w() + ")")
        if count == 1:
            single.append(name)
        alias_lines.append(f"alias{w1()}{name}{w()}={w()}" + f"{w()}|{w()}".join(alternatives))
    names = axes + alias_names

    # groups, each opened one or more times; one `default` per group at most
    with_default: set[str] = set()
    for _ in range(draw(st.integers(0, 4))):
        group = draw(st.sampled_from(GROUPS))
        statements.append(f"rules{w1()}{group}{w()}:")
        for _ in range(draw(st.integers(0, 5))):
            if group not in with_default and draw(st.integers(0, 4)) == 0:
                with_default.add(group)
                head = "default"
            else:
                head = '"' + draw(patterns()) + '"'
            guard = f" {w()}{draw(guards())}" if draw(st.integers(0, 2)) == 0 else ""
            statements.append(f"{head}{w()}->{w()}{draw(specs(names, axes))}{guard}")

    others = list(alias_lines)
    if draw(st.booleans()):
        others.append(f'include{w1()}"common.shard"')
    for line in others:
        statements.insert(draw(st.integers(0, len(statements))), line)

    if draw(st.booleans()):
        sizing = draw(st.sampled_from(["none", "numbers", "star"]))
        star = draw(st.integers(0, len(axes) - 1))
        mesh_axes = []
        for i, axis in enumerate(axes):
            if draw(st.integers(0, 3)) == 0:
                axis += w() + "?"  # the mesh may lack it
            if sizing == "none":
                mesh_axes.append(axis)
            else:
                size = "*" if sizing == "star" and i == star else str(draw(st.integers(1, 64)))
                mesh_axes.append(f"{axis}{w()}={w()}{size}")
        statements.insert(0, "mesh" + w1() + f"{w()},{w()}".join(mesh_axes))

    lines: list[str] = []
    for _ in range(draw(st.integers(0, 2))):
        lines.append(w())  # blank lines at the start
    for statement in statements:
        for _ in range(draw(st.integers(0, 3)) // 2):  # full-line comments and blank lines
            lines.append(w() + draw(COMMENTS) if draw(st.booleans()) else w())
        comment = w() + draw(COMMENTS) if draw(st.integers(0, 2)) == 0 else ""
        lines.append(w() + statement + comment + w())
    for _ in range(draw(st.integers(0, 2))):
        lines.append(w())
    text = "".join(line + draw(NEWLINE) for line in lines)
    if text.endswith("\n") and draw(st.integers(0, 4)) == 0:
        text = text.rstrip("\r\n")  # no newline at the end of the file
    return text


def _items_by_line(out: str) -> tuple[list[str], dict[int, Item]]:
    """The lines of formatted text, and the item (statement or full-line
    comment) on each line number."""
    by_line: dict[int, Item] = {}
    for item in parse(out).items:
        assert item.span is not None
        if not (isinstance(item, Comment) and item.trailing):
            by_line[item.span.line] = item
    return out.split("\n"), by_line


def _check_run(run: list[tuple[int, int]], gap: int, context: object) -> None:
    """`run` holds (column, end of what comes before) for each line of a run:
    one column for all, `gap` after the longest."""
    if run:
        assert len({col for col, _ in run}) == 1, context
        assert run[0][0] == max(end for _, end in run) + gap, context


def _check_aligned(out: str) -> None:
    """In formatted text, the `->` of a run of rules and the `=` of a run of
    aliases share one column, with one space before it on the longest line;
    the trailing comments of consecutive statement lines share one column,
    two spaces after the longest code."""
    lines, by_line = _items_by_line(out)
    for kind, sep in ((RuleLine, " -> "), (Alias, " = ")):
        run: list[tuple[int, int]] = []  # (index of sep, end of the left-hand side)
        for number in range(1, len(lines) + 1):
            item = by_line.get(number)
            if isinstance(item, RuleLine | Alias) and isinstance(item, kind):
                line = lines[number - 1]
                if isinstance(item, RuleLine):
                    assert item.pattern_span is not None
                    end = item.pattern_span.end_col - 1
                else:
                    end = len(f"alias {item.name}")
                col = line.index(sep, end)
                assert line[end:col].strip(" ") == ""
                run.append((col, end))
            elif not isinstance(item, Comment):
                _check_run(run, 0, (kind.__name__, out))
                run = []
        _check_run(run, 0, (kind.__name__, out))

    # the `if` of the guarded rules of a run: one column, one space after the longest of their specs
    guarded: list[tuple[int, int]] = []  # (column of `if`, end of the spec), 1-based
    for number in range(1, len(lines) + 1):
        item = by_line.get(number)
        if isinstance(item, RuleLine):
            if item.guard:
                assert item.guard_span is not None and item.spec.span is not None
                guarded.append((item.guard_span.col, item.spec.span.end_col))
        elif not isinstance(item, Comment):
            _check_run(guarded, 1, ("if", out))
            guarded = []
    _check_run(guarded, 1, ("if", out))

    trailing = {
        c.span.line: c.span.col for c in parse(out).items if isinstance(c, Comment) and c.trailing and c.span
    }
    comments: list[tuple[int, int]] = []  # (column of the comment, length of the code)
    for number in range(1, len(lines) + 1):
        item = by_line.get(number)
        if item is None or isinstance(item, Comment):
            _check_run(comments, 3, ("comments", out))
            comments = []
        elif number in trailing:
            col = trailing[number]
            comments.append((col, len(lines[number - 1][: col - 1].rstrip(" "))))
    _check_run(comments, 3, ("comments", out))


def _check_shape(out: str) -> None:
    """One newline at the end, no blank line at either end or twice in a row,
    no trailing spaces, rules indented two spaces and the rest flush left."""
    if not out:
        return
    assert out.endswith("\n") and not out.endswith("\n\n") and not out.startswith("\n")
    assert "\n\n\n" not in out
    for line in out.split("\n"):
        assert not line.endswith((" ", "\t")), repr(line)
    for item in parse(out).items:
        assert item.span is not None
        if isinstance(item, RuleLine):
            assert item.span.col == 3
        elif not isinstance(item, Comment):
            assert item.span.col == 1


@given(rule_files())
def test_formatting_keeps_the_meaning_and_is_idempotent(include_root: Path, text: str) -> None:
    out = sr.format_text(text)
    assert parse(out) == parse(text)
    assert sr.format_text(out) == out
    assert sr.loads(out, include_root=include_root) == sr.loads(text, include_root=include_root)
    _check_shape(out)
    _check_aligned(out)


_TOKENS = [
    *("mesh", "alias", "rules", "include", "default", "replicated", "auto", "min_bytes"),
    *("->", "(", ")", ",", "=", "?", "...", "_", "*", ":", "#", "\\", '"'),
    *('"a"', '"common.shard"', '"(x"', r'"\d+"', '""', '"a/b$"'),
    *("data", "model", "p", "1MiB", "1.5GiB", "0", "8", "1.5x", "-1", "1e3"),
    *("\n", "\r\n", "\r", " ", "\t", "\f", "\x00", "é"),
]
ARBITRARY_TEXT = st.one_of(
    st.text(),
    st.lists(st.sampled_from(_TOKENS), max_size=40).map(" ".join),
    st.lists(st.sampled_from(_TOKENS), max_size=40).map("".join),
)


@given(ARBITRARY_TEXT)
def test_any_text_loads_or_raises_a_shardrules_error(include_root: Path, text: str) -> None:
    with contextlib.suppress(sr.ShardRulesError):
        sr.loads(text, include_root=include_root)
    try:
        out = sr.format_text(text)
    except sr.RuleSyntaxError:
        return
    assert parse(out) == parse(text)
    assert sr.format_text(out) == out
