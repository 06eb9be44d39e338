"""Shape sources and checkpoints from other people: an index may only name
files in its own folder, shapes are whole numbers in range, and what cannot be
read is an error naming the entry (`load_shapes`, `load_checkpoint`, `--shapes`)."""

from __future__ import annotations

import json
import os
import re
import struct
import threading
import types
from pathlib import Path

import jax
import numpy as np
import pytest

import shardrules as sr
from shardrules._cli._main import main
from shardrules._planning import _mesh
from shardrules._planning._shapes import ShapeSourceError

RULES = 'mesh data=8\nrules params:\n  "w" -> (data, _)\n  default -> replicated\n'


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], header: dict | None = None) -> None:
    """A .safetensors file of float32 tensors; `header` overrides header entries."""
    entries, data, offset = {}, b"", 0
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array, np.float32).tobytes()
        entries[name] = {
            "dtype": "F32",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        data += raw
        offset += len(raw)
    entries.update(header or {})
    text = json.dumps(entries).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def write_index(folder: Path, weight_map: dict[str, str]) -> Path:
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A checkpoint outside the model's folder, and the model's folder."""
    (tmp_path / "elsewhere").mkdir()
    write_safetensors(tmp_path / "elsewhere" / "x.safetensors", {"w": np.arange(32.0).reshape(8, 4)})
    (tmp_path / "a" / "b").mkdir(parents=True)
    return tmp_path / "a" / "b"


def _refused(index: Path, entry: str) -> None:
    """Both readers refuse the index, naming the entry, and read no tensor."""
    with pytest.raises(ShapeSourceError, match="outside the index's folder") as info:
        sr.load_shapes(index)
    assert repr(entry) in str(info.value) and "'w'" in str(info.value)
    with pytest.raises(ValueError, match="outside the index's folder"):
        sr.load_checkpoint(index, sr.loads(RULES))


def test_an_index_naming_a_file_up_the_tree_is_refused(outside: Path) -> None:
    _refused(write_index(outside, {"w": "../../elsewhere/x.safetensors"}), "../../elsewhere/x.safetensors")


def test_an_index_naming_an_absolute_path_is_refused(outside: Path) -> None:
    target = str(outside.parent.parent / "elsewhere" / "x.safetensors")
    _refused(write_index(outside, {"w": target}), target)


def test_an_index_naming_a_link_to_elsewhere_is_refused(outside: Path) -> None:
    (outside / "x.safetensors").symlink_to(outside.parent.parent / "elsewhere" / "x.safetensors")
    index = write_index(outside, {"w": "x.safetensors"})
    _refused(index, "x.safetensors")
    with pytest.raises(ShapeSourceError, match="it links to"):
        sr.load_shapes(index)


def test_the_command_line_refuses_it_with_exit_2(
    outside: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    index = write_index(outside, {"w": "../../elsewhere/x.safetensors"})
    monkeypatch.chdir(outside)
    Path("m.shard").write_text(RULES)
    assert main(["lint", "m.shard", "--shapes", str(index)]) == 2
    _, err = capsys.readouterr()
    assert "'../../elsewhere/x.safetensors', outside the index's folder" in err and "Traceback" not in err


def test_files_inside_the_folder_and_the_hugging_face_cache_layout_load(tmp_path: Path) -> None:
    """Subfolders are fine; so is the Hugging Face cache, where the index and
    every file of a snapshot are links into one `blobs` folder."""
    inside = tmp_path / "inside"
    (inside / "sub").mkdir(parents=True)
    write_safetensors(inside / "sub" / "x.safetensors", {"w": np.arange(32.0).reshape(8, 4)})
    index = write_index(inside, {"w": "sub/./x.safetensors"})
    assert sr.load_shapes(index)["w"].shape == (8, 4)

    blobs, snapshot = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    write_safetensors(blobs / "1f2e", {"w": np.arange(32.0).reshape(8, 4)})
    write_index(blobs, {"w": "model-00001-of-00001.safetensors"}).rename(blobs / "9a8b")
    (snapshot / "model-00001-of-00001.safetensors").symlink_to("../../blobs/1f2e")
    (snapshot / "model.safetensors.index.json").symlink_to("../../blobs/9a8b")
    cached = snapshot / "model.safetensors.index.json"
    assert sr.load_shapes(cached)["w"].shape == (8, 4)
    mesh = jax.make_mesh((8,), ("data",))
    loaded = sr.load_checkpoint(cached, sr.loads(RULES), mesh)
    np.testing.assert_array_equal(np.asarray(loaded["w"]), np.arange(32.0).reshape(8, 4))


@pytest.mark.parametrize(
    ("weight_map", "message"),
    [
        (["x.safetensors"], "maps tensor names to file names"),
        ({"w": 3}, "tensor 'w' is in 3, which is not a file name"),
        ({"w": ""}, "which is not a file name"),
    ],
)
def test_a_weight_map_of_the_wrong_kind_is_refused(tmp_path: Path, weight_map: object, message: str) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ShapeSourceError, match=message):
        sr.load_shapes(index)


BAD_SHAPES = {
    "negative": ([8, -64], "dimension 1 of the shape [8, -64] is negative"),
    "a fraction": ([8, 4.7], "a shape is a list of whole numbers"),
    "true": ([8, True], "a shape is a list of whole numbers"),
    "text": ([8, "4"], "a shape is a list of whole numbers"),
    "not a list": (8, "a shape is a list of whole numbers, not 8"),
    "absurd": ([2**40, 2**40], "more than any array has"),
    "65 dimensions": ([1] * 65, "a shape of 65 dimensions"),
}


@pytest.mark.parametrize("case", sorted(BAD_SHAPES))
def test_bad_dimensions_in_a_safetensors_header_are_refused(tmp_path: Path, case: str) -> None:
    shape, message = BAD_SHAPES[case]
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {}, {"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}})
    with pytest.raises(ShapeSourceError, match="tensor 'w'") as info:
        sr.load_shapes(path)
    assert message in str(info.value)
    with pytest.raises(ValueError, match="tensor 'w'"):
        sr.load_checkpoint(path, sr.loads(RULES))


@pytest.mark.parametrize("case", sorted(BAD_SHAPES))
def test_bad_dimensions_in_a_shapes_file_are_refused(tmp_path: Path, case: str) -> None:
    shape, message = BAD_SHAPES[case]
    message = "should be [shape, dtype]" if case == "not a list" else message
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps({"w": [shape, "float32"]}))
    with pytest.raises(ShapeSourceError, match="entry 'w'") as info:
        sr.load_shapes(path)
    assert message in str(info.value)


def test_lint_refuses_a_negative_dimension_instead_of_passing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to plan -64 B per device and exit 0."""
    monkeypatch.chdir(tmp_path)
    Path("m.shard").write_text(RULES)
    write_safetensors(
        Path("model.safetensors"), {}, {"w": {"dtype": "F32", "shape": [8, -2], "data_offsets": [0, 0]}}
    )
    Path("shapes.json").write_text(json.dumps({"w": [[8, -2], "float32"]}))
    for source in ("model.safetensors", "shapes.json"):
        assert main(["lint", "m.shard", "--shapes", source]) == 2
        out, err = capsys.readouterr()
        assert out == "" and "is negative" in err and "'w'" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "text", ['{"w": [[8], "(2,f4"]}', '{"w": [[8], "(-1,)f4"]}', '{"w": [[' + "9" * 5000 + '], "float32"]}']
)
def test_shapes_files_numpy_or_json_cannot_parse_are_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "shapes.json"
    path.write_text(text)
    with pytest.raises(ShapeSourceError):
        sr.load_shapes(path)


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("shapes.json", '{"w": ' + DEEP + "}", "the shapes file is nested too deeply to read"),
        (
            "model.safetensors.index.json",
            '{"weight_map": ' + DEEP + "}",
            "the checkpoint index is nested too deeply",
        ),
        ("model.safetensors", '{"w": ' + DEEP + "}", "the header is nested too deeply to read"),
        (
            "model.safetensors",
            '{"w": {"dtype": "F32", "shape": [' + "9" * 5000 + "]}}",
            "the header is JSON this cannot read",
        ),
        ("model.safetensors.index.json", "{nope", "the checkpoint index is not JSON"),
        ("model.safetensors.index.json", '{"w": {}}', "not a checkpoint index with a `weight_map`"),
    ],
)
def test_json_too_deep_or_too_long_to_read_is_said_to_be_so(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    """JSON nested deeper than Python's parser goes is JSON still: every
    reader of shapes says it is nested too deeply (as the plan-file and
    converter readers do), never that it is not JSON, and nothing raw escapes."""
    path = tmp_path / name
    if name.endswith(".safetensors"):
        path.write_bytes(struct.pack("<Q", len(content)) + content.encode())
    else:
        path.write_text(content)
    with pytest.raises(ShapeSourceError, match=re.escape(message)) as raised:
        sr.load_shapes(path)
    assert "RecursionError" not in str(raised.value) and "not a JSON file" not in str(raised.value)


@pytest.mark.parametrize("offsets", [[0, 999], [8, 0], "0-128", [0.0, 128], None, [-128, 0]])
def test_data_offsets_outside_the_file_are_refused(tmp_path: Path, offsets: object) -> None:
    path = tmp_path / "model.safetensors"
    header = {"w": {"dtype": "F32", "shape": [8, 4], "data_offsets": offsets}}
    if offsets is None:
        del header["w"]["data_offsets"]
    write_safetensors(path, {"w": np.zeros((8, 4))}, header)
    with pytest.raises(ShapeSourceError, match="tensor 'w' has `data_offsets`"):
        sr.load_checkpoint(path, sr.loads(RULES), jax.make_mesh((8,), ("data",)))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("name", ["model.safetensors", "shapes.json", "model.safetensors.index.json"])
def test_a_fifo_is_refused_instead_of_blocking(tmp_path: Path, name: str) -> None:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    raised: list[BaseException] = []

    def read() -> None:
        try:
            sr.load_shapes(fifo)
        except BaseException as err:  # handed to the test's thread
            raised.append(err)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # blocked in open(): a writer that closes at once lets it go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
        pytest.fail(f"load_shapes({name!r}) blocked on a FIFO")
    assert len(raised) == 1 and isinstance(raised[0], ShapeSourceError), raised
    assert "not a regular file" in str(raised[0])


def test_the_memory_limit_of_a_mesh_with_none_of_this_processs_devices() -> None:
    """No device of this process: no limit to read (not NumPy's "zero-size
    array to reduction operation", which `mesh.local_mesh` raises)."""
    other = types.SimpleNamespace(
        process_index=jax.process_index() + 1, memory_stats=lambda: {"bytes_limit": 1}
    )
    assert _mesh.memory_limit(types.SimpleNamespace(devices=np.array([other, other]))) is None  # type: ignore[arg-type]
    mine = types.SimpleNamespace(process_index=jax.process_index(), memory_stats=lambda: {"bytes_limit": 7})
    assert _mesh.memory_limit(types.SimpleNamespace(devices=np.array([other, mine]))) == 7  # type: ignore[arg-type]


# ---------------------------------------------------------------- a big header read once per shape


def _many_tensors(n: int) -> dict:
    """`n` header entries of three shapes and two dtypes, as a MoE's experts have."""
    kinds = [("BF16", [2048, 7168]), ("BF16", [7168, 2048]), ("F32", [384])]
    return {
        f"model.layers.{i // 3}.mlp.experts.{i}.w": {
            "dtype": kinds[i % 3][0],
            "shape": kinds[i % 3][1],
            "data_offsets": [0, 0],
        }
        for i in range(n)
    }


def test_a_header_of_many_tensors_builds_one_shape_dtype_struct_per_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000 tensors of three shapes and dtypes: three `ShapeDtypeStruct`s made
    and three shapes checked, shared by every tensor of that shape and dtype,
    in the header's order, through the file and through an index."""
    from shardrules._planning import _shapes

    built: list[tuple] = []
    checked: list[object] = []

    class Counted(jax.ShapeDtypeStruct):
        def __init__(self, shape, dtype, **kwargs) -> None:
            built.append((shape, dtype))
            super().__init__(shape, dtype, **kwargs)

    def counted_problem(shape, itemsize):
        checked.append(shape)
        return real_problem(shape, itemsize)

    real_problem = _shapes.shape_problem
    monkeypatch.setattr(_shapes.jax, "ShapeDtypeStruct", Counted)
    monkeypatch.setattr(_shapes, "shape_problem", counted_problem)
    header = _many_tensors(3000)
    write_safetensors(tmp_path / "model.safetensors", {}, header)
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": dict.fromkeys(header, "model.safetensors")})
    )
    for source in ("model.safetensors", "model.safetensors.index.json"):
        built.clear()
        checked.clear()
        shapes = sr.load_shapes(tmp_path / source)
        assert list(shapes) == list(header)
        for name, entry in header.items():
            assert shapes[name].shape == tuple(entry["shape"])
            assert shapes[name].dtype == {"BF16": jax.numpy.bfloat16, "F32": np.float32}[entry["dtype"]]
        assert len(built) == 3 and len(checked) == 3, source
        assert len({id(s) for s in shapes.values()}) == 3


