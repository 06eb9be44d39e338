"""The built wheel, installed on its own, works: grammar packaged, includes, compile, CLI.

The wheel is built from this checkout and installed (without dependencies, from
no index) into a fresh virtual environment in a temporary folder. That
environment sees the running interpreter's third-party packages (jax, lark,
numpy, ...) through a folder of links that leaves out this checkout's editable
install of shardrules, so the package under test is the one from the wheel.
Everything runs with the temporary folder as working directory, outside the
repository.
"""

from __future__ import annotations

import importlib.util
import json
import os
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 300

COMMON = """\
# shared names
mesh data=4, model=2

alias batch = data
"""

MODEL = """\
include "common.shard"

rules params:
  "layers/\\d+/w$" -> (_, model)
  "layers/\\d+/b$" -> (model)
  default         -> replicated

rules inputs:
  "^x$" -> (batch, _)
"""

UNFORMATTED = 'rules params:\n"kernel"->(_,model)\n  default -> replicated\n'

SNIPPET = r"""
import importlib.metadata
import importlib.resources
import json
import sys

import jax
import jax.numpy as jnp
import shardrules as sr

mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
rules = sr.load("model.shard")
tree = {
    "layers": [{"w": jnp.zeros((8, 16)), "b": jnp.zeros(16)}],
    "scale": jnp.ones(()),
    "act": jax.nn.gelu,
}
specs = sr.specs(tree, rules, mesh)
inputs = sr.specs({"x": jnp.zeros((8, 3))}, rules, mesh, group="inputs")
placed = sr.apply(tree, rules, mesh)
grammar = importlib.resources.files("shardrules").joinpath("grammar", "shardrules.lark")
print(sr.plan(tree, rules, mesh))
print(json.dumps({
    "file": sr.__file__,
    "version": sr.__version__,
    "dist_version": importlib.metadata.version("shardrules"),
    "grammar_packaged": grammar.is_file(),
    "files": list(rules.files),
    "groups": list(rules.group_names),
    "w": list(specs["layers"][0]["w"]),
    "b": list(specs["layers"][0]["b"]),
    "scale": list(specs["scale"]),
    "act": specs["act"],
    "x": list(inputs["x"]),
    "placed_w": list(placed["layers"][0]["w"].sharding.spec),
    "devices": jax.device_count(),
    "sys_path": sys.path,
}))
"""


def _run(args: list[str | Path], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )


def _check(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_"))}
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _is_shardrules_entry(name: str) -> bool:
    """This checkout's install of shardrules: package, metadata, editable hooks."""
    lowered = name.lower()
    return lowered == "shardrules" or lowered.startswith(
        ("shardrules-", "shardrules.", "__editable__", "_editable_impl_shardrules", "_shardrules")
    )


def _dependency_dir(dest: Path) -> Path:
    """A folder of links to the running interpreter's installed packages, less shardrules.

    `.pth` files are left out as well: a folder named in a `.pth` line is only
    put on `sys.path`, its own `.pth` files are never run.
    """
    dest.mkdir()
    sources = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    seen: set[str] = set()
    for source in dict.fromkeys(sources):
        folder = Path(source)
        if not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir()):
            if entry.name in seen or entry.suffix == ".pth" or _is_shardrules_entry(entry.name):
                continue
            seen.add(entry.name)
            (dest / entry.name).symlink_to(entry)
    return dest


