"""The public surface: `__all__`, docstrings, docs/api.md, the error hierarchy, the version."""

from __future__ import annotations

import builtins
import dataclasses
import functools
import inspect
import json
import re
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

import shardrules as sr
from shardrules import _errors

REPO = Path(__file__).resolve().parent.parent
API_MD = (REPO / "docs" / "api.md").read_text(encoding="utf-8")

PUBLIC = list(sr.__all__)
CLASSES = [name for name in PUBLIC if isinstance(getattr(sr, name), type)]
FUNCTIONS = [name for name in PUBLIC if inspect.isfunction(getattr(sr, name))]
EXCEPTIONS = [name for name in CLASSES if issubclass(getattr(sr, name), BaseException)]

# Optional integrations and heavy frameworks that `import shardrules` must not pull in.
HEAVY = ("flax", "optax", "equinox", "torch", "torchax", "safetensors", "tensorflow", "yaml", "penzai")

MIN_DOC = 30  # characters: a sentence, not a placeholder

# Constructor storage behind documented read-only mappings (`RuleSet.aliases`, ...):
# not part of the documented surface.
STORAGE_FIELDS = {
    "RuleSet": {
        "alias_items",
        "alias_span_items",
        "group_items",
        "group_span_items",
        "default_items",
        "source_items",
        "alternative_items",
        "alternative_decls",
        "acknowledged_items",
        "real_file_items",
    }
}


def _own_doc(obj: object) -> str:
    """The docstring written for `obj` itself, not inherited or generated."""
    if isinstance(obj, type):
        doc = obj.__dict__.get("__doc__")
        if doc and dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
            return ""  # the signature dataclasses fills in
        return inspect.cleandoc(doc) if doc else ""
    return inspect.cleandoc(getattr(obj, "__doc__", None) or "")


def _members(cls: type, *, fields: bool = True) -> dict[str, object]:
    """Public attributes `cls` itself defines: properties, methods and (with `fields`) dataclass fields."""
    out: dict[str, object] = {}
    if fields and dataclasses.is_dataclass(cls):
        hidden = STORAGE_FIELDS.get(cls.__name__, set())
        out.update(
            {
                f.name: f
                for f in dataclasses.fields(cls)
                if not f.name.startswith("_") and f.name not in hidden
            }
        )
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(
            value, property | functools.cached_property | classmethod | staticmethod
        ) or inspect.isfunction(value):
            out[name] = value
    return out


def _member_doc(value: object) -> str:
    if isinstance(value, property):
        value = value.fget
    elif isinstance(value, functools.cached_property):
        value = value.func
    elif isinstance(value, classmethod | staticmethod):
        value = value.__func__
    elif isinstance(value, dataclasses.Field):
        return ""
    return inspect.cleandoc(getattr(value, "__doc__", None) or "")


def _section(title: str) -> str:
    """The text of docs/api.md under the heading titled `title`, up to the next heading of any level."""
    match = re.search(rf"^#+ {re.escape(title)}\s*$(.*?)(?=^#+ |\Z)", API_MD, re.M | re.S)
    assert match, f"docs/api.md has no heading {title!r}"
    return match.group(1)


# ---------------------------------------------------------------- __all__


def test_all_is_sorted_and_unique() -> None:
    assert sorted(PUBLIC) == PUBLIC
    assert len(PUBLIC) == len(set(PUBLIC))


def test_all_names_exist_and_come_from_the_package() -> None:
    for name in PUBLIC:
        assert hasattr(sr, name), name
        obj = getattr(sr, name)
        assert getattr(obj, "__module__", "").startswith("shardrules"), (name, obj)
        assert getattr(obj, "__name__", name) == name, (name, obj)


def test_all_lists_every_public_name() -> None:
    # `dir`, not `vars`: names the package imports on first use (`_LAZY`) are
    # in its namespace only once read.
    public = {
        name
        for name in dir(sr)
        if not name.startswith("_") and not isinstance(getattr(sr, name), types.ModuleType)
    }
    assert public == set(PUBLIC)


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from shardrules import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(PUBLIC)


