"""`shardrules lint --step` and `explain --step`: a train step traced on Explicit
mesh axes, each layout JAX leaves ambiguous listed (SR208 when no activation
rule gives it), and every way of naming a step wrongly refused with a message."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from shardrules._cli._main import main

RULES = """\
mesh data=4, model=2

rules params:
  "up$"   -> (_, model)
  "down$" -> (model, _)

rules activations:
  "up$" -> (data, model)

rules inputs:
  "x|y" -> (data, _)
"""

STEP = """\
import jax
import jax.numpy as jnp

import shardrules as sr

def forward(params, x):
    with jax.named_scope("up"):
        h = jax.nn.gelu(x @ params["up"])
    with jax.named_scope("down"):
        return h @ params["down"]


def sgd(params, batch):
    loss_fn = lambda p: jnp.mean((forward(p, batch["x"]) - batch["y"]) ** 2)
    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def shapes():
    S = jax.ShapeDtypeStruct
    params = {"up": S((16, 64), jnp.float32), "down": S((64, 16), jnp.float32)}
    batch = {"x": S((32, 16), jnp.float32), "y": S((32, 16), jnp.float32)}
    return params, batch


def check_step(rules, mesh):
    return sr.jit(sgd, rules, mesh, in_groups=("params", "inputs")), shapes()


def layered(params, batch, rows=(32, 32)):
    x = batch["x"]
    with jax.named_scope("layers"):
        for i, n in enumerate(rows):
            with jax.named_scope(str(i)):
                with jax.named_scope("up"):
                    h = jax.nn.gelu(x[:n] @ params["up"])
                with jax.named_scope("down"):
                    x = h @ params["down"]
    return x


def layered_step(rules, mesh):
    return sr.jit(layered, rules, mesh, in_groups=("params", "inputs")), shapes()


def donating_step(rules, mesh):
    step = sr.jit(sgd, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None), donate=(0,))
    return step, shapes()


def donating_the_batch(rules, mesh):
    step = sr.jit(sgd, rules, mesh, in_groups=("params", "inputs"), out_groups=("params", None), donate=(1,))
    return step, shapes()


def mesh_types(rules, mesh):
    global SEEN
    SEEN = tuple(t.name for t in mesh.axis_types), dict(mesh.shape)
    return check_step(rules, mesh)


def strict_step(rules, mesh):
    return sr.jit(sgd, rules, mesh, in_groups=("params", "inputs"), strict=True), shapes()


def not_a_pair(rules, mesh):
    return sr.jit(sgd, rules, mesh)


def plain_jit(rules, mesh):
    return jax.jit(sgd), shapes()


def no_arguments():
    return None


def slice_step(rules, mesh):
    def outer(batch):  # six rows of a batch split four ways: `data` cannot stay
        with jax.named_scope("head"):
            return batch["x"][:6] * 2

    S = jax.ShapeDtypeStruct
    batch = {"x": S((32, 16), jnp.float32), "y": S((32, 16), jnp.float32)}
    return sr.jit(outer, rules, mesh, in_groups=("inputs",)), (batch,)


def raises(rules, mesh):
    raise RuntimeError("no checkpoint here")
"""

_names = itertools.count()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A folder with tp.shard and a module of steps (a fresh module name each
    time, so that no test sees another's import), as the current folder."""
    module = f"steps_{next(_names)}"
    (tmp_path / "tp.shard").write_text(RULES)
    (tmp_path / f"{module}.py").write_text(STEP)
    monkeypatch.chdir(tmp_path)
    return tmp_path, module


