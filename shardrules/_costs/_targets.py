"""What `--target NAME` names: a TPU topology, compiled for by the TPU
compiler with no TPU present, or an NVIDIA GPU model, compiled for on
simulated CPU devices and costed with the chip's figures.

A TPU topology is named as JAX names it, `VERSION:SHAPE` (`v5e:4x4`,
`v5p:8x8x4`, `v4:2x2x2`, `v6e:8x8`): `libtpu` (`pip install
"shardrules[tpu]"`) and `jax.experimental.topologies.get_topology_desc` give
its devices, over which the step's mesh is laid out again (same axis names,
sizes and types; `jax.make_mesh` orders the devices along the physical
torus). A GPU model (`h100`, `h200`, `b200`, `a100-80g`) takes its device
count from the mesh.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import re
from collections.abc import Mapping
from typing import Any

from .._errors import Diagnostic, TargetError
from .._planning._chips import CHIPS, TPU_DEVICE_KINDS, Chip

_TOPOLOGY = re.compile(r"(?P<version>v[0-9]+[a-z]*):(?P<shape>[0-9]+(?:x[0-9]+){1,2})")
_QUIET_START = {
    # libtpu looks for a TPU host's metadata and workers at start-up; there is none
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_SKIP_MDS_QUERY": "1",
    # several processes (a test run, two commands) may compile for a topology at once
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}
EXTRA = 'pip install "shardrules[tpu]"'


def _error(message: str, hint: str) -> TargetError:
    return TargetError([Diagnostic("SR126", "error", message, None, hint=hint)])


@dataclasses.dataclass(frozen=True)
class Target:
    """A parsed `--target`.

    **Attributes:** `name` (as given, lower-cased: `"v5p:8x8x4"`, `"h100"`),
    `chip` (its `Chip`), `shape` (a TPU topology's chip grid, `(8, 8, 4)`;
    `()` for a GPU).
    """

    name: str
    chip: Chip
    shape: tuple[int, ...] = ()

    @property
    def compiler(self) -> str:
        """`"tpu"`: the TPU compiler compiles the step; `"cpu"`: XLA's CPU
        compiler does, on simulated devices (a GPU target)."""
        return "tpu" if self.chip.platform == "tpu" else "cpu"


_KNOWN = (
    ", ".join([f"{key}:SHAPE" for key, c in CHIPS.items() if c.platform == "tpu"])
    + ", "
    + ", ".join(key for key, c in CHIPS.items() if c.platform == "gpu")
)


def parse_target(name: str) -> Target:
    """The `Target` a name gives. **Raises:** `TargetError` (SR126) for a
    name that is neither a known TPU topology form nor a known GPU."""
    text = name.strip().lower()
    if text in CHIPS and CHIPS[text].platform == "gpu":
        return Target(text, CHIPS[text])
    m = _TOPOLOGY.fullmatch(text)
    if m is None or m["version"] not in CHIPS:
        gpu = {"h100-80g": "h100", "a100": "a100-80g", "a100-80gb": "a100-80g", "h100-sxm": "h100"}.get(text)
        version = text.split(":", 1)[0]
        cloud = _CLOUD.fullmatch(text)
        if cloud:  # Cloud TPU's accelerator type: chips (v5e, v6e) or TensorCores (v4, v5p), not a shape
            key = _CLOUD_KEYS[cloud["kind"]]
            count = int(cloud["n"]) // (2 if key in ("v4", "v5p") else 1)
            shape = _shape_of(key, count, 3 if key in ("v4", "v5p") else 2)
            fix = (
                f"--target {shape} ({text} is Cloud TPU's accelerator type: {count} chips; a target names "
                "the topology, chips per dimension)"
                if shape
                else f"--target {key}:SHAPE (chips per dimension)"
            )
        elif gpu:
            fix = f"--target {gpu}"
        elif version in CHIPS and CHIPS[version].platform == "tpu":
            fix = f"--target {version}:4x4 (a TPU target names its topology, chips per dimension)"
        else:
            fix = "--target v5p:8x8x4 (a TPU topology) or --target h100 (a GPU; devices from the mesh)"
        raise _error(
            f"unknown target {name!r}: a target is a TPU topology or a GPU model ({_KNOWN})",
            f"e.g. {fix}",
        )
    shape = tuple(int(n) for n in m["shape"].split("x"))
    if any(n < 1 for n in shape):
        raise _error(f"target {name!r}: every dimension of a topology is at least 1", "e.g. --target v5e:4x4")
    return Target(text, CHIPS[m["version"]], shape)


def has_libtpu() -> bool:
    """Whether the TPU compiler (the `libtpu` package) is installed."""
    return importlib.util.find_spec("libtpu") is not None


@functools.cache
def tpu_devices(name: str) -> tuple[Any, ...]:
    """The devices of the TPU topology `name` (a `Target.name`), for
    compiling only. **Raises:** `TargetError` (SR126) without libtpu, or for
    a topology the TPU runtime refuses (its reason quoted)."""
    if not has_libtpu():
        raise _error(
            f"target {name!r} is a TPU topology and the TPU compiler is not installed",
            f"install it with `{EXTRA}` (libtpu, from the package index; no TPU is needed), "
            "or cost the step for a GPU (--target h100) or on the simulated CPU devices (no --target)",
        )
    for key, value in _QUIET_START.items():
        os.environ.setdefault(key, value)
    chips = math.prod(int(n) for n in name.split(":", 1)[1].split("x"))
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", _cloud_name(name.split(":", 1)[0], chips))
    from jax.experimental import topologies

    options = {"chip_config_name": "megacore"} if name.startswith("v4:") else {}
    try:
        topology = topologies.get_topology_desc(platform="tpu", topology_name=name, **options)
    except Exception as err:  # the runtime's own reason, e.g. a shape its hosts do not divide
        said = str(err).split("\n")[0]
        raise _error(
            f"the TPU runtime refuses the topology {name!r}: {said}",
            "name a topology Cloud TPU offers, e.g. v5e:4x4, v5p:4x4x4, v6e:8x8 (chips per dimension)",
        ) from None
    devices = tuple(topology.devices)
    kinds = {TPU_DEVICE_KINDS.get(d.device_kind) for d in devices}
    if kinds != {name.split(":")[0]}:  # a device kind this table does not know
        raise _error(
            f"the topology {name!r} has devices of kind {sorted({d.device_kind for d in devices})}",
            "name a topology of v4, v5e, v5p or v6e chips",
        )
    return devices


@dataclasses.dataclass(frozen=True)
class MeshSizes:
    """A mesh's axis sizes (`shape`, in mesh order) and types without devices:
    what `target_mesh` lays out on a topology."""

    shape: Mapping[str, int]
    axis_types: tuple[Any, ...]


def target_mesh(target: Target, mesh: Any) -> Any:
    """`mesh` (its axis names, sizes and types) laid out on the TPU devices
    of `target`; for a GPU target, `mesh` itself. **Raises:** `TargetError`
    (SR126) when the sizes do not multiply to the topology's devices."""
    if target.compiler != "tpu":
        return mesh
    import jax

    devices = tpu_devices(target.name)
    sizes = dict(mesh.shape)
    from jax.sharding import Mesh

    if isinstance(mesh, Mesh) and set(mesh.devices.flat) == set(devices):
        return mesh  # already on the topology (a step traced there)
    have = math.prod(sizes.values())
    if have != len(devices):
        shown = ",".join(f"{k}={v}" for k, v in sizes.items())
        chips = "x".join(map(str, target.shape))
        raise _error(
            f"the mesh {shown} has {have} devices and the target {target.name} has {len(devices)} "
            f"({target.chip.name}, {chips} chips)",
            f"give the mesh sizes that multiply to {len(devices)} (`--mesh` on the command line), or a topology of {have} "
            f"chips{_topology_of(target, have)}",
        )
    return jax.make_mesh(
        tuple(sizes.values()), tuple(sizes), axis_types=tuple(mesh.axis_types), devices=list(devices)
    )


