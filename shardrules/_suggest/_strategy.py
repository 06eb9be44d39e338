"""Strategies: which mesh axes each logical role of a weight is split over.

Mesh axes are sorted by their names into kinds (an axis of size 1 splits
nothing and is left out):

- tensor-parallel: `model`, `tensor`, `tp`, `mp` (and names starting so);
- expert: `expert`, `experts`, `ep`, `exp`, `moe`;
- data: `data`, `dp`, `batch`, `replica`, `dcn`, `pod`, `ddp`, `diloco`, and
  pipeline axes (`stage`, `pipeline`, `pp`), which rule files cannot use for
  parameters: they split the batch;
- FSDP: `fsdp`, `zero`, `context` and `sequence` axes (as MaxText's `embed`
  rules), and any name not listed above.

Each strategy says what the aliases stand for:

| strategy | `embed` | `heads`, `mlp`, `vocab` | `experts` |
|---|---|---|---|
| `dp` | `_` | `_` | `_` |
| `fsdp` | FSDP, tensor and expert axes (data axes if none) | `_` | `_` |
| `tp` | `_` | tensor axes | `_` |
| `fsdp+tp` | FSDP (and expert) axes, else data axes | tensor axes | `_` |
| `ep` | FSDP and expert axes, else FSDP axes (else `_`) | tensor axes | expert axes |

Where the product of the axes `embed` stands for does not divide the
model's hidden size but some of them do (`fsdp=256, sequence=16` and a
hidden size of 2048), `embed` (and `default`'s `auto`) takes the largest
product of those axes that divides it (`fsdp`): the others hold copies of
the weights and split the batch, rather than every weight being left whole.

`batch` (the inputs' leading dimension) is every axis the parameters' own
dimensions are not split over for good: data axes, and FSDP and expert axes
(as MaxText's `data_sharding`). `auto` takes `ep` for a model with stacked
experts on a mesh with an expert axis, `dp` for a model under 64 MiB (every
device holds it whole), `fsdp+tp` (or `tp` alone) when the mesh has a tensor
axis, and `fsdp` otherwise.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re

STRATEGIES = ("auto", "dp", "fsdp", "tp", "fsdp+tp", "ep")
SMALL_MODEL_BYTES = 64 << 20
"""`auto` keeps models under this size whole on every device (data parallel)."""

_TP = re.compile(r"^(model|tensor|tp|mp|mdl)(_\w+)?$", re.I)
_EXPERT = re.compile(r"^(experts?|ep|exp|moe)$", re.I)
_DATA = re.compile(r"^(data|dp|batch|replicas?|dcn|pod|ddp|diloco|stage|pipeline|pp|pipe)(_\w+)?$", re.I)

ROLE_ALIASES = ("batch", "embed", "heads", "mlp", "vocab", "experts", "norm")
"""The aliases a drafted file may define, in the order of its `alias` lines."""
_OTHER_NAMES = {
    "batch": ("batch_dims", "data_batch"),
    "embed": ("hidden", "embed_dim"),
    "heads": ("attn_heads", "heads_dim"),
    "mlp": ("ffn", "mlp_dim"),
    "vocab": ("vocabulary", "vocab_dim"),
    "experts": ("moe_experts", "expert_dim"),
    "norm": ("norm_dim", "norms"),
}


class StrategyError(ValueError):
    """A strategy that cannot be used on this mesh or model, with what would work.

    **Arguments:**
    - `message`: the error, with its fix in Python's terms (`strategy='fsdp'`).
    - `cli`: the same in the command line's terms (`--strategy fsdp`), where
      they differ; `None` where the message says it in both."""

    def __init__(self, message: str, cli: str | None = None) -> None:
        super().__init__(message)
        self.cli = cli


Axes = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Layout:
    """A strategy made concrete on one mesh.

    `targets`: for each role alias, its alternatives (each a tuple of mesh
    axes; `()` is `_`), first first. `names`: the name each alias has in the
    file (its role's name unless the mesh has an axis of that name).
    `fallback`: the axes `default -> auto(...)` splits leaves over.
    """

    strategy: str
    why: str
    targets: dict[str, tuple[Axes, ...]]
    names: dict[str, str]
    fallback: Axes
    narrowed: str = ""  # why `embed` takes fewer axes than the strategy's (the hidden size)
    fsdp_dim: str = "embed"  # `largest`: each array's largest dimension that divides (`_largest`)
    min_bytes: int = 0  # under `largest`: arrays smaller than this are whole

    def axes(self, role: str) -> Axes:
        """The axes of the alias's first alternative."""
        return self.targets.get(role, ((),))[0]


def kinds_of_axes(sizes: dict[str, int]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"tp": [], "expert": [], "data": [], "fsdp": []}
    for name, size in sizes.items():
        if size == 1:
            continue
        kind = (
            "tp"
            if _TP.match(name)
            else "expert"
            if _EXPERT.match(name)
            else "data"
            if _DATA.match(name)
            else "fsdp"
        )
        out[kind].append(name)
    return out


def choose(
    strategy: str,
    sizes: dict[str, int],
    *,
    total_bytes: int,
    stacked_experts: bool,
    any_experts: bool,
    hidden: int | None = None,
) -> Layout:
    """The layout `strategy` gives on a mesh of `sizes`, for a model of
    `total_bytes` (with experts stacked in one array per layer, or any) and
    hidden size `hidden` (`None`: unknown)."""
    if strategy not in STRATEGIES:
        raise StrategyError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    axes = kinds_of_axes(sizes)
    tp, ep, data, fsdp = axes["tp"], axes["expert"], axes["data"], axes["fsdp"]
    why = ""
    if strategy == "auto":
        strategy, why = _auto(axes, total_bytes, stacked_experts)
    in_order = lambda names: tuple(n for n in sizes if n in names)  # noqa: E731 - mesh order
    targets: dict[str, tuple[Axes, ...]] = {}
    if strategy == "dp":
        targets = {"embed": ((),), "heads": ((),)}
        batch = in_order(data + fsdp + ep + tp)
        fallback: Axes = ()
    elif strategy == "fsdp":
        shard = in_order(fsdp + tp + ep) or in_order(data)
        targets = {"embed": (shard,), "heads": ((),)}
        batch = in_order(data + list(shard))
        fallback = shard
    elif strategy == "tp":
        if not tp:
            raise StrategyError(
                _needs("tp", "a tensor-parallel axis (model, tensor, tp or mp)", sizes, "data=2,model=4")
            )
        targets = {"embed": ((),), "heads": (in_order(tp),)}
        batch = in_order(data + fsdp + ep)
        fallback = in_order(tp)
    elif strategy == "fsdp+tp":
        if not tp:
            raise StrategyError(
                _needs("fsdp+tp", "a tensor-parallel axis (model, tensor, tp or mp)", sizes, "fsdp=4,model=2")
            )
        shard = in_order(fsdp + ep) or in_order(data)
        targets = {"embed": (shard,), "heads": (in_order(tp),)}
        batch = in_order(data + list(shard))
        fallback = shard or in_order(tp)
    else:  # ep
        if not ep:
            raise StrategyError(
                _needs("ep", "an expert axis (expert, experts, ep)", sizes, "fsdp=4,expert=2")
            )
        if not any_experts:
            raise StrategyError(
                "strategy ep: no experts recognised in this model (paths with `experts`, or MaxText's "
                "`MoeBlock`); use fsdp+tp, or fsdp, for a dense model"
            )
        dense = in_order(fsdp + ep)
        inner = in_order(fsdp)
        embed = (dense, inner) if inner else (dense, ())
        targets = {"embed": embed, "heads": (in_order(tp),), "experts": (in_order(ep),)}
        batch = in_order(data + fsdp + ep)
        fallback = dense
    targets["mlp"] = targets["vocab"] = targets["heads"]
    targets["norm"] = targets["heads"]
    targets["batch"] = (batch,)
    narrowed = ""
    if strategy in ("fsdp", "fsdp+tp", "ep") and hidden:
        embed = tuple(dividing(alt, sizes, hidden) for alt in targets["embed"])
        embed = tuple(dict.fromkeys(embed))  # `(fsdp, expert) | fsdp` may come to `fsdp | fsdp`
        if embed != targets["embed"]:
            first, now = targets["embed"][0], embed[0]
            narrowed = (
                f"the hidden size {hidden} does not divide by {_one(first)} = "
                f"{math.prod(sizes[a] for a in first)}: the weights' hidden size is split over "
                f"{_one(now)} = {math.prod(sizes[a] for a in now)}, the largest product of those axes "
                "that divides it"
            )
            if fallback == first:
                fallback = now
            targets["embed"] = embed
    names = {role: _name(role, sizes) for role in ROLE_ALIASES}
    return Layout(strategy, why, targets, names, fallback, narrowed)


def dividing(axes: Axes, sizes: dict[str, int], size: int) -> Axes:
    """`axes` if their product divides `size`; else those of them (in order)
    whose product is the largest that divides it (of equal products, the
    fewest axes); `axes` again when none of them divides it."""
    if not axes or size % math.prod(sizes[a] for a in axes) == 0:
        return axes
    best: Axes = ()
    for count in range(1, len(axes)):
        for some in itertools.combinations(axes, count):
            product = math.prod(sizes[a] for a in some)
            if product > 1 and size % product == 0 and product > math.prod(sizes[a] for a in best):
                best = some
    return best or axes


def _auto(axes: dict[str, list[str]], total_bytes: int, stacked_experts: bool) -> tuple[str, str]:
    if axes["expert"] and stacked_experts:
        return "ep", f"the mesh has an expert axis ({axes['expert'][0]}) and the experts are stacked"
    also = ""
    if axes["expert"]:
        also = f"; no stacked experts, so `{axes['expert'][0]}` splits weights as FSDP"
    if total_bytes < SMALL_MODEL_BYTES:
        return "dp", "the model is under 64 MiB: every device holds it whole"
    if axes["tp"]:
        if axes["fsdp"] or axes["data"] or axes["expert"]:
            return "fsdp+tp", f"the mesh has a tensor-parallel axis ({axes['tp'][0]}) and others{also}"
        return "tp", f"the mesh's only axis is tensor-parallel ({axes['tp'][0]})"
    return "fsdp", f"the mesh has no tensor-parallel axis{also}"


def _needs(strategy: str, what: str, sizes: dict[str, int], example: str) -> str:
    shown = ", ".join(f"{n}={s}" for n, s in sizes.items())
    return (
        f"strategy {strategy} needs {what} of size > 1; the mesh is {shown}. Name the axis so "
        f"(e.g. {example}), or choose another strategy"
    )


def _name(role: str, sizes: dict[str, int]) -> str:
    """The alias name for `role`: the role's own unless a mesh axis has it."""
    for name in (role, *_OTHER_NAMES[role]):
        if name not in sizes:
            return name
    return role + "_"


def target_text(alternatives: tuple[Axes, ...]) -> str:
    """An alias's target as written: `fsdp`, `(fsdp, expert) | fsdp`, `_`."""
    return " | ".join(_one(a) for a in alternatives)


def _one(axes: Axes) -> str:
    if not axes:
        return "_"
    return axes[0] if len(axes) == 1 else "(" + ", ".join(axes) + ")"
