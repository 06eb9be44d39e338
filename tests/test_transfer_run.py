"""`shardrules.transfer`: a plan moving a tree between two layouts, run under a
cap on the memory in flight, on the 8 simulated CPU devices.

The oracle for what moves is JAX's own geometry (`devices_indices_map`,
element masks per device); values are compared with the NumPy tree they came
from; memory is read from `jax.live_arrays()` while each chunk is in flight.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _live import live_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr
from shardrules._placement import _moving, _pieces, _transfer

DEVICES = jax.devices()

TRAIN = """\
mesh data, model
rules params:
  "w"  -> (data, model)
  "b"  -> (model)
  "r"  -> replicated
  "e"  -> (_, data)
"""
ROLLOUT = """\
mesh model
rules params:
  "w"  -> (_, model)
  "b"  -> replicated
  "r"  -> (model)
  "e"  -> (model, _)
"""


def _tree() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "w": rng.standard_normal((12, 8)).astype(np.float32),
        "b": np.arange(8, dtype=np.int32),
        "r": rng.standard_normal(6).astype(jnp.bfloat16),
        "e": rng.integers(0, 2, (4, 6)).astype(bool),
    }


def _meshes() -> tuple[Mesh, Mesh]:
    """The trainer on devices 0-5, the rollout on 6-7."""
    return (
        Mesh(np.array(DEVICES[:6]).reshape(3, 2), ("data", "model")),
        Mesh(np.array(DEVICES[6:]), ("model",)),
    )


def _explicit(shape: tuple[int, ...], names: tuple[str, ...], devices: list | None = None) -> Mesh:
    """A mesh with Explicit axes (JAX's default since 0.9; 0.8 made Auto ones)."""
    types = (jax.sharding.AxisType.Explicit,) * len(names)
    return jax.make_mesh(shape, names, types, devices=devices)


def _equal(out: dict, tree: dict, mesh: Mesh, rules: sr.RuleSet) -> None:
    want = sr.shardings(tree, rules, mesh)
    for key, value in tree.items():
        assert np.array_equal(np.asarray(out[key]), np.asarray(value)), key
        assert out[key].sharding.is_equivalent_to(want[key], value.ndim), key


@pytest.mark.parametrize("cap", [None, 1, 40, "1KiB"])
@pytest.mark.parametrize("verify", [False, True])
def test_trainer_to_rollout_on_other_devices(cap: int | str | None, verify: bool) -> None:
    train_mesh, rollout_mesh = _meshes()
    train, rollout = sr.loads(TRAIN), sr.loads(ROLLOUT)
    tree = _tree()
    placed = sr.apply(tree, train, train_mesh)
    t = sr.transfer(train, rollout, train_mesh, rollout_mesh)
    out = t.run(placed, max_bytes_in_flight=cap, verify=verify)
    _equal(out, tree, rollout_mesh, rollout)
    assert all(not x.is_deleted() for x in placed.values())  # not donated: the inputs stay
    # Disjoint devices: every byte each rollout device holds came from elsewhere.
    assert t.bytes_moved == sum(sum(s.data.nbytes for s in out[k].addressable_shards) for k in tree)


def _needed_bytes(shape: tuple[int, ...], itemsize: int, old: NamedSharding, new: NamedSharding) -> int:
    """The oracle: for each device of the new layout, the elements it needs
    and did not hold under the old one."""
    total = 0
    held = {d.id: index for d, index in old.devices_indices_map(shape).items()}
    for device, index in new.devices_indices_map(shape).items():
        need = np.zeros(shape, bool)
        need[index] = True
        if device.id in held:
            have = np.zeros(shape, bool)
            have[held[device.id]] = True
            need &= ~have
        total += int(need.sum()) * itemsize
    return total


MESH_SHAPES = [(8,), (4, 2), (2, 4), (2, 2, 2), (2,), (4,), (2, 2), (1, 2), (3,), (3, 2), (6,)]


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[Mesh, P, Mesh, P, tuple[int, ...]]:
    def mesh(prefix: str) -> Mesh:
        shape = draw(st.sampled_from(MESH_SHAPES))
        n = math.prod(shape)
        ids = draw(st.permutations(range(8)))[:n]
        names = tuple(f"{prefix}{k}" for k in range(len(shape)))
        return Mesh(np.array([DEVICES[i] for i in ids]).reshape(shape), names)

    def spec(mesh: Mesh, rank: int) -> P:
        axes = list(mesh.axis_names)
        draw(st.randoms()).shuffle(axes)
        entries: list = []
        for _ in range(rank):
            k = draw(st.integers(0, min(2, len(axes))))
            taken, axes = axes[:k], axes[k:]
            entries.append(None if not taken else taken[0] if k == 1 else tuple(taken))
        return P(*entries)

    a, b = mesh("a"), mesh("b")
    rank = draw(st.integers(1, 3))
    sa, sb = spec(a, rank), spec(b, rank)
    shape = []
    for k in range(rank):
        need = math.lcm(
            *(
                math.prod(m.shape[x] for x in ((e,) if isinstance(e, str) else e or ()))
                for m, e in ((a, sa[k] if k < len(sa) else None), (b, sb[k] if k < len(sb) else None))
            )
        )
        shape.append(need * draw(st.integers(1, 2)))
    return a, sa, b, sb, tuple(shape)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=_layouts(),
    cap=st.sampled_from([None, 1, 48, 4096]),
    donate=st.booleans(),
    crossing=st.booleans(),
)
def test_any_layout_to_any_other(case: tuple, cap: int | None, donate: bool, crossing: bool) -> None:
    """Random meshes over random subsets of the 8 devices (overlapping or
    not), random layouts: every value arrives, in the target sharding, and
    `bytes_moved` is what JAX's geometry says each device lacks. `crossing`
    sends every piece that moves through the collective used between
    processes (here on one process)."""
    a, sa, b, sb, shape = case
    old, new = NamedSharding(a, sa), NamedSharding(b, sb)
    value = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    source_rules = sr.loads(f"rules params:\n  default -> {_spec_text(sa)}\n")
    target_rules = sr.loads(f"rules params:\n  default -> {_spec_text(sb)}\n")
    placed = {"x": jax.device_put(value, old)}
    t = sr.transfer(source_rules, target_rules, a, b, shapes=placed)
    moved = 0 if old.is_equivalent_to(new, len(shape)) else _needed_bytes(shape, 4, old, new)
    assert t.bytes_moved == moved
    previous = _moving._crossing_hook
    _moving._crossing_hook = (lambda p: not p.stays) if crossing else None
    try:
        out = t.run(placed, max_bytes_in_flight=cap, donate=donate)
    finally:
        _moving._crossing_hook = previous
    assert np.array_equal(np.asarray(out["x"]), value)
    assert out["x"].sharding.is_equivalent_to(new, len(shape))
    if donate and moved:
        assert placed["x"].is_deleted()


