"""`suggest`: a first rule file for a model, from its paths and shapes.

The steps: the tree's arrays as kinds (`_leaves`), what each is by its names
(`_roles`) and the model's sizes (`_facts`), which dimension of each is which
(`_dims`), the strategy's aliases on the mesh (`_strategy`), rules for the
kinds (`_draft`) with patterns telling them apart (`_patterns`), and the text
(`_text`). The text is loaded, and each kind's spec and bytes per device
worked out by the planner's own code, before it is returned; a budget
(`max_bytes_per_device`) is checked there.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

from .._errors import ShardRulesError
from .._language._format import format_text
from .._language._load import loads
from .._language._sizes import byte_size
from .._planning._check import DEFAULT_REPLICATED_THRESHOLD
from .._planning._mesh import sizes_of
from .._planning._plan import format_bytes
from . import _largest as L
from . import _roles as R
from . import _text as T
from ._draft import EMBEDDINGS, Draft, draft, embedding_layouts, replication_findings, say_whole
from ._facts import facts_of
from ._findings import acknowledge_whole, batch_for_unused, mostly_replicated, planned
from ._leaves import Kind, holds_haliax, kinds_of
from ._patterns import patterns, shared_paths
from ._roles import DESCRIPTIONS
from ._strategy import STRATEGIES, Layout, StrategyError, choose

DEFAULT_MIN_BYTES = 1 << 20
WHOLE_LIMIT = DEFAULT_REPLICATED_THRESHOLD
"""A recognised array this large that its role's rule would leave whole on
every device (no dimension of its role divides) is left to `default`
instead, which splits it by shape: lint warns about such arrays (SR204)."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NOT_NAMES = {"_", "auto", "explicit", "unconstrained"}
_MAXTEXT = {"token_embedder", "logits_dense", "decoder_norm"}


@dataclasses.dataclass(frozen=True)
class Suggestion:
    """A drafted rule file and what it comes to (for the command line)."""

    text: str
    strategy: str
    rules: int  # rules with a pattern
    arrays: int
    total_bytes: int
    bytes_per_device: int
    by_shape: int  # arrays left to `default`
    over_budget: bool
    replicated: str = ""  # what lint's SR116 would say of it (an error), or ""


