"""`suggest(search=True)` / `shardrules suggest --search`: meshes and drafted
rule files chosen by what the step costs.

A small decoder-shaped step (an embedding, attention q/k/v/o, an MLP, an
output head) with its weights, an optimizer state in a group of its own and
a batch, searched on 8 simulated CPU devices."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardrules as sr
from shardrules._cli._main import main
from shardrules._costs import _targets
from shardrules._search import _space
from shardrules._search._api import NoneFitsError
from shardrules._search._candidates import with_groups
from shardrules._search._probe import StepError
from shardrules._search._search import search

D, F, V, ROWS, SEQ = 64, 128, 256, 16, 8


def _params() -> dict:
    S = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
    layer = {
        "attn": {n: {"kernel": S(D, D)} for n in ("q", "k", "v", "o")},
        "mlp": {"up": {"kernel": S(D, F)}, "down": {"kernel": S(F, D)}},
        "norm": {"scale": S(D)},
    }
    return {"embed": {"embedding": S(V, D)}, "layers": [layer, layer], "head": {"kernel": S(D, V)}}


def _loss(params: dict, batch: dict) -> jax.Array:
    x = params["embed"]["embedding"][batch["tokens"]]
    for p in params["layers"]:
        a = p["attn"]
        h = x * p["norm"]["scale"]
        scores = jnp.einsum("btd,bsd->bts", h @ a["q"]["kernel"], h @ a["k"]["kernel"])
        x = x + (jax.nn.softmax(scores) @ (h @ a["v"]["kernel"])) @ a["o"]["kernel"]
        x = x + jax.nn.relu(x @ p["mlp"]["up"]["kernel"]) @ p["mlp"]["down"]["kernel"]
    logits = x @ params["head"]["kernel"]
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["tokens"][..., None], -1).mean()


def _train(params: dict, opt: dict, batch: dict) -> tuple[dict, dict, jax.Array]:
    loss, grads = jax.value_and_grad(_loss)(params, batch)
    opt = jax.tree.map(lambda m, g: 0.9 * m + g, opt, grads)
    return jax.tree.map(lambda p, m: p - 0.01 * m, params, opt), opt, loss


def _args(rows: int = ROWS) -> tuple:
    params = _params()
    return params, params, {"tokens": jax.ShapeDtypeStruct((rows, SEQ), jnp.int32)}


def make_step(rules, mesh):
    """The search's step: weights (`params`), an optimizer state (`opt`), a batch (`batch`)."""
    step = sr.jit(
        _train, rules, mesh, in_groups=("params", "opt", "batch"), out_groups=("params", "opt", None)
    )
    return step, _args()


@pytest.fixture(scope="module")
def found():
    lines: list[str] = []
    result = search(make_step, 8, name="make_step", progress=lines.append)
    return result, lines


# ---------------------------------------------------------------- the space


def _brute(n: int, experts: bool) -> set[tuple[str, tuple[tuple[str, int], ...]]]:
    """Every (strategy, sizes) by brute force: each axis any divisor (1 = absent)."""
    out = set()
    axes = {
        "dp": ("data",),
        "fsdp": ("data", "fsdp"),
        "tp": ("data", "model"),
        "fsdp+tp": ("data", "fsdp", "model"),
        "ep": ("data", "fsdp", "expert", "model"),
    }
    required = {
        "dp": {"data"},
        "fsdp": {"fsdp"},
        "tp": {"model"},
        "fsdp+tp": {"fsdp", "model"},
        "ep": {"expert"},
    }
    for strategy, names in axes.items():
        if strategy == "ep" and not experts:
            continue
        options = [d for d in range(1, n + 1) if n % d == 0]
        for sizes in itertools.product(options, repeat=len(names)):
            if math.prod(sizes) != n:
                continue
            present = {a: s for a, s in zip(names, sizes, strict=True) if s > 1}
            if required[strategy] <= set(present):
                out.add((strategy, tuple(present.items())))
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=2, max_value=600), st.booleans())
def test_the_space_is_every_mesh_of_each_strategys_axes(n: int, experts: bool) -> None:
    shapes = _space.shapes(n, experts=experts)
    got = [(s.strategy, s.sizes) for s in shapes]
    assert len(got) == len(set(got))  # each once
    assert set(got) == _brute(n, experts)
    for s in shapes:
        assert math.prod(s.mesh.values()) == n and min(s.mesh.values()) >= 2
        assert list(s.mesh) == [a for a in _space.AXES if a in s.mesh]  # the mesh line's order


