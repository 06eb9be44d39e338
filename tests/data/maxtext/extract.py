"""Refresh the MaxText extracts in this folder from a MaxText git repository.

    python tests/data/maxtext/extract.py PATH/TO/maxtext [COMMIT]

`PATH/TO/maxtext` is a clone, bare or not; files are read from its `COMMIT`
(default `HEAD`) with `git show`, never from a work tree, so what is written
is exactly that commit's (record it in NOTICE). Writes:

- `configs/base.yml` and `configs/custom_mesh_and_rule/NAME.yml`: each config's
  `mesh_axes` line and `logical_axis_rules` block, verbatim;
- `sharding/MODEL/TOPOLOGY/RULE.json`: from each golden dump pair
  `tests/utils/sharding_info/MODEL/TOPOLOGY/slice_1/RULE/{logical,named}_shardings.json`,
  the mesh (axis sizes, in order), then every leaf of the dump (the train
  state: `.step`, `.params` and `.opt_state`), in the dump's order:
  - `leaves`: each leaf's logical axis names, shape and named
    `partition_spec`, for every leaf but those of `mirrored`;
  - `mirrored`: the paths of the optimizer-state leaves that have a parameter
    counterpart (`.opt_state/[0]/.mu/['params']/X` has `.params/['params']/X`,
    see `counterpart`), only the paths: each such leaf's names, shape and spec
    are checked here to equal its counterpart's, and extraction fails if one
    does not. Optimizer leaves with no counterpart (AdamW's `count`) are in
    `leaves`, in full.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = "src/maxtext/configs"
DUMPS = "tests/utils/sharding_info"


def counterpart(path: str) -> str | None:
    """The parameter an optimizer-state leaf mirrors. A dump's path is MaxText's
    `"/".join(str(key) for key in keypath)` (`.name` for an attribute, `[0]` for
    a sequence index, `['name']` for a dict key); an optimizer-state leaf's is
    the state node's (`.opt_state/[0]/.mu`), then the parameter's own, whose
    first key is a dict key (`['params']/...`). `None` for a leaf with no dict
    key (`count`). tests/test_convert.py has the same function."""
    parts = path.split("/")
    assert parts[0] == ".opt_state", path
    for i, part in enumerate(parts):
        if part.startswith("['"):
            return "/".join([".params", *parts[i:]])
    return None


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def _blocks(text: str) -> str:
    """The `mesh_axes` line and the `logical_axis_rules` block of a config."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("mesh_axes:"):
            out.append(line)
        elif line.startswith("logical_axis_rules:"):
            out.append(line)
            while not lines[i].strip().startswith("]"):
                i += 1
                out.append(lines[i])
        i += 1
    return "\n".join(out) + "\n"


def _write(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")


def _dump(folder: str, logical: dict, physical: dict, source: str) -> str:
    """One dump pair as the text of `sharding/MODEL/TOPOLOGY/RULE.json`."""
    assert list(logical) == list(physical), f"{folder}: the two files have different leaves"
    meshes = {json.dumps(v["mesh"]["shape"]) for v in physical.values()}
    assert len(meshes) == 1, f"{folder}: more than one mesh"
    full: dict[str, list] = {}
    for path, entry in physical.items():
        assert path.split("/")[0] in (".step", ".params", ".opt_state"), f"{folder}: {path}"
        assert logical[path]["shape"] == entry["shape"], f"{folder}: {path}: two shapes"
        full[path] = [logical[path]["partition_spec"], entry["shape"], entry["partition_spec"]]
    leaves: dict[str, list] = {}
    mirrored: list[str] = []
    for path, leaf in full.items():
        param = counterpart(path) if path.startswith(".opt_state/") else None
        if param is None or param not in full:
            leaves[path] = leaf
            continue
        if leaf != full[param]:
            raise SystemExit(
                f"{folder}: {path} is not laid out as its parameter {param}:\n"
                f"  names, shape, spec {leaf}\n  parameter's        {full[param]}"
            )
        mirrored.append(path)
    rows = ",\n".join(f"  {json.dumps(path)}: {json.dumps(leaf)}" for path, leaf in leaves.items())
    paths = ",\n".join(f"  {json.dumps(path)}" for path in mirrored)
    return (
        f'{{"source": {json.dumps(source)},\n'
        f' "mesh": {meshes.pop()},\n'
        f' "leaves": {{\n{rows}\n }},\n'
        f' "mirrored": [\n{paths}\n ]}}\n'
    )


def main(repo: str, rev: str = "HEAD") -> None:
    commit = _git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}").strip()

    def show(path: str) -> str:
        return _git(repo, "show", f"{commit}:{path}")

    custom = _git(repo, "ls-tree", "--name-only", commit, f"{CONFIGS}/custom_mesh_and_rule/").split()
    for config in [f"{CONFIGS}/base.yml", *sorted(p for p in custom if p.endswith(".yml"))]:
        rel = config.removeprefix(f"{CONFIGS}/")
        header = (
            f"# Extract of {CONFIGS}/{rel} from github.com/AI-Hypercomputer/maxtext at {commit}\n"
            "# (Apache-2.0, see tests/data/maxtext/NOTICE): its mesh_axes and logical_axis_rules, verbatim.\n"
        )
        _write(HERE / "configs" / rel, header + _blocks(show(config)))
    files = _git(repo, "ls-tree", "-r", "--name-only", commit, f"{DUMPS}/").split("\n")
    dump = re.compile(rf"{DUMPS}/[^/]+/[^/]+/slice_1/[^/]+/named_shardings\.json")
    named = sorted(f for f in files if dump.fullmatch(f))
    assert named, f"no dumps under {DUMPS} at {commit}"
    for path in named:
        folder = path.rsplit("/", 1)[0]
        logical = json.loads(show(f"{folder}/logical_shardings.json"))
        physical = json.loads(show(path))
        model, topology, _, rule = folder.split("/")[-4:]
        text = _dump(folder, logical, physical, f"{folder} at {commit}")
        _write(HERE / "sharding" / model / topology / f"{rule}.json", text)


if __name__ == "__main__":
    main(*sys.argv[1:])