def _spec_text(spec: P) -> str:
    parts = []
    for e in spec:
        parts.append("_" if e is None else e if isinstance(e, str) else "(" + ", ".join(e) + ")")
    return "(" + ", ".join(parts) + ")" if parts else "replicated"


def test_memory_in_flight_stays_under_the_cap_plus_one_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trainer (data=3, model=2 on devices 0-5) to rollout (model=2 on 6-7),
    donating: measured while each chunk is in flight, every device holds at
    most what it holds before or after the transfer, plus the cap, plus one
    piece; and no more than `peaks` predicts."""
    train_mesh, rollout_mesh = _meshes()
    train = sr.loads("mesh data, model\nrules params:\n  default -> (data, model)\n")
    rollout = sr.loads("mesh model\nrules params:\n  default -> (_, model)\n")
    tree = {f"w{i}": np.full((96, 64), i, np.float32) for i in range(6)}
    placed = sr.apply(tree, train, train_mesh)
    cap = 8 * 1024  # each rollout block (48 x 64 x 4 = 12 KiB) spans chunks
    t = sr.transfer(train, rollout, train_mesh, rollout_mesh, shapes=placed)
    largest = max(p.nbytes for leaf in t.leaves for p in leaf.pieces)
    predicted = t.peaks(cap, donate=True)
    start = live_bytes()
    seen: list[dict[int, int]] = []
    monkeypatch.setattr(_moving, "_observe", lambda mover, chunk: seen.append(live_bytes()))
    out = t.run(placed, max_bytes_in_flight=cap, donate=True)
    end = live_bytes()
    assert len(seen) > len(tree)  # the cap cut the transfer into more chunks than arrays
    for live in seen:
        for device, held in live.items():
            bound = max(start.get(device, 0), end.get(device, 0)) + cap + largest
            assert held <= bound, (device, held, bound)
            if device in predicted:
                others = start.get(device, 0) - sum(
                    s.data.nbytes
                    for x in placed.values()
                    if not x.is_deleted()
                    for s in x.addressable_shards
                    if s.device.id == device
                )
                assert held - max(others, 0) <= predicted[device] + 1, (device, held, predicted[device])
    assert t.in_flight_per_device(cap) <= cap + largest
    assert all(x.is_deleted() for x in placed.values())
    _equal(out, tree, rollout_mesh, rollout)


def test_a_warm_run_plans_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    train_mesh, rollout_mesh = _meshes()
    train, rollout = sr.loads(TRAIN), sr.loads(ROLLOUT)
    tree = _tree()
    t = sr.transfer(train, rollout, train_mesh, rollout_mesh)
    t.run(sr.apply(tree, train, train_mesh), max_bytes_in_flight=64)
    calls: list[str] = []
    for module, name in (
        (_moving, "leaf_pieces"),
        (_transfer, "compile_leaves"),
        (_moving._schedule, "chunks"),
    ):
        real = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k)
        )
    out = t.run(sr.apply(tree, train, train_mesh), max_bytes_in_flight=64)
    assert calls == []
    _equal(out, tree, rollout_mesh, rollout)
    t.run(sr.apply(tree, train, train_mesh), max_bytes_in_flight=128)  # another cap: chunks only
    assert calls == ["chunks"]


def test_verify_names_the_array_a_corrupted_piece_belongs_to(monkeypatch: pytest.MonkeyPatch) -> None:
    train_mesh, rollout_mesh = _meshes()
    train, rollout = sr.loads(TRAIN, name="train.shard"), sr.loads(ROLLOUT, name="rollout.shard")
    tree = _tree()
    placed = sr.apply(tree, train, train_mesh)
    t = sr.transfer(train, rollout, train_mesh, rollout_mesh)
    t.run(placed, verify=True)  # clean: no error

    def corrupting(part: jax.Array, device: jax.Device) -> jax.Array:
        if part.dtype == np.float32 and part.ndim == 2:  # a piece of "w"
            part = part.at[0, 0].add(1.0)
        return jax.device_put(part, device)

    monkeypatch.setattr(_moving, "_send_hook", corrupting)
    with pytest.raises(sr.PlacementError) as caught:
        t.run(placed, max_bytes_in_flight=64, verify=True, donate=True)
    text = str(caught.value)
    assert "SR132" in text and "`w` (12, 8)" in text and "rollout.shard:3" in text
    assert not placed["w"].is_deleted()  # its source is kept
    assert np.array_equal(np.asarray(placed["w"]), tree["w"])
    # The arrays finished before it were donated: the error hands back the whole tree.
    whole = caught.value.tree
    assert placed["b"].is_deleted() and whole["w"] is placed["w"]
    assert whole["b"].sharding.mesh == rollout_mesh and np.array_equal(np.asarray(whole["b"]), tree["b"])
    assert "stopped after 3 of 4 arrays" in "\n".join(caught.value.__notes__)
    # Without verify the same corruption goes through unseen: the check is what caught it.
    out = t.run(sr.apply(tree, train, train_mesh))
    assert not np.array_equal(np.asarray(out["w"]), tree["w"])


def test_a_source_not_in_the_source_layout_is_refused_before_anything_moves() -> None:
    train_mesh, rollout_mesh = _meshes()
    train, rollout = sr.loads(TRAIN, name="train.shard"), sr.loads(ROLLOUT)
    tree = _tree()
    placed = sr.apply(tree, train, train_mesh)
    placed["w"] = jax.device_put(tree["w"], NamedSharding(train_mesh, P("model", None)))
    t = sr.transfer(train, rollout, train_mesh, rollout_mesh)
    with pytest.raises(sr.PlacementError) as caught:
        t.run(placed, donate=True)
    assert "train.shard:3:3: SR131" in str(caught.value) and "`w` (12, 8)" in str(caught.value)
    assert not any(x.is_deleted() for x in placed.values())


def test_a_deleted_input_is_refused() -> None:
    train_mesh, rollout_mesh = _meshes()
    train, rollout = sr.loads(TRAIN), sr.loads(ROLLOUT)
    placed = sr.apply(_tree(), train, train_mesh)
    placed["b"].delete()
    with pytest.raises(sr.PlacementError, match="SR107"):
        sr.transfer(train, rollout, train_mesh, rollout_mesh).run(placed)


def _buffers(x: jax.Array) -> set[tuple[int, int]]:
    return {(s.device.id, s.data.unsafe_buffer_pointer()) for s in x.addressable_shards}


def test_the_outputs_of_a_jitted_step_and_an_unchanged_layout() -> None:
    """A leaf whose layout does not change is copied on its devices (no byte
    moves): the result shares no buffer with the step's output, which is
    deleted when donated."""
    train_mesh, _rollout_mesh = _meshes()
    train = sr.loads("mesh data, model\nrules params:\n  default -> (data, model)\n")
    same = sr.loads('mesh data, model\nrules params:\n  "k" -> (data, model)\n  default -> (model, _)\n')
    tree = {"k": np.ones((6, 4), np.float32), "v": np.arange(24, dtype=np.float32).reshape(6, 4)}
    shardings = sr.shardings(tree, train, train_mesh)
    step = jax.jit(lambda t: jax.tree.map(lambda x: x * 2, t), out_shardings=shardings)
    outputs = step(sr.apply(tree, train, train_mesh))
    before = _buffers(outputs["k"])
    t = sr.transfer(train, same, train_mesh, train_mesh)
    moved = t.run(outputs, donate=True)
    assert outputs["k"].is_deleted() and outputs["v"].is_deleted()
    assert not _buffers(moved["k"]) & before
    assert np.array_equal(np.asarray(moved["k"]), tree["k"] * 2)
    assert np.array_equal(np.asarray(moved["v"]), tree["v"] * 2)
    assert moved["v"].sharding.spec == P("model", None)
    k = t.leaves[0]
    assert k.bytes_moved == 0 and k.pieces and all(p.stays for p in k.pieces)


def test_the_same_layout_on_another_mesh_comes_back_on_that_mesh() -> None:
    """Colocated trainer and rollout, one layout under other axis names (and
    axis types): every array comes back on the rollout's mesh, and a later
    donating training step frees none of the rollout's arrays."""
    auto, explicit = jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit
    train_mesh = jax.make_mesh((4, 2), ("data", "model"), (explicit, explicit))
    rollout_mesh = jax.make_mesh((4, 2), ("replica", "tensor"), (auto, auto))
    train = sr.loads('mesh data, model\nrules params:\n  "w" -> (data, model)\n  "s" -> replicated\n')
    rollout = sr.loads(
        'mesh replica, tensor\nrules params:\n  "w" -> (replica, tensor)\n  "s" -> replicated\n'
    )
    tree = {"w": np.arange(64, dtype=np.float32).reshape(8, 8), "s": np.ones(8, np.float32)}
    params = sr.apply(tree, train, train_mesh)
    t = sr.transfer(train, rollout, train_mesh, rollout_mesh)
    served = t.run(params)
    assert t.bytes_moved == 0
    for key in tree:
        assert served[key].sharding.mesh == rollout_mesh, key
        assert not _buffers(served[key]) & _buffers(params[key]), key
    step = jax.jit(lambda p: jax.tree.map(lambda x: x + 1, p), donate_argnums=0)
    params = step(params)
    assert not any(x.is_deleted() for x in served.values())
    assert np.array_equal(np.asarray(served["w"]), tree["w"])


