"""Sizes in bytes as rule files and settings write them (`80GiB`, `1.5 GB`,
`4096`): the units, and `byte_size` for a value given outside a rule file (a
setting, a command-line option, an argument). Imports no parser: the planner,
`apply` and the command line read sizes without loading Lark.
"""

from __future__ import annotations

import re
from fractions import Fraction

UNITS = {
    "": 1,
    "B": 1,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def byte_size(value: int | str) -> int:
    """Bytes in `value`: an int, or text such as `"80GiB"`, `"1.5 GB"`, `"4096"`.

    **Raises:** `ValueError` for anything else, naming the units allowed.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"a size in bytes cannot be negative: {value}")
        return value
    if isinstance(value, str):
        found = _SIZE.fullmatch(value)
        if found and found.group(2) in UNITS:
            scaled = Fraction(found.group(1)) * UNITS[found.group(2)]
            if scaled.denominator == 1:
                return int(scaled)
    units = ", ".join(u for u in UNITS if u)
    raise ValueError(f"not a size in bytes: {value!r}; write a number with one of {units}, e.g. 80GiB")
