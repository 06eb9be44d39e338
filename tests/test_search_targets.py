"""A search for a target's chips: the screen (a step compiled on simulated CPU
devices, timed with the chip's figures) and, for a TPU topology, the best
screened candidates compiled by the TPU compiler (where libtpu is installed:
`pip install 'shardrules[tpu]'`)."""

from __future__ import annotations

import jax
import pytest
from test_search import _params, make_step

import shardrules as sr
from shardrules._costs import _targets
from shardrules._costs._screen import NOTE, screened
from shardrules._costs._targets import parse_target
from shardrules._search._candidates import with_groups
from shardrules._search._search import CONFIRM, search

tpu = pytest.mark.skipif(
    not _targets.has_libtpu(), reason="libtpu is not installed: pip install 'shardrules[tpu]'"
)


def _step(sizes: dict[str, int], strategy: str):
    """`make_step` for `suggest`'s draft on `sizes`, with the step's groups."""
    groups = type("P", (), {"params": "params", "weights": ("opt",), "batches": ("batch",)})
    rules = sr.loads(with_groups(sr.suggest(_params(), sizes, strategy=strategy), groups))  # type: ignore[arg-type]
    explicit = (jax.sharding.AxisType.Explicit,) * len(sizes)
    mesh = jax.make_mesh(tuple(sizes.values()), tuple(sizes), axis_types=explicit, devices=jax.devices()[:8])
    return make_step(rules, mesh)


@pytest.mark.parametrize(("sizes", "strategy"), [({"fsdp": 4, "model": 2}, "fsdp+tp"), ({"data": 8}, "dp")])
def test_a_screen_is_the_cpu_cost_with_the_chips_figures(sizes, strategy) -> None:
    """Compiled for its figures only, a step's FLOPs, bytes and collectives
    are those `step.cost` reads off the full compile; with a GPU's figures,
    so is the estimate."""
    step, args = _step(sizes, strategy)
    h100 = parse_target("h100")
    fast = screened(step, args, h100)
    full = step.cost(*args, ideal=False, target="h100")
    assert fast.flops_per_device == full.flops_per_device
    assert [(c.kind, c.count, c.bytes_per_device) for c in fast.collectives] == [
        (c.kind, c.count, c.bytes_per_device) for c in full.collectives
    ]
    assert fast.peak_bytes_per_device == full.peak_bytes_per_device
    assert fast.time_estimate_s == pytest.approx(full.time_estimate_s, rel=1e-9)
    assert fast.target == "h100" and NOTE not in fast.notes  # the same figures: nothing to say


@tpu
def test_a_tpu_search_screens_every_candidate_and_compiles_the_best_for_the_tpu() -> None:
    found = search(make_step, 8, target="v5e:2x4")
    live = [r for r in found.rows if r.screen is not None]
    assert len(live) > CONFIRM
    compiled = [r for r in found.rows if r.cost is not None]
    assert CONFIRM <= len(compiled) < len(live)
    for r in compiled:
        assert r.cost.target == "v5e:2x4" and r.cost.compiler == "tpu" and r.screen is not None
    assert all(NOTE in r.screen.notes for r in live)  # a CPU compile's figures, said so
    best_screens = sorted(live, key=lambda r: r.screen.time_estimate_s)[:CONFIRM]
    assert all(r.cost is not None for r in best_screens)
    assert found.chosen in compiled and found.chosen.cost.fits
    assert found.chosen.cost.time_estimate_s == min(r.cost.time_estimate_s for r in compiled)
    assert {r.status for r in live if r.cost is None} == {"screened"}

    sweep = search(make_step, 8, target="v5e:2x4", exhaustive=True)
    every = [r for r in sweep.rows if r.cost is not None]
    assert len(every) == len(live) and not any(r.screen for r in sweep.rows)
    assert sweep.chosen.cost.time_estimate_s <= found.chosen.cost.time_estimate_s


@tpu
def test_a_mesh_the_topology_cannot_lay_out_is_set_aside() -> None:
    """`jax.make_mesh` maps each axis to whole dimensions of a slice: on a
    4x4x4 v5p slice an axis of 2 would split a ring of 4."""
    from shardrules._search._search import _unplaced

    v5p = parse_target("v5p:4x4x4")
    assert _unplaced(v5p, {"fsdp": 16, "model": 4}) == ""
    assert _unplaced(v5p, {"fsdp": 64}) == ""
    why = _unplaced(v5p, {"fsdp": 32, "model": 2})
    assert why == (
        "jax.make_mesh lays each axis over whole dimensions of v5p:4x4x4's 4x4x4 chips, so an axis has "
        "4, 16, 64 of them; fsdp=32, model=2 is not"
    )