def test_the_space_of_one_strategy_is_its_meshes_only() -> None:
    assert {s.strategy for s in _space.shapes(64, experts=True, only="fsdp+tp")} == {"fsdp+tp"}
    assert not any(s.strategy == "ep" for s in _space.shapes(64, experts=False))
    with pytest.raises(ValueError, match="at least 2 devices"):
        _space.shapes(1, experts=False)


# ---------------------------------------------------------------- groups


def test_the_drafts_groups_are_the_steps() -> None:
    text = sr.suggest(_params(), {"fsdp": 8}, strategy="fsdp")
    probe = type("P", (), {"params": "weights", "weights": ("opt",), "batches": ("batch", "extra")})
    out = with_groups(text, probe)  # type: ignore[arg-type]
    rules = sr.loads(out)
    assert set(rules.group_names) == {"weights", "opt", "batch", "extra"}
    plan_w = sr.plan(_params(), rules, {"fsdp": 8}, group="weights")
    plan_o = sr.plan(_params(), rules, {"fsdp": 8}, group="opt")
    assert plan_w.ok and [leaf.spec for leaf in plan_w] == [leaf.spec for leaf in plan_o]
    batch = sr.plan({"tokens": jnp.zeros((16, 8), jnp.int32)}, rules, {"fsdp": 8}, group="extra")
    assert batch["tokens"].spec == jax.sharding.PartitionSpec("fsdp", None)
    alone = type("P", (), {"params": "params", "weights": (), "batches": ()})
    no_batch = with_groups(text, alone)  # type: ignore[arg-type]
    assert "rules inputs" not in no_batch and "alias batch" not in no_batch
    assert set(sr.loads(no_batch).group_names) == {"params"}


# ---------------------------------------------------------------- the search


def test_the_search_compiles_every_candidate_that_can_run_and_picks_by_its_rule(found) -> None:
    result, lines = found
    assert {(r.shape.strategy, r.shape.sizes) for r in result.rows} == _brute(8, False)
    costed = [r for r in result.rows if r.cost is not None]
    assert costed and all(r.status in ("chosen", "compiled") for r in costed)
    assert sum(r.status == "chosen" for r in result.rows) == 1
    # without a target: the fewest FLOPs per device (within 5%), then the fewest collective bytes
    chosen = result.chosen.cost
    fewest = min(r.cost.flops_per_device for r in costed)
    assert chosen.flops_per_device <= fewest * 1.05
    moved = lambda c: sum(x.bytes_per_device for x in c.collectives)  # noqa: E731
    for r in costed:
        if r.cost.flops_per_device <= fewest * 1.05:
            assert moved(chosen) <= moved(r.cost)
    assert result.ideal_flops is not None and all(r.cost.ideal_flops_per_device for r in costed)
    assert lines[0].startswith("search: ") and sum("[mesh " in line for line in lines) == len(costed)


def test_the_written_file_lints_clean_is_fmt_stable_and_lists_every_candidate(found) -> None:
    from shardrules._search._report import written

    result, _ = found
    text = written(result)
    assert sr.format_text(text, "x") == text
    rules = sr.loads(text)
    sizes = result.chosen.shape.mesh
    assert f"mesh {result.chosen.shape.text}" in text
    assert set(rules.group_names) == {"params", "opt", "batch"}  # every group the step names
    params, opt, batch = _args()
    for tree, group in ((params, "params"), (opt, "opt"), (batch, "batch")):
        plan = sr.plan(tree, rules, sizes, group=group)
        assert plan.ok and not plan.diagnostics, plan.diagnostics
    table = [line for line in text[text.index("# Candidates") :].splitlines() if line.startswith("#   ")][1:]
    assert len(table) == len(result.rows)
    assert table[0].split()[-1] == "chosen"
    assert "FLOPs x: each device's FLOPs over its share" in text and "`screened`" not in text
    for row in result.rows:
        assert any(line.startswith(f"#   {row.shape.text} ") for line in table)