def _lint_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict]]:
    code = main(["lint", *argv, "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def test_lint_warns_about_each_forward_layout_no_rule_gives(project, capsys) -> None:
    _, module = project
    code, found = _lint_json(capsys, "tp.shard", "--step", f"{module}:check_step")
    step = [f for f in found if f["code"] == "SR208"]
    assert code == 0 and len(step) == 1  # a warning: the run passes
    (finding,) = step
    assert finding["severity"] == "warning" and finding["path"] == "down"
    assert "inferred as P('data', None)" in finding["message"]
    assert "(32, 64) P('data', 'model'), (64, 16) P('model', None)" in finding["message"]
    assert finding["line"] == 7  # the `rules activations:` header
    assert '`"down$" -> (data, _)` under `rules activations:`' in finding["hint"]
    assert main(["lint", "tp.shard", "--step", f"{module}:check_step", "--strict"]) == 1


def test_sr208_hints_one_rule_for_every_layer(project, capsys) -> None:
    """A layer's index in the scope is written `\\d+` in the hinted rule: one
    rule for the layers' like outputs, not one per layer; and adding it
    settles every layer."""
    folder, module = project
    code, found = _lint_json(capsys, "tp.shard", "--step", f"{module}:layered_step")
    step = [f for f in found if f["code"] == "SR208"]
    assert code == 0 and len(step) == 1 and step[0]["path"] == "layers/0/down", found
    assert '`"layers/\\d+/down$" -> (data, _)` under `rules activations:`' in step[0]["hint"], step
    assert "layers/1/down" in json.dumps(step[0])  # the other layer, shown with it
    text = RULES.replace(
        '  "up$" -> (data, model)\n', '  "up$" -> (data, model)\n  "layers/\\d+/down$" -> (data, _)\n'
    )
    (folder / "tp.shard").write_text(text)
    code, found = _lint_json(capsys, "tp.shard", "--step", f"{module}:layered_step")
    assert code == 0 and [f for f in found if f["code"] in ("SR208", "SR211")] == [], found


def test_a_hinted_pattern_covers_every_layer_and_only_the_layers() -> None:
    import re

    from shardrules._tracing._explicit import scope_pattern

    pattern = scope_pattern("model/layers/12/attn.o/0")
    assert pattern == r"model/layers/\d+/attn\.o/\d+"
    for other in ("model/layers/0/attn.o/3", "model/layers/317/attn.o/0"):
        assert re.fullmatch(pattern, other, re.ASCII)
    for other in ("model/layers/x/attn.o/0", "model/layers/1/attnXo/0", "model/layers/1a/attn.o/0"):
        assert not re.fullmatch(pattern, other, re.ASCII)
    assert scope_pattern("layers/\u0663/mlp") == "layers/\u0663/mlp"  # not an ASCII digit: kept as it is


def test_sr208_hints_a_rule_per_layer_where_the_layers_differ(project, capsys) -> None:
    folder, module = project
    text = RULES.replace(
        '  "up$" -> (data, model)\n', '  "0/up$" -> (data, model)\n  "1/up$" -> (_, model)\n'
    )
    (folder / "tp.shard").write_text(text)
    code, found = _lint_json(capsys, "tp.shard", "--step", f"{module}:layered_step")
    hints = sorted(f["hint"] for f in found if f["code"] == "SR208")
    assert code == 0 and len(hints) == 2, found
    assert '`"layers/0/down$" -> (data, _)`' in hints[0] and '`"layers/1/down$" -> (_, _)`' in hints[1], hints


def test_adding_the_hinted_rule_settles_it(project, capsys) -> None:
    folder, module = project
    text = RULES.replace('  "up$" -> (data, model)\n', '  "up$" -> (data, model)\n  "down$" -> (data, _)\n')
    (folder / "tp.shard").write_text(text)
    code, found = _lint_json(capsys, "tp.shard", "--step", f"{module}:check_step")
    assert code == 0 and [f for f in found if f["code"] == "SR208"] == []
    assert main(["explain", "tp.shard", "--step", f"{module}:check_step"]) == 0
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith("down ") and "dot_general" in line)
    assert "(32, 16) P('data', None)" in row and "rule tp.shard:9:3" in row


def test_explain_lists_every_decision(project, capsys) -> None:
    _, module = project
    assert main(["explain", "tp.shard", "--step", f"{module}:check_step"]) == 0
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    start = next(i for i, line in enumerate(out) if line.split()[:2] == ["scope", "operation"])
    lines = [*out[start:], ""]
    lines = lines[: lines.index("")]
    assert lines[0].split() == ["scope", "operation", "operands", "result", "decided", "by"]
    rows = [line.split("  ")[0].strip() for line in lines[1:] if line.strip()]
    assert rows == ["up", "down", "down (backward)", "down (backward)", "up (backward)"]
    assert "rule tp.shard:8:3" in lines[1] and lines[2].rstrip().endswith("inferred")
    assert "SR208" in captured.err  # the finding, on stderr as explain prints findings


def test_explain_lists_every_scope_output_with_its_shapes_and_rule(project, capsys) -> None:
    """The names activation rules are matched against, before the decisions:
    what a user writes rules from."""
    _, module = project
    assert main(["explain", "tp.shard", "--step", f"{module}:check_step"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["scope", "output", "shapes", "dtype", "rule"]
    rows = {line.split()[0]: line for line in out[1 : out.index("")]}
    assert set(rows) == {"up", "down"}
    assert "(32, 64)" in rows["up"] and "float32" in rows["up"] and 'tp.shard:8:3 "up$"' in rows["up"]
    assert "(32, 16)" in rows["down"] and rows["down"].rstrip().endswith("-")


def test_lint_reports_an_activation_rule_that_matches_no_scope_sr211(project, capsys) -> None:
    folder, module = project
    text = RULES.replace('  "up$" -> (data, model)\n', '  "up$" -> (data, model)\n  "^dwn$" -> (data, _)\n')
    (folder / "tp.shard").write_text(text)
    code, found = _lint_json(capsys, "tp.shard", "--step", f"{module}:check_step")
    (finding,) = [f for f in found if f["code"] == "SR211"]
    assert code == 0 and finding["severity"] == "warning" and finding["line"] == 9
    assert "`^dwn$` matches no scope output of this step (2 scope outputs seen)" in finding["message"]
    assert 'did you mean "down"?' in finding["hint"]
    assert main(["lint", "tp.shard", "--step", f"{module}:check_step", "--strict"]) == 1


def test_the_mesh_has_the_declared_types_explicit_where_unstated(project, capsys) -> None:
    folder, module = project
    text = RULES.replace("mesh data=4, model=2", "mesh data=4, model=2 auto")
    (folder / "tp.shard").write_text(text.replace('"up$" -> (data, model)', '"up$" -> (data, _)'))
    assert main(["lint", "tp.shard", "--step", f"{module}:mesh_types", "--mesh", "data=2,model=4"]) == 0
    seen = sys.modules[module].SEEN
    assert seen == (("Explicit", "Auto"), {"data": 2, "model": 4})
    capsys.readouterr()


def test_an_all_auto_mesh_has_nothing_to_check(project, capsys) -> None:
    folder, module = project
    (folder / "tp.shard").write_text(RULES.replace("mesh data=4", "mesh auto data=4"))
    assert main(["lint", "tp.shard", "--step", f"{module}:check_step"]) == 2
    assert "declares every axis `auto`" in capsys.readouterr().err


def test_a_strict_step_reports_its_error(project, capsys) -> None:
    _, module = project
    code, found = _lint_json(capsys, "tp.shard", "--step", f"{module}:strict_step")
    assert code == 1
    (error,) = found
    assert error["code"] == "SR117" and error["path"] == "down" and '"down$" -> (data, _)' in error["hint"]


@pytest.mark.parametrize(
    ("attr", "said"),
    [
        ("not_a_pair", "returned RuleJit; return the step and its example arguments"),
        ("plain_jit", "returned a PjitFunction as its step, not a `shardrules.jit` step"),
        ("no_arguments", "raised TypeError"),
        ("raises", "raised RuntimeError: no checkpoint here"),
        ("missing", "has no attribute 'missing'"),
    ],
)
def test_a_step_named_wrongly_is_a_usage_error(project, capsys, attr: str, said: str) -> None:
    _, module = project
    assert main(["lint", "tp.shard", "--step", f"{module}:{attr}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardrules lint: --step") and said in err


def test_sizes_are_needed(project, capsys) -> None:
    folder, module = project
    (folder / "tp.shard").write_text(RULES.replace("mesh data=4, model=2", "mesh data, model"))
    assert main(["lint", "tp.shard", "--step", f"{module}:check_step"]) == 2
    assert "--step needs the mesh's sizes" in capsys.readouterr().err
    assert main(["lint", "tp.shard", "--step", f"{module}:check_step", "--mesh", "data=4,model=2"]) == 0


def test_more_devices_than_jax_has_is_a_usage_error(project, capsys) -> None:
    _, module = project
    assert main(["lint", "tp.shard", "--step", f"{module}:check_step", "--mesh", "data=8,model=2"]) == 2
    err = capsys.readouterr().err
    assert (
        "the mesh needs 16 devices and JAX has 8" in err
        and "--xla_force_host_platform_device_count=16" in err
    )


def test_the_step_can_be_set_in_pyproject(project, capsys) -> None:
    folder, module = project
    (folder / "pyproject.toml").write_text(f'[tool.shardrules]\nstep = "{module}:check_step"\n')
    code, found = _lint_json(capsys, "tp.shard")
    assert code == 0 and [f["code"] for f in found] == ["SR208"]


def test_a_fresh_process_gets_simulated_cpu_devices(tmp_path: Path) -> None:
    """The command line alone, with no XLA_FLAGS: JAX starts with as many CPU
    devices as the mesh needs."""
    (tmp_path / "tp.shard").write_text(RULES)
    (tmp_path / "fresh_steps.py").write_text(STEP)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    done = subprocess.run(
        [sys.executable, "-m", "shardrules", "lint", "tp.shard", "--step", "fresh_steps:check_step"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "SR208" in done.stdout and "Found 0 errors and 1 warning." in done.stdout
    assert textwrap.dedent(done.stderr).strip() == ""


def test_a_rule_over_both_axis_types_is_one_error_not_also_a_warning(project, capsys) -> None:
    folder, module = project
    (folder / "tp.shard").write_text(
        RULES.replace("mesh data=4, model=2", "mesh data=4 explicit, model=2 auto")
    )
    code, found = _lint_json(capsys, "tp.shard", "--step", f"{module}:check_step")
    assert code == 1
    assert [(f["code"], f["severity"], f["line"]) for f in found if f["code"] == "SR207"] == [
        ("SR207", "error", 8)
    ]


def test_lint_step_reports_an_axis_the_result_drops_sr210(project, capsys) -> None:
    """SR210 from `lint --step`: the operation, its scope, the step's source line, both
    layouts and why the axis is dropped; not also raised as a warning by the trace."""
    _, module = project
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the trace's own warning becomes the finding, not a warning
        code, found = _lint_json(capsys, "tp.shard", "--step", f"{module}:slice_step")
    dropped = [f for f in found if f["code"] == "SR210"]
    assert code == 0 and len(dropped) == 1, found
    (finding,) = dropped
    assert finding["severity"] == "warning" and finding["path"] == "head"
    assert "`slice` in scope `head`" in finding["message"]
    assert (
        f"{module}.py:" in finding["message"]
        and "`data` on dimension 0 (does not divide)" in finding["message"]
    )
    assert "(32, 16) P('data', None)" in finding["message"]
    assert main(["lint", "tp.shard", "--step", f"{module}:slice_step", "--strict"]) == 1


def test_explain_cost_prints_what_the_step_costs_each_device(project, capsys) -> None:
    _, module = project
    assert main(["explain", "tp.shard", "--step", f"{module}:check_step", "--cost"]) == 0
    out = capsys.readouterr().out
    cost = out[out.index("step cost:") :].splitlines()
    assert cost[1].strip() == "devices: 8"
    assert cost[2].strip().startswith("FLOPs per device:") and "x the ideal" in cost[2]
    assert any(line.strip().startswith("all-reduce: ") for line in cost)
    assert main(["explain", "tp.shard", "--cost"]) == 2  # no step to compile
    assert "--cost needs a step" in capsys.readouterr().err


def test_lint_fails_a_step_over_its_budgets_sr122_sr123(project, capsys) -> None:
    folder, module = project
    code, found = _lint_json(
        capsys,
        "tp.shard",
        "--step",
        f"{module}:check_step",
        "--max-flops-ratio",
        "1.0001",
        "--max-peak-bytes",
        "1KiB",
    )
    assert code == 1
    (ratio,) = [f for f in found if f["code"] == "SR122"]
    (peak,) = [f for f in found if f["code"] == "SR123"]
    assert ratio["severity"] == "error" and "x the ideal FLOPs per device (at most 1.0001" in ratio["message"]
    # collectives move bytes and add no FLOPs: the hint names the computations run repeated
    assert "computed more than their share: " in ratio["hint"], ratio
    assert "all-reduce" not in ratio["hint"] and "collective" not in ratio["hint"], ratio
    assert "at most 1.0 KiB allowed by --max-peak-bytes" in peak["message"]
    assert "donate the parameters and optimizer state (`donate=` in sr.jit)" in peak["hint"]
    code, found = _lint_json(capsys, "tp.shard", "--step", f"{module}:check_step", "--max-flops-ratio", "8")
    assert code == 0 and not [f for f in found if f["code"] in ("SR122", "SR123")]
    # the same budgets from [tool.shardrules], named as where they come from
    (folder / "pyproject.toml").write_text(
        f'[tool.shardrules]\nstep = "{module}:check_step"\nmax-flops-ratio = 1.0001\nmax-peak-bytes = "1KiB"\n'
    )
    code, found = _lint_json(capsys, "tp.shard")
    assert code == 1 and {"SR122", "SR123"} <= {f["code"] for f in found}
    assert "pyproject.toml" in next(f for f in found if f["code"] == "SR122")["message"]
    assert main(["lint", "tp.shard", "--max-peak-bytes", "lots"]) == 2


def test_sr123_does_not_ask_to_donate_what_the_step_donates(project, capsys) -> None:
    """With `donate=` given, SR123 says what donation saves (or that no
    output can reuse what is donated), never to donate."""
    _, module = project
    budget = ("--max-peak-bytes", "1KiB")
    code, found = _lint_json(capsys, "tp.shard", "--step", f"{module}:donating_step", *budget)
    (peak,) = [f for f in found if f["code"] == "SR123"]
    assert code == 1 and "donate=(0,) already saves " in peak["hint"], peak
    assert "donate the parameters" not in peak["hint"] and "shard the largest arguments" in peak["hint"]
    saved = peak["hint"].split("already saves ")[1].split(" (")[0]
    assert saved != "0 B", peak
    # a donated batch: no output has its shape, so nothing is reused, and the hint says why
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # JAX's own note that a donated buffer went unused
        code, found = _lint_json(capsys, "tp.shard", "--step", f"{module}:donating_the_batch", *budget)
    (peak,) = [f for f in found if f["code"] == "SR123"]
    assert code == 1 and "donate=(1,) is given but no output reuses a donated buffer" in peak["hint"], peak
    assert "donate the parameters" not in peak["hint"]


def test_a_mesh_bigger_than_the_machine_is_costed_on_simulated_devices(tmp_path: Path) -> None:
    """256 devices on a machine with 2 cores: a fresh process starts JAX with
    as many simulated CPU devices as the mesh needs."""
    (tmp_path / "tp.shard").write_text(RULES)
    (tmp_path / "big_steps.py").write_text(STEP)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    done = subprocess.run(
        [sys.executable, "-m", "shardrules", "explain", "tp.shard", "--step", "big_steps:check_step",
         "--mesh", "data=32,model=8", "--cost"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "  devices: 256" in done.stdout and "FLOPs per device" in done.stdout


def test_diff_step_shows_both_rule_files_costs_side_by_side(project, capsys) -> None:
    folder, module = project
    replicated = RULES.replace('"up$"   -> (_, model)', '"up$"   -> replicated')
    (folder / "rep.shard").write_text(replicated.replace('"down$" -> (model, _)', '"down$" -> replicated'))
    (folder / f"{module}_shapes.py").write_text(
        f"from {module} import shapes\n\ndef params():\n    return shapes()[0]\n"
    )
    argv = [
        "diff",
        "rep.shard",
        "tp.shard",
        "--shapes",
        f"{module}_shapes:params",
        "--step",
        f"{module}:check_step",
    ]
    assert main(argv) == 1  # the plans differ
    out = capsys.readouterr().out
    table = out[out.index("step cost") :].splitlines()
    rows = {line[:22].strip(): line[22:].split() for line in table[1:] if line.strip()}
    assert rows["devices"] == ["8", "8", "1.00x"]
    flops_a, flops_b = float(rows["FLOPs per device"][0]), float(rows["FLOPs per device"][2])
    assert flops_b < flops_a  # tensor parallelism splits the work the replicated file repeats
    assert main([*argv, "--format", "json"]) == 1
    costs = json.loads(capsys.readouterr().out)["step_cost"]
    assert costs["a"]["ratio"] > costs["b"]["ratio"] >= 0.95
    assert (
        main(["diff", "rep.shard", "tp.shard", "--shapes", f"{module}_shapes:params", "--step", "nope:x"])
        == 2
    )


def test_a_step_module_that_is_not_found_says_where_it_was_looked_for(project, capsys) -> None:
    assert main(["lint", "tp.shard", "--step", "no_such_steps:check_step"]) == 2
    err = capsys.readouterr().err
    assert "cannot import 'no_such_steps'" in err and "looked for in the current directory" in err
    assert "PYTHONPATH" in err


NOISY = STEP.replace(
    "import shardrules as sr\n",
    'import os\nimport sys\n\nimport shardrules as sr\n\nprint("printed at import")\nos.write(1, b"written to fd 1 at import\\n")\n',
).replace(
    "def forward(params, x):\n",
    'def forward(params, x):\n    print("printed while traced")\n    os.write(1, b"written to fd 1 while traced\\n")\n',
) + textwrap.dedent(
    """
    def param_shapes():
        print("printed by the shape function")
        return shapes()[0]


    def noisy_factory(rules, mesh):
        print("printed by the factory")
        return check_step(rules, mesh)


    def exits(params, batch):
        sys.exit(0)


    def exiting_step(rules, mesh):
        return sr.jit(exits, rules, mesh, in_groups=("params", "inputs")), shapes()


    def exiting_factory(rules, mesh):
        sys.exit(0)


    def exiting_shapes():
        sys.exit(0)
    """
)


def _run(folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardrules", *argv],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def noisy(tmp_path: Path) -> Path:
    (tmp_path / "tp.shard").write_text(RULES)
    (tmp_path / "noisy.py").write_text(NOISY)
    return tmp_path


NOISES = [
    "printed at import",
    "written to fd 1 at import",
    "printed by the factory",
    "printed while traced",
    "written to fd 1 while traced",
]


@pytest.mark.parametrize(
    "argv",
    [
        ["dump", "tp.shard", "--shapes", "noisy:param_shapes", "--step", "noisy:noisy_factory", "-o", "-"],
        ["explain", "tp.shard", "--step", "noisy:noisy_factory", "--cost", "--format", "json"],
        ["lint", "tp.shard", "--step", "noisy:noisy_factory", "--format", "json"],
    ],
    ids=["dump", "explain-cost", "lint"],
)
def test_what_a_step_prints_goes_to_stderr_and_stdout_is_only_the_commands(noisy: Path, argv) -> None:
    done = _run(noisy, *argv)
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)  # nothing but the command's JSON
    for noise in NOISES + (["printed by the shape function"] if "--shapes" in argv else []):
        assert noise not in done.stdout and noise in done.stderr


def test_a_step_that_exits_while_traced_is_a_usage_error_naming_it(noisy: Path) -> None:
    done = _run(
        noisy, "dump", "tp.shard", "--shapes", "noisy:param_shapes", "--step", "noisy:exiting_step", "-o", "-"
    )
    assert done.returncode == 2 and done.stdout == ""
    assert (
        "shardrules dump: --step noisy:exiting_step: the step exited (SystemExit: 0, as `sys.exit` raises) "
        "while it was traced; a step must return its outputs" in done.stderr
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["lint", "tp.shard", "--step", "noisy:exiting_factory"],
            "--step noisy:exiting_factory: calling it with (rules, mesh) exited (SystemExit: 0",
        ),
        (
            ["lint", "tp.shard", "--shapes", "noisy:exiting_shapes"],
            "--shapes: noisy:exiting_shapes exited (SystemExit: 0",
        ),
    ],
    ids=["factory", "shapes"],
)
def test_a_factory_or_shape_function_that_exits_is_a_usage_error(
    noisy, monkeypatch, capsys, argv, said
) -> None:
    monkeypatch.chdir(noisy)
    monkeypatch.delitem(sys.modules, "noisy", raising=False)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert said in captured.err
    assert "printed at import" in captured.err and "printed at import" not in captured.out


def test_what_a_convert_module_prints_goes_to_stderr(tmp_path, monkeypatch, capfd) -> None:
    """`convert flax module:attr` runs the module's code too: its output, at
    the Python and the file-descriptor level, is not the rule file."""
    (tmp_path / "chatty_rules.py").write_text(
        'import os\nprint("printed at import")\nos.write(1, b"written to fd 1 at import\\n")\n'
        'RULES = [("batch", "data"), ("embed", None)]\n'
    )
    monkeypatch.chdir(tmp_path)
    assert main(["convert", "flax", "chatty_rules:RULES"]) == 0
    out, err = capfd.readouterr()
    assert "printed at import" in err and "written to fd 1 at import" in err
    assert "printed" not in out and "written" not in out and "alias batch = data" in out
