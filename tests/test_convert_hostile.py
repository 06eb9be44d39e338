"""Converters read other people's files and objects as data: no input text
becomes a line of the rule file; YAML alias bombs, deep nesting, huge
numbers and huge rule lists are refused before the work, quickly; what a
`module:attr` source's code raises or exits with is a clear error, exit 2;
notes grow linearly with the rules. (Random inputs: tests/test_convert_campaign.py.)"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules._cli._main import main
from shardrules._convert import _common
from shardrules._convert._common import SourceError
from shardrules._convert._documents import MAX_DEPTH, MAX_NODES, parse_json, parse_yaml
from shardrules._language._parse import parse
from shardrules._language._syntax import Alias, RuleLine

INJECTED = '"evil" -> (model)'
"""A rule an input tries to add, after a line break of one kind or another."""

BREAKS = ["\n", "\r\n", "\r", "\n#", "\x85", "\u2028", "\x0b", "\x0c"]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`main(args)`: exit status, standard output, standard error. A
    `SystemExit` escaping `main` fails the test (argparse's own are not
    expected here)."""
    status = main(args)
    out, err = capsys.readouterr()
    return status, out, err


def _rule_patterns(text: str) -> list[str | None]:
    return [s.pattern for s in parse(text).statements if isinstance(s, RuleLine)]


def _no_injection(conversion: sr.Conversion) -> None:
    """No rule of the injected text's own: input text is only ever inside a
    pattern derived from an input key or regex, or a comment."""
    assert "evil" not in _rule_patterns(conversion.text)
    for line in conversion.text.splitlines():
        assert not line.lstrip().startswith('"evil"'), line
    assert all("\n" not in note and "\r" not in note for note in conversion.notes)
    controls = {c for c in conversion.text if c != "\n" and (ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0)}
    assert not controls, controls  # escaped, in comments and in patterns alike


# ------------------------------------------------------------- no injection


@pytest.mark.parametrize("brk", BREAKS, ids=repr)
def test_hf_text_never_becomes_a_rule(brk: str) -> None:
    """The red-team case: an unknown style's text (a comment after the rule
    it did not convert) held a line break, and the next line became a rule."""
    plan = {
        "layers.*.q_proj": f"colwise_x{brk}{INJECTED}{brk}#",  # an unknown style
        f"layers.*.k{brk}{INJECTED}": "colwise",  # a key (becomes a pattern)
        f"layers.*.v{brk}{INJECTED}": "packed_colwise",  # a key in a comment
        f"lm.{brk}x": f"local{brk}{INJECTED}",  # an unknown style, too
    }
    conversion = sr.convert_hf(plan, source=f"plan{brk}{INJECTED}")
    _no_injection(conversion)
    # The rules of the key `layers.*.k...` (its bias, its weight: the key's text escaped in
    # their patterns), and the default.
    patterns = _rule_patterns(conversion.text)
    assert len(patterns) == 3 and patterns[2] is None
    assert all(p is not None and p.startswith("(^|[./])layers[./]\\d+[./]k") for p in patterns[:2])


@pytest.mark.parametrize("brk", BREAKS, ids=repr)
def test_maxtext_and_flax_text_never_becomes_a_rule(brk: str) -> None:
    config = {
        "base_config": f"base.yml{brk}{INJECTED}",
        "mesh_axes": ["data", "model"],
        "logical_axis_rules": [
            [f"embed{brk}{INJECTED}", "model"],
            ["mlp", [f"model{brk}{INJECTED}"]],
            ["heads", f"x{brk}{INJECTED}"],
            ["batch", "data"],
        ],
    }
    conversion = sr.convert_maxtext(config, source=f"base{brk}{INJECTED}.yml")
    _no_injection(conversion)
    assert [s.name for s in parse(conversion.text).statements if isinstance(s, Alias)] == ["batch"]
    conversion = sr.convert_flax(config["logical_axis_rules"], source=f"m{brk}{INJECTED}:R")
    _no_injection(conversion)


@pytest.mark.parametrize("brk", BREAKS, ids=repr)
def test_regex_text_never_becomes_a_rule(brk: str) -> None:
    rules = [
        (f"a{brk}{INJECTED}", P("model")),  # a pattern: its line breaks are escapes in the literal
        (f"(?<=x){brk}{INJECTED}", P("model")),  # refused (lookbehind): written as a comment
        ("b", P(f"model{brk}{INJECTED}")),  # not a name: a note
    ]
    conversion = sr.convert_regex(rules, source=f"src{brk}{INJECTED}")
    _no_injection(conversion)
    patterns = _rule_patterns(conversion.text)
    assert (
        len(patterns) == 2 and patterns[0] is not None and patterns[0].startswith("a") and patterns[1] == "b"
    )