_CLOUD = re.compile(r"(?P<kind>v4|v5p|v5litepod|v5e|v6e)-(?P<n>[0-9]+)")
_CLOUD_KEYS = {"v4": "v4", "v5p": "v5p", "v5litepod": "v5e", "v5e": "v5e", "v6e": "v6e"}


def _cloud_name(key: str, chips: int) -> str:
    """Cloud TPU's accelerator type for `chips` chips of `key` (`v5litepod-16`;
    v4 and v5p count TensorCores): what libtpu asks for at start-up."""
    return {"v4": f"v4-{2 * chips}", "v5p": f"v5p-{2 * chips}", "v5e": f"v5litepod-{chips}"}.get(
        key, f"{key}-{chips}"
    )


def _shape_of(key: str, count: int, dims: int) -> str:
    """`"v5e:4x4"`: a topology of `count` chips in `dims` dimensions, as square as
    whole numbers allow; `""` for none."""
    if count < 1:
        return ""
    if dims == 2:
        a = math.isqrt(count)
        while count % a:
            a -= 1
        sides = [a, count // a]
    else:
        a = max(round(count ** (1 / 3)), 1)
        while count % a:
            a -= 1
        rest = count // a
        b = math.isqrt(rest)
        while rest % b:
            b -= 1
        sides = [a, b, rest // b]
    sides = sorted(n for n in sides if n > 1) + [n for n in sides if n == 1]  # as Cloud TPU writes them
    return f"{key}:" + "x".join(map(str, sides))


def _topology_of(target: Target, count: int) -> str:
    """`" (e.g. v5e:4x4)"`: a topology of `count` chips shaped like the target's."""
    shape = _shape_of(target.chip.key, count, len(target.shape))
    return f" (e.g. {shape})" if shape else ""
