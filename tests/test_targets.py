"""`step.cost(target=...)` and `--target`: what a step costs on the chips it
will run on. GPU targets compile on the simulated CPU devices and take the
chip's figures; TPU targets compile with the TPU compiler (libtpu, no TPU
needed) and are tested where libtpu is installed (`pip install
"shardrules[tpu]"`), skipped with that reason elsewhere."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType

import shardrules as sr
from shardrules._cli._main import main
from shardrules._costs import _targets
from shardrules._costs._estimate import communication_seconds, estimate
from shardrules._planning._chips import CHIPS, GiB

RULES = """\
mesh fsdp, model

rules params:
  "w1" -> (fsdp, model)
  "w2" -> (model, fsdp)

rules inputs:
  "x" -> (fsdp, _)
"""


def _step(p, x):
    def loss(p):
        return jnp.sum(jnp.tanh(x @ p["w1"]) @ p["w2"])

    g = jax.grad(loss)(p)
    return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)


def _args(width: int = 256, dtype=jnp.float32):
    S = jax.ShapeDtypeStruct
    return {"w1": S((width, 4 * width), dtype), "w2": S((4 * width, width), dtype)}, S((64, width), dtype)


def _jit(mesh):
    return sr.jit(_step, sr.loads(RULES), mesh, in_groups=("params", "inputs"), out_groups="params")


@pytest.fixture
def mesh():
    return jax.make_mesh((4, 2), ("fsdp", "model"), axis_types=(AxisType.Explicit,) * 2)


# --- naming a target -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "key", "shape"),
    [
        ("v5p:8x8x4", "v5p", (8, 8, 4)),
        ("V5E:4x4", "v5e", (4, 4)),
        ("h100", "h100", ()),
        ("a100-80g", "a100-80g", ()),
    ],
)
def test_a_target_names_a_chip(name: str, key: str, shape: tuple[int, ...]) -> None:
    target = _targets.parse_target(name)
    assert target.chip is CHIPS[key] and target.shape == shape
    assert target.compiler == ("tpu" if CHIPS[key].platform == "tpu" else "cpu")


@pytest.mark.parametrize(
    ("name", "fix"),
    [
        ("v5litepod-16", "v5e:4x4"),
        ("v5p-512", "v5p:4x8x8"),
        ("v5p", "v5p:4x4"),
        ("a100", "--target a100-80g"),
        ("mi300", "h100"),
    ],
)
def test_an_unknown_target_is_sr126_with_a_fix(name: str, fix: str) -> None:
    with pytest.raises(sr.TargetError) as err:
        _targets.parse_target(name)
    assert err.value.code == "SR126" and isinstance(err.value, ValueError)
    assert name in str(err.value) and fix in err.value.hint


def test_every_chip_the_docs_promise_has_its_memory() -> None:
    said = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32, "h100": 80, "h200": 141, "b200": 192, "a100-80g": 80}
    assert {key: chip.hbm_bytes / GiB for key, chip in CHIPS.items()} == said
    page = (Path(__file__).resolve().parents[1] / "docs" / "cookbook" / "step-cost.md").read_text()
    for chip in CHIPS.values():  # the table in the docs shows every chip with its sources
        assert f"| {chip.name} |" in page, chip.name
        for source in chip.sources:
            assert source.split(" ")[0] in page, source


# --- GPU targets: the CPU compile and the chip's figures ------------------------------------------


def test_a_gpu_target_compiles_on_the_mesh_and_says_so(mesh) -> None:
    step = _jit(mesh)
    plain = step.cost(*_args())
    on_h100 = step.cost(*_args(), target="h100")
    assert (on_h100.target, on_h100.compiler, on_h100.hbm_bytes_per_device) == ("h100", "cpu", 80 * GiB)
    figures = ("flops_per_device", "peak_bytes_per_device", "collectives", "bytes_accessed_per_device")
    assert all(getattr(on_h100, f) == getattr(plain, f) for f in figures)  # the same compile
    assert plain.target is None and plain.fits is None and plain.time_estimate_s is None
    assert on_h100.fits is True and on_h100.time_estimate_s > 0
    text = str(on_h100)
    assert "compiled on simulated CPU devices" in text and "fits: peak" in text and "(estimate" in text
    data = on_h100.to_json()
    assert data["target"] == "h100" and data["fits"] is True and data["estimate"]["total_s"] > 0
    json.dumps(data)


def test_a_faster_chip_estimates_a_shorter_step(mesh) -> None:
    step = _jit(mesh)
    times = {name: step.cost(*_args(), target=name).time_estimate_s for name in ("a100-80g", "h100", "b200")}
    assert times["b200"] < times["h100"] < times["a100-80g"]


def test_a_step_too_big_for_the_chip_does_not_fit(mesh) -> None:
    big = _args(width=32768)  # 4 GiB per weight, compiled from shapes only: nothing is allocated
    cost = _jit(mesh).cost(*big, target="a100-80g", ideal=False)
    assert cost.fits is (cost.peak_bytes_per_device <= 80 * GiB)
    small = _jit(mesh).cost(*big, target="b200", ideal=False)
    assert small.peak_bytes_per_device == cost.peak_bytes_per_device


# --- the estimate ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Call:
    kind: str
    bytes_per_device: int
    runs: int
    groups: tuple[tuple[int, ...], ...] | None


@given(
    kind=st.sampled_from(["all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute"]),
    size=st.integers(1, 2**34),
    runs=st.integers(1, 64),
    n=st.sampled_from([2, 4, 8]),
)
@settings(max_examples=60, deadline=None)
def test_a_collective_takes_its_ring_bytes_over_the_link(kind: str, size: int, runs: int, n: int) -> None:
    chip = CHIPS["h100"]
    groups = (tuple(range(n)),)
    once = communication_seconds(chip, [_Call(kind, size, 1, groups)], n, [1], [0] * n)
    many = communication_seconds(chip, [_Call(kind, size, runs, groups)], n, [1], [0] * n)
    assert set(once) == {"nvlink"}
    assert math.isclose(many["nvlink"], once["nvlink"] * runs, rel_tol=1e-12)
    share = {"all-gather": (n - 1) / n, "all-to-all": (n - 1) / n, "all-reduce": 2 * (n - 1) / n}
    expected = size * share.get(kind, n - 1 if kind == "reduce-scatter" else 1.0) / chip.axis_bandwidth
    assert math.isclose(once["nvlink"], expected, rel_tol=1e-12)
    # the same group spread over two nodes goes over the network, which is slower
    spread = communication_seconds(chip, [_Call(kind, size, 1, groups)], n, [1], [d % 2 for d in range(n)])
    assert set(spread) == {"network"} and spread["network"] > once["nvlink"]


def test_the_estimate_is_a_roofline() -> None:
    chip = CHIPS["v5e"]
    est = estimate(
        chip,
        flops=197e12,
        bytes_accessed=819e9 / 2,
        by_dtype={"bf16": 197e12},
        calls=[],
        devices=4,
        axes=[],
        node_of=None,
        model_flops=98.5e12,
    )
    assert math.isclose(est.compute_s, 1.0) and math.isclose(est.memory_s, 0.5)
    assert est.total_s == est.compute_s and est.bound == "compute" and math.isclose(est.mfu, 0.5)
    f32 = estimate(
        CHIPS["h100"], flops=494e12, bytes_accessed=0, by_dtype={"f32": 494e12}, calls=[], devices=1,
        axes=[], node_of=None, model_flops=None,
    )  # fmt: skip
    assert math.isclose(f32.compute_s, 1.0) and f32.dtype == "f32"  # TF32 at JAX's default precision


# --- the command line ----------------------------------------------------------------------------

STEP = """\
import jax
import jax.numpy as jnp
import shardrules as sr
from jax.sharding import AxisType