def test_a_line_break_left_in_a_rule_line_is_refused() -> None:
    """The last guard: whatever a converter builds, a body line with a line
    break is refused, not written."""
    with pytest.raises(SourceError, match="would break in two"):
        _common.finish(
            "hf", "s", [], ["rules params:", '  "a" -> replicated  # x\n  "evil" -> replicated'], []
        )


def test_notes_in_the_file_are_bounded() -> None:
    rules = [(f"bad-{i}", "x") for i in range(500)] + [("ok", "x")]
    conversion = sr.convert_flax(rules)
    assert len(conversion.notes) == 500
    assert conversion.text.count("\n#   - ") == _common.MAX_NOTES_WRITTEN + 1
    assert "#   - and 400 more (Conversion.notes, standard error)" in conversion.text


def test_shown_is_bounded_and_one_line() -> None:
    assert _common.shown("a\nb\u2028c") == "a\\nb\\u2028c"
    assert len(_common.shown("x" * 100_000)) < 200
    nested: list[object] = []
    nested.append(nested)
    assert len(_common.shown([nested] * 10_000)) < 200
    assert _common.shown(int("1" * 4000) ** 3) == "<int>"  # too many digits to print


# ------------------------------------------------------------- patterns


def test_regex_with_a_construct_re2_reads_otherwise_is_reported_not_converted() -> None:
    """`x{,}` is `x*` to Python and the text `x{,}` to RE2: converted as is, the
    rule would have matched nothing, silently."""
    conversion = sr.convert_regex([("layers/{,}kernel", P("m")), ("[^[:alpha:]]", P("m"))])
    assert len(conversion.notes) == 2
    assert "SR017" in conversion.notes[0] and "write `*`" in conversion.notes[0]
    assert "SR017" in conversion.notes[1] and "POSIX class" in conversion.notes[1]
    assert _rule_patterns(conversion.text) == []


# ------------------------------------------------------------- YAML and JSON bombs

BILLION_LAUGHS = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
    + ["logical_axis_rules: [[x, *i]]", ""]
)


def test_yaml_alias_bomb_is_refused_before_it_is_built(tmp_path: Path) -> None:
    """482 bytes that stand for 387 million values: 40 s and 2.8 GB before."""
    assert len(BILLION_LAUGHS) < 500
    (tmp_path / "bomb.yml").write_text(BILLION_LAUGHS)
    start = time.perf_counter()
    with pytest.raises(SourceError, match=f"more than {MAX_NODES:,} values"):
        sr.convert_maxtext(tmp_path / "bomb.yml")
    assert time.perf_counter() - start < 5  # a hang guard; it takes milliseconds


def test_yaml_bombs_of_merge_keys_and_recursive_aliases_are_refused() -> None:
    merges = ["a: &a {k0: 1, k1: 2, k2: 3, k3: 4, k4: 5, k5: 6, k6: 7, k7: 8}"]
    for i in range(1, 9):
        previous = "a" if i == 1 else f"m{i - 1}"
        merges.append(f"m{i}: &m{i} {{<<: [{', '.join([f'*{previous}'] * 9)}], z{i}: 0}}")
    with pytest.raises(SourceError, match="values"):
        parse_yaml("\n".join(merges) + "\n", "merge.yml")
    with pytest.raises(SourceError, match="inside the node it names"):
        parse_yaml("logical_axis_rules: &r [[x, *r]]\n", "loop.yml")
    with pytest.raises(SourceError, match=f"nested more than {MAX_DEPTH} deep"):
        parse_yaml("[" * 500 + "]" * 500, "deep.yml")
    with pytest.raises(SourceError, match=r"nested more than|maximum nesting depth"):  # libyaml stops first
        parse_yaml("[" * 100_000 + "]" * 100_000, "deep.yml")
    with pytest.raises(SourceError, match="nested more than"):
        parse_yaml("a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 200)), "deep.yml")
    assert parse_yaml("a: &a [1, 2]\nb: [*a, *a]\n", "ok.yml") == {"a": [1, 2], "b": [[1, 2], [1, 2]]}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("[" + "9" * 5000 + "]", "not JSON this reads"),
        ('{"a": ', "not JSON"),
    ],
)
def test_json_that_python_cannot_read_is_a_source_error(text: str, message: str) -> None:
    with pytest.raises(SourceError, match=message):
        parse_json(text, "plan.json")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("logical_axis_rules: [[a, " + "9" * 5000 + "]]\n", "not YAML this reads"),
        ("logical_axis_rules: [[a, 0x" + "f" * 5000 + "]]\n", None),  # read; the number is a note
        ("logical_axis_rules: !!python/object:os.system {}\n", "not a YAML file"),
        ("? [a, b]\n: 1\n", "not a YAML file"),  # a key that is not hashable
        ("a: *nothing\n", "not a YAML file"),
        ("a: &x 1\nb: &x 2\n", "not a YAML file"),
    ],
)
def test_yaml_that_python_cannot_read_is_a_source_error(text: str, message: str | None) -> None:
    if message is None:
        conversion = sr.convert_maxtext(parse_yaml(text, "odd.yml"), source="odd.yml")
        assert "rule 1 (a): <int> is not a mesh axis name" in conversion.notes[0]
        return
    with pytest.raises(SourceError, match=message):
        parse_yaml(text, "odd.yml")


