"""How figures are written for people: FLOPs, bytes and seconds; a rule's
`file:line` with the file relative to the working directory."""

from __future__ import annotations

import os


def format_flops(value: float | None) -> str:
    """`2.5e9` → `"2.50 GFLOP"`, `512` → `"512 FLOP"`; `None` → `"-"`."""
    units = (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3))
    unit, size = next(((u, s) for u, s in units if value is not None and value >= s), ("FLOP", 0))
    return "-" if value is None else f"{value / size:.2f} {unit}" if size else f"{value:.0f} FLOP"


def format_bytes(n: float) -> str:
    """`1536` → `"1.5 KiB"`."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_seconds(seconds: float) -> str:
    """`1.2` → `"1.20 s"`, `0.0123` → `"12.3 ms"`, `4.5e-5` → `"45.0 µs"`, `3e-9` → `"3.0 ns"`."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e9:.1f} ns"


def shown_location(location: str) -> str:
    """A rule's `FILE:LINE` as a person reads it: an absolute `FILE` inside
    the working directory relative to it
    (`examples/transformer/transformer.shard:11`); anything else as it is
    (`inferred`, a file elsewhere, `<string>:3`)."""
    file, sep, line = location.rpartition(":")
    if not sep or not line.isdigit() or not os.path.isabs(file):
        return location
    try:
        relative = os.path.relpath(file)
    except ValueError:  # another drive on Windows
        return location
    return location if relative.startswith("..") else f"{relative}:{line}"