def suggest(
    tree: Any,
    mesh: Any,
    strategy: str = "auto",
    *,
    max_bytes_per_device: int | None = None,
    head_dim: int | None = None,
    min_bytes: int | str = DEFAULT_MIN_BYTES,
    embedding: str | None = None,
    fsdp_dim: str = "embed",
) -> str:
    """Draft a rule file for `tree` on `mesh`.

    Each array is given a role by the names in its path (embedding, attention
    q/k/v and output, MLP in and out, experts, router, norms, biases, output
    head, convolutions), in the conventions of transformers checkpoints, Flax
    linen and NNX, MaxText, Equinox, keras-hub, penzai, dm-haiku and gemma;
    its dimensions are read from its shape (the hidden size, stacked layers, stacked experts,
    heads). One rule per role lays it out through aliases for the logical
    dimensions (`embed`, `heads`, `mlp`, `vocab`, `experts`), which the
    strategy sets to mesh axes. Arrays whose names are not recognised are left
    to `default -> auto(...)` (their largest dimension that divides, if at
    least `min_bytes`), and listed in a comment. The file passes
    `shardrules lint` on the shapes it was drafted from (unless
    `embedding="whole"` keeps a large embedding whole, which it then says),
    and `shardrules fmt` leaves it as it is: a large array it keeps whole on
    purpose (under `"dp"`, or where no dimension divides) has its line
    acknowledge lint's SR204 with a note, and a mesh axis that splits no
    weight splits the batch. See [the cookbook](cookbook/suggest.md).

    **Arguments:**

    - `tree`: a pytree of arrays or `jax.ShapeDtypeStruct`s (for instance what
      `load_shapes` reads from a checkpoint's headers).
    - `mesh`: a dict of axis sizes (`{"fsdp": 4, "model": 2}`, in mesh order)
      or a `jax.sharding.Mesh` / `AbstractMesh`. Axes are known by their
      names: `model`, `tensor`, `tp`, `mp` are tensor-parallel; `expert`,
      `ep` expert-parallel; `data`, `dp`, `batch` (and pipeline axes) split
      only the batch; `fsdp` and any other name split weights (FSDP).
    - `strategy`: `"fsdp"`, `"tp"` (Megatron: q/k/v and gate/up
      column-parallel, o and down row-parallel, output head and, but see
      `embedding`, embedding vocab-parallel), `"fsdp+tp"`, `"ep"` (stacked
      experts over the expert axis, FSDP and tensor parallelism inside),
      `"dp"` (every weight whole on every device), or `"auto"`, which picks
      by the mesh's axis names and the model's size.
    - `max_bytes_per_device`: a budget for the weights on each device. Under
      `"auto"`, a strategy that meets it is preferred; the file says whether it
      is met, and if not which arrays take the most.
    - `head_dim`: the width of an attention head, to count the heads of a
      `(heads × head_dim, hidden)` weight (default: read from the shapes where
      they show it, else 128 where that divides the attention projections'
      widths, else the widest under 128 that does).
    - `min_bytes`: arrays smaller than this that `default` lays out stay whole
      (bytes, or a size such as `"1MiB"`); under `fsdp_dim="largest"`, every
      array smaller than this stays whole.
    - `fsdp_dim`: the dimension `"fsdp"` splits: `"embed"` (default) the
      hidden size of every weight, as MaxText does; `"largest"` each array's
      largest dimension that the FSDP axes divide (of equal ones the last),
      as kauldron's `FSDPSharding` does (with `min_bytes=4 * 2**20 + 1`: it
      keeps arrays of at most 4 MiB whole). Each role's rule names the
      dimension it splits; a leaf not recognised by name is left to
      `default -> auto(...)` unless `auto` would take another of its equal
      largest dimensions, when it gets a rule of its own.
    - `embedding`: the token embedding's vocabulary, where the strategy splits
      the vocabulary (`"tp"`, `"fsdp+tp"`, `"ep"` on a mesh with a
      tensor-parallel axis): `"vocab"` splits it (vocab-parallel: an
      all-reduce of the looked-up rows), `"whole"` keeps it whole (its hidden
      size still split where the strategy splits it). `None` (default): whole
      for transformers' names with a separate output head (`lm_head`), as
      transformers' tp plans do an untied embedding, unless the plan would
      then be mostly replicated (SR116) or miss `max_bytes_per_device`;
      vocab-parallel otherwise (a tied embedding, other conventions). The
      rule's comment says which, and why. An embedding kept whole that is
      64 MiB or more has its rule line acknowledge lint's warning about it
      (`# noqa: SR204`), so the file passes lint and says the copy on every
      device is meant.

    **Returns:** the rule file's text (canonical layout, ending in a newline).

    **Raises:** `ValueError` for an unknown strategy, one the mesh cannot
    carry (`"tp"` without a tensor-parallel axis, `"ep"` without an expert axis
    or experts, or one whose axes divide so few of the weights' dimensions
    that most of the weights would be whole on every device, lint's SR116:
    `"auto"` then drafts `"dp"` and says why), `fsdp_dim="largest"` with a
    strategy other than `"fsdp"`, an unknown `embedding` or `fsdp_dim`, a tree
    with no arrays, or a mesh axis name that a rule file cannot write;
    `TypeError` for a `mesh` of another type.

    ```python
    import jax, jax.numpy as jnp
    S = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    params = {"embed_tokens": {"weight": S(32000, 4096)}, "lm_head": {"weight": S(32000, 4096)}}
    print(sr.suggest(params, {"fsdp": 4, "model": 2}, strategy="fsdp+tp"))
    ```
    """
    return drafted(
        tree,
        mesh,
        strategy,
        max_bytes_per_device=max_bytes_per_device,
        head_dim=head_dim,
        min_bytes=min_bytes,
        embedding=embedding,
        fsdp_dim=fsdp_dim,
    ).text


