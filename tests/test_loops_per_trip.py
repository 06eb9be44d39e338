"""A loop's body costs once per trip: `StepCost` of a step that scans over
its layers (or microbatches) against the same step unrolled, and the HLO
reader (`_costs/_hlo.py`) under them: collective transfers, replica groups
in every form XLA writes, the mesh axes a collective runs over."""

from __future__ import annotations

import importlib.util
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import AxisType, Mesh

import shardrules as sr
from shardrules._costs._cost import cost_of
from shardrules._costs._groups import axes_of, parse_groups
from shardrules._costs._hlo import collective_calls, loop_extra, matmul_flops_by_dtype

S = jax.ShapeDtypeStruct
L, D, F = 8, 256, 512
TP = 'rules params:\n  "up" -> (_, _, model)\n  "down" -> (_, model, _)\nrules inputs:\n  default -> replicated\n'
FSDP = 'rules params:\n  "up" -> (_, fsdp, model)\n  "down" -> (_, model, fsdp)\nrules inputs:\n  "x" -> (fsdp, _)\n'


def _layer(h, w):
    return jnp.tanh(h @ w["up"]) @ w["down"]


def _layers(params, x, *, unroll):
    """The layers scanned over (`unroll=False`) or written out one by one."""
    if unroll:
        for i in range(params["up"].shape[0]):
            x = _layer(x, {k: v[i] for k, v in params.items()})
        return x
    return jax.lax.scan(lambda h, w: (_layer(h, w), None), x, params)[0]


def _train(unroll):
    """A step that descends the gradient of both the weights and the input
    (so the unrolled step keeps every layer's backward pass)."""

    def loss(params, x):
        return jnp.sum(_layers(params, x, unroll=unroll) ** 2)

    def step(params, batch):
        gp, gx = jax.grad(loss, argnums=(0, 1))(params, batch["x"])
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, gp), {"x": batch["x"] - 0.1 * gx}

    return step


def _mesh(devices=None):
    devices = jax.devices() if devices is None else devices
    return Mesh(np.array(devices[:8]).reshape(4, 2), ("fsdp", "model"), axis_types=(AxisType.Explicit,) * 2)


PARAMS = {"up": S((L, D, F), jnp.float32), "down": S((L, F, D), jnp.float32)}
BATCH = {"x": S((64, D), jnp.float32)}


def _compiled(fn, text, mesh, *args, out_groups=("params", "inputs")):
    step = sr.jit(
        fn, sr.loads(text, name="loops.shard"), mesh, in_groups=("params", "inputs"), out_groups=out_groups
    )
    return step.lower(*args).compile()


def _by_kind(cost):
    return {c.kind: (c.count, c.bytes_per_device) for c in cost.collectives}


def _same(scanned, unrolled, *, counts=True, flops=0.03):
    """Collectives per kind and FLOPs of the two within a few percent."""
    mine, theirs = _by_kind(scanned), _by_kind(unrolled)
    assert mine.keys() == theirs.keys(), (scanned, unrolled)
    for kind, (count, nbytes) in mine.items():
        assert nbytes == pytest.approx(theirs[kind][1], rel=0.03), (kind, scanned, unrolled)
        if counts:
            assert count == pytest.approx(theirs[kind][0], rel=0.03), (kind, scanned, unrolled)
    assert scanned.flops_per_device == pytest.approx(unrolled.flops_per_device, rel=flops)


def _raw_flops(compiled):
    cost = compiled.cost_analysis()
    return float((cost[0] if isinstance(cost, list) else cost)["flops"])


def test_a_scan_over_layers_costs_what_the_layers_unrolled_do():
    scanned_step, unrolled_step = (_compiled(_train(u), TP, _mesh(), PARAMS, BATCH) for u in (False, True))
    scanned, unrolled = cost_of(scanned_step, 8), cost_of(unrolled_step, 8)
    _same(scanned, unrolled)
    # XLA counts the loop's body once: without the trips the scan would cost an eighth
    assert _raw_flops(scanned_step) < unrolled.flops_per_device / 4
    assert (calls := [c for c in scanned.calls if c.runs == L]) and all(c.kind == "all-reduce" for c in calls)
    assert sum(c.runs for c in scanned.calls) == _by_kind(scanned)["all-reduce"][0] == 2 * L
    # the bytes the loop's body reads and writes count once per trip as well
    assert scanned.bytes_accessed_per_device > 0.8 * unrolled.bytes_accessed_per_device
    assert loop_extra(scanned_step.as_text())[1] > 0 and loop_extra(unrolled_step.as_text()) == (0.0, 0.0)


