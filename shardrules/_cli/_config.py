"""`[tool.shardrules]` in a `pyproject.toml`: finding the nearest one, checking
its keys and their types, and filling in what the command line left out
(a flag always wins over the file)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .._errors import did_you_mean
from .._language._sizes import byte_size
from ._lint import UsageError, parse_mesh


@dataclasses.dataclass(frozen=True)
class Config:
    """The checked `[tool.shardrules]` table of one `pyproject.toml`."""

    path: Path  # the pyproject.toml, absolute
    values: Mapping[str, Any]  # key as written in the file (`replicated-tolerance`) -> checked value

    @property
    def folder(self) -> Path:
        return self.path.parent

    def where(self, key: str) -> str:
        return f"[tool.shardrules] {key} in {_shown(self.path)}"

    @property
    def excludes(self) -> list[str]:
        """`exclude`, as absolute globs (relative ones are relative to the folder of the file)."""
        return [str(self.folder / g) for g in self.values.get("exclude", [])]


def parse_tolerance(text: str, what: str = "--replicated-tolerance") -> float:
    """`"0.25"` or `"25%"` → `0.25`: the share of a plan's bytes that may be
    fully replicated, from 0 to 1 (0% to 100%)."""
    body = text.strip()
    scale = 100.0 if body.endswith("%") else 1.0
    try:
        value = float(body.removesuffix("%")) / scale
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise UsageError(f"{what} {text!r}: write a fraction from 0 to 1 or a percentage, e.g. 0.25 or 25%")
    return value


def _string(key: str, value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UsageError(f"{where}: must be a non-empty string, not {_toml(value)}")
    return value


def _bool(key: str, value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{where}: must be true or false, not {_toml(value)}")
    return value


def _size(key: str, value: Any, where: str) -> int | str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise UsageError(f'{where}: must be a size such as "80GiB" or a number of bytes, not {_toml(value)}')
    try:
        byte_size(value)
    except ValueError as err:
        raise UsageError(f"{where}: {err}") from None
    return value


def _hosts(key: str, value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{where}: must be a whole number of at least 1, not {_toml(value)}")
    return value


def _tolerance(key: str, value: Any, where: str) -> float:
    if isinstance(value, str):
        return parse_tolerance(value, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise UsageError(
            f'{where}: must be a fraction from 0 to 1 (0.25) or a percentage ("25%"), not {_toml(value)}'
        )
    return float(value)


def _mesh(key: str, value: Any, where: str) -> dict[str, int]:
    if isinstance(value, str):
        return parse_mesh(value, where)
    if isinstance(value, dict) and value:
        text = ",".join(f"{k}={v}" for k, v in value.items())
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
            return parse_mesh(text, where)
    raise UsageError(
        f'{where}: must be axis sizes, "fsdp=32,model=8" or {{fsdp = 32, model = 8}}, not {_toml(value)}'
    )


def _ratio(key: str, value: Any, where: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf"):
        return float(value)
    raise UsageError(f"{where}: must be a number above 0, e.g. 1.2, not {_toml(value)}")


def _headroom(key: str, value: Any, where: str) -> float:
    from ._options import fraction

    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1:
        return float(value)
    if isinstance(value, str):
        try:
            return fraction(value)
        except argparse.ArgumentTypeError:
            pass
    raise UsageError(f'{where}: must be a share from 0 to under 1, e.g. 0.1 or "10%", not {_toml(value)}')


def _increase(key: str, value: Any, where: str) -> float:
    from ._options import increase

    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1:
        return float(value)
    if isinstance(value, str):
        try:
            return increase(value)
        except argparse.ArgumentTypeError:
            pass
    raise UsageError(
        f'{where}: must be an increase of 0 or more, a fraction under 1 or a percentage, e.g. 0.1 or "10%", '
        f"not {_toml(value)}"
    )


def _globs(key: str, value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(g, str) for g in value):
        raise UsageError(f'{where}: must be a list of strings, e.g. ["tests/data"], not {_toml(value)}')
    return value


KEYS: dict[str, Callable[[str, Any, str], Any]] = {
    "baseline": _string,
    "device-memory": _size,
    "exclude": _globs,
    "group": _string,
    "hbm-headroom": _headroom,
    "hosts": _hosts,
    "lint-included": _bool,
    "max-collective-bytes": _size,
    "max-collective-increase": _increase,
    "max-flops-ratio": _ratio,
    "max-peak-bytes": _size,
    "max-step-time": _ratio,
    "mesh": _mesh,
    "replicated-threshold": _size,
    "replicated-tolerance": _tolerance,
    "shapes": _string,
    "step": _string,
    "strict": _bool,
    "target": _string,
}
"""Every key `[tool.shardrules]` may hold, with the check of its value."""


def _toml(value: Any) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array"}
    return (
        f"{kind.get(type(value), 'a table' if isinstance(value, dict) else type(value).__name__)} ({value!r})"
    )


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def check(table: Any, path: Path) -> Config:
    """The `Config` of a `[tool.shardrules]` table read from `path`.

    **Raises:** `UsageError` for a key that is not in `KEYS` (naming the
    closest one and every known key) or a value of the wrong type."""
    if not isinstance(table, dict):
        raise UsageError(f"{_shown(path)}: [tool.shardrules] must be a table, not {_toml(table)}")
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in KEYS:
            close = did_you_mean(key, KEYS)
            raise UsageError(
                f"{_shown(path)}: unknown key `{key}` in [tool.shardrules]"
                + (f"; {close}" if close else "")
                + f" (known keys: {', '.join(KEYS)})"
            )
        values[key] = KEYS[key](key, value, f"[tool.shardrules] {key} in {_shown(path)}")
    return Config(path.resolve(), values)


def nearest(start: Path) -> Config | None:
    """The config of the nearest `pyproject.toml` at or above the folder
    `start` that has a `[tool.shardrules]` table (as ruff finds `[tool.ruff]`)."""
    start = start.resolve()
    for folder in (start, *start.parents):
        path = folder / "pyproject.toml"
        if not path.is_file():
            continue
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"{_shown(path)}: cannot read: {err}") from None
        except tomllib.TOMLDecodeError as err:
            raise UsageError(f"{_shown(path)}: not valid TOML: {err}") from None
        tool = data.get("tool", {})
        if isinstance(tool, dict) and "shardrules" in tool:
            return check(tool["shardrules"], path)
    return None


def for_paths(paths: Iterable[str | os.PathLike[str]]) -> Config | None:
    """The config nearest to the folder that holds every path named (a file's
    folder, or the folder itself)."""
    folders = [str(p if Path(p).is_dir() else Path(p).parent) for p in paths]
    common = os.path.commonpath([os.path.abspath(f) for f in folders]) if folders else os.getcwd()
    return nearest(Path(common))


# The command line's option (an attribute of its namespace) for each key.
_OPTIONS = {
    "baseline": "baseline",
    "device-memory": "device_memory",
    "group": "group",
    "hosts": "hosts",
    "max-collective-bytes": "max_collective_bytes",
    "max-collective-increase": "max_collective_increase",
    "max-flops-ratio": "max_flops_ratio",
    "hbm-headroom": "hbm_headroom",
    "max-peak-bytes": "max_peak_bytes",
    "max-step-time": "max_step_time",
    "mesh": "mesh",
    "replicated-threshold": "replicated_threshold",
    "replicated-tolerance": "replicated_tolerance",
    "shapes": "shapes",
    "step": "step",
    "strict": "strict",
    "target": "target",
}


def apply(args: argparse.Namespace, config: Config | None) -> None:
    """Fill in the options the command line did not give (`None`) from
    `config`; `args.origins` maps each option taken from it to where it is."""
    origins: dict[str, str] = {}
    args.origins = origins
    if config is None:
        return
    for key, option in _OPTIONS.items():
        if key in config.values and hasattr(args, option) and getattr(args, option) is None:
            value = config.values[key]
            if key == "shapes":
                value = _shapes(value, config.folder)
            elif key == "baseline":  # a plan file, relative to the config's folder
                value = _shown(Path(value) if Path(value).is_absolute() else config.folder / value)
            setattr(args, option, value)
            origins[option] = config.where(key)


def _shapes(source: str, folder: Path) -> str:
    """A shapes file relative to the config's folder; a `module:function` as written."""
    if ":" in source and not source.endswith((".json", ".safetensors")) and not (folder / source).exists():
        return source
    path = Path(source) if Path(source).is_absolute() else folder / source
    return _shown(path)