def test_empty_arrays_donated_on_shared_devices() -> None:
    mesh = _explicit((4, 2), ("data", "model"))
    a = sr.loads('mesh data, model\nrules params:\n  "e" -> (data, _)\n  "w" -> (data, model)\n')
    b = sr.loads('mesh data, model\nrules params:\n  "e" -> (_, model)\n  "w" -> (model, data)\n')
    tree = {"e": np.zeros((0, 8), np.int8), "w": np.ones((8, 8), np.float32)}
    placed = sr.apply(tree, a, mesh)
    out = sr.transfer(a, b, mesh, mesh).run(placed, donate=True)
    assert placed["e"].is_deleted() and not out["e"].is_deleted()
    assert out["e"].shape == (0, 8) and out["e"].sharding.spec == P(None, "model")


def test_verify_on_a_one_device_mesh_with_explicit_axes() -> None:
    """A shard of an array on a one-device Explicit mesh is that array,
    typed by the mesh's axes; the checksums take it as a plain array."""
    _, rollout_mesh = _meshes()
    one = _explicit((1, 1), ("data", "model"), DEVICES[:1])
    a = sr.loads('mesh data, model\nrules params:\n  "w" -> (model, data)\n')
    b = sr.loads('mesh model\nrules params:\n  "w" -> (_, model)\n')
    value = np.arange(32, dtype=np.float32).reshape(4, 8)
    step = jax.jit(lambda t: t, out_shardings=sr.shardings({"w": value}, a, one))
    placed = step(sr.apply({"w": value}, a, one))
    for crossing in (None, lambda p: not p.stays):
        previous = _moving._crossing_hook
        _moving._crossing_hook = crossing
        try:
            out = sr.transfer(a, b, one, rollout_mesh).run(placed, verify=True)
        finally:
            _moving._crossing_hook = previous
        assert np.array_equal(np.asarray(out["w"]), value)