def test_fsdp_gathers_each_layer_once_per_trip():
    """Weights sharded over `fsdp`: each layer's are gathered, in the forward
    pass and again in the backward one (the gradients' reductions XLA may
    combine into fewer, larger ones: their bytes, not their count, agree)."""
    scanned, unrolled = (
        cost_of(_compiled(_train(u), FSDP, _mesh(), PARAMS, BATCH), 8) for u in (False, True)
    )
    _same(scanned, unrolled, counts=False)
    assert _by_kind(scanned)["all-gather"][0] == _by_kind(unrolled)["all-gather"][0] >= 2 * L


def test_gradient_accumulation_over_microbatches_counts_each_microbatch():
    """The microbatches are independent: unrolled, XLA combines their
    all-reduces into fewer, larger ones (their bytes agree, not their count)."""
    params = {k: S((2, *v.shape[1:]), v.dtype) for k, v in PARAMS.items()}
    batch = {"x": S((4, 64, D), jnp.float32)}

    def accumulate(unroll):
        def step(params, batch):
            def grads(g, x):
                new = jax.grad(lambda p: jnp.sum(_layers(p, x, unroll=True) ** 2))(params)
                return jax.tree.map(jnp.add, g, new), None

            zeros = jax.tree.map(jnp.zeros_like, params)
            g = jax.lax.scan(grads, zeros, batch["x"], unroll=4 if unroll else 1)[0]
            return jax.tree.map(lambda p, g: p - 0.1 * g, params, g)

        return step

    compiled = [
        _compiled(accumulate(u), TP, _mesh(), params, batch, out_groups="params") for u in (False, True)
    ]
    scanned, unrolled = (cost_of(c, 8) for c in compiled)
    _same(scanned, unrolled, counts=False)
    assert {c.runs for c in scanned.calls} == {4}
    assert _raw_flops(compiled[0]) < scanned.flops_per_device / 3


def test_nested_loops_multiply():
    """A scan over layers inside a scan over microbatches: the inner body
    runs microbatches x layers times."""
    params = {k: S((3, *v.shape[1:]), v.dtype) for k, v in PARAMS.items()}
    batch = {"x": S((5, 64, D), jnp.float32)}

    def forward(unroll):
        def step(params, batch):
            outer = lambda total, x: (total + jnp.sum(_layers(params, x, unroll=unroll)), None)  # noqa: E731
            return jax.lax.scan(outer, jnp.float32(0), batch["x"], unroll=5 if unroll else 1)[0]

        return step

    compiled = [_compiled(forward(u), TP, _mesh(), params, batch, out_groups=None) for u in (False, True)]
    scanned, unrolled = (cost_of(c, 8) for c in compiled)
    _same(scanned, unrolled, counts=False)  # unrolled, the microbatches' all-reduces combine
    assert 15 in {c.runs for c in scanned.calls}  # each layer's all-reduce
    assert _by_kind(scanned)["all-reduce"][0] >= 15


def test_a_fori_loop_with_a_known_trip_count():
    def step(params, batch):
        w = {k: v[0] for k, v in params.items()}
        return {"x": jax.lax.fori_loop(0, 6, lambda i, h: _layer(h, w), batch["x"])}

    def unrolled(params, batch):
        w, h = {k: v[0] for k, v in params.items()}, batch["x"]
        for _ in range(6):
            h = _layer(h, w)
        return {"x": h}

    one, many = (
        cost_of(_compiled(f, TP, _mesh(), PARAMS, BATCH, out_groups="inputs"), 8) for f in (step, unrolled)
    )
    _same(one, many)
    assert [c.runs for c in one.calls] == [6]