def drafted(
    tree: Any,
    mesh: Any,
    strategy: str = "auto",
    *,
    max_bytes_per_device: int | None = None,
    head_dim: int | None = None,
    min_bytes: int | str = DEFAULT_MIN_BYTES,
    embedding: str | None = None,
    fsdp_dim: str = "embed",
) -> Suggestion:
    """`suggest`, with what the file comes to."""
    if strategy not in STRATEGIES:
        raise StrategyError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if head_dim is not None and (not isinstance(head_dim, int) or head_dim < 1):
        raise ValueError(f"head_dim must be a positive int, not {head_dim!r}")
    if embedding is not None and embedding not in EMBEDDINGS:
        raise ValueError(f"embedding must be 'vocab', 'whole' or None, not {embedding!r}")
    if fsdp_dim not in L.DIMS:
        raise ValueError(f"fsdp_dim must be 'embed' or 'largest', not {fsdp_dim!r}")
    if fsdp_dim == "largest" and strategy != "fsdp":
        raise StrategyError(
            f"fsdp_dim='largest' lays weights out for strategy 'fsdp', not {strategy!r}: pass "
            "strategy='fsdp' with it (or leave fsdp_dim at 'embed')",
            cli=f"--fsdp-dim largest lays weights out for --strategy fsdp, not {strategy}: add --strategy "
            "fsdp (or leave out --fsdp-dim)",
        )
    min_bytes = byte_size(min_bytes)
    sizes = _sizes(mesh)
    kinds = kinds_of(tree)
    if not kinds:
        raise ValueError("the tree has no arrays to lay out (scalars and size-1 arrays need no rule)")
    facts = facts_of(kinds, head_dim)
    maxtext = any(_MAXTEXT & set(k.lower) or any(t.startswith("moeblock") for t in k.lower) for k in kinds)
    experts = [r for r in facts.roles if r is not None and r.name in (R.EXPERT_IN, R.EXPERT_OUT)]
    total = sum(k.nbytes for k in kinds)
    options: dict[str, Any] = {
        "total_bytes": total,
        "stacked_experts": any(not r.per_expert for r in experts),
    }
    options["any_experts"] = bool(experts)
    options["hidden"] = facts.hidden if fsdp_dim == "embed" else None  # largest: every FSDP axis
    first = choose(strategy, sizes, **options)
    if fsdp_dim == "largest":
        first = dataclasses.replace(first, targets=L.targets(first), fsdp_dim=fsdp_dim, min_bytes=min_bytes)
    settings = (maxtext, min_bytes, max_bytes_per_device, embedding, holds_haliax(tree))
    best = _write(kinds, facts, first, sizes, *settings)
    if best.replicated:  # lint's SR116, which no line can acknowledge
        if fsdp_dim == "largest":
            whole = "those no dimension of which the axes divide, are whole"
            raise StrategyError(
                f"fsdp_dim='largest' with min_bytes={min_bytes} would leave {best.replicated}: arrays under "
                f"min_bytes, and {whole}. Lower min_bytes, or pass fsdp_dim='embed'",
                cli=f"--fsdp-dim largest with --min-bytes {min_bytes} would leave {best.replicated}: arrays "
                f"under --min-bytes, and {whole}. Lower --min-bytes, or pass --fsdp-dim embed",
            )
        if strategy != "auto":
            raise StrategyError(
                f"strategy {strategy} on {', '.join(f'{a}={n}' for a, n in sizes.items())} would leave "
                f"{best.replicated}: the axes divide too few of the weights' dimensions. Choose strategy "
                "dp (every device holds the model whole, as the file then says), or a mesh whose axis "
                f"sizes divide the model's ({'hidden size ' + str(facts.hidden) if facts.hidden else 'sizes'})"
            )
        for layout in _other_layouts(("fsdp+tp", "fsdp", "dp"), first, sizes, options):
            why = f"{first.strategy} would leave {best.replicated.split(', over')[0]}"
            candidate = _write(kinds, facts, dataclasses.replace(layout, why=why), sizes, *settings)
            if not candidate.replicated:
                best = candidate
                break
    if strategy == "auto" and best.over_budget:  # another strategy may split more of the weights
        for layout in _other_layouts(("ep", "fsdp+tp", "fsdp"), first, sizes, options):
            layout = dataclasses.replace(layout, why=f"{first.strategy} is over the budget")
            candidate = _write(kinds, facts, layout, sizes, *settings)
            if not candidate.replicated and candidate.bytes_per_device < best.bytes_per_device:
                best = candidate
            if not best.over_budget:
                break
    return best


def _other_layouts(
    strategies: tuple[str, ...], first: Layout, sizes: dict[str, int], options: dict[str, Any]
) -> Iterator[Layout]:
    """The layouts of `strategies` that fit `sizes` and differ from `first`'s strategy, in order."""
    for other in strategies:
        try:
            layout = choose(other, sizes, **options)
        except StrategyError:
            continue
        if layout.strategy != first.strategy:
            yield layout


def _sizes(mesh: Any) -> dict[str, int]:
    sizes = sizes_of(mesh)
    if not sizes:
        raise ValueError("the mesh has no axes")
    for name in sizes:
        if _NAME.fullmatch(name) is None or name in _NOT_NAMES:
            raise ValueError(f"mesh axis {name!r} cannot be named in a rule file; rename it")
    return sizes