def test_the_chosen_file_runs_the_step_on_its_mesh(found) -> None:
    """The file is a rule file like any other: the step it was chosen for
    runs with it on that mesh, and computes what one device computes."""
    from shardrules._search._report import written

    result, _ = found
    rules = sr.loads(written(result))
    sizes = result.chosen.shape.mesh
    explicit = (jax.sharding.AxisType.Explicit,) * len(sizes)
    mesh = jax.make_mesh(tuple(sizes.values()), tuple(sizes), axis_types=explicit, devices=jax.devices()[:8])
    step, shapes = make_step(rules, mesh)
    key = iter(jax.random.split(jax.random.key(0), 64))
    args = jax.tree.map(
        lambda s: (
            jax.random.randint(next(key), s.shape, 0, V)
            if s.dtype == jnp.int32
            else jax.random.normal(next(key), s.shape) * 0.1
        ),
        shapes,
    )
    assert step.compare(*args, rtol=1e-4, atol=1e-5).ok


def test_memory_rules_candidates_out_before_compiling() -> None:
    """Arguments over the memory are set aside without a compile; none fitting is an error."""
    per = sum(math.prod(x.shape) * 4 for x in jax.tree.leaves(_params()))
    hbm = int(per * 0.4)  # weights and state (2 x per) split 8 ways fit; 4 or 2 ways do not
    result = search(make_step, 8, hbm=hbm, headroom=0.0, strategy="fsdp")
    rejected = {r.shape.text: r for r in result.rows if "its arguments alone" in r.why}
    assert set(rejected) == {"data=2, fsdp=4", "data=4, fsdp=2"}
    assert all(r.cost is None and r.candidate.argument_bytes > hbm for r in rejected.values())
    with pytest.raises(NoneFitsError, match=r"no candidate fits|could be compiled"):
        sr.suggest(search=True, step=make_step, devices=8, hbm=1024, strategy="dp")


def test_a_batch_that_does_not_divide_is_set_aside() -> None:
    def odd_batch(rules, mesh):
        step, (params, opt, _) = make_step(rules, mesh)
        return step, (params, opt, {"tokens": jax.ShapeDtypeStruct((12, SEQ), jnp.int32)})

    result = search(odd_batch, 8, strategy="fsdp")
    by_mesh = {r.shape.text: r for r in result.rows}
    assert "the batch of 12 rows does not divide over fsdp=8" in by_mesh["fsdp=8"].why
    assert by_mesh["fsdp=8"].cost is None
    assert by_mesh["data=2, fsdp=4"].why.startswith("the batch of 12 rows does not divide")


def test_equivalent_candidates_are_compiled_once() -> None:
    """Weights too small to split under `auto` and no recognised role: each
    batch layout is one program, whichever strategy names its axes."""

    def small(rules, mesh):
        def f(w, batch):
            return (batch["x"] * w["w"]).sum()

        S = jax.ShapeDtypeStruct
        step = sr.jit(f, rules, mesh, in_groups=("params", "inputs"))
        return step, ({"w": S((2, 4), jnp.float32)}, {"x": S((8, 2, 4), jnp.float32)})

    result = search(small, 8)
    same = [r for r in result.rows if r.why.startswith("the same layout as")]
    assert same and all(r.cost is None for r in same)
    keys = [r.candidate.key for r in result.rows if r.cost is not None]
    assert len(keys) == len(set(keys))


