"""What loading a checkpoint costs each host (`Plan.load_cost`, SR220, `lint
--hosts`), against what `load_checkpoint`'s reader really issues.

The reader's one read function (`_ranged.read_at`) is wrapped to count the
reads and their bytes; the predictions must equal them. The byte geometry
(`_ranges.runs`) is checked against NumPy's own indexing.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import struct
import tracemalloc
from pathlib import Path
from unittest import mock

import jax
import ml_dtypes
import numpy as np
import pytest
from _safetensors import write_safetensors
from hypothesis import given
from hypothesis import strategies as st

import shardrules as sr
from shardrules._cli._main import main as cli_main
from shardrules._placement import _checkpoint, _ranged
from shardrules._planning import _ranges
from shardrules._planning._hosts import HostsError


@contextlib.contextmanager
def counted_reads():
    """Every read the reader issues: `{"reads": n, "bytes": n}`."""
    counts = {"reads": 0, "bytes": 0}
    real = _ranged.read_at

    def counting(fd: int, view: memoryview, offset: int) -> None:
        counts["reads"] += 1
        counts["bytes"] += len(view)
        real(fd, view, offset)

    with mock.patch.object(_ranged, "read_at", counting):
        yield counts


def checkpoint() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "fsdp.w": rng.standard_normal((256, 512)).astype(np.float32),  # runs: one range per slice
        "inner.w": rng.standard_normal((512, 256)).astype(ml_dtypes.bfloat16),  # many small runs: blocks
        "grid.w": rng.standard_normal((128, 64)).astype(np.float32),
        "stack.w": rng.standard_normal((4, 64, 96)).astype(ml_dtypes.float8_e4m3fn),
        "norm": rng.standard_normal(64).astype(np.float32),
        "scale": np.array(3.0, np.float32),
        "empty": np.zeros((0, 8), np.int8),
    }


LAYOUTS = {
    "outer": '"fsdp"  -> (fsdp, _)\n  "inner" -> (fsdp, _)\n  "grid" -> (fsdp, model)\n  "stack" -> (_, fsdp, _)',
    "inner splits": '"fsdp"  -> (_, fsdp)\n  "inner" -> (_, model)\n  "grid" -> (model, fsdp)\n  "stack" -> (_, _, model)',
    "partly replicated": '"fsdp" -> (_, model)\n  "inner" -> (fsdp, _)\n  "grid" -> (model, _)\n  "stack" -> (fsdp, _, _)',
    "replicated": '"w" -> replicated',
}


def rules_for(layout: str) -> sr.RuleSet:
    return sr.loads(
        f"mesh fsdp, model\nrules params:\n  {LAYOUTS[layout]}\n  default -> replicated\n", name="load.shard"
    )


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    write_safetensors(path, checkpoint())
    return path


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_predicted_reads_and_bytes_are_what_the_reader_issues(ckpt: Path, layout: str) -> None:
    mesh = jax.make_mesh((2, 4), ("fsdp", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    rules = rules_for(layout)
    with counted_reads() as counts:
        loaded = sr.load_checkpoint(ckpt, rules, mesh)
    want = checkpoint()
    for name, array in loaded.items():
        assert array.dtype == want[name].dtype
        np.testing.assert_array_equal(np.asarray(array), want[name])
    cost = sr.plan(sr.load_shapes(str(ckpt)), rules, mesh).load_cost(hosts=1)
    (host,) = cost.hosts
    assert (host.reads, host.bytes_read) == (counts["reads"], counts["bytes"])
    assert host.devices == tuple(range(8))
    data = sum(a.nbytes for a in want.values())
    assert cost.data_bytes == data
    assert host.bytes_read >= data  # every byte at least once (more where rows are read whole)


def test_the_layouts_above_use_both_ways_of_reading() -> None:
    """Runs for the outer splits, blocks for the inner ones (so both are compared above)."""
    plan = sr.plan(
        {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in checkpoint().items()},
        rules_for("outer"),
        {"fsdp": 2, "model": 4},
    )
    inner = sr.plan(plan_tree(), rules_for("inner splits"), {"fsdp": 2, "model": 4})
    modes = set()
    for p in (plan, inner):
        for leaf in p.leaves:
            regions = _host_regions(leaf)
            if regions is not None:
                modes.add(_ranges.read_plan(leaf.shape, leaf.dtype.itemsize, regions).mode)
    assert {"runs", "blocks"} <= modes


def plan_tree() -> dict[str, jax.ShapeDtypeStruct]:
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in checkpoint().items()}


def _host_regions(leaf: sr.LeafPlan):
    from shardrules._planning._loadcost import host_regions
    from shardrules._pspec import entries

    if leaf.spec is None or not leaf.nbytes:
        return None
    return host_regions(leaf.shape, tuple(entries(leaf.spec)), {"fsdp": 2, "model": 4}, 1)[0]


def test_peak_is_what_the_reader_holds_for_the_largest_tensor(ckpt: Path) -> None:
    """Measured with tracemalloc (NumPy reports its buffers to it) while each
    tensor's slices are read: the most allocated at once, against the model.
    Large buffers come from memory maps, which tracemalloc does not see: here
    they come from NumPy too."""
    mesh = jax.make_mesh((2, 4), ("fsdp", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    for layout in ("outer", "inner splits"):
        rules = rules_for(layout)
        held = []
        real = _checkpoint._reader

        def measuring(*args, real=real, held=held):
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            read = real(*args)
            held.append(tracemalloc.get_traced_memory()[1] - before)
            return read

        tracemalloc.start()
        try:  # every buffer from NumPy (which tracemalloc sees), none from a memory map
            with (
                mock.patch.object(_checkpoint, "_reader", measuring),
                mock.patch.object(_ranged, "MAPPED", 1 << 62),
            ):
                sr.load_checkpoint(ckpt, rules, mesh)
        finally:
            tracemalloc.stop()
        peak = sr.plan(plan_tree(), rules, mesh).load_cost(hosts=1).peak_bytes
        assert peak <= max(held) <= peak + 64 * 1024, (layout, peak, max(held))


# ------------------------------------------------------------------ geometry


@st.composite
def regions(draw):
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=4)))
    region = []
    for n in shape:
        start = draw(st.integers(0, n))
        region.append((start, draw(st.integers(start, n))))
    return shape, tuple(region), draw(st.sampled_from([1, 2, 4]))


@given(regions())
def test_runs_cover_exactly_the_slices_bytes(case) -> None:
    """The bytes of a tensor numbered in C order (an arange, `itemsize` bytes
    an element): the runs' bytes, in order, are NumPy's slice of it."""
    shape, region, itemsize = case
    positions = np.arange(int(np.prod(shape)) * itemsize, dtype=np.int64).reshape((*shape, itemsize))
    want = positions[tuple(slice(a, b) for a, b in region)].reshape(-1)
    runs = _ranges.runs(shape, itemsize, region)
    offsets = runs.offsets()
    got = np.concatenate([np.arange(o, o + runs.length) for o in offsets] or [np.zeros(0, np.int64)])
    np.testing.assert_array_equal(got, want)
    assert runs.nbytes == want.size and len(offsets) == runs.count
    if runs.count > 1:  # coalesced: the next run starts after a gap
        assert (np.diff(offsets) > runs.length).all()


@st.composite
def split_tensors(draw):
    rank = draw(st.integers(1, 3))
    shape, splits = [], []
    for _ in range(rank):
        parts = draw(st.sampled_from([1, 2, 4]))
        shape.append(parts * draw(st.integers(1, 5)))
        splits.append(parts)
    return tuple(shape), tuple(splits), draw(st.sampled_from(["float32", "bfloat16", "int8"]))


@given(
    tensor=split_tensors(),
    skip=st.integers(0, 3),
    read_cost=st.sampled_from([0, 1, 64, 1 << 20]),
    block=st.sampled_from([8, 64, 1 << 20]),
    data=st.data(),
)
def test_read_regions_gives_numpys_slices_with_the_planned_reads(
    tensor, skip, read_cost, block, data, tmp_path_factory
) -> None:
    """Any set of a tensor's blocks, read by either way (a read's price and the
    block size drawn), is NumPy's slicing of the tensor, in the reads `read_plan` says."""
    shape, splits, dtype = tensor
    dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    array = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape).astype(dtype)
    every = [
        tuple(
            (i * n // parts, (i + 1) * n // parts) for i, n, parts in zip(index, shape, splits, strict=True)
        )
        for index in np.ndindex(*splits)
    ]
    chosen = data.draw(st.lists(st.sampled_from(every), min_size=1, max_size=len(every), unique=True))
    path = tmp_path_factory.mktemp("read") / "t.bin"
    path.write_bytes(b"x" * skip + array.tobytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        with mock.patch.object(_ranges, "READ_COST", read_cost), mock.patch.object(_ranges, "BLOCK", block):
            plan = _ranges.read_plan(shape, dtype.itemsize, chosen)
            with counted_reads() as counts:
                got = _ranged.read_regions(fd, skip, shape, dtype, chosen)
    finally:
        os.close(fd)
    for region, part in zip(chosen, got, strict=True):
        np.testing.assert_array_equal(part, array[tuple(slice(a, b) for a, b in region)])
    assert (counts["reads"], counts["bytes"]) == (plan.reads, plan.nbytes)
    if plan.mode == "blocks":
        assert plan.blocks.buffer <= max(block, plan.blocks.row)


def test_a_file_cut_short_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    path.write_bytes(b"\0" * 10)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="the file ends at byte 10"):
            _ranged.read_regions(fd, 0, (4, 4), np.dtype(np.float32), [((0, 4), (0, 4))])
    finally:
        os.close(fd)


# ------------------------------------------------------------------ the cost model


def test_load_cost_of_a_real_mesh_and_of_sizes_agree() -> None:
    rules = rules_for("inner splits")
    mesh = jax.make_mesh((2, 4), ("fsdp", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    on_mesh = sr.plan(plan_tree(), rules, mesh).load_cost(hosts=2)
    on_sizes = sr.plan(plan_tree(), rules, {"fsdp": 2, "model": 4}).load_cost(hosts=2)
    assert on_mesh == on_sizes
    assert [h.devices for h in on_mesh.hosts] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert isinstance(on_mesh, sr.LoadCost) and isinstance(on_mesh.hosts[0], sr.HostLoad)


def test_hosts_that_do_not_split_the_mesh_are_refused() -> None:
    plan = sr.plan(plan_tree(), rules_for("outer"), {"fsdp": 2, "model": 4})
    with pytest.raises(
        HostsError, match=r"hosts=3: the mesh has 8 devices, which do not split evenly over 3 hosts"
    ):
        plan.load_cost(hosts=3)
    with pytest.raises(ValueError, match="at least 1"):
        plan.load_cost(hosts=0)
    with pytest.raises(HostsError, match="needs the mesh's sizes"):
        sr.plan(plan_tree(), rules_for("outer")).load_cost()


def test_hosts_split_an_outer_layout_and_each_reads_its_part() -> None:
    """`(fsdp, _)` with `fsdp` across 4 hosts: each host reads a quarter, in
    one read per device; the table merges equal hosts and totals them."""
    tree = {"w": jax.ShapeDtypeStruct((1024, 1024), np.float32)}
    rules = sr.loads('mesh fsdp, model\nrules params:\n  "w" -> (fsdp, _)\n')
    cost = sr.plan(tree, rules, {"fsdp": 4, "model": 2}).load_cost(hosts=4)
    quarter = 1024 * 1024 * 4 // 4
    assert [(h.bytes_read, h.reads, h.slices) for h in cost.hosts] == [(quarter, 1, 1)] * 4
    assert cost.bytes_read == 4 * quarter and cost.worst.host == 0
    assert cost.peak_bytes == quarter
    text = str(cost)
    assert text.splitlines()[0].split() == ["hosts", "devices", "read", "reads", "runs", "slices", "peak"]
    assert "0-3    0-7" in text and "4 hosts × 2 devices: 4.0 MiB read in 4 reads" in text
    as_json = cost.to_json()
    assert as_json["rows"][1] == {
        "host": 1,
        "devices": [2, 3],
        "bytes_read": quarter,
        "reads": 1,
        "runs": 1,
        "slices": 1,
        "peak_bytes": quarter,
    }
    assert as_json["worst_host"] == 0 and as_json["bytes_read"] == 4 * quarter


# ------------------------------------------------------------------ SR220

SR220_RULES = 'mesh model\nrules params:\n  "w" -> (_, model)\n  "v" -> (model, _)\n  default -> replicated\n'


def sr220_plan(text: str = SR220_RULES, hosts: int = 16) -> sr.LoadCost:
    tree = {
        "a/w": jax.ShapeDtypeStruct((4096, 4096), np.float32),
        "b/w": jax.ShapeDtypeStruct((1024, 4096), np.float32),
        "a/v": jax.ShapeDtypeStruct((4096, 4096), np.float32),
    }
    return sr.plan(tree, sr.loads(text, name="kernels.shard"), {"model": 16}).load_cost(hosts=hosts)


def test_sr220_fires_on_an_inner_split_once_per_rule_and_not_on_an_outer_one() -> None:
    cost = sr220_plan()
    (finding,) = cost.findings
    assert finding.code == "SR220" and finding.severity == "warning"
    assert (finding.span.file, finding.span.line, finding.span.col) == ("kernels.shard", 3, 10)
    assert finding.path == "a/w" and finding.count == 2  # both leaves of the rule, the worst first
    assert [p for p, _ in finding.paths] == ["a/w", "b/w"]
    assert "`a/w` (4096, 4096) float32" in finding.message
    assert "4,096 separate byte runs" in finding.message and "(4,096 per slice" in finding.message
    assert "load_checkpoint issues 4,096 reads, one per run, where one per slice would do" in finding.message
    assert "`-> (model, _)` rather than `(_, model)`" in finding.hint
    # the reads each host issues: 4096 for each of a/w's and a/v's slices... a/v's is one range
    assert cost.hosts[0].reads == 4096 + 1024 + 1


def test_sr220_where_the_reader_reads_whole_rows() -> None:
    """256-byte runs: each host reads the whole tensor in blocks, 16 times its slices' bytes."""
    tree = {"q": jax.ShapeDtypeStruct((2048, 2048), ml_dtypes.bfloat16)}
    rules = sr.loads('mesh fsdp, model\nrules params:\n  "q" -> (model, fsdp)\n', name="q.shard")
    cost = sr.plan(tree, rules, {"fsdp": 16, "model": 8}).load_cost(hosts=16)
    (finding,) = cost.findings
    assert "its 8 distinct slices on host 0 are 2,048 separate byte runs" in finding.message
    assert "load_checkpoint reads whole rows, 8.0 MiB in 1 read, for their 512.0 KiB (16.0x the bytes)" in (
        finding.message
    )
    assert "`-> ((model, fsdp), _)` rather than `(model, fsdp)`" in finding.hint
    assert [h.bytes_read for h in cost.hosts] == [2048 * 2048 * 2] * 16


def test_sr220_for_a_layout_read_one_run_at_a_time() -> None:
    """Runs of 64 KiB: the reader issues one read per run, 512 per slice."""
    tree = {"w": jax.ShapeDtypeStruct((512, 16 * 16384), np.float32)}
    rules = sr.loads('mesh model\nrules params:\n  "w" -> (_, model)\n', name="r.shard")
    cost = sr.plan(tree, rules, {"model": 16}).load_cost(hosts=16)
    (finding,) = cost.findings
    assert "load_checkpoint issues 512 reads, one per run" in finding.message
    assert cost.hosts[3].reads == 512


def test_sr220_is_quiet_on_outer_splits_one_host_and_acknowledged_lines() -> None:
    outer = SR220_RULES.replace('"w" -> (_, model)', '"w" -> (model, _)')
    assert sr220_plan(outer).findings == ()
    # one host holds every slice: the reader reads the whole tensor in blocks, as fast as contiguous
    assert sr220_plan(hosts=1).findings == ()
    acknowledged = SR220_RULES.replace('"w" -> (_, model)', '"w" -> (_, model)  # noqa: SR220')
    assert sr220_plan(acknowledged).findings == ()


def test_sr220_names_a_sharded_outer_dimension_when_no_free_one_divides() -> None:
    from shardrules._planning._slow_reads import better_spec

    assert better_spec((4096, 4096), (None, "model"), {"model": 8}) == ("model", None)
    assert better_spec((256, 2048), ("model", "fsdp"), {"model": 8, "fsdp": 16}) == (("model", "fsdp"), None)
    assert better_spec((3, 4096), (None, "model"), {"model": 8}) is None


# ------------------------------------------------------------------ the command line


def lint(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli_main(list(args))
    return code, out.getvalue()


def write_header(path: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * int(np.prod(shape))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kernels.shard").write_text(SR220_RULES)
    write_header(
        tmp_path / "model.safetensors", {"a.w": (4096, 4096), "b.w": (1024, 4096), "a.v": (4096, 4096)}
    )
    return tmp_path


def test_lint_hosts_prints_each_hosts_load_cost(project: Path) -> None:
    code, out = lint(
        "lint", "kernels.shard", "--mesh", "model=16", "--hosts", "16", "--shapes", "model.safetensors"
    )
    assert code == 0  # a warning
    assert "kernels.shard:3:10: SR220 `a.w` (4096, 4096) float32" in out
    assert "kernels.shard: what load_checkpoint reads on each host:" in out
    header = next(line for line in out.splitlines() if line.strip().startswith("hosts"))
    assert header.split() == ["hosts", "devices", "read", "reads", "runs", "slices", "peak"]
    assert "16 hosts × 1 device:" in out
    assert "bytes per host (16 hosts × 1 device)" in out  # the line it printed before is kept
    plain = lint("lint", "kernels.shard", "--mesh", "model=16", "--shapes", "model.safetensors")[1]
    assert "SR220" not in plain and "load_checkpoint" not in plain


def test_lint_hosts_json(project: Path) -> None:
    _, out = lint(
        "lint",
        "kernels.shard",
        "--mesh",
        "model=16",
        "--hosts",
        "16",
        "--shapes",
        "model.safetensors",
        "--format",
        "json",
    )
    found = json.loads(out)
    assert set(found) == {"findings", "load_cost"}
    assert [f["code"] for f in found["findings"]] == ["SR220"] and found["findings"][0]["count"] == 2
    (cost,) = found["load_cost"]
    assert cost["file"] == "kernels.shard" and cost["hosts"] == 16 and cost["devices_per_host"] == 1
    expected = sr.plan(
        sr.load_shapes("model.safetensors"), sr.load("kernels.shard"), {"model": 16}
    ).load_cost(hosts=16)
    assert cost["rows"] == expected.to_json()["rows"]
    assert set(cost["rows"][0]) == {"host", "devices", "bytes_read", "reads", "runs", "slices", "peak_bytes"}
    # without --hosts, the list of findings as before
    plain = json.loads(
        lint(
            "lint", "kernels.shard", "--mesh", "model=16", "--shapes", "model.safetensors", "--format", "json"
        )[1]
    )
    assert plain == []


def test_explain_hosts_shows_the_load_cost(project: Path) -> None:
    args = ["explain", "kernels.shard", "--mesh", "model=16", "--hosts", "4", "--shapes", "model.safetensors"]
    _, out = lint(*args)
    assert "what load_checkpoint reads on each host:" in out and "4 hosts × 4 devices:" in out
    _, out = lint(*args, "--format", "json")
    found = json.loads(out)
    assert found["load_cost"]["hosts"] == 4 and len(found["load_cost"]["rows"]) == 4
    assert json.loads(lint(*args[:4], *args[6:], "--format", "json")[1])["load_cost"] is None


@pytest.mark.parametrize("layout", ["outer", "inner splits"])
def test_buffers_from_memory_maps_hold_the_same_values(ckpt: Path, layout: str) -> None:
    """Every buffer from an anonymous memory map (as large ones are)."""
    mesh = jax.make_mesh((2, 4), ("fsdp", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    with mock.patch.object(_ranged, "MAPPED", 0):
        loaded = sr.load_checkpoint(ckpt, rules_for(layout), mesh)
    for name, array in checkpoint().items():
        np.testing.assert_array_equal(np.asarray(loaded[name]), array)


def test_sr220_says_so_where_no_outer_dimension_divides() -> None:
    tree = {"w": jax.ShapeDtypeStruct((3, 5, 16 * 4096), np.float32)}
    rules = sr.loads('mesh model\nrules params:\n  "w" -> (_, _, model)\n', name="r.shard")
    (finding,) = sr.plan(tree, rules, {"model": 16}).load_cost(hosts=16).findings
    assert "15 separate byte runs" in finding.message
    assert finding.hint.startswith("no outer dimension of (3, 5, 65536) divides by the same mesh axes")