# ------------------------------------------------------------- sizes first


def test_too_many_rules_are_refused_before_they_are_converted(tmp_path: Path) -> None:
    """100,000 rules took 18 to 42 s before the rule file's limit refused them."""
    big = tmp_path / "big.yml"
    rows = "".join(f"  [n{i}, [fsdp, model]],\n" for i in range(100_000))
    big.write_text(f"mesh_axes: [data, fsdp, model]\nlogical_axis_rules: [\n{rows}]\n")
    start = time.perf_counter()
    with pytest.raises(SourceError, match="values"):
        sr.convert_maxtext(big)
    assert time.perf_counter() - start < 10  # a hang guard: the parse stops at the budget
    many = [[f"n{i}", "x"] for i in range(10_001)]
    with pytest.raises(SourceError, match="10,001 rules, more than the 10,000"):
        sr.convert_maxtext({"logical_axis_rules": many})
    with pytest.raises(SourceError, match="10,001 rules, more than"):
        sr.convert_flax(many)
    with pytest.raises(SourceError, match="10,001 entries"):
        sr.convert_hf({f"l{i}": "colwise" for i in range(10_001)})
    with pytest.raises(SourceError, match=r"10,001 \(regex, PartitionSpec\) rules"):
        sr.convert_regex([(f"l{i}", P()) for i in range(10_001)])


def test_a_converted_text_over_the_limits_is_refused_before_it_is_parsed() -> None:
    long = "n" * 200
    with pytest.raises(SourceError, match=r"bytes \(at most 1,048,576\).*SR009"):
        sr.convert_flax([(f"{long}{i}", f"{long}x{i}") for i in range(6000)])


def test_out_of_order_notes_grow_linearly() -> None:
    """Each note listed every rule in between that shared an axis: 20,000
    rules took 1.7 GB, 86 KB of them 21 s. Now: the first few, and how many
    rules are in between."""
    rules = [(f"n{i}", "x") for i in range(5000)] * 2
    start = time.perf_counter()
    conversion = sr.convert_flax(rules)
    assert time.perf_counter() - start < 20  # a hang guard: about a second
    assert len(conversion.notes) == 5000
    assert max(len(note) for note in conversion.notes) < 400
    assert (
        "rules in between use the same axes (n1 -> x; n2 -> x; n3 -> x; and more of the 4,999 rules in "
        "between)" in conversion.notes[0]
    )
    axis_names = [("x", "x")] + [(f"n{i}", "x") for i in range(3000)] + [("x", "y")]
    conversion = sr.convert_flax(axis_names)
    assert "(through n0, n1, n10 and 2,997 more)" in conversion.notes[-1]


