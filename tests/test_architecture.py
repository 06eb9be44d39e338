"""The package's layout: which stage may import which, module sizes, and the
map in docs/architecture.md.

Stages sit in a stack, each importing only those below it:

    _cli → _search → _costs | _suggest
    _cli → _placement | _costs → _tracing → _planning → _interop → _language → _errors
    _cli → _convert → _language
    _cli → _suggest → _planning
    _cli → _reports → _planning

`_placement`, `_tracing`, `_suggest` and `_reports` stand side by side and
never import each other;
`_convert` (other projects' rules to rule files) needs only the language.
Every import counts: at the top of a module, inside a function (a lazy
import), under `if TYPE_CHECKING:`, and `importlib.import_module` or
`__import__` of a literal name. `_language` and `_errors` need neither JAX nor
NumPy: a rule file is loaded with no device and no array at hand.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "shardrules"

# Modules at the package's top level, outside every stage: below them all.
BASE = {"_errors", "_version", "_gcpause", "_imports", "_pspec", "_quiet"}
BELOW_ALL = frozenset(BASE)
LANGUAGE = BELOW_ALL | {"_language"}
INTEROP = LANGUAGE | {"_interop"}
PLANNING = INTEROP | {"_planning"}
ALLOWED: dict[str, frozenset[str]] = {
    "_errors": frozenset(),
    "_version": frozenset(),
    "_gcpause": frozenset(),
    "_imports": frozenset(),
    "_pspec": frozenset(),
    "_quiet": frozenset(),
    "_language": LANGUAGE,
    "_interop": INTEROP,
    "_convert": LANGUAGE | {"_convert"},
    "_planning": PLANNING,
    "_placement": PLANNING | {"_placement"},
    "_tracing": PLANNING | {"_tracing"},
    "_costs": PLANNING | {"_tracing", "_costs"},
    "_suggest": PLANNING | {"_suggest"},
    "_reports": PLANNING | {"_reports"},
    "_search": PLANNING | {"_tracing", "_costs", "_suggest", "_search"},
    "_cli": PLANNING
    | {"_placement", "_tracing", "_costs", "_convert", "_suggest", "_reports", "_search", "_cli"},
}
"""For each stage (a folder, or a base module), the stages it may import."""

FRONT_DOORS: dict[str, frozenset[str]] = {
    "shardrules._planning._plan": frozenset(
        {"shardrules._reports._dump", "shardrules._reports._dumpread", "shardrules._reports._html"}
    ),
    "shardrules._tracing._jit": frozenset({"shardrules._costs._step", "shardrules._costs._cost"}),
    "shardrules._suggest._suggest": frozenset({"shardrules._search._api"}),
}
"""The only imports up the stack: `Plan.to_json`, `Plan.from_json` and
`Plan._repr_html_` are the plan's own doors to its file and its HTML page, so
they import the report that writes (or reads) it when called, inside the
method, never at the top: planning still loads, and works, without reports.
`RuleJit.cost` is the step's door to what it costs (`_costs`, the stage above
tracing that compiles it for a target): imported inside the method, and the
`StepCost` it returns named under `if TYPE_CHECKING:` only. `suggest` hands a
search (`search=True`) to `_search`, the stage above it that compiles its drafts,
importing it inside the function."""

FACADE = {"__init__", "__main__"}  # the public names and `python -m shardrules`
MAX_LINES = 400


def stage_of(module: str) -> str | None:
    """`shardrules._planning._mesh` → `_planning`; `shardrules._errors` →
    `_errors`; the package itself (its public `__init__`) → `None`."""
    parts = module.split(".")
    assert parts[0] == "shardrules", module
    return parts[1] if len(parts) > 1 else None


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_package(module: str) -> bool:
    return (PACKAGE.parent / module.replace(".", "/")).is_dir()


def _dynamic_import(call: ast.Call) -> bool:
    """`importlib.import_module(...)`, `import_module(...)` or `__import__(...)`."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in ("import_module", "__import__") and bool(call.args)


def _resolve_dynamic(call: ast.Call, package: str) -> str | None:
    """The module a dynamic import names, when it is a literal naming one of
    ours (relative names resolved against `package`); else `None`."""
    first = call.args[0]
    if not isinstance(first, ast.Constant) or not isinstance(first.value, str):
        return None
    name = first.value
    if name.startswith("."):
        level = len(name) - len(name.lstrip("."))
        base = package.split(".")
        base = base[: len(base) - (level - 1)]
        name = ".".join([*base, name.lstrip(".")] if name.lstrip(".") else base)
    return name if name.split(".")[0] == "shardrules" else None


