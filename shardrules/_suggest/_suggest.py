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
from collections.abc import Callable, Iterator
from typing import Any

from .._language._sizes import byte_size
from .._planning._mesh import sizes_of
from . import _largest as L
from . import _roles as R
from ._draft import EMBEDDINGS
from ._facts import facts_of
from ._leaves import holds_haliax, kinds_of
from ._strategy import STRATEGIES, Layout, StrategyError, choose
from ._write import Suggestion
from ._write import write as _write

DEFAULT_MIN_BYTES = 1 << 20
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NOT_NAMES = {"_", "auto", "explicit", "unconstrained"}
_MAXTEXT = {"token_embedder", "logits_dense", "decoder_norm"}


def suggest(
    tree: Any = None,
    mesh: Any = None,
    strategy: str = "auto",
    *,
    max_bytes_per_device: int | None = None,
    head_dim: int | None = None,
    min_bytes: int | str = DEFAULT_MIN_BYTES,
    embedding: str | None = None,
    fsdp_dim: str = "embed",
    search: bool = False,
    step: Any = None,
    devices: int | None = None,
    target: str | None = None,
    hbm: int | str | None = None,
    hbm_headroom: float = 0.1,
    budget: float | None = None,
    progress: Callable[[str], None] | None = None,
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
    `TypeError` for a `mesh` of another type. A search: `TypeError` for a
    tree or a mesh given with it, or no step or device count; `ValueError`
    when no candidate fits, or for a step that returns something else than
    a step and its arguments, or arguments that change with the mesh.

    - `search`: choose the mesh and the strategy by what each candidate's
      step costs (see [the cookbook](cookbook/suggest.md#let-the-cost-choose)),
      with the arguments below; the tree and the mesh are then not given.

    **Search** (`search=True`): every mesh of `devices` devices over each
    strategy's axes (`data`, `fsdp`, `expert`, `model`) is drafted as above
    from the step's own weights; candidates whose batch does not divide, whose plan has an
    error, whose arguments alone do not fit, or whose layout is another's
    are set aside; the rest are compiled with `step.cost` (on `target`: a
    TPU topology's candidates are first screened on simulated CPU devices
    with the chip's figures and the best few compiled by the TPU compiler),
    and of those whose peak fits, the lowest estimated step time wins
    (without a target: the fewest FLOPs per device, then the fewest
    collective bytes). The file ends with a table of every candidate.

    - `step`: a function `(rules, mesh) -> (sr.jit step, example arguments)`,
      or its `"module:function"` name (as `--step` takes it); its arguments
      (arrays or `jax.ShapeDtypeStruct`s) must not change with the mesh.
      The group `params` (else the one holding the most bytes) is drafted as the weights; a group
      whose arrays share their leading dimension is a batch, split over the
      batch axes; each group of its arguments gets rules.
    - `devices`: how many devices (default: the TPU target's chips). On
      simulated CPU devices, JAX needs that many (`jax_num_cpu_devices`).
    - `target`: the chips (`"v5p:8x8x4"`, `"h100"`), as `step.cost` takes it.
    - `hbm`: the memory of one device (default: the target chip's), bytes or
      a size such as `"16GiB"`; `hbm_headroom`: the share of it kept free.
    - `budget`: seconds; the search stops when they run out, with the best
      found so far (the file says so).
    - `progress`: a function given a line of text per candidate compiled.
    - `strategy`: `"auto"` searches every strategy; another, only its meshes.

    ```python
    import jax, jax.numpy as jnp
    S = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    params = {"embed_tokens": {"weight": S(32000, 4096)}, "lm_head": {"weight": S(32000, 4096)}}
    print(sr.suggest(params, {"fsdp": 4, "model": 2}, strategy="fsdp+tp"))
    ```
    """
    if search:
        from .._search._api import searched  # the stage above: drafts compiled and costed

        return searched(
            tree,
            mesh,
            strategy,
            step=step,
            devices=devices,
            target=target,
            hbm=hbm,
            hbm_headroom=hbm_headroom,
            budget=budget,
            progress=progress,
            head_dim=head_dim,
            min_bytes=byte_size(min_bytes),
            embedding=embedding,
            others={"max_bytes_per_device=": max_bytes_per_device, "fsdp_dim=": fsdp_dim != "embed"},
        ).text
    for given, name in (
        (step, "step"),
        (devices, "devices"),
        (target, "target"),
        (hbm, "hbm"),
        (budget, "budget"),
    ):
        if given is not None:
            raise TypeError(f"{name}= is for a search: pass search=True with it (or leave it out)")
    if tree is None or mesh is None:
        raise TypeError(
            "suggest needs the tree and the mesh: sr.suggest(params, {'fsdp': 4, 'model': 2}), or "
            "sr.suggest(search=True, step=make_step, devices=8) to choose the mesh by cost"
        )
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