def test_the_checksums_see_changes_that_cancel_in_plain_sums() -> None:
    from shardrules._placement._checksums import sums

    x = np.arange(1, 65, dtype=np.float32)
    base = np.asarray(sums(jnp.asarray(x)))
    flipped = x.copy()
    flipped[[3, 40]] *= -1  # two sign bits: +2^31 twice, 0 modulo 2^32
    swapped = x.copy()
    swapped[[5, 6]] = swapped[[6, 5]]
    for changed in (flipped, swapped):
        assert not np.array_equal(np.asarray(sums(jnp.asarray(changed))), base)


@pytest.mark.parametrize("dtype", [jnp.int2, jnp.int4, jnp.uint4, jnp.float4_e2m1fn])
def test_elements_narrower_than_a_byte_verify_and_cross(dtype: type, monkeypatch: pytest.MonkeyPatch) -> None:
    train_mesh, rollout_mesh = _meshes()
    train = sr.loads('mesh data, model\nrules params:\n  "w" -> (data, model)\n')
    rollout = sr.loads('mesh model\nrules params:\n  "w" -> (_, model)\n')
    value = (np.arange(96).reshape(12, 8) % 2).astype(dtype)
    placed = sr.apply({"w": value}, train, train_mesh)
    out = sr.transfer(train, rollout, train_mesh, rollout_mesh).run(placed, verify=True)
    assert np.array_equal(np.asarray(out["w"]).astype(np.float32), value.astype(np.float32))
    monkeypatch.setattr(_moving, "_crossing_hook", lambda p: not p.stays)
    out = sr.transfer(train, rollout, train_mesh, rollout_mesh).run(placed, verify=True)
    assert np.array_equal(np.asarray(out["w"]).astype(np.float32), value.astype(np.float32))