def _write(
    kinds: list[Kind],
    facts: Any,
    layout: Layout,
    sizes: dict[str, int],
    maxtext: bool,
    min_bytes: int,
    budget: int | None,
    embedding: str | None,
    haliax: bool = False,
) -> Suggestion:
    default = f"auto({_axes(layout.fallback)}, min_bytes={min_bytes})" if layout.fallback else "replicated"
    moved: dict[int, str] = {}  # recognised kinds left to `default`, and why
    split: dict[int, str] = {}  # embeddings the convention keeps whole that lint would report, and why
    while True:
        vocab = embedding_layouts(kinds, facts, layout, embedding, split)
        kept = {i for i, (whole, _) in vocab.items() if whole}  # vocabulary whole
        asked = kept if embedding == "whole" else set()
        rules, fallback = draft(
            kinds,
            facts,
            layout,
            sizes,
            maxtext=maxtext,
            by_shape=frozenset(moved),
            vocab=vocab,
            haliax=haliax,
        )
        clash = shared_paths(kinds, rules, fallback)
        if clash:  # no pattern can tell them apart: each layer's leaves by their own shape
            moved |= {i: "a path it shares with leaves of another layout" for i in clash}
            continue
        found_patterns = patterns([[kinds[i] for i in r.kinds] for r in rules], [kinds[i] for i in fallback])
        missing = {i for r, p in zip(rules, found_patterns, strict=True) if p is None for i in r.kinds}
        if missing:  # no pattern small enough tells them apart: by their shape
            moved |= {i: "no rule pattern small enough tells its paths from the others'" for i in missing}
            continue
        regexes = [p for p in found_patterns if p is not None]
        body = _body(kinds, rules, regexes, layout, sizes, default, [])
        loaded = loads("\n".join(body) + "\n", name="<suggest>")
        specs, per_device, kept_whole = planned(kinds, rules, fallback, loaded, sizes)
        whole = {
            i
            for r in rules
            for i in r.kinds
            if i in kept_whole and kinds[i].leaf_bytes >= WHOLE_LIMIT and i not in kept
        }
        if whole and layout.fallback:
            moved |= {i: "its rule would keep it whole on every device" for i in whole}
            continue
        found = {i: replication_findings(kinds, kept_whole, i) for i in kept & kept_whole}
        lint = {i: why["SR116"] for i, why in found.items() if "SR116" in why and i not in asked}
        if lint:  # the convention's whole vocabulary would make the plan mostly replicated: vocab-parallel
            split |= lint
            continue
        if budget is not None and sum(per_device.values()) > budget:  # a budget before a convention
            why = f"the weights over the budget of {format_bytes(budget)} per device"
            yields = {i: why for i in kept - asked}
            if yields:
                split |= yields
                continue
        break
    say_whole(rules, found, asked)
    acknowledged = acknowledge_whole(rules, kinds, kept_whole, fallback, layout, sizes)
    layout, idle = batch_for_unused(layout, rules, sizes)
    replicated = mostly_replicated(kinds, kept_whole, rules, layout, sizes, asked)
    total = sum(k.nbytes for k in kinds)
    need = sum(per_device.values())
    over = budget is not None and need > budget
    unknown = [i for i in fallback if i not in moved]
    moved = {i: f"{_described(facts.roles[i])}: {why}" for i, why in moved.items()}
    listing = T.fallback_lines(unknown, moved, kinds, specs)
    listing += [line for note in acknowledged for line in T.comment_lines(note, "  ")]
    header = T.header(kinds, facts, layout, sizes, total, need, budget, per_device, specs, idle)
    noqa = "  # noqa: SR204" if acknowledged else ""
    body = _body(kinds, rules, regexes, layout, sizes, default + noqa, listing)
    text = "\n".join([*header, "", *body]) + "\n"
    text = format_text(text, "<suggest>")
    try:
        loads(text, name="<suggest>")
    except ShardRulesError as err:  # a bug here, not in the input: say what was drafted
        raise AssertionError(f"the drafted rules do not load:\n{err}\n\n{text}") from None
    return Suggestion(
        text,
        layout.strategy,
        len(rules),
        sum(k.count for k in kinds),
        total,
        need,
        sum(kinds[i].count for i in fallback),
        over,
        replicated,
    )


def _described(role: Any) -> str:
    return "not recognised by name" if role is None else DESCRIPTIONS[role.name]


def _axes(axes: tuple[str, ...]) -> str:
    return axes[0] if len(axes) == 1 else "(" + ", ".join(axes) + ")"


def _body(
    kinds: list[Kind],
    rules: list[Draft],
    regexes: list[str],
    layout: Layout,
    sizes: dict[str, int],
    default: str,
    listing: list[str],
) -> list[str]:
    used = {e for r in rules if r.entries is not None for e in r.entries}
    lines = [T.mesh_line(sizes), "", *T.alias_lines(layout, used, sizes), "", "rules params:"]
    for rule, regex in zip(rules, regexes, strict=True):
        for note in rule.notes:
            lines += T.comment_lines(note, "  ")
        noqa = f"; noqa: {', '.join(sorted(rule.acknowledged))}" if rule.acknowledged else ""
        lines.append(
            f"  {T.literal(regex)} -> {rule.spec_text()}  "
            f"# {T.label(rule, layout)}: {T.covers(rule.kinds, kinds)}{noqa}"
        )
    lines += listing
    lines.append(f"  default -> {default}")
    lines += ["", "rules inputs:", f"  default -> ({layout.names['batch']}, ...)"]
    return lines