def third_party(source: str) -> set[str]:
    """The top-level names of every module outside shardrules that `source` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and _dynamic_import(node):
            first = node.args[0]
            if (
                isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and not first.value.startswith(".")
            ):
                found.add(first.value.split(".")[0])
    return found - {"shardrules"}


def imported(path: Path, source: str) -> list[tuple[int, str]]:
    """Every shardrules module that `source` (the text of the module at `path`)
    imports, with the line: relative imports resolved, `from . import x`
    taken as the module `x`, lazy and type-checking imports included."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _dynamic_import(node):
            target = _resolve_dynamic(node, package)
            if target is not None:
                found.append((node.lineno, target))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "shardrules"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "shardrules":
                continue
            if node.module is None or _is_package(target):  # `from . import _mesh`: the modules
                found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, target))
    return found


def _lines_in_functions(source: str) -> set[int]:
    """The lines of `source` inside a function's body (where a lazy import
    sits) or under `if TYPE_CHECKING:` (an import for type checkers only,
    never run)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or (
            isinstance(node, ast.If) and _is_type_checking(node.test)
        ):
            body = node.body
        else:
            continue
        for inner in body:
            lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def violations(path: Path, source: str) -> list[str]:
    """What in `source` (the module at `path`) breaks the stack, one line each."""
    name = module_name(path)
    if name in ("shardrules", "shardrules.__main__"):  # the facade may import anything
        return []
    stage = stage_of(name)
    where = path.relative_to(REPO)
    if stage not in ALLOWED:
        return [f"{where}: not in a stage; put it in a stage folder (see docs/architecture.md)"]
    out = []
    doors = FRONT_DOORS.get(name, frozenset())
    in_functions = _lines_in_functions(source) if doors else set()
    for line, target in imported(path, source):
        if target in doors and line in in_functions:
            continue
        to = stage_of(target)
        if to not in ALLOWED:  # `shardrules` itself, or a public name of it
            out.append(f"{where}:{line}: imports {target} from the public package; import its module")
        elif to not in ALLOWED[stage]:
            allowed = ", ".join(sorted(ALLOWED[stage])) or "nothing of shardrules"
            out.append(f"{where}:{line}: {stage} imports {target}; {stage} may import {allowed}")
    return out


def _is_type_checking(test: ast.expr) -> bool:
    """`TYPE_CHECKING`, or `typing.TYPE_CHECKING` by any name of the module."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _named(node: ast.stmt, name: str) -> ast.expr | None:
    """The value `node` assigns to `name` at the top of a module, if it does."""
    if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
        return node.value
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
        return node.value
    return None


def facade(source: str) -> tuple[dict[str, dict[str, str]], list[str]]:
    """The public names of `shardrules/__init__.py` (its text `source`), each
    with the module it comes from: `"eager"`, imported at the top; `"lazy"`,
    listed in `_LAZY` (read by the module's `__getattr__` on first use);
    `"typing"`, imported under `if TYPE_CHECKING:`; `"all"`, `__all__`. And
    the re-exports not written `name as name`."""
    names: dict[str, dict[str, str]] = {"eager": {}, "typing": {}, "lazy": {}, "all": {}}
    unlike: list[str] = []

    def take(node: ast.stmt, into: dict[str, str]) -> None:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                if alias.asname != alias.name and not (alias.asname or "").startswith("_"):
                    unlike.append(f"line {node.lineno}: `{alias.name} as {alias.asname}`")
                into[alias.asname or alias.name] = f"shardrules.{node.module}"

    for node in ast.parse(source).body:
        take(node, names["eager"])
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for inner in node.body:
                take(inner, names["typing"])
        if (value := _named(node, "_LAZY")) is not None:
            names["lazy"] = {name: "shardrules" + module for name, module in ast.literal_eval(value).items()}
        if (value := _named(node, "__all__")) is not None:
            names["all"] = dict.fromkeys(ast.literal_eval(value), "")
    return names, unlike


