"""A campaign against `suggest`: generated model-like trees (transformers'
numbered layers, Flax scan stacks, MaxText's stacked layers, mixtures of
experts stacked or one array per expert, convolutional networks, names of any
kind: letters above U+00FF, non-ASCII digits, `*` keys, hundreds of layers,
odd hidden sizes) on generated meshes, under every strategy.

Every draft loads, lints clean (no error, no warning it does not
acknowledge), is left as it is by `fmt`, and says what `sr.plan` does with
it: each rule takes the arrays its comment counts, each leaf listed under
`default` gets the listed spec, and the header's bytes per device are the
plan's (`_suggest_trees.check_draft`). A strategy the mesh or model cannot
carry is refused with a `ValueError` saying why, and nothing else escapes.

The default profile draws 100 examples (seconds); `HYPOTHESIS_PROFILE=deep`
draws more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _suggest_trees import check_draft, draft, meshes, models, options, strategies
from hypothesis import HealthCheck, given, note, settings

import shardrules as sr

EXAMPLES = settings().max_examples


@settings(
    max_examples=EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(tree=models, mesh=meshes(), strategy=strategies, chosen=options)
def test_every_draft_loads_lints_clean_and_says_what_the_plan_does(
    tree: Any,
    mesh: dict[str, int],
    strategy: str,
    chosen: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    note(f"mesh {mesh}, strategy {strategy}, options {chosen}")
    text = draft(tree, mesh, strategy, **chosen)
    if text is None:
        return
    note(text)
    check_draft(text, tree, mesh, tmp_path_factory.mktemp("draft"))


def test_the_campaign_check_finds_a_draft_that_says_otherwise(tmp_path: Path) -> None:
    """The check is not vacuous: a count, a listed spec or the bytes per device
    that disagree with the plan are each caught."""
    from _suggest_trees import S

    tree = {
        "model.layers.0.mlp.up_proj.weight": S(1024, 256),
        "model.norm.weight": S(256),
        "other": S(1024, 1024),
    }
    mesh = {"fsdp": 4}
    text = sr.suggest(tree, mesh, "fsdp")
    check_draft(text, tree, mesh, tmp_path)
    for old, new in (
        ("MLP in (gate/up): 1 array", "MLP in (gate/up): 2 arrays"),
        ("-> P('fsdp', None)", "-> P(None, 'fsdp')"),
        ("device, against", None),
    ):
        assert old in text, (old, text)
        changed = text.replace(old, new, 1) if new is not None else _other_bytes(text)
        assert changed != text
        with pytest.raises(AssertionError):
            check_draft(changed, tree, mesh, tmp_path)


def _other_bytes(text: str) -> str:
    import re

    return re.sub(
        r"[\d.]+ (?:B|KiB|MiB|GiB)(?=\s+(?:#\s+)?per\s+(?:#\s+)?device)", "999.0 GiB", text, count=1
    )