@pytest.mark.parametrize("cap", [0, -1, "0B", "0KiB", "lots", True, 1.5])
def test_a_cap_must_be_a_positive_size(cap: object) -> None:
    train_mesh, rollout_mesh = _meshes()
    t = sr.transfer(sr.loads(TRAIN), sr.loads(ROLLOUT), train_mesh, rollout_mesh, shapes=_tree())
    with pytest.raises(ValueError, match="max_bytes_in_flight"):
        t.in_flight_per_device(cap)  # type: ignore[arg-type]


def test_a_numpy_integer_is_a_cap() -> None:
    train_mesh, rollout_mesh = _meshes()
    t = sr.transfer(sr.loads(TRAIN), sr.loads(ROLLOUT), train_mesh, rollout_mesh, shapes=_tree())
    assert t.in_flight_per_device(np.int64(4096)) == t.in_flight_per_device(4096)


def test_sr131_says_when_only_the_devices_order_differs() -> None:
    train_mesh, rollout_mesh = _meshes()
    train = sr.loads('mesh data, model\nrules params:\n  "w" -> (data, model)\n', name="train.shard")
    rollout = sr.loads('mesh model\nrules params:\n  "w" -> (_, model)\n')
    reversed_mesh = Mesh(np.array(DEVICES[:6][::-1]).reshape(3, 2), ("data", "model"))
    placed = sr.apply({"w": np.ones((12, 8), np.float32)}, train, reversed_mesh)
    with pytest.raises(sr.PlacementError) as caught:
        sr.transfer(train, rollout, train_mesh, rollout_mesh).run(placed)
    text = str(caught.value)
    assert "train.shard:3:3: SR131" in text and "over devices [5, 4, 3, 2, 1, 0]" in text


