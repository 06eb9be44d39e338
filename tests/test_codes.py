"""Every diagnostic code, triggered from a bad rule file: its code, where it points and its hint.

The table must cover every code documented in docs/diagnostics.md, so a new code
cannot land without a test here.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules._cli import _lint

DOCS = Path(__file__).resolve().parent.parent / "docs" / "diagnostics.md"
SIZES = {"data": 2, "fsdp": 4, "model": 8}


def S(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


# code -> (rule file text, tree or None, mesh sizes, expected (line, col) or None, hint fragment)
LINT_CASES = {
    "SR207": (
        'mesh data=4 explicit, model=2 auto\nrules params:\n  "w" -> (data, model)\n'
        'rules activations:\n  "mlp$" -> (data, model)\n',
        None,
        {"data": 4, "model": 2},
        (5, 13),
        "axes of one type",
    ),
    "SR001": ('rules params:\n  "w" -> (fsdp,\n', None, SIZES, (2, 16), "close the parenthesis"),
    "SR002": ('rules params:\n  "w(" -> (fsdp)\n', None, SIZES, (2, 5), "escape special characters"),
    "SR003": (
        "rules params:\n  default -> auto(fsdp, min_bytes=2XB)\n",
        None,
        SIZES,
        (2, 35),
        "did you mean",
    ),
    "SR007": ('mesh fsdp\n"w" -> (fsdp)\n', None, SIZES, (2, 1), "rules params:"),
    "SR010": (
        'mesh fsdp, model\nrules params:\n  "w" -> (fdsp)\n',
        None,
        SIZES,
        (3, 11),
        "did you mean `fsdp`?",
    ),
    "SR011": ("alias a = b\nalias b = a\n", None, SIZES, (1, 1), "must end in mesh axes"),
    "SR012": ("alias a = fsdp\nalias a = model\n", None, SIZES, (2, 1), "keep one"),
    "SR013": ("mesh fsdp\nalias fsdp = fsdp\n", None, SIZES, (2, 1), "rename the alias"),
    "SR014": ("mesh fsdp=*, model=*\n", None, SIZES, (1, 1), ""),
    "SR015": (
        "rules params:\n  default -> replicated\n  default -> replicated\n",
        None,
        SIZES,
        (3, 3),
        "one default",
    ),
    "SR016": ('rules params:\n  "w" -> (..., fsdp, ...)\n', None, SIZES, (2, 22), "`...` stands for"),
    "SR018": ('rules params:\n  "w" -> (fsdp)\n', {"w": S(8)}, SIZES, None, "did you mean `params`?"),
    "SR019": (
        'rules params:\n  "w" -> (fsdp) if elemnts > 3\n',
        None,
        SIZES,
        (2, 20),
        "did you mean `elements`?",
    ),
    "SR020": (
        'rules params:\n  "w" -> replicated  # noqa: SR204, SR2O5\n',
        None,
        SIZES,
        (2, 37),
        "did you mean `SR205`?",
    ),
    "SR101": ('rules params:\n  "w" -> (modle)\n', None, SIZES, (2, 11), "did you mean `model`?"),
    "SR102": ('rules params:\n  "w" -> (fsdp, fsdp)\n', None, SIZES, (2, 10), "only one dimension"),
    "SR103": (
        'rules params:\n  "w" -> (fsdp, _)\n',
        {"w": S(8, 8, 8)},
        SIZES,
        (2, 10),
        "start the spec with `...`",
    ),
    "SR104": ('rules params:\n  "w" -> (model)\n', {"w": S(12)}, SIZES, (2, 11), "`model?`"),
    "SR105": (
        'rules params:\n  "w" -> (fsdp)\n',
        {"w": S(8), "v": S(8)},
        SIZES,
        (1, 1),
        "default -> replicated",
    ),
    "SR108": (
        "mesh fsdp, model=*\nrules params:\n  default -> auto(fsdp)\n",
        {"w": S(8)},
        None,
        (3, 14),
        "--mesh",
    ),
    "SR110": ('rules params:\n  "w" -> (_, model)\n', {"w": S(4096, 4096)}, SIZES, (2, 3), "more mesh axes"),
    "SR113": (
        "alias embed = fsdp\nrules params:\n  default -> logical\n",
        {"w": S(8, 8)},
        SIZES,
        (3, 14),
        "with_logical_partitioning",
    ),
    "SR115": (
        'rules params:\n  "w" -> (fsdp, _)\n',
        {"w": S(8, 8, dtype=np.dtype([("a", "f4"), ("b", "i4")]))},
        SIZES,
        (2, 3),
        "one array per field",
    ),
    # `^` ties the rule to the path's start: the optimizer's copy falls to `default`.
    "SR125": (
        'rules params:\n  "^layers/\\d+/w$" -> (fsdp)\n  default -> replicated\n',
        {"layers/0/w": S(8), "opt/mu/layers/0/w": S(8)},
        SIZES,
        (2, 4),
        "drop the anchor: `layers/\\d+/w$`",
    ),
    "SR201": (
        'rules params:\n  "w" -> (fsdp)\n  "zzz" -> replicated\n',
        {"w": S(8)},
        SIZES,
        (3, 3),
        "delete",
    ),
    "SR202": (
        'rules params:\n  "w" -> (fsdp)\n  "w$" -> replicated\n',
        {"w": S(8)},
        SIZES,
        (3, 3),
        "move it above",
    ),
    "SR203": (
        'rules params:\n  "step" -> (fsdp)\n  "w" -> (fsdp)\n',
        {"step": S(), "w": S(8)},
        SIZES,
        (2, 13),
        "scalars",
    ),
    "SR204": ('rules params:\n  "w" -> replicated\n', {"w": S(8192, 8192)}, SIZES, (2, 10), "auto(model)"),
    "SR205": (
        'mesh data, fsdp, model\nrules params:\n  "w" -> (fsdp)\n',
        {"w": S(8)},
        SIZES,
        (1, 6),
        "drop it",
    ),
    "SR215": (
        'mesh data, model\nrules params:\n  "w" -> (_, model)\nrules inputs:\n  "x" -> (data)\n',
        {"w": S(8, 8)},
        {"data": 8, "model": 1},
        (3, 10),
        "give `model` a size above 1",
    ),
    # the kernel's columns split over 16 hosts: 4096 runs of 1 KiB per host (lint with HOSTS below)
    "SR220": (
        'mesh model\nrules params:\n  "w" -> (_, model)\n',
        {"w": S(4096, 4096)},
        {"model": 16},
        (3, 10),
        "`-> (model, _)` rather than `(_, model)`",
    ),
    "SR301": ('mesh fsdp, model\nrules params:\n  "w" -> (fsdp)\n', None, None, (1, 1), "--mesh fsdp=SIZE"),
    # Rules written for slashed paths, a tree with dotted ones: everything falls to `default`.
    "SR116": (
        'rules params:\n  "layers/\\d+/w" -> (_, model)\n  default -> replicated\n',
        {"model.layers.0.w": S(8192, 8192), "model.embed": S(32000, 4096)},
        SIZES,
        (1, 1),
        "--replicated-tolerance",
    ),
    # a quantized kernel's scale in 2 blocks of rows, the rows split over fsdp=4
    "SR303": (
        'rules params:\n  "mlp/up/kernel" -> (fsdp, model)\n',
        {"mlp/up/kernel/array/qvalue": S(64, 16, dtype=jnp.int8), "mlp/up/kernel/array/scale": S(2, 16)},
        SIZES,
        (2, 3),
        "blocks whose count divides",
    ),
    "SR302": (
        'alias embed = fsdpp\nmesh data, fsdp, model\nrules params:\n  "q" -> (embed)\n  "w" -> (fsdp)\n',
        {"q": S(8), "w": S(8)},
        SIZES,
        (4, 3),
        "the rest of the file was checked",
    ),
    # an alias with alternatives: `model` is taken by the fixed `heads`, `expert` is not in the mesh
    "SR119": (
        'alias heads = model\nalias mlp = (fsdp, expert) | model\nrules params:\n  "w" -> (mlp, heads)\n',
        {"w": S(8, 8)},
        SIZES,
        (4, 11),
        "`| _`",
    ),
    "SR209": (
        'mesh data, fsdp, model\nalias mlp = (fsdp, modle) | _ | model\nrules params:\n  "w" -> (mlp)\n',
        None,
        SIZES,
        (2, 20),
        "did you mean `model`?",
    ),
}
GROUPS = {"SR018": "parms"}
BUDGETS = {"SR110": 1 << 20}
HOSTS = {"SR220": 16}


@pytest.mark.parametrize("code", sorted(LINT_CASES))
def test_code_from_a_bad_rule_file(code, tmp_path):
    text, tree, sizes, where, hint = LINT_CASES[code]
    path = tmp_path / "bad.shard"
    path.write_text(text)
    result = _lint.lint_file(
        str(path), tree, sizes, group=GROUPS.get(code), device_memory=BUDGETS.get(code), hosts=HOSTS.get(code)
    )
    found = [d for d in result.diagnostics if d.code == code]
    assert found, [d.render() for d in result.diagnostics]
    d = found[0]
    assert d.severity == ("note" if code >= "SR300" else "warning" if code >= "SR200" else "error")
    if where is None:
        assert d.span is None
    else:
        assert d.span is not None and (d.span.file, d.span.line, d.span.col) == (str(path), *where), (
            d.render()
        )
    assert hint in d.hint, d.hint


def test_sr004_sr005_sr006_from_includes(tmp_path):
    (tmp_path / "a.shard").write_text('include "b.shard"\n')
    (tmp_path / "b.shard").write_text('include "a.shard"\n')
    (tmp_path / "c.shard").write_text('mesh x\ninclude "gone.shard"\n')
    (tmp_path / "d.shard").write_text('include "../up.shard"\n')
    cases = {
        "a.shard": ("SR004", "b.shard", 1, "include"),
        "c.shard": ("SR005", "c.shard", 2, "relative to the including file"),
        "d.shard": ("SR006", "d.shard", 1, "include_root"),
    }
    for name, (code, file, line, hint) in cases.items():
        result = _lint.lint_file(str(tmp_path / name), None, SIZES)
        (d,) = result.diagnostics
        assert d.code == code
        assert d.span is not None and Path(d.span.file).name == file and d.span.line == line
        assert hint in d.hint, (code, d.hint)


RULES = sr.loads(
    'mesh data, model\nrules params:\n  "w" -> (data, model)\n  default -> replicated\n', name="r.shard"
)


def test_sr106_committed_outside_the_mesh_points_at_the_rule():
    mesh = jax.make_mesh((2, 2), ("data", "model"), devices=jax.devices()[:4])
    far = jax.device_put(jnp.ones((4, 4)), jax.devices()[7])
    (d,) = sr.check({"w": far}, RULES, mesh)
    assert d.code == "SR106" and (d.span.file, d.span.line) == ("r.shard", 3)
    assert "pass the mesh those arrays live on" in d.hint


def test_sr107_deleted_input_points_at_the_rule(mesh42):
    x = jnp.ones((4, 4))
    x.delete()
    (d,) = sr.check({"w": x}, RULES, mesh42)
    assert d.code == "SR107" and (d.span.file, d.span.line) == ("r.shard", 3)
    assert "donating call" in d.hint


def test_sr109_tree_that_cannot_be_flattened():
    with pytest.raises(sr.TreeError) as info:
        sr.plan({1: S(2), "a": S(2)}, RULES, {"data": 2, "model": 2})
    assert info.value.code == "SR109"
    assert "comparable" in info.value.hint


def test_sr111_trees_on_different_devices(mesh42):
    params = sr.apply({"w": jnp.ones((4, 4))}, RULES, mesh42)
    with pytest.raises(sr.PlacementError) as info:
        sr.check_devices(params=params, batch={"x": jax.device_put(np.ones(3), jax.devices()[1])})
    assert info.value.code == "SR111"
    assert "same mesh" in info.value.hint
    other = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2)[::-1], ("data", "model"))
    moved = jax.device_put(jnp.ones((4, 4)), NamedSharding(other, P("data")))
    with pytest.raises(sr.PlacementError):
        sr.check_devices(params=params, batch={"x": moved})


def test_sr206_logical_name_without_an_alias(tmp_path):
    nn = pytest.importorskip("flax.linen")
    path = tmp_path / "bad.shard"
    path.write_text("alias embed = fsdp\nrules params:\n  default -> logical\n")
    tree = {"emb": nn.LogicallyPartitioned(S(64, 8), ("vocab", "embed"))}
    result = _lint.lint_file(str(path), tree, SIZES)
    (d,) = [d for d in result.diagnostics if d.code == "SR206"]
    assert d.severity == "warning" and d.path == "emb" and "`vocab`" in d.message
    assert d.span is not None and (d.span.line, d.span.col) == (3, 14)
    assert "alias vocab = _" in d.hint


# SR008 and SR009 are triggered in test_hardening.py, SR017 in test_patterns.py; SR206 (a boxed tree) just above;
# SR117 needs a traced function on Explicit axes: tests/test_explicit.py (strict=True);
# SR118 a shard_map: tests/test_shard_map.py; SR208 and SR210 a train step: tests/test_cli_step.py;
# SR120 needs arrays placed (lint places nothing): tests/test_unconstrained.py;
# SR112 and SR114 need two processes: tests/test_multihost.py starts them and checks their messages
# (SR114: test_a_process_that_died_is_named_before_jax_gives_up, and in one process with a fake
# key-value store, test_processes_that_do_not_post_are_named_sr114).
TESTED_ELSEWHERE = {
    "SR004",
    "SR005",
    "SR006",
    "SR008",
    "SR009",
    "SR017",
    "SR106",
    "SR107",
    "SR109",
    "SR111",
    "SR112",
    "SR114",
    "SR117",
    "SR118",
    "SR120",
    "SR122",  # tests/test_cli_step.py
    "SR123",  # tests/test_cli_step.py
    "SR124",  # tests/test_plan_files.py: a plan file, not a rule file, is at fault
    "SR126",  # tests/test_targets.py: a --target, not a rule file, is at fault
    "SR127",  # tests/test_targets.py
    "SR128",  # tests/test_targets.py
    "SR129",  # tests/test_collective_budgets.py: a step's cost, compiled
    "SR130",  # tests/test_collective_budgets.py: against a baseline plan file
    "SR131",  # tests/test_transfer_run.py: an array, not a rule file, is at fault
    "SR132",  # tests/test_transfer_run.py: a corrupted copy, injected
    "SR121",  # tests/test_leaf_kinds.py: a leaf, not a rule file, is at fault
    "SR206",
    "SR208",
    "SR210",
    "SR211",  # tests/test_nothing_silent.py, tests/test_cli_step.py
    "SR212",  # tests/test_nothing_silent.py
    "SR214",  # tests/test_named_dims.py
    "SR213",  # tests/test_leaf_kinds.py, tests/test_penzai.py
    "SR216",  # tests/test_waste.py: found in the compiled step
    "SR217",  # tests/test_waste.py
    "SR218",  # tests/test_waste.py
    "SR219",  # tests/test_waste.py
}


def test_every_documented_code_is_tested_here():
    documented = set(re.findall(r"^## (SR\d{3})", DOCS.read_text(), re.M))
    assert len(documented) >= 30
    assert documented == set(LINT_CASES) | TESTED_ELSEWHERE
