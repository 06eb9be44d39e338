"""The device grids of `shardrules explain` (text) and the HTML report: which
devices hold which block of an array, checked against JAX's own answer
(`NamedSharding.devices_indices_map`) on the 8 simulated devices."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules._cli._main import main
from shardrules._reports._picture import device_text, grid_of, text_picture

MESHES = [(8,), (4, 2), (2, 4), (2, 2, 2)]
NAMES = ("a", "b", "c")


@st.composite
def _case(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], P]:
    """A mesh shape, an array shape, and a valid spec for them."""
    mesh_shape = draw(st.sampled_from(MESHES))
    names = NAMES[: len(mesh_shape)]
    rank = draw(st.integers(1, 3))
    free = list(names)
    entries: list[object] = []
    for _ in range(rank):
        axes = draw(st.lists(st.sampled_from(free), unique=True, max_size=2)) if free else []
        free = [a for a in free if a not in axes]
        entries.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    sizes = dict(zip(names, mesh_shape, strict=True))
    shape = []
    for entry in entries:  # each dimension 1, 2 or 3 blocks per device's share
        axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
        shape.append(math.prod(sizes[a] for a in axes) * draw(st.integers(1, 3)))
    return mesh_shape, tuple(shape), P(*entries)


@settings(max_examples=150, deadline=None)
@given(_case())
def test_grid_agrees_with_jax(case: tuple[tuple[int, ...], tuple[int, ...], P]) -> None:
    """Every device listed in cell (r, c) holds, in JAX's own sharding, block r
    of the second-to-last dimension and block c of the last one (and the first
    block of the leading ones); every device holding that part is listed; and
    each cell lists as many devices as the grid says hold each block."""
    mesh_shape, shape, spec = case
    names = NAMES[: len(mesh_shape)]
    mesh = jax.make_mesh(mesh_shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(names))
    sizes = dict(zip(names, mesh_shape, strict=True))
    plan = sr.plan(
        {"x": jax.ShapeDtypeStruct(shape, np.float32)},
        sr.loads(f'rules params:\n  "x" -> {_spec_text(spec)}\n'),
        sizes,
    )
    (leaf,) = plan.leaves
    assert leaf.spec == spec
    found = grid_of(leaf, sizes)
    assert found is not None and not found.too_large
    indices = NamedSharding(mesh, spec).devices_indices_map(shape)
    flat = list(mesh.devices.flat)
    expected: dict[tuple[int, int], set[int]] = {}
    rows, cols = found.shape
    for position, device in enumerate(flat):
        index = indices[device]
        blocks = [
            (s.start or 0) * n // dim if dim else 0
            for s, n, dim in zip(index, _splits(spec, shape, sizes), shape, strict=True)
        ]
        if any(blocks[:-2]):
            continue  # not the first block of the leading dimensions
        r = blocks[-2] if len(shape) >= 2 else 0
        expected.setdefault((r, blocks[-1]), set()).add(position)
    got = {(r, c): set(found.devices[r][c]) for r in range(rows) for c in range(cols)}
    assert got == expected
    assert all(len(d) == found.copies for d in got.values())


def _splits(spec: P, shape: tuple[int, ...], sizes: dict[str, int]) -> list[int]:
    entries = list(spec) + [None] * (len(shape) - len(spec))
    out = []
    for entry in entries:
        axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
        out.append(math.prod(sizes[a] for a in axes))
    return out


def _spec_text(spec: P) -> str:
    def one(entry: object) -> str:
        if entry is None:
            return "_"
        if isinstance(entry, str):
            return entry
        return "(" + ", ".join(entry) + ")"  # type: ignore[arg-type]

    return "(" + ", ".join(one(e) for e in spec) + ")"


@pytest.mark.parametrize(
    ("devices", "text"),
    [
        ([3], "3"),
        ([0, 1, 2, 3], "0-3"),
        ([0, 2, 4, 6], "0,2,4,6"),
        ([0, 1, 4, 5], "0-1,4-5"),
        (list(range(0, 128, 8)), "0,8,…,120"),
        (list(range(0, 256, 2)), "0,2,…,254"),
        ([0, 3, 7, 12, 18, 25, 33, 42], "8 devices"),
    ],
)
def test_device_text(devices: list[int], text: str) -> None:
    assert device_text(devices) == text


def test_text_picture_of_a_matrix() -> None:
    sizes = {"fsdp": 4, "model": 2}
    rules = sr.loads('rules params:\n  "w" -> (model, fsdp)\n')
    (leaf,) = sr.plan({"w": jax.ShapeDtypeStruct((64, 32), np.float32)}, rules, sizes).leaves
    assert text_picture(leaf, sizes) == [
        "  w  (64, 32)  P('model', 'fsdp')  rows: model, columns: fsdp",
        "    | 0 | 2 | 4 | 6 |",
        "    | 1 | 3 | 5 | 7 |",
    ]


def test_text_picture_in_words_when_too_large() -> None:
    sizes = {"fsdp": 16, "model": 8}
    rules = sr.loads('rules params:\n  "w" -> (model, fsdp)\n')
    (leaf,) = sr.plan({"w": jax.ShapeDtypeStruct((64, 32), np.float32)}, rules, sizes).leaves
    lines = text_picture(leaf, sizes)
    assert lines[1] == "    8×16 blocks, too many to draw; each block on 1 device"


def test_text_picture_of_leading_dims_and_replicated() -> None:
    sizes = {"expert": 2, "fsdp": 4}
    rules = sr.loads('rules params:\n  "e" -> (expert, fsdp, _)\n  "n" -> replicated\n')
    plan = sr.plan(
        {"e": jax.ShapeDtypeStruct((2, 8, 4), np.float32), "n": jax.ShapeDtypeStruct((4,), np.float32)},
        rules,
        sizes,
    )
    e, n = plan.leaves
    assert text_picture(e, sizes) == [
        "  e  (2, 8, 4)  P('expert', 'fsdp', None)  rows: fsdp",
        "    | 0 |",
        "    | 1 |",
        "    | 2 |",
        "    | 3 |",
        "    dim 0 over expert (the grid shows its first block)",
    ]
    assert text_picture(n, sizes) == ["  n  (4,)  P(None)  replicated", "    | 0-7 |"]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    shapes = {"big": [[64, 32], "float32"], "small": [[8], "float32"], "mid": [[16, 16], "float32"]}
    Path("s.json").write_text(json.dumps(shapes))
    Path("m.shard").write_text(
        'mesh fsdp, model\nrules params:\n  "big" -> (model, fsdp)\n  "small" -> (fsdp)\n  "mid" -> (fsdp, model)\n'
    )
    return tmp_path


def _explain(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(["explain", "m.shard", "--mesh", "fsdp=4,model=2", "--shapes", "s.json", *extra]) == 0
    return capsys.readouterr().out


def test_explain_draws_the_largest_arrays(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _explain(capsys, "--pictures", "2")
    pictures = out.split("which devices hold which blocks", 1)[1].splitlines()
    assert pictures[0].startswith(" (2 largest arrays;")
    assert pictures[1].startswith("  big  (64, 32)")
    assert pictures[4].startswith("  mid  (16, 16)")
    assert "small" not in out.split("which devices", 1)[1]


def test_explain_pictures_follow_path_and_can_be_turned_off(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _explain(capsys, "--path", "small")
    assert "  small  (8,)  P('fsdp')  columns: fsdp\n    | 0-1 | 2-3 | 4-5 | 6-7 |\n" in out
    assert "which devices" not in _explain(capsys, "--pictures", "0")


def test_explain_refuses_a_negative_count(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["explain", "m.shard", "--shapes", "s.json", "--pictures", "-2"])
    assert exit_info.value.code == 2
    assert "--pictures: -2 is negative; give 0 or more" in capsys.readouterr().err
