"""Reading YAML configs for `shardrules convert maxtext`: an alias bomb refused,
and a 4,000-rule config written with anchors and a merge key read, each
against its floor in the same run.

    python benchmarks/yaml_configs.py [--repeat 5]

Documents:

- the "billion laughs": nine levels of nine aliases under a
  `logical_axis_rules` key (standing for 387 million values), and the same
  bomb made of merge keys (`<<: [*m1, *m1, ...]`);
- a MaxText config of 4,000 logical axis rules written with anchors and
  aliases (the axes of five rules anchored, the other rules' axes aliases of them), all of it
  under `base: &base` and spread into the top level with `<<: *base`; and
  the same config written out (no anchor, alias or merge key).

Measured, best of `--repeat` rounds, the variants taking turns, with PyYAML's
C loader (libyaml) and with its own Python loader (the C one hidden, as where
PyYAML has no libyaml):

- refusing each bomb (`SourceError`) against parsing its text to events
  (floor: the parser alone, nothing counted or built);
- reading the config (`parse_yaml`, the bounded reader `convert` uses), and
  `sr.convert_maxtext` of the file (read, bounded, converted), against
  `yaml.load` of the same text with no bounds, `yaml.load` of the written-out
  config, and `json.loads` of the same data as JSON (floors).

Then the commands as fresh processes, in CPU time (user + sys): `shardrules
convert maxtext` of the config and of the bomb, against a Python that starts
and imports the command line (floor). Target: each bomb refused and the
config read (`parse_yaml`) in under 1 s, in the process; the conversion after
it is shown, not a target. Exits 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

import shardrules as sr
from shardrules._convert._common import SourceError
from shardrules._convert._documents import parse_yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import best_of, cpu_of

BOMB = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
    + ["logical_axis_rules: [[x, *i]]", ""]
)
MERGE_BOMB = "\n".join(
    ["a: &a {k0: 1, k1: 2, k2: 3, k3: 4, k4: 5, k5: 6, k6: 7, k7: 8}"]
    + [
        f"m{i}: &m{i} {{<<: [{', '.join([f'*{p}'] * 9)}], z{i}: 0}}"
        for i, p in enumerate(["a", *[f"m{j}" for j in range(1, 8)]], 1)
    ]
    + ["logical_axis_rules: [[x, y]]", ""]
)
AXES = [["fsdp", "sequence"], "tensor", ["data", "fsdp"], "expert", ["fsdp", "tensor"]]


def configs(n: int) -> tuple[str, str]:
    """The config of `n` rules with anchors, aliases and `<<: *base`, and written out."""
    lines = ["base: &base", "  mesh_axes: [data, fsdp, sequence, tensor, expert]", "  logical_axis_rules:"]
    lines += [f"    - [n{i}, &x{i} {json.dumps(axis)}]" for i, axis in enumerate(AXES)]
    lines += [f"    - [m{i}, *x{i % len(AXES)}]" for i in range(n - len(AXES))]
    lines += ["<<: *base", "scan_layers: true", ""]
    plain = ["mesh_axes: [data, fsdp, sequence, tensor, expert]", "logical_axis_rules:"]
    plain += [f"  - [n{i}, {json.dumps(axis)}]" for i, axis in enumerate(AXES)]
    plain += [f"  - [m{i}, {json.dumps(AXES[i % len(AXES)])}]" for i in range(n - len(AXES))]
    plain += ["scan_layers: true", ""]
    return "\n".join(lines), "\n".join(plain)


@contextlib.contextmanager
def loader(kind: str) -> Iterator[type]:
    """PyYAML's C loader, or its Python one with the C one hidden (as without libyaml)."""
    c_loader = yaml.CSafeLoader
    if kind == "libyaml":
        yield c_loader
        return
    del yaml.CSafeLoader
    try:
        yield yaml.SafeLoader
    finally:
        yaml.CSafeLoader = c_loader


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def refused(text: str) -> None:
    try:
        parse_yaml(text, "bomb.yml")
    except SourceError:
        return
    raise AssertionError("the bomb was read")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="rounds; each variant keeps its best")
    args = parser.parse_args()
    anchored, plain = configs(4000)
    as_json = json.dumps(yaml.load(plain, Loader=yaml.CSafeLoader))
    missed = False
    rows: list[tuple[str, str, float, float, bool]] = []  # loader, what, seconds, floor, has a target
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "config.yml").write_text(anchored)
        (folder / "bomb.yml").write_text(BOMB)
        for kind in ("libyaml", "python"):
            with loader(kind) as load_with:
                best = best_of(
                    {
                        "bomb events": lambda: timed(lambda: list(yaml.parse(BOMB, Loader=load_with))),
                        "bomb": lambda: timed(lambda: refused(BOMB)),
                        "merge bomb events": lambda: timed(
                            lambda: list(yaml.parse(MERGE_BOMB, Loader=load_with))
                        ),
                        "merge bomb": lambda: timed(lambda: refused(MERGE_BOMB)),
                        "json": lambda: timed(lambda: json.loads(as_json)),
                        "load plain": lambda: timed(lambda: yaml.load(plain, Loader=load_with)),
                        "load anchored": lambda: timed(lambda: yaml.load(anchored, Loader=load_with)),
                        "parse_yaml plain": lambda: timed(lambda: parse_yaml(plain, "plain.yml")),
                        "parse_yaml": lambda: timed(lambda: parse_yaml(anchored, "config.yml")),
                        "convert": lambda: timed(lambda: sr.convert_maxtext(folder / "config.yml")),
                    },
                    args.repeat,
                )
            floor = best["load anchored"]
            rows += [
                (
                    kind,
                    f"refusing the billion laughs ({len(BOMB)} bytes)",
                    best["bomb"],
                    best["bomb events"],
                    True,
                ),
                (
                    kind,
                    f"refusing the merge-key bomb ({len(MERGE_BOMB)} bytes)",
                    best["merge bomb"],
                    best["merge bomb events"],
                    True,
                ),
                (kind, "floor: `json.loads` of the config as JSON", best["json"], floor, False),
                (kind, "floor: `yaml.load` of the config written out", best["load plain"], floor, False),
                (kind, "floor: `yaml.load` of the config, no bounds", floor, floor, False),
                (kind, "`parse_yaml` of the config written out", best["parse_yaml plain"], floor, False),
                (kind, "`parse_yaml` of the config", best["parse_yaml"], floor, True),
                (kind, "`sr.convert_maxtext` of the config file", best["convert"], floor, False),
            ]
        python = [sys.executable]
        commands = best_of(
            {
                "start + import (floor)": lambda: cpu_of(
                    [*python, "-c", "import shardrules._cli._main"], folder
                ),
                "shardrules convert maxtext config.yml": lambda: cpu_of(
                    [*python, "-m", "shardrules", "convert", "maxtext", "config.yml", "-o", "out.shard"],
                    folder,
                ),
                "shardrules convert maxtext bomb.yml": lambda: cpu_of(
                    [*python, "-m", "shardrules", "convert", "maxtext", "bomb.yml"], folder, check=False
                ),
            },
            args.repeat,
        )

    print(f"machine: {platform.machine()} {os.cpu_count()} cores, {platform.system()}")
    print(
        f"python {platform.python_version()}, PyYAML {yaml.__version__} (libyaml: {yaml.__with_libyaml__}), "
        f"shardrules {sr.__version__}"
    )
    print(
        f"config: 4,000 rules, {len(anchored):,} bytes ({len(plain):,} written out); best of {args.repeat} rounds"
    )
    print()
    print("| loader | | seconds | vs floor | target |\n|---|---|--:|--:|--:|")
    for kind, what, seconds, floor, target in rows:
        missed = missed or (target and seconds >= 1.0)
        floor_note = "vs its events" if "refusing" in what else "vs no bounds"
        print(
            f"| {kind} | {what} | {seconds:.4f} | {seconds / floor:.2f}x ({floor_note}) | {'< 1 s' if target else ''} |"
        )
    print()
    floor = commands["start + import (floor)"]
    print("| command (fresh process) | CPU seconds | vs floor |\n|---|--:|--:|")
    for name, seconds in commands.items():
        print(f"| {name} | {seconds:.2f} | {seconds / floor:.2f}x |")
    print("\nall targets met" if not missed else "\nTARGET MISSED")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