def test_axes_of_a_compiled_step_name_the_axis_a_layout_shards_over():
    mesh = _mesh()
    names = list(mesh.axis_names)
    params = {"up": S((D, F), jnp.float32)}

    def gather(params, batch):  # `up` is sharded over `model`; the product needs it whole
        return {"x": batch["x"] @ jax.sharding.reshard(params["up"], jax.P())[:, :D]}

    compiled = _compiled(
        gather,
        'rules params:\n  "up" -> (_, model)\nrules inputs:\n  default -> replicated\n',
        mesh,
        params,
        BATCH,
        out_groups="inputs",
    )
    (call,) = [c for c in collective_calls(compiled.as_text()) if c.kind == "all-gather"]
    assert axes_of(call.groups, mesh.devices.shape) == (names.index("model"),)

    tp = cost_of(_compiled(_train(False), TP, mesh, PARAMS, BATCH), 8)
    assert {axes_of(c.groups, mesh.devices.shape) for c in tp.calls} == {(names.index("model"),)}
    fsdp = cost_of(_compiled(_train(False), FSDP, mesh, PARAMS, BATCH), 8)
    gathers = {axes_of(c.groups, mesh.devices.shape) for c in fsdp.calls if c.kind == "all-gather"}
    assert gathers == {(names.index("fsdp"),)}, fsdp.calls


MATMUL_FLOPS = L * 6 * 2 * 64 * D * F // 2
"""`_train`'s products on a device under `TP`: two a layer forward, four
backward, each 2 x 64 x D x F/2 (F split over `model`'s 2 devices)."""


def test_matmul_flops_by_dtype_count_every_trip():
    by_dtype = matmul_flops_by_dtype(_compiled(_train(False), TP, _mesh(), PARAMS, BATCH).as_text())
    assert by_dtype == {"f32": pytest.approx(MATMUL_FLOPS, rel=0.01)}


_PIECES = "(s32[], bf16[128], f32[64,64], f32[512,512])"
TPU_LIKE = f"""HloModule tpu_like

%add (x: f32[], y: f32[]) -> f32[] {{
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}}

%start_fusion (p0: bf16[128]) -> (bf16[128], bf16[512], u32[]) {{
  %p0 = bf16[128]{{0}} parameter(0)
  %ag.1 = bf16[512]{{0}} all-gather(%p0), channel_id=7, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={{0}}, metadata={{op_name="jit(f)/while/body/up/dot_general"}}, backend_config={{"async_collective_fusion_config":{{"flag_start":"-1"}}}}
  ROOT %cc.1 = (bf16[128]{{0}}, bf16[512]{{0}}, u32[]) custom-call(%ag.1), custom_call_target="AsyncCollectiveStart"
}}

%overlap_fusion (p0: bf16[128], p1: bf16[512], p2: f32[64,64]) -> (f32[64,64], bf16[512]) {{
  %p0 = bf16[128]{{0}} parameter(0)
  %p2 = f32[64,64]{{1,0}} parameter(2)
  %ag.2 = bf16[512]{{0}} all-gather(%p0), channel_id=7, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={{0}}, backend_config={{"async_collective_fusion_config":{{"flag_start":"2","flag_end":"8"}}}}
  %dot.1 = f32[64,64]{{1,0}} dot(%p2, %p2), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  ROOT %tuple.1 = (f32[64,64]{{1,0}}, bf16[512]{{0}}) tuple(%dot.1, %ag.2)
}}

%done_fusion (p0: bf16[128], p1: bf16[512]) -> bf16[512] {{
  %p0 = bf16[128]{{0}} parameter(0)
  %p1 = bf16[512]{{0}} parameter(1)
  %ag.3 = bf16[512]{{0}} all-gather(%p0), channel_id=7, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={{0}}
  ROOT %cc.2 = bf16[512]{{0}} custom-call(%p0, %p1, %ag.3), custom_call_target="AsyncCollectiveDone"
}}

%all-reduce-scatter (in0: f32[512,512]) -> f32[128,512] {{
  %in0 = f32[512,512]{{1,0}} parameter(0)
  %ar.1 = f32[512,512]{{1,0}} all-reduce(%in0), channel_id=1, replica_groups={{{{0,2,4,6}},{{1,3,5,7}}}}, to_apply=%add
  %pid = u32[] partition-id()
  %zero = u32[] constant(0)
  ROOT %ds = f32[128,512]{{1,0}} dynamic-slice(%ar.1, %pid, %zero), dynamic_slice_sizes={{128,512}}
}}

%body (state: {_PIECES}) -> {_PIECES} {{
  %state = {_PIECES} parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %w = bf16[128]{{0}} get-tuple-element(%state), index=1
  %h = f32[64,64]{{1,0}} get-tuple-element(%state), index=2
  %g = f32[512,512]{{1,0}} get-tuple-element(%state), index=3
  %start = (bf16[128]{{0}}, bf16[512]{{0}}, u32[]) fusion(%w), kind=kCustom, calls=%start_fusion
  %s0 = bf16[128]{{0}} get-tuple-element(%start), index=0
  %s1 = bf16[512]{{0}} get-tuple-element(%start), index=1
  %work = (f32[64,64]{{1,0}}, bf16[512]{{0}}) fusion(%s0, %s1, %h), kind=kCustom, calls=%overlap_fusion
  %w1 = bf16[512]{{0}} get-tuple-element(%work), index=1
  %done = bf16[512]{{0}} fusion(%s0, %w1), kind=kCustom, calls=%done_fusion
  %rs = f32[128,512]{{1,0}} fusion(%g), kind=kCustom, calls=%all-reduce-scatter
  %hh = f32[64,64]{{1,0}} get-tuple-element(%work), index=0
  ROOT %out = {_PIECES} tuple(%next, %w, %hh, %g)
}}

%cond (state: {_PIECES}) -> pred[] {{
  %state = {_PIECES} parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %n = s32[] constant(6)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}}

ENTRY %main (w: bf16[128], h: f32[64,64], g: f32[512,512]) -> f32[64,64] {{
  %w = bf16[128]{{0}} parameter(0)
  %h = f32[64,64]{{1,0}} parameter(1)
  %g = f32[512,512]{{1,0}} parameter(2)
  %zero = s32[] constant(0)
  %first = s32[] copy(%zero)
  %init = {_PIECES} tuple(%first, %w, %h, %g)
  %loop = {_PIECES} while(%init), condition=%cond, body=%body
  ROOT %result = f32[64,64]{{1,0}} get-tuple-element(%loop), index=2
}}
"""
"""A loop the way the TPU compiler writes one: no trip count (a counter
from 0 while below 6, up by 1), an asynchronous all-gather as three fusions
that each hold a copy of it, and a reduce-scatter as an all-reduce sliced."""


