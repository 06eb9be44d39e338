"""`shardrules dump`, `shardrules diff`, `Plan.to_json`/`from_json` and
`sr.assert_plan_matches`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import shardrules as sr
from shardrules._cli._main import main

RULES = """mesh fsdp=8, model=2

rules params:
  "kernel$" -> (fsdp, model)
  "bias$"   -> (model)
  default   -> replicated
"""
EDITED = RULES.replace('"kernel$" -> (fsdp, model)', '"kernel$" -> (model, fsdp)')


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rules.shard").write_text(RULES)
    (tmp_path / "edited.shard").write_text(EDITED)
    shapes = {f"layers/{i}/kernel": [[16, 64], "float32"] for i in range(160)}
    shapes |= {f"layers/{i}/bias": [[64], "bfloat16"] for i in range(160)}
    shapes["norm/scale"] = [[64], "float32"]
    (tmp_path / "shapes.json").write_text(json.dumps(shapes))
    return tmp_path


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_dump_is_deterministic_and_reads_back(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, first, _ = _run(capsys, "dump", "rules.shard", "--shapes", "shapes.json")
    assert status == 0
    assert _run(capsys, "dump", "rules.shard", "--shapes", "shapes.json", "-o", "plan.json")[0] == 0
    assert (files / "plan.json").read_text() == first  # byte-identical, file or stdout
    data = json.loads(first)
    assert (data["format"], data["version"], data["rules"], data["group"]) == (
        "shardrules-plan",
        1,
        "rules.shard",
        "params",
    )
    assert data["mesh"] == [
        {"name": "fsdp", "size": 8, "type": "unknown"},
        {"name": "model", "size": 2, "type": "unknown"},
    ]
    paths = [leaf["path"] for leaf in data["leaves"]]
    assert paths == sorted(paths) and len(paths) == 321
    kernel = next(leaf for leaf in data["leaves"] if leaf["path"] == "layers/0/kernel")
    assert kernel == {
        "path": "layers/0/kernel",
        "shape": [16, 64],
        "dtype": "float32",
        "spec": ["fsdp", "model"],
        "rule": "rules.shard:4",
        "bytes": 256,
    }
    assert first.count("\n") == 321 + 12  # one leaf per line
    plan = sr.Plan.from_json(first)
    assert plan.to_json() == first
    assert plan["layers/0/kernel"].where == "rules.shard:4"
    assert plan["norm/scale"].why == "default"
    assert plan.specs()["layers/0/bias"] == jax.sharding.PartitionSpec("model")


def test_to_json_of_a_plan_on_a_real_mesh_round_trips() -> None:
    rules = sr.loads(RULES, name="m.shard")
    mesh = jax.make_mesh((4, 2), ("fsdp", "model"))
    tree = {"a": {"kernel": jnp.zeros((8, 4)), "bias": jnp.zeros(4)}, "b": 3}
    plan = sr.plan(tree, rules, mesh)
    text = plan.to_json()
    assert text == sr.plan(tree, rules, mesh).to_json()
    back = sr.Plan.from_json(text)
    assert back.to_json() == text
    assert isinstance(back.mesh, jax.sharding.AbstractMesh) and dict(back.mesh.shape) == {
        "fsdp": 4,
        "model": 2,
    }
    assert [(x.path, x.shape, x.dtype, x.spec, x.bytes_per_device, x.why) for x in back] == sorted(
        (x.path, x.shape, x.dtype, x.spec, x.bytes_per_device, x.why) for x in plan
    )
    pretty = json.dumps(json.loads(text), indent=1, sort_keys=True)  # any JSON layout reads
    assert sr.Plan.from_json(pretty).to_json() == text
    odd = sr.plan({'q"u\\o\u00e9': jnp.zeros(4), "b": jnp.zeros(4)}, rules, mesh).to_json()
    assert sr.Plan.from_json(odd).to_json() == odd and '"q\\"u\\\\o\\u00e9"' in odd
    with pytest.raises(ValueError, match="not a shardrules plan file"):
        sr.Plan.from_json('{"format": "other"}')


def test_diff_groups_a_rule_edit(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _run(capsys, "diff", "rules.shard", "edited.shard", "--shapes", "shapes.json")
    assert status == 1
    assert "changed: 160 leaves" in out
    assert (
        "P('fsdp', 'model') -> P('model', 'fsdp')  (edited.shard:4): 160 leaves, 40.0 KiB per device" in out
    )
    assert "unchanged: 161 leaves" in out
    # 16 devices, 40 KiB of new shards each; the 8 devices whose fsdp block lies in
    # their model half (fsdp // 4 == model) already hold a quarter of theirs.
    assert "to move: 40.0 KiB per device, 560.0 KiB in all" in out
    status, out, _ = _run(
        capsys, "diff", "rules.shard", "edited.shard", "--shapes", "shapes.json", "--format", "json"
    )
    data = json.loads(out)
    assert status == 1 and not data["equal"]
    [change] = data["changed"]
    assert (change["from"], change["to"], change["count"], change["rule"]) == (
        ["fsdp", "model"],
        ["model", "fsdp"],
        160,
        "edited.shard:4",
    )
    assert change["paths"] == ["layers/0/kernel", "layers/1/kernel", "layers/10/kernel"]
    assert data["move"] == {"bytes_per_device": 40960, "total_bytes": 40960 * 16 - 8 * 40960 // 4}


def test_diff_of_equal_plans_and_of_a_dump(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "dump", "rules.shard", "--shapes", "shapes.json", "-o", "plan.json")[0] == 0
    status, out, _ = _run(capsys, "diff", "plan.json", "rules.shard", "--shapes", "shapes.json")
    assert status == 0 and "no changes: 321 leaves laid out the same" in out
    assert _run(capsys, "diff", "plan.json", "plan.json")[0] == 0  # no shapes needed for two dumps
    status, out, _ = _run(capsys, "diff", "plan.json", "edited.shard", "--shapes", "shapes.json")
    assert status == 1 and "changed: 160 leaves" in out


def test_diff_of_a_mesh_change_alone(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _run(
        capsys, "diff", "rules.shard", "rules.shard", "--shapes", "shapes.json",
        "--mesh-a", "fsdp=8,model=2", "--mesh-b", "fsdp=4,model=2",
    )  # fmt: skip
    assert status == 1
    assert "P('fsdp', 'model') with fsdp=8, model=2 -> P('fsdp', 'model') with fsdp=4, model=2" in out
    assert "changed: 160 leaves" in out and "unchanged: 161 leaves" in out  # `model` kept its size
    assert "only in" not in out


def test_diff_leaves_only_in_one_and_errors(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (files / "more.json").write_text(json.dumps({"extra/kernel": [[16, 64], "float32"]}))
    assert _run(capsys, "dump", "rules.shard", "--shapes", "more.json", "-o", "more_plan.json")[0] == 0
    status, out, _ = _run(capsys, "diff", "more_plan.json", "rules.shard", "--shapes", "shapes.json")
    assert status == 1 and "only in A: 1 leaf: extra/kernel" in out and "only in B: 321 leaves" in out
    assert _run(capsys, "diff", "nope.json", "rules.shard", "--shapes", "shapes.json")[0] == 2
    (files / "bad.shard").write_text('mesh fsdp=8\nrules params:\n  "kernel" -> (fsdp, _, _)\n')
    status, _, err = _run(capsys, "diff", "bad.shard", "rules.shard", "--shapes", "shapes.json")
    assert status == 2 and "SR1" in err
    status, out, err = _run(capsys, "dump", "bad.shard", "--shapes", "shapes.json")
    assert status == 1 and out == "" and "SR1" in err


def test_assert_plan_matches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHARDRULES_UPDATE_GOLDEN", raising=False)
    golden = tmp_path / "golden" / "plan.json"
    tree = {"layers": [{"kernel": jax.ShapeDtypeStruct((16, 64), jnp.float32)} for _ in range(3)]}
    plan = sr.plan(tree, sr.loads(RULES, name="rules.shard"), {"fsdp": 8, "model": 2})
    with pytest.raises(AssertionError, match="SHARDRULES_UPDATE_GOLDEN=1"):
        sr.assert_plan_matches(plan, golden)
    monkeypatch.setenv("SHARDRULES_UPDATE_GOLDEN", "1")
    sr.assert_plan_matches(plan, golden)  # refreshes
    monkeypatch.setenv("SHARDRULES_UPDATE_GOLDEN", "0")
    assert golden.read_text() == plan.to_json()
    sr.assert_plan_matches(plan, golden)
    edited = sr.plan(tree, sr.loads(EDITED, name="rules.shard"), {"fsdp": 8, "model": 2})
    with pytest.raises(AssertionError) as caught:
        sr.assert_plan_matches(edited, golden)
    message = str(caught.value)
    assert "changed: 3 leaves" in message and "P('fsdp', 'model') -> P('model', 'fsdp')" in message
    assert '-    {"path": "layers/0/kernel"' in message
    sr.assert_plan_matches(edited, golden, update=True)
    sr.assert_plan_matches(edited, golden)


def test_dumps_that_no_plan_could_hold_are_refused() -> None:
    """A hand edit gone wrong is an error naming the leaf, not a silent "no changes"."""
    rules = sr.loads('rules params:\n  "w" -> (model, _)\n  default -> replicated\n')
    good = sr.plan({"w": jnp.zeros((8, 4)), "b": jnp.zeros(4)}, rules, {"model": 2}).to_json()
    assert sr.Plan.from_json(good.encode()).to_json() == good  # bytes are read as UTF-8
    edits = {
        '"spec": ["model", null]': ('"spec": ["modle", null]', "names 'modle', which the mesh (model) lacks"),
        '"dtype": "float32", "spec": ["model"': (
            '"dtype": "flaot32", "spec": ["model"',
            '"flaot32" is not a dtype',
        ),
        '"shape": [8, 4]': ('"shape": [8, "4"]', "a shape is a list of whole numbers"),
        '"bytes": 64}': ('"bytes": 99}', "99 bytes per device, but its shape, dtype and spec make 64"),
    }
    for old, (new, message) in edits.items():
        assert old in good, old
        with pytest.raises(ValueError, match=re.escape(message)) as info:
            sr.Plan.from_json(good.replace(old, new))
        assert "leaf 'w'" in str(info.value)
    with pytest.raises(TypeError, match=re.escape("Plan.from_json(Path('plan.json').read_text())")):
        sr.Plan.from_json(Path("plan.json"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="looks like a file name"):
        sr.Plan.from_json("plan.json")


def test_a_larger_mesh_moves_the_unchanged_leaves_to_its_new_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("m.shard").write_text(
        'mesh fsdp=4, model=1\nrules params:\n  "w" -> (fsdp, _)\n  default -> replicated\n'
    )
    Path("s.json").write_text(json.dumps({"w": [[8, 4], "float32"], "n": [[4], "float32"]}))
    status, out, err = _run(
        capsys, "diff", "m.shard", "m.shard", "--shapes", "s.json", "--mesh-b", "fsdp=8", "--format", "json"
    )
    data = json.loads(out)
    assert status == 1 and not err, err
    # `--mesh-b fsdp=8` changes one axis of the file's mesh: model=1 stays
    assert [a["size"] for a in data["b"]["mesh"]] == [8, 1]
    # w: device i held rows 2i, 2i+1 and needs row i (16 bytes): only device 0 has it.
    # n (16 bytes, replicated, unchanged): devices 4 to 7 are new and need it.
    assert data["move"] == {"bytes_per_device": 32, "total_bytes": 7 * 16 + 4 * 16}
    assert data["unchanged"] == 1


def test_options_a_dump_cannot_use_are_named(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "dump", "rules.shard", "--shapes", "shapes.json", "-o", "plan.json")[0] == 0
    status, _, err = _run(
        capsys, "diff", "plan.json", "plan.json", "--group", "nothere", "--mesh-a", "fsdp=2"
    )
    assert status == 0
    assert "note: --mesh-a (A is a dump; it keeps its own mesh) is not used" in err
    assert "note: --group (both sides are dumps) is not used" in err


def test_diff_takes_the_settings_nearest_to_b(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The review recipe: A copied out of the project (from git), B the working copy."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "sharding").mkdir(parents=True)
    elsewhere.mkdir()
    (project / "pyproject.toml").write_text(
        '[tool.shardrules]\nmesh = "fsdp=4,model=2"\nshapes = "shapes.json"\n'
    )
    (project / "shapes.json").write_text(json.dumps({"w": [[8, 4], "float32"]}))
    (project / "sharding" / "m.shard").write_text('mesh fsdp, model\nrules params:\n  "w" -> (model, fsdp)\n')
    (elsewhere / "m.shard").write_text('mesh fsdp, model\nrules params:\n  "w" -> (fsdp, model)\n')
    monkeypatch.chdir(project)
    status, out, err = _run(capsys, "diff", str(elsewhere / "m.shard"), "sharding/m.shard")
    assert status == 1, err
    assert "on fsdp=4, model=2" in out and "P('fsdp', 'model') -> P('model', 'fsdp')" in out


def test_a_golden_plan_of_sizes_against_a_real_mesh_says_the_types_differ(tmp_path: Path) -> None:
    rules = sr.loads('rules params:\n  "w" -> (model, _)\n')
    tree = {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32)}
    golden = tmp_path / "golden.json"
    sr.assert_plan_matches(sr.plan(tree, rules, {"data": 4, "model": 2}), golden, update=True)
    with pytest.raises(AssertionError) as info:
        sr.assert_plan_matches(sr.plan(tree, rules, jax.make_mesh((4, 2), ("data", "model"))), golden)
    assert "mesh axis types: unknown, unknown -> explicit, explicit" in str(info.value)