def step(p, x):
    def loss(p):
        return jnp.sum(jnp.tanh(x @ p["w1"]) @ p["w2"])
    g = jax.grad(loss)(p)
    return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

def make(width):
    S = jax.ShapeDtypeStruct
    return ({"w1": S((width, 4 * width), jnp.float32), "w2": S((4 * width, width), jnp.float32)},
            S((64, width), jnp.float32))

def train_step(rules, mesh):
    return sr.jit(step, rules, mesh, in_groups=("params", "inputs"), out_groups="params"), make(256)

def shapes():
    return make(256)[0]

def medium_step(rules, mesh):
    return sr.jit(step, rules, mesh, in_groups=("params", "inputs"), out_groups="params"), make(2048)

def huge_step(rules, mesh):
    return sr.jit(step, rules, mesh, in_groups=("params", "inputs"), out_groups="params"), make(65536)
"""

_names = itertools.count()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    module = f"target_step_{next(_names)}"
    (tmp_path / "model.shard").write_text(RULES.replace("mesh fsdp, model", "mesh fsdp=4, model=2"))
    (tmp_path / f"{module}.py").write_text(STEP)
    monkeypatch.chdir(tmp_path)
    return tmp_path, module


def _lint(capsys, *argv: str) -> tuple[int, list[dict]]:
    code = main(["lint", "model.shard", *argv, "--format", "json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else []


def test_lint_fails_a_step_that_does_not_fit_sr127(project, capsys) -> None:
    _, module = project
    code, found = _lint(capsys, "--step", f"{module}:huge_step", "--target", "a100-80g")
    assert code == 1
    (fit,) = [f for f in found if f["code"] == "SR127"]
    assert "does not fit a100-80g" in fit["message"] and "over: arguments" in fit["message"]
    assert "largest arguments per chip: `argument 0: w" in fit["hint"]
    assert "largest values the step makes" in fit["hint"]
    code, found = _lint(capsys, "--step", f"{module}:train_step", "--target", "a100-80g")
    assert code == 0 and not [f for f in found if f["code"] == "SR127"]
    # headroom: a share of the chip kept free
    code, found = _lint(
        capsys, "--step", f"{module}:medium_step", "--target", "a100-80g", "--hbm-headroom", "99.99%"
    )
    assert (
        code == 1
        and "kept free by --hbm-headroom" in next(f for f in found if f["code"] == "SR127")["message"]
    )


def test_lint_fails_a_step_over_its_time_sr128(project, capsys) -> None:
    _, module = project
    code, found = _lint(
        capsys, "--step", f"{module}:train_step", "--target", "h100", "--max-step-time", "1e-9"
    )
    assert code == 1
    (slow,) = [f for f in found if f["code"] == "SR128"]
    assert "the step takes an estimated" in slow["message"] and "on h100" in slow["message"]
    assert "(at most 1.0 ns allowed by --max-step-time)" in slow["message"] and slow["hint"]
    code, found = _lint(capsys, "--step", f"{module}:train_step", "--target", "h100", "--max-step-time", "60")
    assert code == 0 and not [f for f in found if f["code"] == "SR128"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--max-step-time", "2"], "--max-step-time is a budget for a step"),
        (["--step", "{m}:train_step", "--max-step-time", "2"], "needs the chips the step will run on"),
        (["--step", "{m}:train_step", "--hbm-headroom", "10%"], "needs the chips the step will run on"),
        (["--step", "{m}:train_step", "--target", "tpu9"], "unknown target 'tpu9'"),
    ],
)
def test_target_options_misused_are_usage_errors(project, capsys, argv: list[str], said: str) -> None:
    _, module = project
    assert main(["lint", "model.shard", *[a.format(m=module) for a in argv]]) == 2
    assert said in capsys.readouterr().err


def test_explain_shows_the_target(project, capsys) -> None:
    _, module = project
    assert main(["explain", "model.shard", "--step", f"{module}:train_step", "--target", "h200"]) == 0
    out = capsys.readouterr().out
    assert "target: h200" in out and "step time:" in out and "fits: peak" in out
    assert main(["explain", "model.shard", "--target", "h200", "--shapes", "x.json"]) == 2
    assert "--target needs a step" in capsys.readouterr().err


def test_the_target_can_be_set_in_pyproject(project, capsys) -> None:
    folder, module = project
    (folder / "pyproject.toml").write_text(
        f'[tool.shardrules]\nstep = "{module}:huge_step"\ntarget = "a100-80g"\nhbm-headroom = "10%"\n'
    )
    code, found = _lint(capsys)
    assert code == 1
    assert (
        "10% kept free by [tool.shardrules] hbm-headroom"
        in next(f for f in found if f["code"] == "SR127")["message"]
    )
    (folder / "pyproject.toml").write_text('[tool.shardrules]\ntarget = "h100"\nhbm-headroom = 2\n')
    assert main(["lint", "model.shard"]) == 2
    assert "hbm-headroom" in capsys.readouterr().err


# --- TPU targets: the TPU compiler ---------------------------------------------------------------

tpu = pytest.mark.skipif(
    not _targets.has_libtpu(), reason="libtpu is not installed: pip install 'shardrules[tpu]'"
)


def test_a_tpu_target_without_libtpu_names_the_extra(mesh, monkeypatch) -> None:
    monkeypatch.setattr(_targets, "has_libtpu", lambda: False)
    _targets.tpu_devices.cache_clear()
    try:
        with pytest.raises(sr.TargetError) as err:
            _jit(mesh).cost(*_args(), target="v5e:2x4")
    finally:
        _targets.tpu_devices.cache_clear()
    assert err.value.code == "SR126" and 'pip install "shardrules[tpu]"' in err.value.hint


@tpu
def test_a_tpu_target_gives_the_tpu_compilers_figures() -> None:
    """What `step.cost(target=)` reports is what `jax.jit(...).lower(...).compile()`
    gives for the same step, with the same shardings, on the same topology
    (on Auto axes, where plain `jax.jit` with shardings is the same program)."""
    from jax.experimental import topologies
    from jax.sharding import AxisType

    auto = (AxisType.Auto, AxisType.Auto)
    cost = _jit(jax.make_mesh((4, 2), ("fsdp", "model"), axis_types=auto)).cost(*_args(), target="v5e:2x4")
    devices = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x4").devices
    tpu_mesh = jax.make_mesh((4, 2), ("fsdp", "model"), devices=list(devices), axis_types=auto)
    rules = sr.loads(RULES)
    params, x = _args()
    ins = (
        sr.shardings(params, rules, tpu_mesh),
        sr.shardings({"x": x}, rules, tpu_mesh, group="inputs")["x"],
    )
    with jax.set_mesh(tpu_mesh):
        compiled = jax.jit(_step, in_shardings=ins, out_shardings=ins[0]).lower(params, x).compile()
    analysis, memory = compiled.cost_analysis(), compiled.memory_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    assert cost.compiler == "tpu" and cost.target == "v5e:2x4"
    assert cost.flops_per_device == analysis["flops"]
    assert cost.bytes_accessed_per_device == analysis["bytes accessed"]
    assert cost.argument_bytes_per_device == memory.argument_size_in_bytes
    assert cost.output_bytes_per_device == memory.output_size_in_bytes
    assert cost.temp_bytes_per_device == memory.temp_size_in_bytes
    assert cost.code_bytes_per_device == memory.generated_code_size_in_bytes > 0
    assert cost.peak_bytes_per_device == (
        memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
        + memory.generated_code_size_in_bytes - memory.alias_size_in_bytes
    )  # fmt: skip
    from shardrules._costs._cost import collectives

    assert cost.collectives == collectives(compiled.as_text())
    assert cost.hbm_bytes_per_device == 16 * GiB and cost.fits is True and cost.estimate is not None
    assert "compiled by the TPU compiler for v5e:2x4" in str(cost)


@tpu
def test_a_mesh_that_is_not_the_topologys_size_is_sr126(mesh) -> None:
    with pytest.raises(sr.TargetError) as err:
        _jit(mesh).cost(*_args(), target="v5e:4x4")
    assert "has 8 devices and the target v5e:4x4 has 16" in str(err.value)
    assert "v5e:2x4" in err.value.hint or "v5e:" in err.value.hint
    with pytest.raises(sr.TargetError) as err:
        _jit(mesh).cost(*_args(), target="v5e:3x3")
    assert "refuses the topology" in str(err.value)


@tpu
def test_the_done_when_command_runs_on_256_chips_with_no_tpu(project, capsys) -> None:
    """`lint --step --mesh fsdp=64,model=4 --target v5p:8x8x4 --max-step-time 2.0`:
    traced and compiled for 256 v5p chips in a process with 8 CPU devices."""
    _, module = project
    argv = ["--step", f"{module}:train_step", "--mesh", "fsdp=64,model=4", "--target", "v5p:8x8x4"]
    code, found = _lint(capsys, *argv, "--max-step-time", "2.0")
    assert code == 0 and not [f for f in found if f["code"] in ("SR126", "SR127", "SR128")]
    assert main(["explain", "model.shard", *argv]) == 0
    out = capsys.readouterr().out
    assert "compiled by the TPU compiler for v5p:8x8x4 (256 TPU v5p chips)" in out
    code, found = _lint(
        capsys, "--step", f"{module}:huge_step", "--mesh", "fsdp=2,model=2", "--target", "v5p:2x2x1"
    )
    assert code == 1 and "does not fit v5p:2x2x1" in next(f for f in found if f["code"] == "SR127")["message"]


# --- what a new user met ---------------------------------------------------------------------------


def test_a_gpu_target_times_bfloat16_products_at_the_bfloat16_rate_and_says_what_the_cpu_widens(mesh) -> None:
    """XLA's CPU compiler runs bfloat16 products in float32: the estimate's
    compute part takes the dtype from the program as the model wrote it,
    and a note says the bytes are the CPU compiler's."""
    step = _jit(mesh)
    bf16 = step.cost(*_args(dtype=jnp.bfloat16), target="h100")
    f32 = step.cost(*_args(), target="h100")
    assert (bf16.estimate.dtype, f32.estimate.dtype) == ("bf16", "f32")
    assert bf16.estimate.compute_s < f32.estimate.compute_s
    assert any("bfloat16" in note and "float32" in note for note in bf16.notes)
    assert not f32.notes
    assert "note: the model computes in bfloat16" in str(bf16)