def test_the_budget_stops_with_the_best_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search's clock (made to stand still but for 10 s that pass while
    the first candidate is reported) runs out after one candidate of a budget of 5 s."""
    import types

    from shardrules._search import _search as module

    now = [0.0]
    monkeypatch.setattr(module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    lines: list[str] = []

    def slow(line: str) -> None:
        lines.append(line)
        if "[mesh 1/" in line:
            now[0] += 10.0

    found = sr.suggest(search=True, step=make_step, devices=8, budget=5.0, progress=slow, strategy="fsdp+tp")
    assert (
        "# Stopped early: the budget of 5 s ran out after 10 s, with 2 of 3 candidates not compiled" in found
    )
    assert sum("[mesh " in line for line in lines) == 1
    assert "not compiled" in found and "chosen" in found
    sr.loads(found)
    now[0] = 0.0
    with pytest.raises(NoneFitsError, match="no candidate was compiled: the budget of 1e-09 s ran out"):
        sr.suggest(
            search=True, step=make_step, devices=8, budget=1e-9, progress=lambda _: now.__setitem__(0, 1.0)
        )


def test_an_expert_axis_must_divide_the_experts() -> None:
    """Stacked experts (4) split over an expert axis that divides them; 8
    would not, and is set aside before anything is drafted or compiled."""

    def moe(rules, mesh):
        def f(p, batch):
            h = jnp.einsum("btd,edf->btef", batch["x"], p["moe"]["w_in"])
            return jnp.einsum("btef,efd->btd", h, p["moe"]["w_out"]).mean()

        S = jax.ShapeDtypeStruct
        params = {"moe": {"w_in": S((4, 64, 128), jnp.float32), "w_out": S((4, 128, 64), jnp.float32)}}
        step = sr.jit(jax.grad(f), rules, mesh, in_groups=("params", "inputs"), out_groups="params")
        return step, (params, {"x": S((16, 4, 64), jnp.float32)})

    from shardrules._search._space import Shape

    result = search(moe, 8, strategy="ep", budget=1e-9)  # drafted, nothing compiled
    by_mesh = {r.shape.sizes: r for r in result.rows}
    assert by_mesh[(("expert", 8),)].why == "expert=8 does not divide the 4 experts"
    assert by_mesh[(("expert", 8),)].candidate.text == ""  # not even drafted
    assert by_mesh[(("fsdp", 2), ("expert", 4))].candidate.rules is not None
    assert Shape("ep", (("expert", 8),)) in [r.shape for r in result.rows]


def test_a_step_whose_arguments_change_with_the_mesh_is_refused() -> None:
    def grows(rules, mesh):
        step, (params, opt, _) = make_step(rules, mesh)
        rows = 8 * dict(mesh.shape).get("fsdp", 1)
        return step, (params, opt, {"tokens": jax.ShapeDtypeStruct((rows, SEQ), jnp.int32)})

    with pytest.raises(StepError, match=r"must not\s+change with the mesh") as err:
        search(grows, 8, strategy="fsdp")
    assert "made `args[2]['tokens']` of shape (64, 8) int32 (for the first, (8, 8) int32)" in str(err.value)
    assert "for the mesh fsdp=8 than for the first, data=8" in str(err.value)


def test_a_factory_that_fails_or_returns_another_thing_is_named() -> None:
    def raises(rules, mesh):
        raise RuntimeError("no checkpoint here")

    with pytest.raises(
        StepError, match="called with \\(rules, mesh\\) for the mesh data=8, raised RuntimeError"
    ):
        search(raises, 8, name="raises")

    def plain(rules, mesh):
        return jax.jit(_train), _args()

    with pytest.raises(StepError, match=r"returned a PjitFunction as its step, not a `shardrules.jit` step"):
        search(plain, 8)

    def listed(rules, mesh):
        step, args = make_step(rules, mesh)
        return step, {"args": args}

    with pytest.raises(StepError, match="returned a dict as its arguments; return them as a tuple"):
        search(listed, 8)


def test_ep_without_experts_says_so() -> None:
    with pytest.raises(StepError, match="strategy ep: no experts recognised"):
        sr.suggest(search=True, step=make_step, devices=8, strategy="ep")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"search": True, "step": make_step}, TypeError, "needs devices="),
        ({"search": True, "devices": 8}, TypeError, "needs step="),
        ({"search": True, "step": make_step, "devices": 1}, ValueError, "at least 2"),
        ({"search": True, "step": make_step, "devices": 8, "hbm_headroom": 1.5}, ValueError, "headroom"),
        ({"search": True, "step": make_step, "devices": 8, "budget": 0}, ValueError, "budget"),
        ({"search": True, "step": make_step, "devices": 8, "fsdp_dim": "largest"}, TypeError, "fsdp_dim"),
        ({"step": make_step}, TypeError, "search=True"),
        ({}, TypeError, "needs the tree and the mesh"),
        (
            {"search": True, "step": lambda r, m: (1, 2), "devices": 8},
            StepError,
            "returned a tuple of 2|returned",
        ),
    ],
)
def test_search_arguments_are_checked(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        sr.suggest(**kwargs)


def test_a_search_takes_no_tree_and_no_mesh() -> None:
    with pytest.raises(TypeError, match="chooses the mesh"):
        sr.suggest(_params(), {"fsdp": 8}, search=True, step=make_step, devices=8)
    with pytest.raises(ValueError, match="devices=8 and target 'v5e:4x4' has 16 chips"):
        sr.suggest(search=True, step=make_step, devices=8, target="v5e:4x4")


# ---------------------------------------------------------------- the command line

STEPS = """
import jax, jax.numpy as jnp
import shardrules as sr

