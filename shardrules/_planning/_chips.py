"""The chips a step can be costed for: each one's memory, peak FLOPs per
dtype, memory bandwidth and link bandwidths, from its maker's published
figures (kept here and nowhere else; docs/cookbook/step-cost.md shows the
table with its sources).

Bandwidths are in bytes per second, FLOPs per second per chip, memory in
bytes. `axis_bandwidth` is what one collective running over one mesh axis
can use, one way, per chip: on a TPU, the chip's bidirectional
inter-chip-interconnect (ICI) bandwidth over its ICI ports (one ring over a
torus dimension uses a port each way); on an NVIDIA GPU, its NVLink
bandwidth one way (NVSwitch connects every GPU of a node to every other).
`network_bandwidth` is a GPU's share of its node's network, one way (used by
collectives whose devices span nodes of `node_size` GPUs); a TPU topology is
one slice, all ICI.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

GiB = 2**30
T = 1e12


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator's published figures.

    **Attributes:**

    - `key`: the name a target uses (`"v5p"`, `"h100"`).
    - `name`: the product's name (`"TPU v5p"`, `"NVIDIA H100 SXM"`).
    - `platform`: `"tpu"` or `"gpu"`.
    - `hbm_bytes`: memory per chip.
    - `hbm_bandwidth`: memory bandwidth per chip (bytes/s).
    - `peak_flops`: dense FLOPs/s per chip by the dtype of a matrix
      multiplication's operands: `"bf16"` (also float16), `"f32"` (float32
      at JAX's default precision: bf16 passes on a TPU, TF32 on an NVIDIA
      GPU), `"fp8"`, `"int8"`; a dtype a chip has no faster unit for runs
      at its bf16 rate.
    - `axis_bandwidth`: one way, per chip, for a collective over one mesh
      axis within a slice (TPU ICI) or a node (NVLink).
    - `network_bandwidth`: one way, per GPU, between nodes; `None` for a TPU.
    - `node_size`: GPUs per node (NVLink domain); `None` for a TPU.
    - `ici_ports`: a TPU's ICI ports (how many mesh axes' rings can run at
      once at `axis_bandwidth` each); `None` for a GPU.
    - `sources`: where the figures come from.
    """

    key: str
    name: str
    platform: str
    hbm_bytes: int
    hbm_bandwidth: float
    peak_flops: Mapping[str, float]
    axis_bandwidth: float
    network_bandwidth: float | None = None
    node_size: int | None = None
    ici_ports: int | None = None
    sources: tuple[str, ...] = ()

    def flops_rate(self, dtype: str) -> float:
        """Peak dense FLOPs/s for matrix multiplications whose operands
        have the HLO element type `dtype` (`bf16`, `f32`, `f8e4m3fn`, `s8`)."""
        return self.peak_flops.get(dtype_class(dtype), self.peak_flops["bf16"])


def dtype_class(dtype: str) -> str:
    """The class of peak rate an HLO element type runs at: `bf16`, `f32`, `fp8` or `int8`."""
    if dtype.startswith("f8"):
        return "fp8"
    if dtype in ("s8", "u8", "s4", "u4"):
        return "int8"
    if dtype in ("f32", "f64"):
        return "f32"
    return "bf16"


_TPU_DOCS = "https://cloud.google.com/tpu/docs/"
_SCALING = "https://jax-ml.github.io/scaling-book/tpus/ (ICI per link, one way)"

CHIPS: dict[str, Chip] = {
    "v4": Chip(
        "v4", "TPU v4", "tpu", 32 * GiB, 1200e9,
        {"bf16": 275 * T, "f32": 275 * T, "int8": 275 * T},
        axis_bandwidth=2 * 45e9, ici_ports=6,
        sources=(_TPU_DOCS + "v4", _SCALING),
    ),
    "v5e": Chip(
        "v5e", "TPU v5e", "tpu", 16 * GiB, 819e9,
        {"bf16": 197 * T, "f32": 197 * T, "int8": 394 * T},
        axis_bandwidth=400e9 / 4, ici_ports=4,
        sources=(_TPU_DOCS + "v5e",),
    ),
    "v5p": Chip(
        "v5p", "TPU v5p", "tpu", 95 * GiB, 2765e9,
        {"bf16": 459 * T, "f32": 459 * T, "fp8": 459 * T, "int8": 918 * T},
        axis_bandwidth=1200e9 / 6, ici_ports=6,
        sources=(_TPU_DOCS + "v5p",),
    ),
    "v6e": Chip(
        "v6e", "TPU v6e (Trillium)", "tpu", 32 * GiB, 1640e9,
        {"bf16": 918 * T, "f32": 918 * T, "int8": 1836 * T},
        axis_bandwidth=800e9 / 4, ici_ports=4,
        sources=(_TPU_DOCS + "v6e",),
    ),
    "h100": Chip(
        "h100", "NVIDIA H100 SXM", "gpu", 80 * GiB, 3.35e12,
        {"bf16": 989 * T, "f32": 494 * T, "fp8": 1979 * T, "int8": 1979 * T},
        axis_bandwidth=450e9, network_bandwidth=400e9 / 8, node_size=8,
        sources=("https://www.nvidia.com/en-us/data-center/h100/ (datasheet, SXM, dense)",
                 "DGX H100: 8 x 400 Gb/s ConnectX-7 per node"),
    ),
    "h200": Chip(
        "h200", "NVIDIA H200 SXM", "gpu", 141 * GiB, 4.8e12,
        {"bf16": 989 * T, "f32": 494 * T, "fp8": 1979 * T, "int8": 1979 * T},
        axis_bandwidth=450e9, network_bandwidth=400e9 / 8, node_size=8,
        sources=("https://www.nvidia.com/en-us/data-center/h200/ (datasheet, SXM, dense)",
                 "HGX H200: 8 x 400 Gb/s per node"),
    ),
    "b200": Chip(
        "b200", "NVIDIA B200", "gpu", 192 * GiB, 8e12,
        {"bf16": 2250 * T, "f32": 1100 * T, "fp8": 4500 * T, "int8": 4500 * T},
        axis_bandwidth=900e9, network_bandwidth=400e9 / 8, node_size=8,
        sources=("https://www.nvidia.com/en-us/data-center/dgx-b200/ (per GPU, dense)",
                 "DGX B200: 8 x 400 Gb/s ConnectX-7 per node"),
    ),
    "a100-80g": Chip(
        "a100-80g", "NVIDIA A100 80GB SXM", "gpu", 80 * GiB, 2039e9,
        {"bf16": 312 * T, "f32": 156 * T, "int8": 624 * T},
        axis_bandwidth=300e9, network_bandwidth=200e9 / 8, node_size=8,
        sources=("https://www.nvidia.com/en-us/data-center/a100/ (datasheet, SXM, dense)",
                 "DGX A100: 8 x 200 Gb/s HDR per node"),
    ),
}  # fmt: skip
"""Every chip a `--target` can name, by its key."""

TPU_DEVICE_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5": "v5p", "TPU v6 lite": "v6e"}
"""The chip each TPU `device_kind` JAX reports is (a topology's devices)."""
