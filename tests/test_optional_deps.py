"""Optional dependencies stay optional.

Each check runs in a fresh interpreter whose import system refuses every
framework shardrules integrates with (as if none were installed): `import
shardrules` and the core API must work on plain dicts, and every entry point
that does need a framework must fail with an `ImportError` that names the extra
to install.

To cover a new integration, add a row to `ENTRY_POINTS`.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Top-level packages made unimportable in the subprocess.
BLOCKED = ("flax", "optax", "equinox", "torch", "torchax", "orbax", "safetensors", "yaml", "penzai")

# Every entry point that needs a framework: name -> (extra it needs, a statement
# calling it). The statement runs after the preamble below (`sr`, `jax`, `jnp`,
# `np`, `RULES`, `MESH`, `TMP` are defined) and must raise ImportError.
ENTRY_POINTS: dict[str, tuple[str, str]] = {
    "load_orbax": ("orbax", "sr.load_orbax(TMP / 'no-checkpoint', RULES, MESH)"),
    "convert_maxtext": ("yaml", "sr.convert_maxtext(TMP / 'base.yml')"),
}

_HOOK = f"""
import importlib.abc, sys

BLOCKED = {BLOCKED!r}

class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked for this test)", name=name)
        return None

sys.meta_path.insert(0, _Refuse())
for _name in list(sys.modules):
    if _name.split(".")[0] in BLOCKED:
        del sys.modules[_name]
"""

_PREAMBLE = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
import pathlib, tempfile
import jax, jax.numpy as jnp, numpy as np
import shardrules as sr

TMP = pathlib.Path(tempfile.mkdtemp())
RULES = sr.loads('''
mesh data, model
alias hidden = model
rules params:
  "up/kernel$"   -> (_, hidden)
  "down/kernel$" -> (hidden, _)
  default        -> replicated
rules inputs:
  "." -> (data, _)
''', name="plain.shard")
MESH = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
"""


def _run(body: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "check.py"
    script.write_text(_HOOK + _PREAMBLE + textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_hook_blocks_every_framework(tmp_path):
    """The test below is only meaningful if the frameworks really cannot be imported."""
    body = """
    import importlib
    for name in ("flax", "flax.linen", "flax.nnx", "optax", "equinox", "torch", "torchax",
                 "orbax.checkpoint", "safetensors", "yaml"):
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        raise SystemExit(f"{name} was importable")
    print("all blocked")
    """
    result = _run(body, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "all blocked" in result.stdout


def test_core_api_works_without_any_framework(tmp_path):
    body = """
    from jax.sharding import PartitionSpec as P

    params = {"up": {"kernel": np.ones((16, 32), np.float32), "bias": np.zeros(32, np.float32)},
              "down": {"kernel": np.ones((32, 8), np.float32)}, "step": 0, "act": jax.nn.relu}
    assert sr.specs(params, RULES, MESH)["up"]["kernel"] == P(None, "model")
    assert sr.shardings(params, RULES, MESH)["down"]["kernel"].spec == P("model", None)
    plan = sr.plan(params, RULES, MESH)
    assert plan.ok and plan["up/kernel"].why == "rule"
    assert all(d.severity == "warning" for d in sr.check(params, RULES, MESH))

    placed = sr.apply(params, RULES, MESH)
    assert placed["up"]["kernel"].sharding.spec == P(None, "model") and placed["act"] is jax.nn.relu

    made = sr.init(lambda key: {"up": {"kernel": jax.random.normal(key, (16, 32))}}, RULES, MESH)(jax.random.key(0))
    assert made["up"]["kernel"].sharding.spec == P(None, "model")

    @jax.jit
    def step(p, x):
        p = sr.constrain(p, RULES, MESH)
        return sr.constrain(x, RULES, MESH, name="x", group="inputs") @ p["up"]["kernel"]

    x = sr.apply({"x": np.ones((8, 16), np.float32)}, RULES, MESH, group="inputs")["x"]
    assert step({"up": {"kernel": placed["up"]["kernel"]}}, x).shape == (8, 32)

    # A rule file using `logical` loads and gives its error on plain leaves, no Flax needed.
    logical = sr.loads("alias hidden = model\\nrules params:\\n  default -> logical\\n")
    try:
        sr.specs({"w": np.ones((4, 4))}, logical, MESH)
    except sr.PlanError as err:
        assert err.code == "SR113", err
    else:
        raise SystemExit("logical on a plain leaf did not fail")

    assert sr.format_text("rules params:\\n  default->replicated\\n") == "rules params:\\n  default -> replicated\\n"

    # Checkpoints are read without the safetensors package.
    header = json.dumps({"up/kernel": {"dtype": "F32", "shape": [16, 32], "data_offsets": [0, 2048]}}).encode()
    path = TMP / "model.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + np.ones((16, 32), np.float32).tobytes())
    loaded = sr.load_checkpoint(path, RULES, MESH)
    assert loaded["up/kernel"].sharding.spec == P(None, "model")

    # The CLI, with shapes from a JSON file.
    (TMP / "plain.shard").write_text("mesh data, model\\nrules params:\\n  default -> replicated\\n")
    (TMP / "shapes.json").write_text(json.dumps({"w": [[8, 8], "float32"]}))
    from shardrules._cli._main import main
    status = main(["lint", str(TMP / "plain.shard"), "--mesh", "data=4,model=2",
                   "--shapes", str(TMP / "shapes.json")])
    assert status == 0, status

    # Converting needs no framework; only reading a MaxText YAML file needs PyYAML.
    assert sr.convert_flax([("embed", "fsdp")]).exact
    assert sr.convert_maxtext({"mesh_axes": ["fsdp"], "logical_axis_rules": [["embed", "fsdp"]]}).exact
    assert sr.convert_hf({"layers.*.q": "colwise"}).exact
    assert sr.convert_regex([("kernel", P("model"))]).exact

    import sys
    loaded_frameworks = sorted({m.split(".")[0] for m in sys.modules} & set(BLOCKED))
    assert not loaded_frameworks, loaded_frameworks
    print("core ok")
    """
    result = _run("import json\n" + textwrap.dedent(body), tmp_path)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "core ok" in result.stdout


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_entry_point_names_its_extra(name, tmp_path):
    extra, call = ENTRY_POINTS[name]
    body = f"""
    try:
        {call}
    except ImportError as err:
        print("ImportError:", err)
    else:
        raise SystemExit("{name} did not raise ImportError")
    """
    result = _run(body, tmp_path)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "ImportError:" in result.stdout
    assert f'pip install "shardrules[{extra}]"' in result.stdout, result.stdout


def test_every_extra_named_is_declared():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, (extra, _) in ENTRY_POINTS.items():
        assert extra in extras, f"{name} names the extra {extra!r}, which pyproject.toml does not declare"
    for package in ("flax", "optax", "equinox", "torchax", "orbax", "yaml"):
        assert package in extras, f"no extra installs {package}"
    # .safetensors files are read by shardrules itself (see the checkpoint test above)
    assert "safetensors" not in extras