@pytest.mark.parametrize(
    ("twin", "says"),
    [
        ([2048, True], "a shape is a list of whole numbers"),
        ([2048.0, 1], "a shape is a list of whole numbers"),
        ([2048, 1e0], "a shape is a list of whole numbers"),
        ([2048, -1], "is negative"),
    ],
)
def test_a_bad_shape_equal_to_a_good_one_read_before_is_refused(
    tmp_path: Path, twin: list, says: str
) -> None:
    """`[2048, true]` and `[2048.0, 1]` equal `[2048, 1]` in Python: a header
    holding them is checked entry by entry, so the bad twin of a shape read
    before is refused all the same, naming it."""
    header = {"good": {"dtype": "F32", "shape": [2048, 1], "data_offsets": [0, 0]}} | _many_tensors(30)
    header["bad"] = {"dtype": "F32", "shape": twin, "data_offsets": [0, 0]}
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {}, header)
    with pytest.raises(ShapeSourceError, match="tensor 'bad'") as info:
        sr.load_shapes(path)
    assert says in str(info.value)


@pytest.mark.parametrize(
    "entry",
    [
        {"dtype": "F32"},
        {"shape": [4]},
        {"dtype": ["F32"], "shape": [4]},
        {"dtype": "F32", "shape": "4"},
        [4],
        "x",
    ],
)
def test_a_malformed_entry_after_good_ones_is_refused_naming_it(tmp_path: Path, entry: object) -> None:
    header = _many_tensors(30) | {"bad": entry}
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {}, header)
    with pytest.raises(ShapeSourceError, match="tensor 'bad'"):
        sr.load_shapes(path)


def test_an_index_naming_a_tensor_its_file_lacks_or_a_missing_file_is_refused(tmp_path: Path) -> None:
    header = _many_tensors(30)
    write_safetensors(tmp_path / "a.safetensors", {}, header)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(
        json.dumps({"weight_map": dict.fromkeys(header, "a.safetensors") | {"extra": "a.safetensors"}})
    )
    with pytest.raises(
        ShapeSourceError, match=re.escape("puts 'extra' in a.safetensors, but that file has no such tensor")
    ):
        sr.load_shapes(index)
    index.write_text(
        json.dumps({"weight_map": dict.fromkeys(header, "a.safetensors") | {"extra": "b.safetensors"}})
    )
    with pytest.raises(FileNotFoundError, match=re.escape("names b.safetensors, which is not in")):
        sr.load_shapes(index)
