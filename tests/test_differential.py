"""Differential tests against JAX itself.

For random shapes and specs on real (simulated) meshes: our plan is accepted
exactly when `jax.device_put` accepts the same sharding, and every plan we accept
places data with the shard shapes and byte counts we predicted.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from hypothesis import assume, given, note
from hypothesis import strategies as st
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardrules as sr


def _mesh(shape, names):
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names))


MESHES = [
    _mesh((2, 2, 2), ("data", "fsdp", "model")),
    _mesh((4, 2), ("data", "model")),
    _mesh((8,), ("fsdp",)),
    _mesh((2, 4), ("fsdp", "model")),
]
DIMS = [1, 2, 3, 4, 6, 8, 12, 16]


@st.composite
def cases(draw, optional=False, unknown=True):
    mesh = draw(st.sampled_from(MESHES))
    names = list(mesh.axis_names) + (["modle"] if unknown else [])
    shape = tuple(draw(st.lists(st.sampled_from(DIMS), min_size=1, max_size=3)))
    entries = []
    for _ in shape:
        kind = draw(st.sampled_from(["none", "axis", "tuple"]))
        if kind == "none":
            entries.append(None)
        elif kind == "axis":
            entries.append(draw(st.sampled_from(names)))
        else:
            entries.append(tuple(draw(st.lists(st.sampled_from(names), min_size=2, max_size=2))))
    marks = [draw(st.booleans()) if optional else False for _ in shape]
    return mesh, shape, entries, marks


def _entry_text(entry, optional):
    q = "?" if optional else ""
    if entry is None:
        return "_"
    if isinstance(entry, tuple):
        return "(" + ", ".join(a + q for a in entry) + ")"
    return entry + q


def _rules(entries, marks):
    spec = ", ".join(_entry_text(e, m) for e, m in zip(entries, marks, strict=True))
    return sr.loads(f'rules params:\n  "w" -> ({spec})\n', name="diff.shard")


def _jax_accepts(value, mesh, spec):
    try:
        out = jax.device_put(value, NamedSharding(mesh, spec))
    except Exception as err:  # any refusal by JAX counts, whatever its class
        note(f"jax refused: {type(err).__name__}: {str(err)[:200]}")
        return None
    return out


@given(cases())
def test_our_verdict_matches_device_put(case):
    mesh, shape, entries, _ = case
    value = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    plan = sr.plan({"w": value}, _rules(entries, [False] * len(entries)), mesh)
    note(f"shape={shape} entries={entries} mesh={dict(mesh.shape)} diagnostics={plan.diagnostics}")
    # Size-1 arrays are replicated without consulting the rule (semantics 4).
    assume(math.prod(shape) > 1)
    placed = _jax_accepts(value, mesh, P(*entries))
    assert plan.ok == (placed is not None)
    if placed is not None:
        assert plan["w"].spec == P(*entries)
        assert {s.data.nbytes for s in placed.addressable_shards} == {plan["w"].bytes_per_device}
        np.testing.assert_array_equal(np.asarray(placed), value)


@given(cases(optional=True, unknown=False))
def test_optional_axes_always_give_a_spec_jax_accepts(case):
    mesh, shape, entries, marks = case
    value = np.ones(shape, np.float32)
    plan = sr.plan({"w": value}, _rules(entries, marks), mesh)
    note(f"shape={shape} entries={entries} marks={marks} diagnostics={plan.diagnostics}")
    flat = [a for e in entries if e is not None for a in (e if isinstance(e, tuple) else (e,))]
    if len(set(flat)) < len(flat):
        assert [d.code for d in plan.errors] == ["SR102"]
        return
    if any(m for m in marks) and all(m or e is None for e, m in zip(entries, marks, strict=True)):
        # Only optional axes: the plan can always be made.
        assert plan.ok
    if not plan.ok:
        assert {d.code for d in plan.errors} == {"SR104"}
        return
    spec = plan["w"].spec
    placed = _jax_accepts(value, mesh, spec)
    assert placed is not None
    assert max(s.data.nbytes for s in placed.addressable_shards) == plan["w"].bytes_per_device
    # A kept axis is one the user wrote for that dimension, and it divides it.
    for dim, (got, wrote) in enumerate(zip(spec, entries, strict=True)):
        got_axes = () if got is None else (got if isinstance(got, tuple) else (got,))
        wrote_axes = () if wrote is None else (wrote if isinstance(wrote, tuple) else (wrote,))
        assert set(got_axes) <= set(wrote_axes)
        assert shape[dim] % math.prod(mesh.shape[a] for a in got_axes) == 0


@given(
    st.sampled_from(MESHES),
    st.lists(st.sampled_from([*DIMS, 24, 48, 96, 1000]), min_size=0, max_size=4),
    st.sampled_from(["1B", "64B", "1KiB", "1MiB"]),
)
def test_auto_always_gives_a_spec_jax_accepts(mesh, shape, min_bytes):
    assume(math.prod(shape) <= 1 << 18)  # up to 1 MiB of float32
    axis = mesh.axis_names[-1]
    rules = sr.loads(f"rules params:\n  default -> auto({axis}, min_bytes={min_bytes})\n")
    value = np.ones(tuple(shape), np.float32)
    plan = sr.plan({"w": value}, rules, mesh)
    assert plan.ok, plan.diagnostics
    spec = plan["w"].spec
    assert len(spec) == len(shape)
    assert sum(e is not None for e in spec) <= 1
    placed = _jax_accepts(value, mesh, spec)
    assert placed is not None
    assert max(s.data.nbytes for s in placed.addressable_shards) == plan["w"].bytes_per_device
    sharded = [d for d, e in enumerate(spec) if e is not None]
    size = mesh.shape[axis]
    divisible = [d for d, n in enumerate(shape) if n % size == 0 and n >= size]
    big_enough = value.nbytes >= {"1B": 1, "64B": 64, "1KiB": 1024, "1MiB": 1 << 20}[min_bytes]
    if sharded:
        (dim,) = sharded
        assert big_enough
        largest = max(shape[d] for d in divisible)
        assert dim == next(d for d in divisible if shape[d] == largest)  # ties: the first
    else:
        assert not divisible or not big_enough or value.size == 1


def test_the_reverse_direction_on_known_refusals(mesh222):
    """Each thing JAX refuses, we refuse first, with our own code."""
    value = np.ones((6, 4), np.float32)
    for text, code in [
        ('"w" -> (modle, _)', "SR101"),
        ('"w" -> (data, data)', "SR102"),
        ('"w" -> (data, _, _)', "SR103"),
        ('"w" -> ((data, fsdp), _)', "SR104"),
    ]:
        plan = sr.plan({"w": value}, sr.loads(f"rules params:\n  {text}\n"), mesh222)
        assert [d.code for d in plan.errors] == [code], text


def _dtypes_numpy_can_make():
    """Every dtype character NumPy has, the ml_dtypes types (bfloat16, float8_*,
    int4, ...), and dtypes only a description gives (records, other byte order)."""
    import ml_dtypes

    found = []
    for char in sorted(set(np.typecodes["All"]) | {"T", "V", "S", "U", "O", "g", "G", "M", "m"}):
        try:
            found.append(np.dtype(char))
        except TypeError:
            continue
    for name in dir(ml_dtypes):
        kind = getattr(ml_dtypes, name)
        if isinstance(kind, type) and issubclass(kind, np.generic):
            found.append(np.dtype(kind))
    found += [np.dtype(d) for d in (">f4", ">i8", "<f8", "f4,i4", "V8", "U3", "S3", "M8[s]", "m8[ns]")]
    found.append(np.dtype(jax.dtypes.float0))
    made = []
    for dtype in dict.fromkeys(found):
        try:
            made.append((dtype, np.zeros((2,), dtype)))
        except (TypeError, ValueError):
            continue
    return made


@pytest.mark.parametrize("x64", [False, True])
def test_the_dtypes_we_refuse_are_those_device_put_refuses(x64):
    """SR115 is reported for exactly the dtypes `jax.device_put` refuses (onto a
    device: `apply` always names one; with none, JAX refuses NumPy's
    variable-width strings only because they may live on CPU devices only)."""
    rules = sr.loads("rules params:\n  default -> replicated\n")
    accepted, refused = [], []
    with jax.enable_x64(x64):
        for dtype, value in _dtypes_numpy_can_make():
            try:
                jax.block_until_ready(jax.device_put(value, jax.devices()[0]))  # float0 comes back as it went
                jax_holds = True
            except Exception:  # TypeError for most; the runtime's error for float6
                jax_holds = False
            ours = [d for d in sr.plan({"x": value}, rules, {}).errors if d.code == "SR115"]
            assert (not ours) == jax_holds, (dtype, ours)
            (accepted if jax_holds else refused).append(dtype)
    assert {np.dtype(np.float64), np.dtype("int4"), np.dtype("bfloat16")} <= set(accepted)
    assert {np.dtype(object), np.dtype("f4,i4"), np.dtype(">f4")} <= set(refused)
    assert len(accepted) >= 25 and len(refused) >= 8, (accepted, refused)