@pytest.mark.parametrize(
    "dtype", [np.int8, np.uint16, jnp.bfloat16, np.complex64, np.bool_, jnp.float8_e4m3fn]
)
def test_every_dtype_survives_the_crossing_between_processes(
    dtype: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    train_mesh, rollout_mesh = _meshes()
    rng = np.random.default_rng(1)
    value = (rng.standard_normal((12, 8)) * 10).astype(dtype)
    if dtype is np.complex64:
        value = value + 1j * value[::-1]
    train = sr.loads('mesh data, model\nrules params:\n  "w" -> (data, model)\n')
    rollout = sr.loads('mesh model\nrules params:\n  "w" -> (_, model)\n')
    placed = sr.apply({"w": value}, train, train_mesh)
    monkeypatch.setattr(_moving, "_crossing_hook", lambda p: not p.stays)
    out = sr.transfer(train, rollout, train_mesh, rollout_mesh).run(
        placed, max_bytes_in_flight=64, verify=True
    )
    assert np.array_equal(np.asarray(out["w"]), value)


def test_plan_before_running_and_what_it_reports() -> None:
    train_mesh, rollout_mesh = _meshes()
    train, rollout = sr.loads(TRAIN), sr.loads(ROLLOUT)
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _tree())
    t = sr.transfer(train, rollout, train_mesh, rollout_mesh, shapes=shapes)
    assert [leaf.path for leaf in t.leaves] == ["b", "e", "r", "w"]
    w = t.leaves[3]
    assert w.source == P("data", "model") and w.target == P(None, "model")
    assert w.bytes_moved == 12 * 8 * 4  # every byte of w lands on other devices
    assert "w" in str(t) and "Transfer(" in repr(t)
    assert t.peak_bytes_per_device(64, donate=True) <= t.peak_bytes_per_device(None)
    with pytest.raises(ValueError, match="max_bytes_in_flight"):
        t.peak_bytes_per_device(0)
    with pytest.raises(ValueError, match="max_bytes_in_flight"):
        t.peak_bytes_per_device("lots")
    fresh = sr.transfer(train, rollout, train_mesh, rollout_mesh)
    with pytest.raises(ValueError, match="not been planned"):
        _ = fresh.bytes_moved