def facade_problems(source: str) -> list[str]:
    """What is wrong with the public names of `shardrules/__init__.py`: each
    name of `__all__` is imported at the top (`from ._stage._module import
    name as name`) or on first use, listed in `_LAZY` and imported under `if
    TYPE_CHECKING:` from the same module (so that type checkers, IDEs and
    `imported`, the stack's checks, see it); never both."""
    names, unlike = facade(source)
    eager, lazy = names["eager"], names["lazy"]
    out = [f"{where}: re-export as `name as name`" for where in unlike]
    if lazy != names["typing"]:
        out.append(f"`_LAZY` and the `if TYPE_CHECKING:` imports differ: {lazy} != {names['typing']}")
    if both := sorted(set(lazy) & set(eager)):
        out.append(f"imported at the top and on first use: {both}")
    shown = {name for name in eager if not name.startswith("_")} | set(lazy)
    if shown != set(names["all"]):
        out.append(f"`__all__` and the imported names differ: {sorted(shown ^ set(names['all']))}")
    for name, module in lazy.items():
        if not (PACKAGE.parent / (module.replace(".", "/") + ".py")).is_file():
            out.append(f"`_LAZY` names {module} for {name}: no such module")
        elif stage_of(module) not in ALLOWED:
            out.append(f"`_LAZY` names {module} for {name}: not in a stage")
    return out


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_stages_are_the_package_folders() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(ALLOWED) - BASE
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == BASE | FACADE