def test_tpu_like_hlo_counts_each_transfer_once_per_trip():
    gather, scatter = collective_calls(TPU_LIKE)
    assert (gather.kind, gather.bytes_per_device, gather.runs) == ("all-gather", 512 * 2, 6)
    assert gather.groups == parse_groups("{{0,2,4,6},{1,3,5,7}}") and gather.scopes == ("up",)
    assert (scatter.kind, scatter.bytes_per_device, scatter.runs) == ("reduce-scatter", 128 * 512 * 4, 6)
    # the product in the loop runs 6 times; XLA counts it once
    assert loop_extra(TPU_LIKE)[0] == pytest.approx(5 * 2 * 64**3, rel=0.01)
    assert matmul_flops_by_dtype(TPU_LIKE) == {"f32": 6 * 2 * 64**3}
    # the counter on the right of the comparison, or a bound the loop never reaches
    flipped = TPU_LIKE.replace("compare(%i, %n), direction=LT", "compare(%n, %i), direction=GT")
    assert [c.runs for c in collective_calls(flipped)] == [6, 6]
    assert [c.runs for c in collective_calls(TPU_LIKE.replace("constant(6)", "constant(0)"))] == [1, 1]


@st.composite
def _iota_groups(draw):
    """A mesh shape and a subset of its axes, and XLA's iota form of the
    replica groups that run over those axes: `[G,S]<=[dims]T(perm)`."""
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    axes = draw(st.lists(st.sampled_from(range(len(shape))), unique=True, min_size=1))
    rest = [d for d in range(len(shape)) if d not in axes]
    perm = rest + sorted(axes)
    size = math.prod(shape[d] for d in axes)
    text = f"[{math.prod(shape) // size},{size}]<=[{','.join(map(str, shape))}]"
    if perm != list(range(len(shape))):
        text += f"T({','.join(map(str, perm))})"
    return shape, sorted(axes), text


@given(_iota_groups())
def test_replica_groups_in_both_forms_are_the_same_groups(case):
    shape, axes, iota = case
    ids = np.arange(math.prod(shape)).reshape(shape)
    expected = ids.transpose([d for d in range(len(shape)) if d not in axes] + axes).reshape(
        -1, math.prod(shape[d] for d in axes)
    )
    explicit = "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in expected) + "}"
    groups = tuple(tuple(int(d) for d in g) for g in expected)
    for text in (iota, explicit):
        line = f"%ar = f32[8]{{0}} all-reduce(%p), channel_id=1, replica_groups={text}, to_apply=%add"
        (call,) = collective_calls(line)
        assert call.groups == groups and call.runs == 1 and call.bytes_per_device == 32
    assert axes_of(groups, shape) == tuple(d for d in axes if shape[d] > 1)
    assert parse_groups(iota) == parse_groups(explicit)