def test_the_products_by_dtype_are_read_before_the_compiler_widens_them() -> None:
    from shardrules._costs._step import products_by_dtype

    f = jax.jit(lambda a, b, c: jnp.tanh(a @ b) @ c.astype(jnp.float32))
    S = jax.ShapeDtypeStruct
    text = f.lower(S((4, 8), jnp.bfloat16), S((8, 2), jnp.bfloat16), S((2, 16), jnp.bfloat16)).as_text(
        dialect="hlo"
    )
    assert products_by_dtype(text) == {"bf16": 2 * 4 * 2 * 8, "f32": 2 * 4 * 16 * 2}


def test_a_mesh_without_devices_is_refused_where_devices_are_needed() -> None:
    abstract = jax.sharding.AbstractMesh((4, 2), ("fsdp", "model"))
    step = _jit(abstract)
    with pytest.raises(TypeError, match="a mesh without devices is costed only for a TPU topology"):
        step.cost(*_args(), target="h100")


@tpu
def test_a_mesh_without_devices_is_costed_for_a_tpu_topology() -> None:
    """An `AbstractMesh` of 256 is enough: the topology gives the devices,
    and the ideal is compiled on one CPU device."""
    abstract = jax.sharding.AbstractMesh((64, 4), ("fsdp", "model"))
    cost = _jit(abstract).cost(*_args(width=2048), target="v5p:8x8x4")
    assert (cost.devices, cost.compiler) == (256, "tpu")
    # the ideal is the one-device program's FLOPs on the CPU compiler: what the mesh's own cost has
    mesh = jax.make_mesh((4, 2), ("fsdp", "model"), axis_types=(AxisType.Explicit,) * 2)
    on_cpu = _jit(mesh).cost(*_args(width=2048))
    assert cost.ideal_flops_per_device * 256 == on_cpu.ideal_flops_per_device * 8