def test_imports_flow_down_the_stack() -> None:
    found = [v for path in MODULES for v in violations(path, path.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("where", "source", "bad"),
    [
        ("_language/_x.py", "from .._planning import _mesh\n", "shardrules._planning._mesh"),
        (
            "_language/_x.py",
            "def f():\n    from .._interop._paths import flatten\n",
            "shardrules._interop._paths",
        ),
        ("_planning/_x.py", "from .._placement._apply import apply\n", "shardrules._placement._apply"),
        ("_tracing/_x.py", "from .._placement import _agree\n", "shardrules._placement._agree"),
        ("_placement/_x.py", "import shardrules._tracing._jit\n", "shardrules._tracing._jit"),
        ("_interop/_x.py", "from .. import _cli\n", "shardrules._cli"),
        ("_errors.py", "from ._language._rules import Rule\n", "shardrules._language._rules"),
        ("_planning/_x.py", "from .. import apply\n", "shardrules.apply"),
        ("_planning/_x.py", "import shardrules\n", "shardrules"),
        ("_language/_x.py", "from shardrules import _planning\n", "shardrules._planning"),
        ("_language/_x.py", "from shardrules._tracing._jit import jit\n", "shardrules._tracing._jit"),
        (
            "_planning/_x.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .._cli._lint import Result\n",
            "shardrules._cli._lint",
        ),
        (
            "_tracing/_x.py",
            "import importlib\nimportlib.import_module('shardrules._placement._apply')\n",
            "shardrules._placement._apply",
        ),
        (
            "_interop/_x.py",
            "import importlib\nimportlib.import_module('.._planning._plan', __package__)\n",
            "shardrules._planning._plan",
        ),
        ("_language/_x.py", "__import__('shardrules._interop._paths')\n", "shardrules._interop._paths"),
    ],
)
def test_an_upward_import_is_caught(where: str, source: str, bad: str) -> None:
    found = violations(PACKAGE / where, source)
    assert len(found) == 1 and f"imports {bad}" in found[0], found


@pytest.mark.parametrize(
    ("where", "source"),
    [
        (
            "_planning/_x.py",
            "from . import _mesh\nfrom .._language._rules import Rule\nfrom .._errors import Span\n",
        ),
        (
            "_cli/_x.py",
            "from .._placement import _apply\nfrom .._tracing._jit import jit\nfrom .._version import v\n",
        ),
        ("_placement/_x.py", "from .._interop import _nnx\nimport jax\nfrom ._agree import check_mode\n"),
    ],
)
def test_a_downward_import_passes(where: str, source: str) -> None:
    assert violations(PACKAGE / where, source) == []


@pytest.mark.parametrize("stage", ["_language", "_errors.py", "_version.py"])
def test_loading_rules_needs_no_jax(stage: str) -> None:
    where = PACKAGE / stage
    files = sorted(where.rglob("*.py")) if where.is_dir() else [where]
    used = {
        str(f.relative_to(REPO)): third_party(f.read_text(encoding="utf-8")) & {"jax", "jaxlib", "numpy"}
        for f in files
    }
    assert not any(used.values()), used


def test_third_party_imports_are_seen() -> None:
    source = "import jax.numpy as jnp\nfrom numpy import ndarray\nimportlib.import_module('flax.nnx')\nfrom . import _x\n"
    assert third_party(source) == {"jax", "numpy", "flax"}


def test_a_module_outside_the_stages_is_caught() -> None:
    assert "not in a stage" in violations(PACKAGE / "_helpers.py", "")[0]


def test_no_module_is_long() -> None:
    long = {
        str(p.relative_to(REPO)): n
        for p in MODULES
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"split these by concern (at most {MAX_LINES} lines a module): {long}"


def test_the_architecture_page_maps_every_module() -> None:
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [
        str(p.relative_to(PACKAGE))
        for p in MODULES
        if p.name != "__init__.py" and p.parent != PACKAGE and str(p.relative_to(PACKAGE)) not in page
    ]
    assert not missing, f"docs/architecture.md does not list: {missing}"
    for folder in set(ALLOWED) - BASE:
        assert re.search(rf"^#+ .*`{folder}/`", page, re.M), f"no section for {folder}/"
    assert "docs/architecture.md" in (REPO / "README.md").read_text(encoding="utf-8")


def test_the_plans_front_doors_are_imported_only_inside_its_methods() -> None:
    plan = PACKAGE / "_planning" / "_plan.py"
    inside = "def to_json(self):\n    from .._reports._dump import dumps\n    return dumps(self)\n"
    assert violations(plan, inside) == []
    at_top = "from .._reports._dump import dumps\n"
    assert "_planning imports shardrules._reports._dump" in violations(plan, at_top)[0]
    other_report = "def f():\n    from .._reports._plandiff import compare\n"
    assert "imports shardrules._reports._plandiff" in violations(plan, other_report)[0]
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .._reports._dump import dumps\n"
    assert violations(plan, typed) == []
    other_module = "def f():\n    from .._reports._dump import dumps\n"
    assert (
        "imports shardrules._reports._dump"
        in violations(PACKAGE / "_planning" / "_check.py", other_module)[0]
    )


def test_the_facades_names_on_first_use_are_seen() -> None:
    """`shardrules/__init__.py` imports some names on first use (`_LAZY`):
    they are imported under `if TYPE_CHECKING:` too, so the stack's checks
    (`imported`) see every module the facade reaches."""
    init = PACKAGE / "__init__.py"
    source = init.read_text(encoding="utf-8")
    assert facade_problems(source) == []
    lazy = facade(source)[0]["lazy"]
    assert lazy, "no `_LAZY` table found in shardrules/__init__.py"
    seen = {target for _, target in imported(init, source)}
    assert set(lazy.values()) <= seen


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        (
            '__all__ = ["plan", "suggest"]\nfrom ._planning._api import plan as plan\n'
            '_LAZY = {"suggest": "._suggest._suggest"}\n',
            "`_LAZY` and the `if TYPE_CHECKING:` imports differ",
        ),
        (
            '__all__ = ["suggest"]\nif TYPE_CHECKING:\n    from ._suggest._suggest import suggest as suggest\n'
            '_LAZY = {"suggest": "._suggest._draft"}\n',
            "`_LAZY` and the `if TYPE_CHECKING:` imports differ",
        ),
        (
            '__all__ = ["suggest"]\nfrom ._suggest._suggest import suggest as suggest\n'
            "if TYPE_CHECKING:\n    from ._suggest._suggest import suggest as suggest\n"
            '_LAZY = {"suggest": "._suggest._suggest"}\n',
            "imported at the top and on first use",
        ),
        (
            '__all__ = ["plan"]\nfrom ._planning._api import plan as plan\n'
            "if _typing.TYPE_CHECKING:\n    from ._suggest._suggest import suggest as suggest\n"
            '_LAZY = {"suggest": "._suggest._suggest"}\n',
            "`__all__` and the imported names differ",
        ),
        (
            '__all__ = ["nothing"]\nif TYPE_CHECKING:\n    from ._nowhere._x import nothing as nothing\n'
            '_LAZY = {"nothing": "._nowhere._x"}\n',
            "no such module",
        ),
        ('__all__ = ["plan"]\nfrom ._planning._api import plan as p\n', "re-export as `name as name`"),
    ],
)
def test_a_wrong_facade_is_caught(source: str, problem: str) -> None:
    assert any(problem in p for p in facade_problems(source)), facade_problems(source)
