"""Writing small `.safetensors` files for the tests that read checkpoints
(tests/test_place.py, tests/test_load_cost.py): a JSON header padded to 8
bytes, then each tensor's bytes in C order. Not a test module."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

CODES = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
    np.dtype(np.int8): "I8",
}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {
            "dtype": CODES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))
