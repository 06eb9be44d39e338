"""Plan files read strictly: `Plan.from_json` raises only `PlanFileError`
(SR124) or returns a plan that round-trips, whatever the text; `shardrules
diff` on any file exits 0, 1 or 2 without a traceback; bytes to move are
exact, however large; meshes too large to look at device by device are
refused where they are read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardrules as sr
from shardrules._cli._main import main
from shardrules._planning._mesh import MAX_DEVICES
from shardrules._reports._dumpread import loads
from shardrules._reports._plandiff import compare

S = jax.ShapeDtypeStruct
RULES = """mesh fsdp, model

rules params:
  "kernel$"   -> (fsdp, model)
  "bias$"     -> (model)
  "embedding" -> ((fsdp, model), _)
  default     -> replicated
"""


def _tree() -> dict[str, Any]:
    return {
        "embedding": S((64, 16), jnp.bfloat16),
        "layers": [{"kernel": S((16, 32), jnp.float32), "bias": S((32,), jnp.float32)} for _ in range(3)],
        "norm": {"scale": S((32,), jnp.float32)},
        "step": S((), jnp.int32),
        "one": S((1, 1), jnp.float32),
        "act": "relu",
        'odd "path"\\é': S((8,), jnp.float32),
    }


def _seeds() -> list[str]:
    rules = sr.loads(RULES, name="sharding/model.shard")
    tree = _tree()
    explicit = jax.make_mesh((4, 2), ("fsdp", "model"))
    no_sizes = sr.loads(RULES.replace('"embedding" -> ((fsdp, model), _)', '"embedding" -> (fsdp, _)'))
    return [
        sr.plan(tree, rules, {"fsdp": 4, "model": 2}).to_json(),
        sr.plan(tree, rules, explicit).to_json(),
        sr.plan(tree, no_sizes).to_json(),  # no mesh
        sr.plan({"key": jax.eval_shape(lambda: jax.random.key(0))}, rules, {"fsdp": 1, "model": 1}).to_json(),
    ]


SEEDS = _seeds()


def _leaves(plan: sr.Plan) -> list[tuple[Any, ...]]:
    return [(x.path, x.shape, x.dtype, x.spec, x.bytes_per_device, x.why, x.where) for x in plan]


def _read(text: str | bytes) -> sr.Plan | None:
    """The property: a `PlanFileError` (SR124), or a plan that round-trips
    and makes its report and a diff with itself."""
    try:
        plan = sr.Plan.from_json(text)
    except sr.PlanFileError as err:
        assert err.code == "SR124" and str(err).startswith("SR124 not a shardrules plan file: "), str(err)
        assert isinstance(err, ValueError)
        return None
    written = plan.to_json()
    again = sr.Plan.from_json(written)
    assert again.to_json() == written
    assert _leaves(again) == _leaves(plan)
    assert plan._repr_html_().startswith('<div class="sr-plan">')
    table = loads(written)
    assert compare(table, table).equal
    return plan


def _like_dump(data: Any) -> str:
    """`data` laid out as `shardrules dump` lays out a file (one leaf a line),
    so that mutated files also take the line-by-line reading; other values as JSON."""
    if not isinstance(data, dict) or not isinstance(data.get("leaves"), list):
        return json.dumps(data)
    head = [
        f"  {json.dumps(k)}: {json.dumps(v, separators=(', ', ': '))},"
        for k, v in data.items()
        if k != "leaves"
    ]
    lines = ["    " + json.dumps(leaf, separators=(", ", ": ")) for leaf in data["leaves"]]
    leaves = '  "leaves": [' + ("\n" + ",\n".join(lines) + "\n  ]" if lines else "]")
    return "\n".join(["{", *head, leaves]) + "\n}\n"


def test_the_seeds_round_trip_in_both_readings() -> None:
    for seed in SEEDS:
        assert _like_dump(json.loads(seed)) == seed  # the campaign's layout is the writer's
        plan = _read(seed)
        assert plan is not None and plan.to_json() == seed
        pretty = json.dumps(json.loads(seed), indent=2)  # read as JSON, not line by line
        assert sr.Plan.from_json(pretty).to_json() == seed


# ---------------------------------------------------------------- the red team's files, one by one


def _edit(seed: int, old: str, new: str) -> str:
    text = SEEDS[seed]
    assert old in text, old
    return text.replace(old, new, 1)


REFUSED = {
    "mesh size 0": (
        _edit(0, '"size": 2', '"size": 0'),
        "mesh axis 'model' is a whole number of at least 1, not 0",
    ),
    "mesh size Infinity": (_edit(0, '"size": 2', '"size": Infinity'), "not Infinity"),
    "mesh size 2**40": (
        _edit(0, '"size": 2', '"size": 1099511627776'),
        "a plan file's mesh has at most 1048576",
    ),
    "mesh size 4.7": (_edit(0, '"size": 2', '"size": 4.7'), "not 4.7"),
    "mesh size true": (_edit(0, '"size": 2', '"size": true'), "not true"),
    "mesh size text": (_edit(0, '"size": 2', '"size": "2"'), 'not "2"'),
    "mesh size 1e400": (_edit(0, '"size": 2', '"size": 1e400'), "not Infinity"),
    "a spec as text": (
        _edit(0, '"spec": ["model"]', '"spec": "dm"'),
        'an array\'s spec is a list of entries, not "dm"',
    ),
    "version true": (
        _edit(0, '"version": 1', '"version": true'),
        "version true; this shardrules reads versions 1, 2, 3 and 4",
    ),
    "version 1.0": (_edit(0, '"version": 1', '"version": 1.0'), "version 1.0"),
    "version 5": (
        _edit(0, '"version": 1', '"version": 5'),
        "version 5; this shardrules reads versions 1, 2, 3 and 4",
    ),
    "version 3 without a cost": (
        _edit(0, '"version": 1', '"version": 3'),
        "the file lacks the key 'step_cost'",
    ),
    "version 2 without a cost": (
        _edit(0, '"version": 1', '"version": 2'),
        "the file lacks the key 'step_cost'",
    ),
    "unknown top key": (_edit(0, '"group": "params",', '"group": "params", "note": 1,'), 'the key "note"'),
    "unknown leaf key": (_edit(0, '"bytes": 0}', '"bytes": 0, "extra": null}'), 'has the key "extra"'),
    "unknown axis key": (
        _edit(0, '"type": "unknown"}', '"type": "unknown", "devices": []}'),
        'the key "devices"',
    ),
    "missing key": (_edit(0, '"arrays": 11,\n', ""), "the file lacks the key 'arrays'"),
    "key twice": (_edit(0, '"bytes": 0}', '"bytes": 0, "bytes": 0}'), 'the key "bytes" is written twice'),
    "negative dimension": (_edit(0, '"shape": [16, 32]', '"shape": [16, -32]'), "dimension 1 of the shape"),
    "dimension 4.7": (
        _edit(0, '"shape": [16, 32]', '"shape": [16, 4.7]'),
        "a shape is a list of whole numbers",
    ),
    "dimension true": (
        _edit(0, '"shape": [16, 32]', '"shape": [16, true]'),
        "a shape is a list of whole numbers",
    ),
    "absurd array": (_edit(0, '"shape": [16, 32]', '"shape": [1125899906842624, 32]'), "more than any array"),
    "65 dimensions": (
        _edit(0, '"shape": [32]', '"shape": [' + ", ".join(["1"] * 64) + ", 32]"),
        "65 dimensions",
    ),
    "dtype not as JAX writes it": (
        _edit(0, '"dtype": "int32"', '"dtype": "i4"'),
        '"i4" is not a dtype JAX knows',
    ),
    "dtype JAX cannot hold": (_edit(0, '"dtype": "int32"', '"dtype": "object"'), '"object" is not a dtype'),
    "dtype NumPy parses as Python": (_edit(0, '"dtype": "int32"', '"dtype": "(2,f4"'), "is not a dtype"),
    "axis type bogus": (_edit(0, '"type": "unknown"}', '"type": "bogus"}'), 'the type "bogus"'),
    "axis types mixed": (_edit(1, '"type": "explicit"}', '"type": "unknown"}'), "for some axes only"),
    "axis twice": (_edit(0, '"name": "model"', '"name": "fsdp"'), "two axes named 'fsdp'"),
    "uneven split": (
        _edit(
            0,
            '"shape": [32], "dtype": "float32", "spec": ["model"]',
            '"shape": [33], "dtype": "float32", "spec": ["model"]',
        ),
        "dimension 0 (33) does not divide into 2 blocks",
    ),
    "totals": (_edit(0, '"arrays": 11', '"arrays": 12'), '"arrays" is 12, but the leaves make 11'),
    "a leaf of a plan with errors": (_edit(0, '"rule": "default"', '"rule": "error"'), "a plan with errors"),
    "not an array with a shape": (_edit(0, '"shape": null', '"shape": [1]'), "a leaf that is not an array"),
    "leaves not a list": (
        json.dumps({**json.loads(SEEDS[0]), "leaves": {}}),
        '"leaves" is a list of leaves, not {}',
    ),
    "deep nesting": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "deeper in an object": ('{"format": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    "not JSON": ("{", "it is not JSON"),
    "5,000 digits": (_edit(0, '"bytes_per_device": ', '"bytes_per_device": ' + "9" * 5000), "not JSON"),
    "a file name": ("plan.json", "looks like a file name"),
    "no format": ('{"version": 1}', 'no "format": "shardrules-plan"'),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_hand_edits_and_hostile_files_are_refused_with_sr124(case: str) -> None:
    text, message = REFUSED[case]
    with pytest.raises(sr.PlanFileError, match=None) as info:
        sr.Plan.from_json(text)
    assert info.value.code == "SR124"
    assert message in str(info.value), str(info.value)


def test_bytes_that_are_not_utf8_are_sr124() -> None:
    with pytest.raises(sr.PlanFileError, match="not UTF-8"):
        sr.Plan.from_json(b'{"format": "\xff"}')


@pytest.mark.parametrize("case", ["mesh size 0", "mesh size Infinity", "mesh size 2**40", "a spec as text"])
def test_diff_refuses_such_files_with_exit_2(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("a.json").write_text(SEEDS[0])
    Path("b.json").write_text(REFUSED[case][0])
    assert main(["diff", "a.json", "b.json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("shardrules diff: b.json: SR124 not a shardrules plan file: ")
    assert "hint: " in err and "Traceback" not in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_diff_refuses_a_fifo_or_a_bad_name_instead_of_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("a.json").write_text(SEEDS[0])
    os.mkfifo("fifo.json")
    assert main(["diff", "a.json", "fifo.json"]) == 2
    assert "fifo.json: not a regular file" in capsys.readouterr().err
    assert main(["diff", "a.json", "b\0.json"]) == 2
    assert "Traceback" not in capsys.readouterr().err


# ---------------------------------------------------------------- bytes to move, exactly


def test_bytes_to_move_are_python_integers_beyond_2_to_the_63(tmp_path: Path) -> None:
    """16,384 arrays of 1 PiB, sharded over 1,024 devices, then replicated: each
    device receives 2**64 - 2**54 bytes, more than a 64-bit integer holds."""
    tree = {f"w{i}": S((2**48,), jnp.float32) for i in range(2**14)}
    sharded = sr.loads('rules params:\n  "w" -> (data)\n', name="a.shard")
    replicated = sr.loads('rules params:\n  "w" -> (_)\n', name="b.shard")
    a = loads(sr.plan(tree, sharded, {"data": 1024}).to_json())
    b = loads(sr.plan(tree, replicated, {"data": 1024}).to_json())
    diff = compare(a, b)
    assert diff.moved_per_device == 2**64 - 2**54
    assert diff.moved_total == 1024 * (2**64 - 2**54)
    assert diff.changes[0].bytes_per_device == 2**64 - 2**54
    assert b.bytes_per_device == 2**64 and "to move: 16760832.0 TiB per device" in diff.text()
    assert json.loads(json.dumps(diff.as_json()))["move"]["total_bytes"] == 1024 * (2**64 - 2**54)


# ---------------------------------------------------------------- meshes too large to look at


def test_command_line_meshes_are_limited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("m.shard").write_text('mesh data, model\nrules params:\n  "w" -> (data, model)\n')
    Path("big.shard").write_text('mesh data=1099511627776, model=4\nrules params:\n  "w" -> (data?, model)\n')
    Path("s.json").write_text(json.dumps({"w": [[1024, 512], "float32"]}))
    for argv in (
        ["explain", "m.shard", "--shapes", "s.json", "--mesh", "data=1099511627776,model=4"],
        ["lint", "m.shard", "--shapes", "s.json", "--mesh", f"data={MAX_DEVICES},model=2"],
        [
            "diff",
            "m.shard",
            "m.shard",
            "--shapes",
            "s.json",
            "--mesh",
            "data=2,model=4",
            "--mesh-b",
            "data=524288",
        ],
        ["explain", "big.shard", "--shapes", "s.json"],
    ):
        assert main(argv) == 2, argv
        _, err = capsys.readouterr()
        assert f"shardrules checks meshes of at most {MAX_DEVICES}" in err and "Traceback" not in err, err
    assert main(["lint", "m.shard", "--shapes", "s.json", "--mesh", f"data={MAX_DEVICES // 4},model=4"]) == 1
    capsys.readouterr()  # SR104: 1024 does not divide by 262144, and no more than that


# ---------------------------------------------------------------- the campaign


_KEYS = ["format", "version", "rules", "group", "mesh", "arrays", "bytes_per_device", "total_bytes", "leaves",
         "name", "size", "type", "path", "shape", "dtype", "spec", "rule", "bytes"]  # fmt: skip
_WORDS = ["float32", "bfloat16", "int32", "f4", "key<fry>", "unconstrained", "fsdp", "model", "explicit",
          "auto", "manual", "unknown", "not an array", "default", "", "dm", "object", "(2,f4", "error",
          "shardrules-plan", "model.shard:4"]  # fmt: skip
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, 1, 2, -1, 4, 8, 2**20, 2**40, 2**50, 2**63, 2**64])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(_WORDS)
    | st.text(max_size=6)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=8,
)


def _places(value: Any, where: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [where]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _places(item, (*where, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _places(item, (*where, i))
    return found


def _at(value: Any, where: tuple[Any, ...]) -> Any:
    for step in where:
        value = value[step]
    return value


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A seed with one to three edits: a value replaced, a key or an item
    removed or added, or the text itself cut, spliced or its lines shuffled."""
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 3))):
        how = draw(
            st.sampled_from(["tweak", "tweak", "replace", "replace", "remove", "add", "text", "lines"])
        )
        if how == "text":
            start = draw(st.integers(0, len(text)))
            end = draw(st.integers(start, min(len(text), start + 12)))
            text = (
                text[:start]
                + draw(st.text(alphabet='{}[]",:0123456789.-eE truenlfsaIiy\\\n', max_size=8))
                + text[end:]
            )
            continue
        if how == "lines":
            lines = text.split("\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], draw(st.sampled_from([lines[i], ""]))
            text = "\n".join(lines)
            continue
        try:
            data = json.loads(text)
        except ValueError:
            continue  # a text edit left no JSON: only more text edits apply
        where = draw(st.sampled_from(_places(data)))
        if how == "tweak" and where:  # a value of about the right kind: a near number, a known word
            value = _at(data, where)
            near = (
                st.sampled_from(
                    [value + 1, value - 1, -value, 0, value * 2**40, float(value), str(value), True]
                )
                if isinstance(value, int) and not isinstance(value, bool)
                else st.sampled_from(_WORDS)
            )
            _at(data, where[:-1])[where[-1]] = draw(near)
        elif how == "replace":
            if not where:
                data = draw(_VALUES)
            else:
                _at(data, where[:-1])[where[-1]] = draw(_VALUES)
        elif how == "remove" and where:
            del _at(data, where[:-1])[where[-1]]
        elif how == "add":
            target = _at(data, where)
            if isinstance(target, dict):
                target[draw(st.sampled_from(_KEYS) | st.text(max_size=4))] = draw(_VALUES)
            elif isinstance(target, list):
                target.insert(draw(st.integers(0, len(target))), draw(_VALUES))
        text = (
            _like_dump(data)
            if draw(st.booleans())
            else json.dumps(data, indent=draw(st.sampled_from([None, 1])))
        )
    return text


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=mutated())
def test_any_mutation_of_a_dump_reads_back_or_is_sr124(text: str) -> None:
    _read(text)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_VALUES)
def test_any_json_value_reads_back_or_is_sr124(value: Any) -> None:
    _read(json.dumps(value))


@settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    max_examples=40,
)
@given(text=mutated())
def test_diff_of_any_mutation_exits_0_1_or_2(
    text: str, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path_factory.mktemp("diff")
    (folder / "seed.json").write_text(SEEDS[0], encoding="utf-8")
    (folder / "edited.json").write_text(text, encoding="utf-8", errors="surrogatepass")
    for a, b in (("seed.json", "edited.json"), ("edited.json", "edited.json")):
        status = main(["diff", str(folder / a), str(folder / b), "--format", "json"])
        out, err = capsys.readouterr()
        assert status in (0, 1, 2) and "Traceback" not in err
        if status == 2:
            assert out == "" and err.startswith(f"shardrules diff: {folder / 'edited.json'}: "), err
            continue
        move = json.loads(out)["move"]
        assert move["bytes_per_device"] >= 0 and move["total_bytes"] >= 0
        assert move["total_bytes"] >= move["bytes_per_device"]