# ---------------------------------------------------------------- docstrings


@pytest.mark.parametrize("name", PUBLIC)
def test_public_name_has_a_docstring(name: str) -> None:
    doc = _own_doc(getattr(sr, name))
    assert len(doc) >= MIN_DOC and " " in doc, f"`shardrules.{name}` needs a docstring, has {doc!r}"


@pytest.mark.parametrize("name", sorted(set(CLASSES) - set(EXCEPTIONS)))
def test_public_class_members_are_described(name: str) -> None:
    """Each public property and method has its own docstring or is named in the class's.

    (Dataclass fields are the constructor's; docs/api.md describes them, checked below.)
    """
    cls = getattr(sr, name)
    class_doc = _own_doc(cls)
    missing = [
        member
        for member, value in _members(cls, fields=False).items()
        if not _member_doc(value) and f"`{member}`" not in class_doc
    ]
    assert not missing, f"{name}: undocumented members {missing}"


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_docstring_names_its_parameters(name: str) -> None:
    func = getattr(sr, name)
    doc = _own_doc(func)
    params = [
        p.name
        for p in inspect.signature(func).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    # A one-line docstring may lean on docs/api.md; a longer one describes the
    # arguments, itself or by pointing at another public function ("as for `plan`").
    if "\n" not in doc:
        return
    missing = [p for p in params if f"`{p}`" not in doc]
    for other in re.findall(r"\bas (?:for )?`(?:shardrules\.)?(\w+)`", doc):
        if other in FUNCTIONS and other != name:
            missing = [p for p in missing if f"`{p}`" not in _own_doc(getattr(sr, other))]
    assert not missing, f"`shardrules.{name}` docstring does not describe {missing}"


# ---------------------------------------------------------------- docs/api.md


@pytest.mark.parametrize("name", PUBLIC)
def test_public_name_is_in_api_docs(name: str) -> None:
    heading = re.search(rf"^#+ `{re.escape(name)}`\s*$", API_MD, re.M)
    table_entry = re.search(rf"^\|\s*(\[)?`{re.escape(name)}`", API_MD, re.M)
    assert heading or table_entry, f"docs/api.md has no heading or table entry for `{name}`"


@pytest.mark.parametrize("name", sorted(set(CLASSES) - set(EXCEPTIONS)))
def test_public_class_members_are_in_api_docs(name: str) -> None:
    section = _section(f"`{name}`")
    missing = [m for m in _members(getattr(sr, name)) if not re.search(rf"`{re.escape(m)}\b", section)]
    assert not missing, f"docs/api.md section `{name}` does not mention {missing}"


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_signature_in_api_docs_matches(name: str) -> None:
    """The signature shown under `### name` names the same parameters, in order."""
    block = re.search(r"```python\n(sr\.\w+\(.*?\))\s*->", _section(f"`{name}`"), re.S)
    assert block, f"docs/api.md section `{name}` shows no signature"
    shown = block.group(1)
    assert shown.startswith(f"sr.{name}("), shown
    shown_params = [
        p.strip().split("=")[0].strip().lstrip("*")
        for p in shown[len(name) + 4 : -1].split(",")
        if p.strip() != "*"
    ]
    real = list(inspect.signature(getattr(sr, name)).parameters)
    assert shown_params == real, (shown, real)


# ---------------------------------------------------------------- errors


def _documented_errors() -> dict[str, tuple[str, str]]:
    """docs/api.md's error table: class -> (builtin base, 'raised for' text)."""
    rows = re.findall(r"^\|\s*`(\w+)`\s*\|\s*`(\w+)`\s*\|\s*(.*?)\s*\|\s*$", _section("Errors"), re.M)
    return {cls: (base, raised_for) for cls, base, raised_for in rows}


def _codes(text: str) -> list[str]:
    """`SR001, SR010–SR016` -> every code written or spanned."""
    codes: list[str] = []
    for first, last in re.findall(r"(SR\d{3})(?:\s*[–-]\s*(SR\d{3}))?", text):
        if last:
            codes.extend(f"SR{n:03d}" for n in range(int(first[2:]), int(last[2:]) + 1))
        else:
            codes.append(first)
    return codes


def test_every_exception_is_in_the_error_table() -> None:
    assert set(_documented_errors()) == set(EXCEPTIONS)


def test_exception_classes_in_errors_module_are_all_public() -> None:
    defined = {
        name
        for name, value in vars(_errors).items()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__ == _errors.__name__
    }
    assert defined == set(EXCEPTIONS)


@pytest.mark.parametrize("name", EXCEPTIONS)
def test_exception_inherits_root_and_documented_builtin(name: str) -> None:
    cls = getattr(sr, name)
    base_name, _ = _documented_errors()[name]
    base = getattr(builtins, base_name)
    assert issubclass(cls, sr.ShardRulesError)
    assert issubclass(cls, base), f"{name} is documented as also a {base_name}"
    if cls is not sr.ShardRulesError:
        # Exactly the root and the one documented builtin, in that order.
        assert cls.__bases__ == (sr.ShardRulesError, base), cls.__bases__
        # No other public exception is an ancestor: `except MeshError` never catches a PlanError.
        others = [e for e in EXCEPTIONS if e not in (name, "ShardRulesError")]
        assert not [o for o in others if issubclass(cls, getattr(sr, o))]


@pytest.mark.parametrize("name", EXCEPTIONS)
def test_exception_carries_its_diagnostics(name: str) -> None:
    cls = getattr(sr, name)
    span = sr.Span("rules.shard", 3, 5, 3, 9)
    diag = sr.Diagnostic("SR104", "error", "something is wrong", span=span, path="a/b", hint="fix it")
    err = cls(diag, {"rules.shard": "l1\nl2\n  x -> (model)\n"})
    assert err.diagnostics == (diag,)
    assert (err.code, err.span, err.path, err.hint) == ("SR104", span, "a/b", "fix it")
    text = str(err)
    assert text.startswith("rules.shard:3:5: SR104 something is wrong"), text
    assert "hint: fix it" in text
    with pytest.raises(sr.ShardRulesError):
        raise err


def test_documented_codes_raise_the_documented_class() -> None:
    documented = _documented_errors()
    seen: dict[str, str] = {}
    for name, (_, raised_for) in documented.items():
        for code in _codes(raised_for):
            assert code not in seen, f"{code} documented for both {seen[code]} and {name}"
            seen[code] = name
            err = _errors.error_for([sr.Diagnostic(code, "error", "x")])
            assert type(err).__name__ == name, f"{code}: raised as {type(err).__name__}, documented {name}"
    assert seen, "no codes found in the error table"


# ---------------------------------------------------------------- import cost


def test_import_does_not_load_optional_frameworks() -> None:
    """`import shardrules` neither imports nor tries to import an optional framework."""
    probe = f"""
import importlib.abc, json, sys

HEAVY = {HEAVY!r}
tried = []

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            tried.append(name)
            raise ImportError(f"{{name}} is not allowed here")
        return None

sys.meta_path.insert(0, Refuse())
import shardrules
loaded = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
print(json.dumps({{"tried": tried, "loaded": loaded, "file": shardrules.__file__}}))
"""
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["tried"] == [] and result["loaded"] == [], result


# ---------------------------------------------------------------- version


def test_version_matches_pyproject() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    if "version" in project:
        assert sr.__version__ == project["version"]
    else:  # a dynamic version: then it must come from the package itself
        assert "version" in project.get("dynamic", [])
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?", sr.__version__)


def test_cli_reports_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    from shardrules._cli._main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"shardrules {sr.__version__}"