def train(params, batch):
    loss = lambda p: ((batch["x"] @ p["mlp"]["up"]["kernel"]) @ p["mlp"]["down"]["kernel"]).mean()
    g = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, g)

S = jax.ShapeDtypeStruct

def param_shapes():
    return {"mlp": {"up": {"kernel": S((64, 256), jnp.float32)}, "down": {"kernel": S((256, 64), jnp.float32)}}}

def make_step(rules, mesh):
    return sr.jit(train, rules, mesh, in_groups=("params", "inputs"), out_groups="params"), (
        param_shapes(), {"x": S((16, 64), jnp.float32)})
"""


@pytest.fixture
def steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "search_steps.py").write_text(STEPS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_command_writes_the_file_and_says_its_progress(steps, capsys) -> None:
    out = steps / "chosen.shard"
    argv = ["suggest", "--search", "--step", "search_steps:make_step", "--devices", "8", "--strategy", "fsdp"]
    assert main([*argv, "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "search: 3 candidates for 8 devices" in err and "[mesh 1/" in err and f"wrote {out}: mesh" in err
    text = out.read_text()
    assert text.startswith(
        "# Chosen by `shardrules suggest --search --step search_steps:make_step --devices 8"
    )
    capsys.readouterr()
    assert main(["lint", str(out), "--shapes", "search_steps:param_shapes"]) == 0, capsys.readouterr().out
    assert main(["fmt", "--check", str(out)]) == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--search", "--devices", "8"], "--search needs the step to cost: --step MODULE:FUNCTION"),
        (["--step", "search_steps:make_step"], "--step is for a search: add --search"),
        (["--search", "--step", "search_steps:make_step"], "--search needs how many devices"),
        (
            ["--search", "--step", "search_steps:make_step", "--devices", "8", "--mesh", "fsdp=8"],
            "leave --mesh out",
        ),
        ([], "give the shapes to draft from"),
        (["--search", "--step", "search_steps:nothing", "--devices", "8"], "nothing"),
        (["--search", "--step", "search_steps:make_step", "--target", "v9:2"], "SR126"),
        (["--search", "--step", "search_steps:make_step", "--target", "h100"], "names a GPU, not how many"),
        (
            ["--search", "--step", "search_steps:make_step", "--devices", "8", "--strategy", "ep"],
            "no experts",
        ),
    ],
)
def test_the_command_says_what_a_search_needs(steps, capsys, argv, message) -> None:
    assert main(["suggest", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_command_exits_1_when_nothing_fits(steps, capsys) -> None:
    argv = ["suggest", "--search", "--step", "search_steps:make_step", "--devices", "8", "--strategy", "dp"]
    assert main([*argv, "--hbm", "200KiB", "-o", str(steps / "x.shard")]) == 1  # arguments fit, peaks do not
    err = capsys.readouterr().err
    assert "no candidate fits: the lowest peak is" in err and "(10% of the memory kept free)" in err
    assert "#   data=8  dp" in err and "its peak is" in err  # the table, each candidate's reason
    assert not (steps / "x.shard").exists()
    assert main([*argv, "--hbm", "1KiB", "-o", str(steps / "x.shard")]) == 1  # nothing to compile
    err = capsys.readouterr().err
    assert "no candidate could be compiled: 1 set aside, most often because: 1 x its arguments alone" in err


@pytest.mark.skipif(_targets.has_libtpu(), reason="libtpu is installed here")
def test_a_tpu_target_without_the_tpu_compiler_says_how_to_get_it(steps, capsys) -> None:
    argv = ["suggest", "--search", "--step", "search_steps:make_step", "--target", "v5e:2x4"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "SR126" in err and "TPU compiler is not installed" in err and "shardrules[tpu]" in err
    assert "jax.make_mesh" not in err