@tpu
def test_a_step_too_big_for_one_chip_still_has_its_ideal() -> None:
    """The ideal is the one-device step's FLOPs on the CPU compiler: a step
    that no chip holds whole (the TPU compiler refuses it) keeps its ratio."""
    mesh = jax.make_mesh(
        (2, 2), ("fsdp", "model"), axis_types=(AxisType.Explicit,) * 2, devices=jax.devices()[:4]
    )
    cost = _jit(mesh).cost(*_args(width=65536), target="v5p:2x2x1")  # 128 GiB of weights
    assert cost.fits is False and cost.ideal_flops_per_device and cost.ratio and not cost.notes


def test_lint_says_how_a_step_it_passes_does_on_its_target(project, capsys) -> None:
    _, module = project
    assert main(["lint", "model.shard", "--step", f"{module}:train_step", "--target", "h100"]) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if "the step on h100" in line]
    assert line.startswith(
        "model.shard: the step on h100 (the CPU compiler's figures, the chip's time): fits: peak "
    )
    assert "per step (estimate, " in line


def test_the_command_line_names_sr126(project, capsys) -> None:
    _, module = project
    assert main(["lint", "model.shard", "--step", f"{module}:train_step", "--target", "tpu-v5p"]) == 2
    assert "--target: SR126 unknown target 'tpu-v5p'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("headroom", "said"),
    [("120%", "'120%': give a share from 0% to under 100%"), ("10", "'10': a share is written 10% or 0.1")],
)
def test_a_headroom_that_is_no_share_is_refused(project, capsys, headroom: str, said: str) -> None:
    _, module = project
    argv = [
        "lint",
        "model.shard",
        "--step",
        f"{module}:train_step",
        "--target",
        "h100",
        "--hbm-headroom",
        headroom,
    ]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and said in capsys.readouterr().err