def test_a_plan_as_the_source() -> None:
    train_mesh, rollout_mesh = _meshes()
    train, rollout = sr.loads(TRAIN), sr.loads(ROLLOUT)
    tree = _tree()
    plan = sr.plan(tree, train, train_mesh)
    t = sr.transfer(plan, rollout, target_mesh=rollout_mesh)
    assert t.bytes_moved > 0  # planned from the plan's shapes, with no tree
    _equal(t.run(sr.apply(tree, train, train_mesh)), tree, rollout_mesh, rollout)


def test_pieces_are_taken_from_the_target_itself_first() -> None:
    mesh = Mesh(np.array(DEVICES).reshape(4, 2), ("a", "b"))
    old, new = NamedSharding(mesh, P("a", None)), NamedSharding(mesh, P("a", "b"))
    shape = (8, 4)
    pieces = _pieces.leaf_pieces(
        0, shape, 4, _pieces.blocks(old, shape), _pieces.blocks(new, shape), {d.id: 0 for d in DEVICES}, {}
    )
    assert all(p.stays for p in pieces)  # a finer split of what each device holds: nothing moves


def test_reshard_under_a_cap_moves_pieces_from_any_source_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """`reshard(max_bytes_in_flight=)`: the sources as they are (here one on a
    single device, one from a jitted step), moved under the cap, donated."""
    _, rollout_mesh = _meshes()
    rollout = sr.loads(ROLLOUT)
    tree = _tree()
    placed = {k: jax.device_put(v, DEVICES[k == "w"]) for k, v in tree.items()}
    in_flight: list[int] = []
    largest: list[int] = [0]

    def observe(mover: object, chunk: _moving._schedule.Chunk) -> None:
        held: dict[int, int] = {}
        for piece in chunk.pieces:
            largest[0] = max(largest[0], piece.nbytes)
            for device, size in _moving._schedule.in_flight(piece).items():
                held[device] = held.get(device, 0) + size
        in_flight.append(max(held.values()))

    monkeypatch.setattr(_moving, "_observe", observe)
    out = sr.reshard(placed, rollout, rollout_mesh, donate=True, max_bytes_in_flight="64B")
    _equal(out, tree, rollout_mesh, rollout)
    assert all(x.is_deleted() for x in placed.values())
    assert len(in_flight) >= 3 and max(in_flight) <= 64 + largest[0]
    with pytest.raises(ValueError, match="max_bytes_in_flight"):
        sr.reshard(out, rollout, rollout_mesh, max_bytes_in_flight=-1)


def test_errors_of_either_rule_file_show_that_file() -> None:
    train_mesh, rollout_mesh = _meshes()
    train = sr.loads('mesh data, model\nrules params:\n  "w" -> (model, data)\n')  # 8 over data=3: SR104
    rollout = sr.loads('mesh model\nrules params:\n  "w" -> (_, model)\n')
    with pytest.raises(sr.PlanError) as caught:
        sr.transfer(
            train, rollout, train_mesh, rollout_mesh, shapes={"w": jax.ShapeDtypeStruct((12, 8), np.float32)}
        )
    assert "SR104" in str(caught.value) and '"w" -> (model, data)' in str(caught.value)


