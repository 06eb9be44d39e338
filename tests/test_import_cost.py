"""What `import shardrules` loads, and what it leaves for first use.

Not timed (benchmarks/import_time.py times it against `import jax`): each
test looks at `sys.modules` of a fresh interpreter, so that a heavy module
brought back to import time fails here, by name. Optional frameworks (Flax,
Equinox, torchax, PyYAML, ...) are checked in tests/test_public_api.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from shardrules._language import _grammar
from shardrules._tracing import _compat

REPO = Path(__file__).resolve().parent.parent

# Imported by tracing when it first reads a jaxpr, never by `import shardrules`.
NOT_AT_IMPORT = {
    # `jax.extend` imports Pallas and checkify (20 ms and more): tracing reads
    # `jax.extend.core` through `_compat.jcore` on first use.
    "jax.extend": "tracing reads it through `_compat.jcore`, on first use",
    "jax._src.pallas": "imported by `jax.extend`",
    "jax._src.checkify": "imported by `jax.extend`",
    "jax.experimental.pallas": "Pallas",
    # What only some programs use, imported by `shardrules.__getattr__` (`_LAZY`).
    "shardrules._convert": "`sr.convert_*` and `shardrules convert` only",
    "shardrules._suggest": "`sr.suggest` and `shardrules suggest` only",
    "shardrules._reports": "`assert_plan_matches`, plan files and HTML only",
    # The parser (Lark, and the `regex` module Lark loads) comes with the first rule text parsed.
    "lark": "`_language/_parse.py`, imported by the first load or format; sizes are `_language/_sizes.py`'s",
    "shardrules._language._parse": "imported by the first load or format",
}


def _fresh(code: str) -> dict:
    """What `code` prints last, as JSON, run by a fresh interpreter (this one's)."""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _loaded(modules: list[str], prefix: str) -> list[str]:
    return [m for m in modules if m == prefix or m.startswith(prefix + ".")]


def test_import_leaves_heavy_modules_and_the_parser_for_first_use() -> None:
    found = _fresh(
        """
import json, sys
import shardrules
from shardrules._language import _grammar
from shardrules._tracing import _compat
modules = sorted(sys.modules)
built = _grammar._built is not None
_compat.jcore.Var  # the first read imports `jax.extend.core`
print(json.dumps({"modules": modules, "built": built, "after": "jax.extend.core" in sys.modules}))
"""
    )
    loaded = {prefix: _loaded(found["modules"], prefix) for prefix in NOT_AT_IMPORT}
    assert not any(loaded.values()), {p: (NOT_AT_IMPORT[p], m[:5]) for p, m in loaded.items() if m}
    assert not found["built"], "the Lark parser was built by `import shardrules`"
    assert found["after"]


def test_names_imported_on_first_use() -> None:
    """Each name of `_LAZY`: listed by `dir`, absent from `sys.modules` until
    read, then the object its module defines (by attribute and by `from
    shardrules import`); a star import gives exactly `__all__`."""
    found = _fresh(
        """
import json, sys
import shardrules as sr
report = {"lazy": dict(sr._LAZY), "in_dir": sorted(set(sr.__all__) - set(dir(sr))), "early": [], "wrong": []}
for name, module in sr._LAZY.items():
    full = "shardrules" + module
    if full in sys.modules:
        report["early"].append(full)
    value = getattr(sr, name)
    if value is not getattr(sys.modules[full], name):
        report["wrong"].append(name)
from shardrules import suggest, Conversion
report["from"] = [suggest is sr.suggest, Conversion is sr.Conversion]
star = {}
exec("from shardrules import *", star)
report["star"] = sorted(set(star) - {"__builtins__"}) == sorted(sr.__all__)
try:
    sr.no_such_name
except AttributeError as err:
    report["missing"] = str(err)
print(json.dumps(report))
"""
    )
    assert found["lazy"], "no names are imported on first use"
    assert found["in_dir"] == [], "dir(shardrules) lacks these public names"
    assert found["early"] == [], "imported by `import shardrules` although listed in `_LAZY`"
    assert found["wrong"] == []
    assert found["from"] == [True, True]
    assert found["star"]
    assert found["missing"] == "module 'shardrules' has no attribute 'no_such_name'"


@pytest.mark.parametrize("name", ["ClosedJaxpr", "Jaxpr", "Literal", "Var"])
def test_jcore_gives_jax_extend_cores_names(name: str) -> None:
    """The names tracing reads from `_compat.jcore` are `jax.extend.core`'s."""
    import jax.extend.core  # here, not at the top: no other test relies on this module's import

    assert getattr(_compat.jcore, name) is getattr(jax.extend.core, name)
    assert getattr(_compat.jcore, name) is getattr(_compat.jcore, name)  # kept after the first read
    with pytest.raises(AttributeError):
        _compat.jcore.NoSuchName  # noqa: B018


def test_the_parser_is_built_once_for_threads_asking_together(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[object] = []
    real = _grammar._build

    def slow_build():
        time.sleep(0.05)  # long enough for every thread to ask while it is built
        built.append(real())
        return built[-1]

    monkeypatch.setattr(_grammar, "_built", None)
    monkeypatch.setattr(_grammar, "_build", slow_build)
    start = threading.Barrier(8)
    got: list[object] = []

    def ask() -> None:
        start.wait()
        got.append(_grammar.parser())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1
    assert len(got) == 8 and all(p is built[0] for p in got)
    assert _grammar.parser() is built[0]


def test_reading_a_checkpoint_header_imports_nothing_more(tmp_path: Path) -> None:
    """`shardrules suggest --shapes` and `lint --shapes` of a `.safetensors`
    header import no module of JAX, NumPy, PyYAML, torch or safetensors
    beyond what starting the command line imported: the header is read as
    JSON and checked by shardrules' own code."""
    import struct

    header = {
        f"model.layers.{i}.mlp.experts.{e}.up_proj.weight": {
            "dtype": "BF16",
            "shape": [64, 32],
            "data_offsets": [0, 0],
        }
        for i in range(2)
        for e in range(8)
    }
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    found = _fresh(
        f"""
import contextlib, io, json, sys
from shardrules._cli._main import main
started = set(sys.modules)
shapes = {str(tmp_path / "model.safetensors")!r}
drafted = {str(tmp_path / "drafted.shard")!r}
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    codes = [
        main(["suggest", "--shapes", shapes, "--mesh", "fsdp=4,model=2", "-o", drafted]),
        main(["lint", drafted, "--shapes", shapes]),
    ]
print(json.dumps({{"codes": codes, "new": sorted(set(sys.modules) - started)}}))
"""
    )
    assert found["codes"] == [0, 0]
    heavy = ("jax", "jaxlib", "numpy", "ml_dtypes", "yaml", "torch", "safetensors")
    assert [m for m in found["new"] if m.split(".")[0] in heavy] == []