def test_a_step_in_pyproject_does_not_stop_a_diff_of_two_dumps(project, capsys) -> None:
    folder, module = project
    for name in ("a", "b"):
        argv = ["dump", "model.shard", "--shapes", f"{module}:shapes", "-o", f"{name}.json"]
        assert main(argv) == 0
    (folder / "pyproject.toml").write_text(
        f'[tool.shardrules]\nstep = "{module}:train_step"\ntarget = "h100"\n'
    )
    assert main(["diff", "a.json", "b.json"]) == 0, capsys.readouterr().err


def test_a_tuple_value_is_named_by_its_count_in_sr127s_hint() -> None:
    from shardrules._costs._largest import _type_text

    assert _type_text("(f32[16384,65536]{1,0}, f32[65536]{0})") == "2 values"
    assert _type_text("bf16[8,4096]{1,0:T(8,128)(2,1)}") == "bf16[8,4096]"


@tpu
def test_a_tpu_targets_collectives_are_each_owned_by_a_rule_line() -> None:
    """The TPU compiler writes collectives as asynchronous fusions and combines
    the gradients' reduce-scatters into one sliced all-reduce: each element is
    still owned by its parameter's rule, and the bytes add up."""
    cost = _jit(jax.make_mesh((4, 2), ("fsdp", "model"))).cost(*_args(), target="v5e:2x4")
    total = sum(c.bytes_per_device for c in cost.collectives)
    assert sum(r.bytes_per_device for r in cost.by_rule) == total > 0
    assert sum(a.bytes_per_device for a in cost.by_array) == total
    rules = {r.rule: r for r in cost.by_rule}
    assert set(rules) <= {"<string>:4", "<string>:5", "<string>:8", "inferred", "the model's code"}
    owners = {a.array.removesuffix(" (gradient)"): a.rule for a in cost.by_array}
    assert owners["p/w1"] == "<string>:4" and owners["p/w2"] == "<string>:5"
    assert rules["<string>:4"].bytes_per_device > 0 and rules["<string>:5"].bytes_per_device > 0
    for a in cost.by_array:  # each array, and its gradient, under its own rule's line
        if a.array.startswith("p/w"):
            assert a.rule == {"p/w1": "<string>:4", "p/w2": "<string>:5"}[a.array.split()[0]]