# ------------------------------------------------------------- the command line


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "hostile_src.py").write_text(
        "import sys\n"
        "class Weird(list):\n"
        "    def __len__(self):\n"
        "        raise RuntimeError('no length')\n"
        "class Quits(list):\n"
        "    def __iter__(self):\n"
        "        sys.exit(3)\n"
        "WEIRD = Weird([('a', 'x')])\n"
        "QUITS = Quits([('a', 'x')])\n"
        "def boom():\n"
        "    raise ZeroDivisionError('nope')\n"
        "def deep():\n"
        "    return deep()\n"
        "def quits():\n"
        "    sys.exit(0)\n"
    )
    (tmp_path / "hostile_import.py").write_text("raise RuntimeError('import-time failure')\n")
    (tmp_path / "hostile_exit.py").write_text("import sys\nsys.exit(0)\n")
    return tmp_path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["convert", "flax", "..m:X"], "`..m` is not a module name"),
        (["convert", "regex", ".hostile_src:WEIRD"], "is not a module name"),
        (["convert", "flax", "sys:exit"], "names a function that exited (SystemExit: None)"),
        (["convert", "flax", "hostile_src:quits"], "exited (SystemExit: 0)"),
        (["convert", "flax", "hostile_src:boom"], "raised ZeroDivisionError: nope"),
        (["convert", "regex", "hostile_src:deep"], "raised RecursionError"),
        (["convert", "flax", "hostile_src:WEIRD"], "reading it raised RuntimeError: no length"),
        (["convert", "regex", "hostile_src:QUITS"], "reading it raised SystemExit: 3"),
        (["convert", "flax", "hostile_import:X"], "importing it raised RuntimeError: import-time failure"),
        (["convert", "flax", "hostile_exit:X"], "importing it exited (SystemExit: 0)"),
        (["convert", "hf", "deep.json"], "deep.json: nested too deeply to read"),
        (["convert", "maxtext", "deep.yml"], "deep.yml:1: nested more than 64 deep"),
        (["convert", "maxtext", "bomb.yml"], "bomb.yml:6: holds more than 100,000 values"),
        (["convert", "maxtext", "list.yml"], "expected a MaxText config (a YAML mapping), got list"),
        (["convert", "hf", "list.json"], "expected a JSON object (a plan or a config.json), got list"),
    ],
)
def test_every_failure_exits_2_with_a_message(
    args: list[str], message: str, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workdir / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (workdir / "deep.yml").write_text("[" * 500 + "]" * 500)
    (workdir / "bomb.yml").write_text(BILLION_LAUGHS)
    (workdir / "list.yml").write_text("- a\n- b\n")
    (workdir / "list.json").write_text("[1, 2]")
    status, out, err = run(args, capsys)
    assert (status, out) == (2, ""), err
    assert err.startswith("shardrules convert: ") and message in err, err
    assert "Traceback" not in err and len(err.splitlines()) <= 3, err


def test_standard_input_is_bounded_and_read_as_a_file(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Stdin:
        def __init__(self, data: bytes):
            self.buffer = __import__("io").BytesIO(data)

    monkeypatch.setattr(sys, "stdin", Stdin(b"x" * (_common.MAX_SOURCE_BYTES + 1)))
    status, _, err = run(["convert", "hf", "-"], capsys)
    assert status == 2 and "<stdin>: larger than 4 MiB" in err
    monkeypatch.setattr(sys, "stdin", Stdin(b"\xff\xfe"))
    status, _, err = run(["convert", "maxtext", "-"], capsys)
    assert status == 2 and "<stdin>: not UTF-8 text" in err
    monkeypatch.setattr(sys, "stdin", Stdin(BILLION_LAUGHS.encode()))
    status, _, err = run(["convert", "maxtext", "-"], capsys)
    assert status == 2 and "<stdin>:6: holds more than 100,000 values" in err
    monkeypatch.setattr(sys, "stdin", Stdin(json.dumps({"a": f"x\n{INJECTED}"}).encode()))
    status, out, err = run(["convert", "hf", "-"], capsys)
    assert status == 1 and _rule_patterns(out) == [None]
    assert len(err.splitlines()) == 1  # the note, on one line


def test_a_recursion_or_memory_error_anywhere_is_exit_2(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line's last guard, for inputs nested deeper than a reader expected."""
    from shardrules._cli import _convert

    for error, message in [(RecursionError, "nested too deeply to read"), (MemoryError, "out of memory")]:

        def fail(args: object, error: type[BaseException] = error) -> object:
            raise error()

        monkeypatch.setattr(_convert, "_convert", fail)
        status, out, err = run(["convert", "hf", "x.json"], capsys)
        assert (status, out) == (2, "") and message in err and "Traceback" not in err


# ------------------------------------------------------------- YAML read once, refused at the bound


@pytest.fixture(params=["libyaml", "python"])
def yaml_loader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """PyYAML with libyaml (its C parser and loader), and without: PyYAML's own."""
    yaml = pytest.importorskip("yaml", reason="the YAML reader needs PyYAML")
    if request.param == "libyaml" and not hasattr(yaml, "CSafeLoader"):
        pytest.skip("this PyYAML has no libyaml")
    if request.param == "python":
        monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    return request.param


def _counting_events(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """How many events the parsers hand out (the C parser's through
    `yaml.parse`, PyYAML's own through `Parser.get_event`), and how many
    objects are constructed."""
    import yaml

    events, built = [0], [0]
    real_parse, real_get = yaml.parse, yaml.parser.Parser.get_event
    real_construct = yaml.constructor.BaseConstructor.construct_object

    def parse(*args, **kwargs):
        for event in real_parse(*args, **kwargs):
            events[0] += 1
            yield event

    def get_event(self):
        events[0] += 1
        return real_get(self)

    def construct_object(self, node, deep=False):
        built[0] += 1
        return real_construct(self, node, deep)

    monkeypatch.setattr(yaml, "parse", parse)
    monkeypatch.setattr(yaml.parser.Parser, "get_event", get_event)
    monkeypatch.setattr(yaml.constructor.BaseConstructor, "construct_object", construct_object)
    return events, built


def test_a_bomb_is_refused_at_its_event_with_nothing_after_it_parsed_or_built(
    yaml_loader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The billion laughs, then 20,000 lines of ordinary config: refused at
    the alias that crosses the bound, having taken about as many events as
    the bomb has (not the 100,000 after it), constructing nothing."""
    tail = "".join(f"k{i}: [a, b]\n" for i in range(20_000))
    events, built = _counting_events(monkeypatch)
    start = time.perf_counter()
    with pytest.raises(SourceError, match=f"bomb.yml:6: holds more than {MAX_NODES:,} values"):
        parse_yaml(BILLION_LAUGHS + tail, "bomb.yml")
    assert time.perf_counter() - start < 5  # a hang guard: milliseconds
    bomb_events = 4 + 2 * 9 + 10 + 8 * (2 + 9 + 2) + 2 + 4  # stream, document, keys, lists, aliases
    assert 0 < events[0] <= bomb_events + 10, events
    assert built == [0]
    deep = "a: " + "[" * 10_000 + "]" * 10_000 + "\n"
    with pytest.raises(SourceError, match=r"nested more than 64 deep|maximum nesting depth"):
        parse_yaml(deep, "deep.yml")
    assert events[0] <= bomb_events + 10 + 100 and built == [0]


def test_yaml_is_parsed_once_without_libyaml(monkeypatch: pytest.MonkeyPatch) -> None:
    """PyYAML's own loader is checked as it composes: each event is parsed
    once (the C parser's events are checked in a pass of their own, as its
    composer cannot be watched)."""
    yaml = pytest.importorskip("yaml", reason="the YAML reader needs PyYAML")
    monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    text = "".join(f"k{i}: &a{i} [a, {{b: c}}]\nv{i}: *a{i}\n" for i in range(100))
    in_text = len(list(yaml.parse(text, Loader=yaml.SafeLoader)))
    events, _ = _counting_events(monkeypatch)
    data = parse_yaml(text, "x.yml")
    assert events == [in_text]
    assert data == yaml.load(text, Loader=yaml.SafeLoader)


def _anchored_config(n: int) -> tuple[str, str]:
    """A MaxText config of `n` logical axis rules written with anchors,
    aliases and a merge key (`<<: *base` at the top), and the same config
    written out: `benchmarks/yaml_configs.py`'s, which times reading it."""
    here = Path(__file__).resolve().parent.parent / "benchmarks" / "yaml_configs.py"
    spec = importlib.util.spec_from_file_location("_benchmark_yaml_configs", here)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.configs(n)


def test_a_4000_rule_config_of_anchors_and_merge_keys_reads_as_its_expanded_form(yaml_loader: str) -> None:
    """Aliases and a merge key read as the data they stand for: the same
    rules, converted, as the config written out; within the bounds (the
    merge counted as the nodes it copies)."""
    anchored, plain = _anchored_config(4000)
    start = time.perf_counter()
    data = parse_yaml(anchored, "anchored.yml")
    assert time.perf_counter() - start < 20  # a hang guard: a fraction of a second with libyaml
    data.pop("base")
    assert data == parse_yaml(plain, "plain.yml")
    assert len(data["logical_axis_rules"]) == 4000
    one = sr.convert_maxtext(data, source="x.yml")
    assert one.text == sr.convert_maxtext(parse_yaml(plain, "plain.yml"), source="x.yml").text
    assert not one.notes and "\nalias m3994 = (fsdp, tensor) | _\n" in one.text