def test_groups_none_and_pairs_and_mesh_axes():
    (ag,) = collective_calls("%ag = f32[8,4]{1,0} all-gather(%p), replica_groups={}, dimensions={0}")
    assert ag.groups is None and axes_of(None, (4, 2, 1)) == (0, 1)
    (cp,) = collective_calls(
        "%cp = f32[4]{0} collective-permute(%p), channel_id=2, source_target_pairs={{0,1},{1,2},{2,0}}"
    )
    assert cp.groups == ((0, 1), (1, 2), (2, 0))
    line = (
        "%ag = f32[8]{0} all-gather(%p), channel_id=3, replica_groups=mesh['a'=4,'b'=2] {'a'}, dimensions={0}"
    )
    (mesh,) = collective_calls(line)
    assert mesh.groups == parse_groups("[2,4]<=[4,2]T(1,0)") and axes_of(mesh.groups, (4, 2)) == (0,)
    # the mesh's devices in another order: position k holds device_ids[k]
    listed = "mesh['x'=1,'y'=2,'z'=4], device_ids=([4,2]T(1,0)) {'y'}"
    assert parse_groups(listed) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert parse_groups(listed.replace("[4,2]T(1,0)", "0,2,4,6,1,3,5,7")) == parse_groups(listed)


def test_a_collective_an_async_start_calls_counts_once():
    hlo = """%wrapped (p: f32[8]) -> f32[64] {
  %p = f32[8]{0} parameter(0)
  ROOT %ag = f32[64]{0} all-gather(%p), replica_groups={}, dimensions={0}
}

ENTRY %main (x: f32[8]) -> f32[64] {
  %x = f32[8]{0} parameter(0)
  %start = ((f32[8]{0}), f32[64]{0}, s32[]) async-start(%x), calls=%wrapped
  %update = ((f32[8]{0}), f32[64]{0}, s32[]) async-update(%start), calls=%wrapped
  ROOT %done = f32[64]{0} async-done(%update), calls=%wrapped
}
"""
    (call,) = collective_calls(hlo)
    assert (call.kind, call.bytes_per_device, call.runs, call.groups) == ("all-gather", 64 * 4, 1, None)


_NO_TPU = importlib.util.find_spec("libtpu") is None


@pytest.fixture(scope="module")
def tpu_mesh():
    """The `(4, 2)` mesh on a v5e:2x4 slice, compiled for by the TPU compiler (no TPU needed)."""
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    from jax.experimental import topologies

    return _mesh(topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x4").devices)


@pytest.mark.skipif(_NO_TPU, reason="libtpu is not installed: pip install 'shardrules[tpu]'")
class TestOnTheTpuCompiler:
    """The TPU compiler writes no trip count on a scan's loop, and writes an
    asynchronous collective as several fusions (its start, the work it
    overlaps, its end), each holding a copy of it."""

    def test_a_scan_over_layers_costs_what_the_layers_unrolled_do(self, tpu_mesh):
        """In bfloat16 (in float32 the TPU compiler sums some of the unrolled
        layers' activations in bfloat16, and not the scanned ones')."""
        params = {k: S(v.shape, jnp.bfloat16) for k, v in PARAMS.items()}
        batch = {"x": S(BATCH["x"].shape, jnp.bfloat16)}
        compiled = [_compiled(_train(u), TP, tpu_mesh, params, batch) for u in (False, True)]
        scanned, unrolled = (cost_of(c, 8) for c in compiled)
        _same(scanned, unrolled, flops=0.05)
        assert {c.runs for c in scanned.calls} == {L}
        assert _raw_flops(compiled[0]) < unrolled.flops_per_device / 4

    def test_float32_products_run_partly_in_bfloat16(self, tpu_mesh):
        """At its default precision the TPU compiler multiplies some float32
        operands in bfloat16: the products count by the type they run in."""
        by_dtype = matmul_flops_by_dtype(_compiled(_train(False), TP, tpu_mesh, PARAMS, BATCH).as_text())
        assert sum(by_dtype.values()) == pytest.approx(MATMUL_FLOPS, rel=0.01)
        assert by_dtype.get("bf16", 0) >= MATMUL_FLOPS / 3, by_dtype

    def test_each_transfer_counts_once_however_many_times_the_text_writes_it(self, tpu_mesh):
        compiled = _compiled(_train(False), FSDP, tpu_mesh, PARAMS, BATCH)
        tpu, cpu = cost_of(compiled, 8), cost_of(_compiled(_train(False), FSDP, _mesh(), PARAMS, BATCH), 8)
        # forward and backward, each layer's two weights gathered: as on the CPU
        assert _by_kind(tpu)["all-gather"][0] == _by_kind(cpu)["all-gather"][0] == 4 * L
        gathers = [c for c in tpu.calls if c.kind == "all-gather"]
        assert compiled.as_text().count(" all-gather(") > len(gathers) == 4
        assert {c.runs for c in gathers} == {L}

    def test_collective_bytes_agree_with_the_cpu_compilers(self, tpu_mesh):
        tpu = cost_of(_compiled(_train(False), TP, tpu_mesh, PARAMS, BATCH), 8)
        cpu = cost_of(_compiled(_train(False), TP, _mesh(), PARAMS, BATCH), 8)
        total = sum(c.bytes_per_device for c in tpu.collectives)
        assert 1 / 1.5 <= total / sum(c.bytes_per_device for c in cpu.collectives) <= 1.5
        assert _by_kind(tpu)["all-reduce"][0] == _by_kind(cpu)["all-reduce"][0] == 2 * L


def _attention_step(unroll):
    """Layers whose product is batched (`bst,btd->bsd`, as attention's): the
    TPU compiler writes such a product as a convolution whose window, as
    long as the batch, covers one element of an input dilated as much."""

    def layer(x, w):
        scores = jnp.einsum("bsd,btd->bst", x, x) / D
        return jnp.tanh(jnp.einsum("bst,btd->bsd", scores, x) @ w)

    def loss(params, x):
        if unroll:
            for i in range(L):
                x = layer(x, params["w"][i])
        else:
            x = jax.lax.scan(lambda h, w: (layer(h, w), None), x, params["w"])[0]
        return jnp.sum(x**2)

    def step(params, batch):
        gp, gx = jax.grad(loss, argnums=(0, 1))(params, batch["x"])
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, gp), {"x": batch["x"] - 0.1 * gx}

    return step


