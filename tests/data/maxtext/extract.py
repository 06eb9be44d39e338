"""Refresh the MaxText extracts in this folder from a MaxText checkout.

    python tests/data/maxtext/extract.py PATH/TO/maxtext

Writes, from the checkout's current commit (see NOTICE):

- `configs/base.yml` and `configs/custom_mesh_and_rule/NAME.yml`: each config's
  `mesh_axes` line and `logical_axis_rules` block, verbatim;
- `sharding/MODEL/TOPOLOGY/RULE.json`: from each golden dump pair
  `tests/utils/sharding_info/MODEL/TOPOLOGY/slice_1/RULE/{logical,named}_shardings.json`,
  the mesh (axis sizes, in order) and, for every leaf of `.params` and `.step`,
  its logical axis names, shape and named `partition_spec`. (The optimizer
  state's leaves repeat the parameters' names and specs; they are left out.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = "src/maxtext/configs"
DUMPS = "tests/utils/sharding_info"


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


def main(checkout: Path) -> None:
    commit = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    for config in [
        checkout / CONFIGS / "base.yml",
        *sorted((checkout / CONFIGS / "custom_mesh_and_rule").glob("*.yml")),
    ]:
        rel = config.relative_to(checkout / CONFIGS)
        target = HERE / "configs" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        header = (
            f"# Extract of {CONFIGS}/{rel} from github.com/AI-Hypercomputer/maxtext at {commit}\n"
            "# (Apache-2.0, see tests/data/maxtext/NOTICE): its mesh_axes and logical_axis_rules, verbatim.\n"
        )
        target.write_text(header + _blocks(config.read_text(encoding="utf-8")), encoding="utf-8")
    for named in sorted((checkout / DUMPS).glob("*/*/slice_1/*/named_shardings.json")):
        folder = named.parent
        logical = json.loads((folder / "logical_shardings.json").read_text(encoding="utf-8"))
        physical = json.loads(named.read_text(encoding="utf-8"))
        meshes = {json.dumps(v["mesh"]["shape"]) for v in physical.values()}
        assert len(meshes) == 1, f"{folder}: more than one mesh"
        leaves = {
            path: [logical[path]["partition_spec"], entry["shape"], entry["partition_spec"]]
            for path, entry in physical.items()
            if path.startswith((".params/", ".step"))
        }
        rows = ",\n".join(f"  {json.dumps(path)}: {json.dumps(leaf)}" for path, leaf in leaves.items())
        text = (
            f'{{"source": {json.dumps(f"{folder.relative_to(checkout)} at {commit}")},\n'
            f' "mesh": {meshes.pop()},\n'
            f' "leaves": {{\n{rows}\n }}}}\n'
        )
        model, topology = folder.parts[-4], folder.parts[-3]
        target = HERE / "sharding" / model / topology / f"{folder.name}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
