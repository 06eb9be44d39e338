"""A campaign against the converters: generated YAML and JSON documents
(random nesting, anchors and aliases, merge keys, tags, odd scalars, strings
with line breaks, quotes and `#`) and generated rule lists.

For every input, a converter either returns a rule file or raises the
converters' `SourceError` (the command line's exit 2) — nothing else, and
quickly — and a rule file it returns parses, loads, and holds only what the
input's rules say: aliases named by the input's logical names with its axes
(maxtext, flax), patterns of the input's keys (hf) or its regexes (regex), the
`mesh` line's axes from the input. Sizes are kept small: a hang shows as a
slow example, and each conversion must end within seconds.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardrules as sr
from shardrules._cli._main import main
from shardrules._convert._common import SourceError, is_name, pattern_literal
from shardrules._convert._documents import parse_json, parse_yaml
from shardrules._convert._hf import STYLES, UNCONVERTIBLE, _pattern
from shardrules._convert._hf import from_document as hf_document
from shardrules._convert._maxtext import from_document as maxtext_document
from shardrules._language._parse import parse
from shardrules._language._syntax import Alias, Comment, MeshDecl, RuleLine, RulesHeader

NAMES = [
    "data",
    "fsdp",
    "model",
    "embed",
    "mlp",
    "heads",
    "auto",
    "mesh",
    "rules",
    "default",
    "if",
    "_",
    "x y",
]
PIECES = [
    '"',
    "'",
    "#",
    "\n",
    "\r",
    "\r\n",
    "\\",
    ":",
    "- ",
    "[",
    "]",
    "{",
    "}",
    "&a",
    "*a",
    "!",
    "|",
    ">",
    "->",
]
PIECES += ["\t", " ", "é", "\x85", "\u2028", "\x00", "a", "7", "{,}", '"x" -> (model)', "\nrules p:\n  "]

odd_text = st.lists(st.sampled_from(PIECES + NAMES), max_size=6).map("".join)
names = st.sampled_from(NAMES) | odd_text
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | names
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(names, inner, max_size=4),
    max_leaves=12,
)
axes = st.none() | names | st.lists(names, max_size=3) | values
logical_rule = st.tuples(names, axes).map(list) | values


@st.composite
def shared(draw: st.DrawFn, items: st.SearchStrategy[Any]) -> list[Any]:
    """A list of `items` in which some entries are the same object: PyYAML
    writes those as an anchor and aliases."""
    out = draw(st.lists(items, max_size=8))
    if out and draw(st.booleans()):
        out += [out[draw(st.integers(0, len(out) - 1))]] * draw(st.integers(1, 4))
    return out


@st.composite
def maxtext_configs(draw: st.DrawFn) -> Any:
    rules = draw(shared(logical_rule) | values)
    config: dict[str, Any] = {"logical_axis_rules": rules}
    if draw(st.booleans()):
        config["mesh_axes"] = draw(st.lists(names, max_size=4) | values)
    for key in draw(st.lists(st.sampled_from(["base_config", "data_sharding", "custom_mesh_and_rule"]))):
        config[key] = draw(values)
    if isinstance(rules, list) and rules and isinstance(rules[0], list) and draw(st.booleans()):
        config["mesh_axes"] = rules[0]  # an alias across keys
    return draw(st.just(config) | values) if draw(st.integers(0, 9)) == 0 else config


YAML_PIECES = [
    "logical_axis_rules: ", "mesh_axes: ", "base_config: ", "[", "]", "{", "}", ", ", "\n", "  ", "- ",
    "&a ", "*a", "&b ", "*b", "<<: ", "? ", ": ", "'x\n y'", '"q\\"\n#"', "# c\n", "!!binary aGk=",
    "!!python/object:os.system {}", "!!set {a}", "!!omap [a: 1]", "0x1F", "1e400", ".nan", "~", "yes",
    "2001-12-14", "data", "fsdp", "embed", "|\n  text\n", ">\n  x\n", "---\n", "...\n", "%YAML 1.1\n",
    "[embed, fsdp]", "[mlp, [fsdp, model]]", '"a\\nb"', "9" * 40,
]  # fmt: skip

yaml_texts = st.lists(st.sampled_from(YAML_PIECES), max_size=24).map("".join)


def _hang_guard(start: float) -> None:
    assert time.perf_counter() - start < 10, "a conversion took over 10 s"


def _strings(raw: Any) -> set[str]:
    """Every string in `raw`, at any depth (the names an input holds)."""
    found: set[str] = set()
    stack, seen = [raw], set()
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.add(item)
        elif isinstance(item, (list, tuple, dict)) and id(item) not in seen:
            seen.add(id(item))
            stack.extend(item.items() if isinstance(item, dict) else item)
    return found


def _logical_axes(raw: Any) -> dict[str, set[str]]:
    """logical name -> the axes its rules in `raw` name."""
    out: dict[str, set[str]] = {}
    if isinstance(raw, (list, tuple)):
        for rule in raw:
            if isinstance(rule, (list, tuple)) and len(rule) == 2 and isinstance(rule[0], str):
                out.setdefault(rule[0], set()).update(_strings(rule[1]))
    return out


def _check_logical(text: str, rules: Any, mesh_axes: Any, rng_rule: bool = False) -> None:
    """Only aliases of the input's names, with the input's axes for that name;
    the rules: `default -> logical` (and, from MaxText, the fixed rule
    replicating its RNG streams)."""
    allowed = _logical_axes(rules)
    for item in parse(text).items:
        if isinstance(item, Comment):
            continue
        if isinstance(item, MeshDecl):
            assert {a.name for a in item.axes} <= _strings(mesh_axes)
        elif isinstance(item, Alias):
            assert item.name in allowed, item.name
            targets = [item.target, *(more.target for more in item.more)]
            assert {ref.name for target in targets for ref in target} <= allowed[item.name], item
        elif isinstance(item, RulesHeader):
            assert item.group == "params"
        else:
            assert isinstance(item, RuleLine), item
            fixed = rng_rule and item.pattern == "(^|/)rngs/" and item.spec.kind == "replicated"
            assert fixed or (item.pattern is None and item.spec.kind == "logical"), item


def _converted(conversion: sr.Conversion) -> None:
    """What every conversion returned must be: it loads; its notes are one line each."""
    assert isinstance(sr.loads(conversion.text), sr.RuleSet)
    assert all("\n" not in note and "\r" not in note for note in conversion.notes)


def _maxtext(data: Any) -> None:
    start = time.perf_counter()
    try:
        conversion = maxtext_document(data, "<campaign>")
    except SourceError:
        return
    finally:
        _hang_guard(start)
    _converted(conversion)
    _check_logical(conversion.text, data["logical_axis_rules"], data.get("mesh_axes"), rng_rule=True)


def _flax(rules: Any) -> None:
    if isinstance(rules, str):  # a str is a module:attr to import
        return
    start = time.perf_counter()
    try:
        conversion = sr.convert_flax(rules, source="<campaign>")
    except SourceError:
        return
    finally:
        _hang_guard(start)
    _converted(conversion)
    _check_logical(conversion.text, rules, None)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=maxtext_configs())
def test_maxtext_and_flax_on_generated_yaml(config: Any) -> None:
    text = yaml.safe_dump(config, allow_unicode=bool(hash(repr(config)) % 2))  # shared objects: aliases
    try:
        data = parse_yaml(text, "<campaign>")
    except SourceError:
        return
    _maxtext(data)
    if isinstance(data, dict) and "logical_axis_rules" in data:
        _flax(data["logical_axis_rules"])


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=yaml_texts)
def test_maxtext_on_generated_yaml_text(text: str) -> None:
    start = time.perf_counter()
    try:
        data = parse_yaml(text, "<campaign>")
    except SourceError:
        return
    finally:
        _hang_guard(start)
    _maxtext(data)


STYLE_NAMES = sorted([*STYLES, *UNCONVERTIBLE])
hf_keys = st.lists(st.sampled_from(["layers", "*", "0", "self_attn", "q_proj", "bias", "weight", "a.b"]) | odd_text,
                   min_size=1, max_size=4).map(".".join)  # fmt: skip
hf_plans = st.dictionaries(hf_keys, st.sampled_from(STYLE_NAMES) | odd_text | values, max_size=6)


def _hf_patterns(plan: Any) -> set[str]:
    keys = [k for k in plan if isinstance(k, str)] if isinstance(plan, dict) else []
    return {pattern_literal(_pattern(k, param))[1:-1] for k in keys for param in (None, "bias")}


def _hf(data: Any) -> None:
    start = time.perf_counter()
    try:
        conversion = hf_document(data, "model", "<campaign>")
    except SourceError:
        return
    finally:
        _hang_guard(start)
    _converted(conversion)
    plan = data
    for key in ("base_model_tp_plan", "tp_plan"):
        if isinstance(data, dict) and isinstance(data.get(key), dict):
            plan = data[key]
            break
    allowed = _hf_patterns(plan)
    for statement in parse(conversion.text).statements:
        if isinstance(statement, RuleLine):
            assert statement.pattern is None or statement.pattern in allowed, statement.pattern
        elif isinstance(statement, MeshDecl):
            assert [a.name for a in statement.axes] == ["model"]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=hf_plans
    | st.dictionaries(st.sampled_from(["base_model_tp_plan", "tp_plan", "x"]), hf_plans | values)
)
def test_hf_on_generated_json(plan: Any) -> None:
    text = json.dumps(plan)
    _hf(parse_json(text, "<campaign>"))


json_texts = st.lists(st.sampled_from(['{"a": ', '"b"', "[", "]", "{", "}", ",", ":", '"colwise"', '"x\\ny"',
                                       "1e999", "-0", "NaN", "null", '"\\ud800"', '"layers.*.q"', " "]),
                      max_size=30).map("".join)  # fmt: skip


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=json_texts)
def test_hf_on_generated_json_text(text: str) -> None:
    try:
        data = parse_json(text, "<campaign>")
    except SourceError:
        return
    _hf(data)


REGEX_PIECES = ["a", "/", "\\d", "+", "*", "{,}", "{,2}", "(", ")", "(?<=x)", "\\1", "[^[:alpha:]]", "\n", '"',
                "\\", "#", "->", "kernel", "$", "|", ".", "[", "]", "(?i)", "é"]  # fmt: skip
regexes = st.lists(st.sampled_from(REGEX_PIECES), min_size=1, max_size=6).map("".join) | values
spec_entries = st.none() | names | st.lists(names | st.none(), max_size=3) | values
regex_rules = st.lists(
    st.tuples(regexes, st.lists(spec_entries, max_size=3) | values).map(list) | values, max_size=6
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules=regex_rules)
def test_regex_on_generated_rules(rules: Any) -> None:
    data = parse_json(json.dumps(rules), "<campaign>")  # what a JSON document holds
    start = time.perf_counter()
    try:
        conversion = sr.convert_regex(data, source="<campaign>")
    except SourceError:
        return
    finally:
        _hang_guard(start)
    _converted(conversion)
    allowed = {
        pattern_literal(r[0])[1:-1] for r in data if isinstance(r, list) and r and isinstance(r[0], str)
    }
    mesh = _strings(data)
    for statement in parse(conversion.text).statements:
        if isinstance(statement, RuleLine):
            assert statement.pattern in allowed, statement.pattern
        elif isinstance(statement, MeshDecl):
            assert all(is_name(a.name) and a.name in mesh for a in statement.axes)


@pytest.mark.parametrize("fmt", ["maxtext", "hf"])
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
          max_examples=30)  # fmt: skip
@given(text=yaml_texts | json_texts)
def test_cli_on_generated_text_exits_0_1_or_2(
    fmt: str, text: str, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command line: exit 0 or 1 with a rule file that loads, or 2 with a message."""
    source = tmp_path_factory.mktemp("campaign") / "source.txt"
    source.write_text(text, encoding="utf-8", errors="surrogatepass")
    status = main(["convert", fmt, str(source)])
    out, err = capsys.readouterr()
    assert status in (0, 1, 2)
    if status == 2:
        assert err.startswith("shardrules convert: ") and out == "" and "Traceback" not in err
    else:
        assert isinstance(sr.loads(out), sr.RuleSet)