ATTENTION = 'rules params:\n  default -> replicated\nrules inputs:\n  "x" -> (fsdp, _, _)\n'
ATTENTION_ARGS = ({"w": S((L, D, D), jnp.bfloat16)}, {"x": S((16, 128, D), jnp.bfloat16)})


def test_a_convolution_over_a_dilated_input_counts_the_elements_its_window_covers():
    """A convolution's FLOPs per output element: its input features times
    the real input elements its window covers, `ceil(size / lhs_dilate)` per
    dimension (XLA's count): a window of 128 over an input dilated by 128
    covers one."""
    from shardrules._costs._flops import flops
    from shardrules._costs._hlo import program

    def conv(window: str) -> float:
        hlo = (
            "ENTRY %main (a: bf16[128,512,64], b: bf16[128,64,32]) -> bf16[128,512,32] {\n"
            "  %a = bf16[128,512,64]{2,1,0} parameter(0)\n"
            "  %b = bf16[128,64,32]{2,1,0} parameter(1)\n"
            f"  ROOT %c = bf16[128,512,32]{{2,1,0}} convolution(%a, %b), window={{{window}}}, "
            "dim_labels=0fb_0io->0bf\n}\n"
        )
        return flops(program(hlo).computations["main"][-1])

    out = 128 * 512 * 32
    assert conv("size=128 stride=127 lhs_dilate=128") == 2 * out * 64  # one element: a batched product
    assert conv("size=128 pad=127_127") == 2 * out * 64 * 128  # every element of the window
    assert conv("size=128 lhs_dilate=32") == 2 * out * 64 * 4


@pytest.mark.skipif(_NO_TPU, reason="libtpu is not installed: pip install 'shardrules[tpu]'")
def test_a_scan_over_batched_products_costs_what_it_does_unrolled_on_the_tpu(tpu_mesh):
    compiled = [_compiled(_attention_step(u), ATTENTION, tpu_mesh, *ATTENTION_ARGS) for u in (False, True)]
    scanned, unrolled = (cost_of(c, 8) for c in compiled)
    assert scanned.flops_per_device == pytest.approx(unrolled.flops_per_device, rel=0.05)
    # unrolled, with no loop to add trips to, the count is XLA's own
    assert _raw_flops(compiled[1]) == pytest.approx(unrolled.flops_per_device, rel=1e-6)
