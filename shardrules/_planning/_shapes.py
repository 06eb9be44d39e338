"""Shapes without data: the trees `shardrules lint` and `explain` check.

Every source gives a pytree of `jax.ShapeDtypeStruct` and reads no tensor data:

- `module:function` — the function is called under `jax.eval_shape`;
- `model.safetensors` — the file's JSON header only;
- `model.safetensors.index.json` — the header of every file the index names;
- `shapes.json` — `{"path": [[4096, 4096], "bfloat16"], ...}` (or
  `{"path": {"shape": [...], "dtype": "..."}}`).

Checkpoint tensor names such as `model.layers.0.mlp.up_proj.weight` become the
keys of a flat dict, so rules match them as written.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._gcpause import paused
from .._imports import import_attr

# safetensors limits its header to 100 MB; a longer one is not a safetensors file.
_MAX_HEADER = 100_000_000

_SAFETENSORS_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "F16": "float16",
    "BF16": "bfloat16",
    "U32": "uint32",
    "I32": "int32",
    "F32": "float32",
    "U64": "uint64",
    "I64": "int64",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}


MAX_RANK = 64
"""The most dimensions a shape read from a file may have (NumPy's limit)."""
MAX_ARRAY_BYTES = 2**50
"""The most bytes (1 PiB) an array read from a file may have, and the longest
dimension: far beyond any model's, and exact in 64-bit arithmetic."""


class ShapeSourceError(ValueError):
    """A shapes source that cannot be read: missing, malformed, or of an unknown kind."""


def shown(value: Any, width: int = 60) -> str:
    """`repr(value)`, cut to about `width` characters (values come from files)."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def shape_problem(shape: Any, itemsize: int) -> str:
    """Why `shape`, read from a file, is not the shape of an array of
    `itemsize`-byte elements, or `""`: not a list of whole numbers (`true`
    and `4.7` are not), a negative dimension, more than `MAX_RANK`
    dimensions, or more than `MAX_ARRAY_BYTES` in all."""
    if not isinstance(shape, (list, tuple)):
        return f"a shape is a list of whole numbers, not {shown(shape)}"
    if len(shape) > MAX_RANK:
        return f"a shape of {len(shape)} dimensions; an array has at most {MAX_RANK}"
    for i, n in enumerate(shape):
        if not isinstance(n, int) or isinstance(n, bool):
            return f"a shape is a list of whole numbers, not {shown(shape)} (dimension {i} is {shown(n)})"
        if n < 0:
            return f"dimension {i} of the shape {shown(shape)} is negative"
        if n > MAX_ARRAY_BYTES:
            return f"dimension {i} of the shape {shown(shape)} is longer than any array's (at most 2**50)"
    if math.prod(shape) * itemsize > MAX_ARRAY_BYTES:
        return (
            f"the shape {shown(shape)} of {itemsize}-byte elements makes {math.prod(shape) * itemsize} "
            "bytes, more than any array has (at most 1 PiB)"
        )
    return ""


def load_shapes(source: str | os.PathLike[str]) -> Any:
    """Read a tree of shapes and dtypes from `source`, without tensor data.

    **Arguments:**

    - `source`: `module:function` (a function of no arguments returning a
      pytree, evaluated with `jax.eval_shape`), a `.safetensors` file, a
      sharded checkpoint's `*.index.json`, or a `.json` file mapping paths to
      `[shape, dtype]`.

    **Returns:** a pytree of `jax.ShapeDtypeStruct`; for files, a flat dict keyed
    by tensor name, whose entries of one shape and dtype share one
    `ShapeDtypeStruct` (which cannot be changed).

    **Raises:** `ValueError` for a malformed source or one of an unknown kind,
    `FileNotFoundError` for a missing file, each saying what was expected.

    ```python
    shapes = shardrules.load_shapes("model.safetensors.index.json")
    shardrules.plan(shapes, rules, {"fsdp": 32, "model": 8})
    ```
    """
    text = os.fspath(source)
    path = Path(text)
    if text.endswith(".index.json"):
        return _index(path)
    if text.endswith(".safetensors"):
        return safetensors_shapes(path)
    if text.endswith(".json"):
        return _json_shapes(path)
    if ":" in text and not path.exists():
        return _function_shapes(text)
    raise ShapeSourceError(
        f"cannot tell what kind of shapes source {text!r} is; give a `module:function`, "
        "a .safetensors file, a *.index.json or a .json file of `path: [shape, dtype]`"
    )


def _read_json(path: Path, text: str | bytes, what: str, **options: Any) -> Any:
    """The JSON document `text` read from `path`, or a `ShapeSourceError`
    saying what is wrong with it: `what` names what the text should have been
    (`"a JSON file"`, `"the header"`). JSON nested deeper than Python's parser
    goes is JSON still, and is said to be nested too deeply, as the other
    readers of JSON say; a number of more digits than Python converts is said
    to be one."""
    try:
        return json.loads(text, **options)
    except RecursionError:
        raise ShapeSourceError(
            f"{path}: {what} is nested too deeply to read (arrays or objects inside each other)"
        ) from None
    except UnicodeDecodeError as err:
        raise ShapeSourceError(f"{path}: {what} is not UTF-8 text ({err})") from None
    except json.JSONDecodeError as err:
        raise ShapeSourceError(f"{path}: {what} is not JSON ({shown(str(err), 200)})") from None
    except ValueError as err:  # a number of more than 4,300 digits
        raise ShapeSourceError(f"{path}: {what} is JSON this cannot read ({shown(str(err), 200)})") from None


def _open(path: Path):  # one place that opens files, so tests can count what is read
    return open(path, "rb")


def _regular(path: Path) -> None:
    """Raise unless `path` is a regular file: a FIFO would block the read, a device never ends."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as err:  # ValueError: a NUL character in the name
        raise ShapeSourceError(f"{path}: cannot read it ({err})") from None
    if not stat.S_ISREG(mode):
        raise ShapeSourceError(f"{path}: not a regular file (a folder, a FIFO, a device or a socket)")


def safetensors_shapes(path: str | os.PathLike[str]) -> dict[str, jax.ShapeDtypeStruct]:
    """Tensor name → shape and dtype, from a `.safetensors` file's header alone."""
    with paused():  # the raw header is freed before the collector is back, which would walk it
        return read_header(Path(path))[0]


def read_header(path: Path) -> tuple[dict[str, jax.ShapeDtypeStruct], dict[str, Any], int]:
    """A `.safetensors` file's shapes, its raw header entries (with
    `data_offsets`), and where its data region starts; reads the header only.
    Tensors of one shape and dtype share one `ShapeDtypeStruct`, checked once
    (70,000 experts' tensors have a dozen), as in `_json_shapes`."""
    _regular(path)
    with _open(path) as f:
        head = f.read(8)
        if len(head) < 8:
            raise ShapeSourceError(f"{path}: too short to be a .safetensors file")
        (size,) = struct.unpack("<Q", head)
        if size > _MAX_HEADER:
            raise ShapeSourceError(
                f"{path}: header length {size} is not plausible; is it a .safetensors file?"
            )
        raw = f.read(size)
    if len(raw) < size:
        raise ShapeSourceError(f"{path}: the header is cut short ({len(raw)} of {size} bytes)")
    fractions: list[str] = []  # numbers with a fraction or an exponent, as they are read
    with paused():  # 70,000 small dicts and lists, none in a cycle: the collector would walk them all
        header = _read_json(
            path, raw, "the header", parse_float=lambda text: fractions.append(text) or float(text)
        )
        if not isinstance(header, dict):
            raise ShapeSourceError(f"{path}: the header is not a JSON object")
        header.pop("__metadata__", None)
        made: dict[Any, jax.ShapeDtypeStruct] = {}
        seen = {} if fractions or b"true" in raw or b"false" in raw else made  # {}: check every entry
        out: dict[str, jax.ShapeDtypeStruct] = {}
        for name, info in header.items():
            try:  # only ever a shape and dtype checked before
                out[name] = seen[tuple(info["shape"]), info["dtype"]]
            except (TypeError, KeyError):
                out[name] = _tensor(path, name, info, made)
    return out, header, 8 + size


def _tensor(path: Path, name: str, info: Any, made: dict[Any, jax.ShapeDtypeStruct]) -> jax.ShapeDtypeStruct:
    """One tensor of a header, checked; its `ShapeDtypeStruct` is made once, kept in `made`."""
    name_of = info.get("dtype") if isinstance(info, dict) else None
    dtype = _SAFETENSORS_DTYPES.get(name_of) if isinstance(name_of, str) else None
    if dtype is None or "shape" not in info:
        raise ShapeSourceError(f"{path}: tensor {name!r} has no valid dtype and shape: {shown(info)}")
    problem = shape_problem(info["shape"], jnp.dtype(dtype).itemsize)
    if problem:
        raise ShapeSourceError(f"{path}: tensor {name!r}: {problem}")
    key = (tuple(info["shape"]), name_of)
    found = made.get(key)
    if found is None:
        found = made[key] = jax.ShapeDtypeStruct(key[0], jnp.dtype(dtype))
    return found


def index_files(path: Path) -> dict[str, tuple[str, Path]]:
    """A sharded checkpoint's index: tensor name → (the file as the index
    names it, that file's path). Every file must lie in the index's folder:
    an absolute name, or one that leads out of the folder (`..`, or a
    symbolic link to elsewhere), is refused naming the entry. (The folder the
    index file itself links to counts as its folder too: the Hugging Face
    cache links every file of a snapshot into one `blobs` folder.)"""
    _regular(path)
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as err:
        raise ShapeSourceError(f"{path}: cannot read it ({err})") from None
    index = _read_json(path, text, "the checkpoint index")
    try:
        weight_map = index["weight_map"]
    except (KeyError, TypeError, IndexError):
        raise ShapeSourceError(
            f"{path}: not a checkpoint index with a `weight_map` ({shown(index)})"
        ) from None
    if not isinstance(weight_map, dict):
        raise ShapeSourceError(
            f"{path}: `weight_map` maps tensor names to file names, not {shown(weight_map)}"
        )
    folders = {path.parent.resolve(), path.resolve().parent}
    out: dict[str, tuple[str, Path]] = {}
    checked: dict[str, tuple[str, Path]] = {}  # one pair per file, shared by its tensors
    for name, file in weight_map.items():
        pair = checked.get(file) if type(file) is str else None
        if pair is None and (not isinstance(file, str) or not file):
            raise ShapeSourceError(f"{path}: tensor {name!r} is in {shown(file)}, which is not a file name")
        if pair is None:
            pair = checked[file] = (file, _inside(path, name, file, folders))
        out[name] = pair
    return out


def _inside(index: Path, name: str, file: str, folders: set[Path]) -> Path:
    """The path of a file the index names, if it lies in the index's folder."""
    refused = (
        f"{index}: tensor {name!r} is in {file!r}, outside the index's folder; "
        "an index may only name files in its own folder"
    )
    if os.path.isabs(file) or Path(file).is_absolute():
        raise ShapeSourceError(refused)
    shard = index.parent / file
    try:
        real = shard.resolve()
    except (OSError, RuntimeError, ValueError):  # a loop of symbolic links, a NUL character
        raise ShapeSourceError(f"{index}: tensor {name!r} is in {file!r}, which cannot be resolved") from None
    if not any(real.is_relative_to(folder) for folder in folders):
        raise ShapeSourceError(refused + (f" (it links to {real})" if ".." not in Path(file).parts else ""))
    return shard


def _index(path: Path) -> dict[str, jax.ShapeDtypeStruct]:
    files: dict[str, list[str]] = {}
    shards: dict[str, Path] = {}
    with paused():  # as in `read_header`
        for name, (file, shard) in index_files(path).items():
            names = files.get(file)
            if names is None:
                names = files[file] = []
                shards[file] = shard
            names.append(name)
        out: dict[str, jax.ShapeDtypeStruct] = {}
        for file, names in sorted(files.items()):
            shard = shards[file]
            if not shard.exists():
                raise FileNotFoundError(f"{path} names {file}, which is not in {path.parent}")
            header = safetensors_shapes(shard)
            try:
                out.update({name: header[name] for name in names})
            except KeyError as err:
                missing = err.args[0]
                raise ShapeSourceError(
                    f"{path} puts {missing!r} in {file}, but that file has no such tensor"
                ) from None
        return out


def _json_shapes(path: Path) -> dict[str, jax.ShapeDtypeStruct]:
    """A shapes file's tree. Each distinct `[shape, dtype]` is checked and made
    into a `ShapeDtypeStruct` once, which every entry like it shares (a model's
    million leaves have a few dozen): an entry equal to one already checked is
    taken as it is. Equal is not always the same in JSON (`[true, 4]` equals
    `[1, 4]`, `[4.0]` equals `[4]`), so in a file with any `true`, `false` or
    number with a fraction or an exponent every entry is checked."""
    _regular(path)
    fractions: list[str] = []  # numbers with a fraction or an exponent, as they are read
    with paused():  # a million small lists, none in a cycle: the collector would walk them all
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise
        except UnicodeDecodeError as err:
            raise ShapeSourceError(f"{path}: not a JSON file: not UTF-8 text ({err})") from None
        except OSError as err:
            raise ShapeSourceError(f"{path}: cannot read it ({err})") from None
        data = _read_json(
            path, text, "the shapes file", parse_float=lambda text: fractions.append(text) or float(text)
        )
        if not isinstance(data, dict):
            raise ShapeSourceError(
                f'{path}: expected an object such as {{"layers/0/w": [[512, 512], "float32"]}}'
            )
        made: dict[Any, jax.ShapeDtypeStruct] = {}
        if fractions or "true" in text or "false" in text:
            return {name: _entry(path, name, entry, made) for name, entry in data.items()}
        entry: Any
        for name, entry in data.items():  # values replaced in place: the dict keeps its size
            if type(entry) is dict:
                entry = [entry.get("shape"), entry.get("dtype")]
            try:
                shape, dtype = entry
                data[name] = made[tuple(shape), dtype]  # only ever a shape and dtype checked before
            except (TypeError, ValueError, KeyError):
                data[name] = _entry(path, name, entry, made)
        return data


def _entry(path: Path, name: str, entry: Any, made: dict[Any, jax.ShapeDtypeStruct]) -> jax.ShapeDtypeStruct:
    """One entry of a shapes file, checked; the `ShapeDtypeStruct` of its
    shape and dtype is made once and kept in `made`."""
    if isinstance(entry, dict):
        entry = [entry.get("shape"), entry.get("dtype")]
    try:
        shape, name_of = entry
        if not isinstance(shape, list) or not isinstance(name_of, str):
            raise TypeError("not [list, str]")
    except (TypeError, ValueError):
        raise ShapeSourceError(
            f'{path}: entry {name!r} should be [shape, dtype], e.g. [[512, 512], "float32"]; '
            f"got {shown(entry)}"
        ) from None
    try:
        dtype = np.dtype(jnp.dtype(name_of))
    except (TypeError, ValueError, SyntaxError):  # NumPy parses some names as Python
        raise ShapeSourceError(f"{path}: entry {name!r} has an unknown dtype {shown(name_of)}") from None
    problem = shape_problem(shape, dtype.itemsize)
    if problem:
        raise ShapeSourceError(f"{path}: entry {name!r}: {problem}")
    key = (tuple(shape), name_of)
    found = made.get(key)
    if found is None:
        found = made[key] = jax.ShapeDtypeStruct(key[0], dtype)
    return found


def _function_shapes(spec: str) -> Any:
    fn = import_callable(spec, "mymodel.shapes:llama_70b")
    try:
        inspect.signature(fn).bind()
    except TypeError:
        raise ShapeSourceError(f"{spec!r} must be callable with no arguments") from None
    except ValueError:  # no signature to inspect (some builtins): just try it
        pass
    return jax.eval_shape(fn)


def import_callable(spec: str, example: str) -> Callable[..., Any]:
    """The callable `module:attr` names (see `_imports.import_attr`); a
    `ShapeSourceError` saying what is wrong otherwise (`example`: a spec to show)."""
    obj = import_attr(spec, example, ShapeSourceError, "function")
    if not callable(obj):
        raise ShapeSourceError(f"{spec!r} is not callable")
    return obj