def _build_wheel(outdir: Path, env: dict[str, str]) -> Path:
    # Without build isolation when the backend is at hand (offline-safe); otherwise
    # let `build` fetch it into an isolated environment.
    isolation = ["--no-isolation"] if importlib.util.find_spec("hatchling") else []
    _check(_run([sys.executable, "-m", "build", "--wheel", *isolation, "--outdir", outdir, REPO], REPO, env))
    wheels = sorted(outdir.glob("shardrules-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


class Installed:
    def __init__(self, root: Path, wheel: Path, venv: Path, env: dict[str, str]):
        self.root, self.wheel, self.venv, self.env = root, wheel, venv, env
        self.bin = venv / ("Scripts" if os.name == "nt" else "bin")
        self.python = self.bin / ("python.exe" if os.name == "nt" else "python")

    def run(self, *args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return _run(list(args), cwd or self.root, self.env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    env = _clean_env()
    wheel = _build_wheel(root / "dist", env)

    venv = root / "venv"
    _check(_run([sys.executable, "-m", "venv", "--without-pip", venv], root, env))
    out = Installed(root, wheel, venv, env)
    purelib = _check(
        out.run(out.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    ).stdout.strip()
    deps = _dependency_dir(root / "deps")
    # The new venv's own site-packages stays first on sys.path; the links come after.
    Path(purelib, "zz_test_dependencies.pth").write_text(f"{deps}\n", encoding="utf-8")

    _check(out.run(out.python, "-m", "pip", "install", "--no-deps", "--no-index", "--no-cache-dir", wheel))
    return out


def test_wheel_contents(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as zf:
        names = set(zf.namelist())
        assert "shardrules/grammar/shardrules.lark" in names
        # Every module of every stage folder ships, not only the top level.
        modules = {f.relative_to(REPO).as_posix() for f in (REPO / "shardrules").rglob("*.py")}
        assert "shardrules/_cli/_main.py" in modules
        assert modules <= names, sorted(modules - names)
        packaged = zf.read("shardrules/grammar/shardrules.lark").decode("utf-8")
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "shardrules = shardrules._cli:main" in zf.read(entry_points).decode("utf-8")
    assert packaged == (REPO / "grammar" / "shardrules.lark").read_text(encoding="utf-8")
    assert not any(n.startswith(("tests/", "docs/", "grammar/")) for n in names), sorted(names)


def test_installed_wheel_loads_and_compiles(installed: Installed) -> None:
    (installed.root / "common.shard").write_text(COMMON, encoding="utf-8")
    (installed.root / "model.shard").write_text(MODEL, encoding="utf-8")
    proc = _check(installed.run(installed.python, "-c", SNIPPET))
    result = json.loads(proc.stdout.strip().splitlines()[-1])

    venv = installed.venv.resolve()
    assert Path(result["file"]).resolve().is_relative_to(venv), result["file"]
    assert not any(Path(p).resolve() == REPO for p in result["sys_path"] if p), result["sys_path"]
    assert result["grammar_packaged"] is True
    assert result["version"] == result["dist_version"]
    assert result["files"] == ["model.shard", "common.shard"]
    assert result["groups"] == ["params", "inputs"]
    assert result["w"] == [None, "model"]
    assert result["b"] == ["model"]
    assert result["scale"] == []
    assert result["act"] is None
    assert result["x"] == ["data", None]
    assert result["placed_w"] == [None, "model"]
    assert result["devices"] == 8
    assert "model.shard:4:3" in proc.stdout  # the plan table names the rule


def test_console_script_fmt_check(installed: Installed) -> None:
    script = installed.bin / ("shardrules.exe" if os.name == "nt" else "shardrules")
    assert script.is_file()
    good = installed.root / "fmt_good.shard"
    good.write_text(MODEL, encoding="utf-8")
    _check(installed.run(script, "fmt", "--check", good))

    bad = installed.root / "fmt_bad.shard"
    bad.write_text(UNFORMATTED, encoding="utf-8")
    proc = installed.run(script, "fmt", "--check", bad)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert f"would reformat {bad}" in proc.stdout
    assert bad.read_text(encoding="utf-8") == UNFORMATTED  # --check changes nothing

    version = _check(installed.run(script, "--version"))
    assert version.stdout.strip().startswith("shardrules ")


def test_python_m_shardrules_help(installed: Installed) -> None:
    proc = _check(installed.run(installed.python, "-m", "shardrules", "--help"))
    assert "usage: shardrules" in proc.stdout
    assert "fmt" in proc.stdout
    where = _check(installed.run(installed.python, "-c", "import shardrules; print(shardrules.__file__)"))
    assert Path(where.stdout.strip()).resolve().is_relative_to(installed.venv.resolve())