def test_leaves_that_are_not_arrays_pass_through() -> None:
    train_mesh, rollout_mesh = _meshes()
    train = sr.loads('mesh data, model\nrules params:\n  "w" -> (data, model)\n')
    rollout = sr.loads('mesh model\nrules params:\n  "w" -> (_, model)\n')
    tree = {"layers": [{"w": np.ones((6, 4), np.float32), "act": "gelu", "n": 3}], "none": None}
    placed = sr.apply(tree, train, train_mesh)
    out = sr.transfer(train, rollout, train_mesh, rollout_mesh).run(placed, max_bytes_in_flight=16)
    assert out["layers"][0]["act"] == "gelu" and out["layers"][0]["n"] == 3 and out["none"] is None
    assert out["layers"][0]["w"].sharding.spec == P(None, "model")
    assert np.array_equal(np.asarray(out["layers"][0]["w"]), tree["layers"][0]["w"])


def test_donating_an_array_that_appears_twice_loses_nothing() -> None:
    """The same input twice (or two inputs sharing buffers): deleted only
    once every leaf that uses it has its new array."""
    train_mesh, rollout_mesh = _meshes()
    train = sr.loads("mesh data, model\nrules params:\n  default -> (data, model)\n")
    rollout = sr.loads('mesh model\nrules params:\n  "a" -> (_, model)\n  "b" -> (model, _)\n')
    value = np.arange(48, dtype=np.float32).reshape(6, 8)
    x = sr.apply({"a": value}, train, train_mesh)["a"]
    out = sr.transfer(train, rollout, train_mesh, rollout_mesh).run(
        {"a": x, "b": x}, max_bytes_in_flight=16, donate=True
    )
    assert x.is_deleted()
    assert np.array_equal(np.asarray(out["a"]), value) and np.array_equal(np.asarray(out["b"]), value)
    assert out["b"].sharding.spec == P("model", None)


def test_reshard_under_a_cap_keeps_what_is_in_place_and_moves_the_rest_to_the_mesh() -> None:
    """`reshard`'s contract under a cap too: an array already in its planned
    sharding is returned as it is; one in the same blocks on a mesh of other
    axis names comes back on the target mesh."""
    mesh = _explicit((4, 2), ("data", "model"))
    renamed = _explicit((4, 2), ("replica", "tensor"))
    rules = sr.loads("mesh data, model\nrules params:\n  default -> (data, model)\n")
    renamed_rules = sr.loads("mesh replica, tensor\nrules params:\n  default -> (replica, tensor)\n")
    placed = sr.apply({"w": np.ones((8, 8), np.float32)}, rules, mesh)
    same = sr.reshard(placed, rules, mesh, max_bytes_in_flight=64)
    assert same["w"] is placed["w"]
    moved = sr.reshard(placed, renamed_rules, renamed, max_bytes_in_flight=64)
    assert moved["w"].sharding.mesh == renamed and not _buffers(moved["w"]) & _buffers(placed["w"])


def test_what_the_target_layout_leaves_whole_or_misses_is_said() -> None:
    """As `apply` and `reshard` do: a target rule matching nothing (SR201),
    and more of the tree replicated than the tolerance (SR116), warned once
    when the transfer is planned, pointing at the caller."""
    train_mesh, rollout_mesh = _meshes()
    train = sr.loads("mesh data, model\nrules params:\n  default -> (data, model)\n")
    whole = sr.loads('mesh model\nrules params:\n  "nothing" -> (model)\n  default -> replicated\n')
    shapes = {k: jax.ShapeDtypeStruct((4098, 4098), np.float32) for k in ("w", "b")}  # 128 MiB whole
    with pytest.warns(sr.ShardRulesWarning) as caught:
        sr.transfer(train, whole, train_mesh, rollout_mesh, shapes=shapes)
    codes = {w.message.code for w in caught}  # type: ignore[union-attr]
    assert {"SR201", "SR116"} <= codes, codes
    assert all(w.filename == __file__ for w in caught), [w.filename for w in caught]
    t = sr.transfer(train, whole, train_mesh, rollout_mesh)
    with pytest.warns(sr.ShardRulesWarning) as caught:
        t.plan_for(shapes)  # a new transfer plans again, and says so again: at the caller of plan_for
    assert all(w.filename == __file__ for w in caught), [w.filename for w in caught]
