"""Kinds of leaves → the rules of a drafted file: one rule per role and layout.

Each recognised kind gets its spec from its dimensions' logical names
(`_dims`) and the strategy's aliases (`_strategy`); kinds of one role family
with the same spec share a rule. Where the shapes do not fit the layout:

- **Heads** (grouped-query attention): a weight whose heads do not divide by
  the tensor-parallel axes keeps its heads whole (`_`), with a note; splitting
  a head's width instead would make every device gather the heads it needs.
- **Other dimensions**: an entry whose axes do not divide a dimension of every
  kind it covers gets `?` (split where it divides), or `_` where it divides
  none, with a note naming the shapes.

- **Token embeddings** (`embedding_layouts`): where the strategy splits the
  vocabulary, a transformers-named embedding with a separate output head
  (untied) keeps its vocabulary whole, as transformers' tp plans do (they add
  the embedding, vocab-parallel, only for tied ones), unless the plan would
  then be mostly replicated (SR116, an error) or miss a budget (`_suggest`
  finds out); `embedding="vocab"` or `"whole"` decides instead. Its rule's
  note says why, and what would do the opposite. Kept whole at 64 MiB or
  more, its rule line acknowledges lint's SR204 (`# noqa: SR204`): the file
  says, where a reviewer reads it, that the copy on every device is meant.

Stacked layers are written `...` when they lead (`(..., heads, embed)`) or
end the shape (MaxText's norm scales, `(norm, ...)`), as `_` in between
(MaxText's `(embed, _, heads, _)`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from .._planning._check import DEFAULT_REPLICATED_THRESHOLD, DEFAULT_REPLICATED_TOLERANCE
from .._planning._plan import format_bytes, plural
from . import _largest as L
from . import _roles as R
from ._dims import Dims, dims_of
from ._facts import Facts
from ._leaves import Kind
from ._strategy import Axes, Layout

FAMILIES = {
    R.EMBEDDING: "embedding",
    R.POSITIONS: "positions",
    R.Q: "attn",
    R.KV: "attn",
    R.QKV: "attn",
    R.OUT: "attn_out",
    R.EXPERT_IN: "expert_in",
    R.EXPERT_OUT: "expert_out",
    R.ROUTER: "router",
    R.MLP_IN: "mlp_in",
    R.MLP_OUT: "mlp_out",
    R.LM_HEAD: "lm_head",
    R.CONV: "conv",
    R.BIAS: "bias",
    R.NORM: "norm",
}
ORDER = [
    *dict.fromkeys(FAMILIES.values()),
    "shape",
]  # `shape`: leaves not recognised, with a rule of their own
ALIAS_OF = {"embed": "embed", "heads": "heads", "kv_heads": "heads", "mlp": "mlp", "vocab": "vocab"}
EMBEDDINGS = ("vocab", "whole")
"""What `embedding=` may ask of token embeddings' vocabulary: split (vocab-parallel) or whole."""
_SPLIT = "to split it (vocab-parallel, at the cost of an all-reduce of the looked-up rows): `{other}`"
_CONVENTION = (
    "untied (the output head is an array of its own): vocabulary kept whole, as transformers' tp "
    "plans keep it, so each device looks its tokens up locally; " + _SPLIT
)
_ASKED = "vocabulary kept whole, as asked (embedding=whole); " + _SPLIT
_LINT = (
    "untied: transformers' tp plans keep its vocabulary whole, but here that puts {why}, so it is "
    "vocab-parallel (an all-reduce of the looked-up rows); transformers' layout: `{other}`"
)


@dataclasses.dataclass
class Draft:
    """One rule being drafted: `entries` as written (`None`: `replicated`);
    `form`: where stacked layers are (`_form`); `optional`: the entries that
    get `?`; `acknowledged`: the warning codes its line acknowledges (`# noqa: SR204`)."""

    family: str
    roles: set[str]
    entries: tuple[str, ...] | None
    form: str
    kinds: list[int]
    notes: list[str] = dataclasses.field(default_factory=list)
    optional: set[int] = dataclasses.field(default_factory=set)
    acknowledged: set[str] = dataclasses.field(default_factory=set)  # warnings its line's `noqa` names

    def spec_text(self) -> str:
        if self.entries is None:
            return "replicated"
        written = [e + ("?" if j in self.optional and e != "_" else "") for j, e in enumerate(self.entries)]
        if all(e == "_" for e in written):
            return "replicated"
        lead, trail = (["..."] if self.form == "lead" else []), (["..."] if self.form == "trail" else [])
        return "(" + ", ".join(lead + written + trail) + ")"

    def dim_of(self, j: int, rank: int) -> int:
        """The dimension entry `j` stands for in an array of `rank` dimensions."""
        assert self.entries is not None
        return rank - len(self.entries) + j if self.form == "lead" else j


def draft(
    kinds: list[Kind],
    facts: Facts,
    layout: Layout,
    sizes: dict[str, int],
    *,
    maxtext: bool,
    by_shape: frozenset[int] = frozenset(),
    vocab: Mapping[int, tuple[bool, str]] | None = None,
    haliax: bool = False,
) -> tuple[list[Draft], list[int]]:
    """The rules, in file order, and the kinds left to `default` (by shape):
    those not recognised, and those of `by_shape`. `vocab`: token embeddings
    laid out by `embedding_layouts` (their vocabulary whole or not, and the
    note, `{other}` standing for the spec that does the opposite). `haliax`:
    the arrays are haliax's named arrays, whose norms' hidden dimension (their
    `embed` axis) is split as every other `embed` axis is, as haliax's
    mapping of axis names does."""
    groups: dict[tuple[object, ...], Draft] = {}
    fallback: list[int] = []
    largest = layout.fsdp_dim == "largest"
    for index, (kind, role) in enumerate(zip(kinds, facts.roles, strict=True)):
        dims = dims_of(kind, role, facts, index) if role is not None else None
        if largest and index not in by_shape and (role is None or dims is None) and _tie(kind, layout, sizes):
            entries, _, _ = L.entries(None, kind.shape, kind.leaf_bytes, layout, sizes, layout.min_bytes)
            key = (ORDER.index("shape"), "shape", entries, "none", L.TIE)
            groups.setdefault(key, Draft("shape", set(), entries, "none", [], [L.TIE])).kinds.append(index)
            continue
        if role is None or dims is None or index in by_shape:
            fallback.append(index)
            continue
        family = FAMILIES[role.name]
        stacked = facts.stacks.get(index, ())
        if largest:
            entries, note, on_layers = L.entries(
                dims, kind.shape, kind.leaf_bytes, layout, sizes, layout.min_bytes
            )
            stacked = () if on_layers else stacked
        else:
            entries, note = _entries(dims, role, layout, sizes, maxtext=maxtext, haliax=haliax)
        if role.per_expert and "experts" in layout.targets:
            note = (
                "one array per expert: the expert axis cannot hold whole experts apart (that needs them "
                "stacked in one array), so they are split as the dense layers are"
            )
        other = entries
        if vocab and index in vocab:
            whole, note = vocab[index]
            kept = tuple("_" if n == "vocab" else e for n, e in zip(dims.names, entries, strict=True))
            entries, other = (kept, entries) if whole else (entries, kept)
        form = _form(stacked, kind.rank)
        if form in ("lead", "trail"):
            entries = tuple(e for i, e in enumerate(entries) if i not in stacked)
            other = tuple(e for i, e in enumerate(other) if i not in stacked)
        if vocab and index in vocab and note is not None:
            note = note.format(other=Draft(family, set(), other, form, []).spec_text())
        written: tuple[str, ...] | None = entries
        if all(e == "_" for e in entries):
            written, form = None, "none"
        key = (ORDER.index(family), family, written, form, note)
        group = groups.get(key)
        if group is None:
            group = groups[key] = Draft(family, set(), written, form, [], [note] if note else [])
        group.roles.add(role.name)
        group.kinds.append(index)
    for key in list(groups):  # unstacked kinds join the stacked ones with the same spec
        if key[3] == "none" and key[2] is not None:
            for form in ("lead", "trail"):
                other = groups.get((*key[:3], form, key[4]))
                if other is not None:
                    group = groups.pop(key)
                    other.roles |= group.roles
                    other.kinds += group.kinds
                    break
    drafts = [groups[key] for key in sorted(groups, key=lambda k: (k[0], k[4] is not None))]
    for rule in drafts:
        _optional(rule, kinds, layout, sizes)
    return drafts, fallback


def _tie(kind: Kind, layout: Layout, sizes: dict[str, int]) -> bool:
    """Whether `default`'s `auto` would split another dimension of `kind` than
    `fsdp_dim="largest"` does (two largest dimensions of one size)."""
    split = L.split_of(layout, sizes)
    return kind.leaf_bytes >= layout.min_bytes and L.chosen(kind.shape, split) != L.auto_chosen(
        kind.shape, split
    )


def embedding_layouts(
    kinds: list[Kind], facts: Facts, layout: Layout, choice: str | None, split: Mapping[int, str]
) -> dict[int, tuple[bool, str]]:
    """The token embeddings whose vocabulary `embedding=` (`choice`), or else
    the naming convention, decides, where the strategy splits the vocabulary:
    index → (kept whole, the note on its rule). `None` keeps a transformers
    embedding with a separate output head (untied) whole, unless it is in
    `split` (lint would report it whole, and why); any other stays
    vocab-parallel, as transformers does a tied one (`embedding_rowwise`)."""
    if choice == "vocab" or not layout.axes("vocab") or layout.fsdp_dim == "largest":
        return {}
    untied = any(r is not None and r.name == R.LM_HEAD for r in facts.roles)
    out = {}
    for i, (kind, role) in enumerate(zip(kinds, facts.roles, strict=True)):
        if role is None or role.name != R.EMBEDDING:
            continue
        if choice == "whole":
            out[i] = (True, _ASKED)
        elif untied and R.transformers_embedding(kind.lower):
            out[i] = (False, _LINT.replace("{why}", split[i])) if i in split else (True, _CONVENTION)
    return out


def replication_findings(kinds: list[Kind], kept_whole: set[int], index: int) -> dict[str, str]:
    """What lint would report of kind `index` held whole on every device, with
    the kinds of `kept_whole`: code → a phrase ("all 250.0 MiB of it on every
    device"). SR204 (a warning, which the drafted rule may acknowledge) for an
    array of 64 MiB or more; SR116 (an error) where the whole arrays are more
    than 25% of the weights."""
    kind = kinds[index]
    out = {}
    if kind.leaf_bytes >= DEFAULT_REPLICATED_THRESHOLD:
        out["SR204"] = f"all {format_bytes(kind.leaf_bytes)} of it on every device"
    whole = sum(kinds[i].nbytes for i in kept_whole | {index})
    share = whole / sum(k.nbytes for k in kinds)
    if whole >= DEFAULT_REPLICATED_THRESHOLD and share > DEFAULT_REPLICATED_TOLERANCE:
        out["SR116"] = (
            f"{share:.0%} of the weights ({format_bytes(whole)}) whole on every device, over the "
            f"{DEFAULT_REPLICATED_TOLERANCE:.0%} lint allows (SR116)"
        )
    return out


def say_whole(rules: list[Draft], found: Mapping[int, Mapping[str, str]], asked: set[int]) -> None:
    """Notes and acknowledgements for the kinds kept whole on every device
    (`found`: index → `replication_findings`): one of 64 MiB or more has its
    rule acknowledge SR204, said in a note; one asked whole (`asked`) that
    makes the plan mostly replicated has a note saying lint reports SR116."""
    for rule in rules:
        for i in rule.kinds:
            why = found.get(i, {})
            if "SR204" in why:
                rule.acknowledged.add("SR204")
                rule.notes.append(f"That is {why['SR204']}: lint's SR204, acknowledged (`noqa`) as meant.")
            if i in asked and "SR116" in why:
                rule.notes.append(f"Kept whole, it puts {why['SR116']}.")


def _form(stacked: tuple[int, ...], rank: int) -> str:
    """How stacked layer dimensions are written: `lead` (`...` first), `trail`
    (`...` last), `mid` (as `_`), or `none` (no stack)."""
    if not stacked:
        return "none"
    if stacked == tuple(range(len(stacked))):
        return "lead"
    if stacked == tuple(range(rank - len(stacked), rank)):
        return "trail"
    return "mid"


def _entries(
    dims: Dims, role: R.Role, layout: Layout, sizes: dict[str, int], *, maxtext: bool, haliax: bool = False
) -> tuple[tuple[str, ...], str | None]:
    names = layout.names
    out: list[str] = []
    note = None
    for logical in dims.names:
        if logical in ALIAS_OF:
            alias = ALIAS_OF[logical]
            if alias == "heads" and dims.heads is not None:
                split = math.prod(sizes[a] for a in layout.axes("heads"))
                if split > 1 and dims.heads % split:
                    what = "key/value" if logical == "kv_heads" else "query"
                    note = (
                        f"{plural(dims.heads, f'{what} head')} {'does' if dims.heads == 1 else 'do'} not divide by "
                        f"{_axes_text(layout.axes('heads'), sizes)}: kept whole on every device (`_`); "
                        "splitting a head's width would make each device gather its heads anyway"
                    )
                    out.append("_")
                    continue
            out.append(names[alias])
        elif logical == "experts":
            out.append(names["experts"] if "experts" in layout.targets else "_")
        elif logical == "norm" and haliax:  # haliax: a norm's `embed` axis, as any other
            out.append(names["embed"] if layout.axes("embed") else "_")
        elif logical == "norm":
            out.append(names["norm"] if maxtext and layout.axes("norm") else "_")
        elif logical == "conv":
            out.append(names["embed"] if layout.axes("embed") else names["mlp"])
        else:
            out.append("_")
    if role.name == R.NORM and not (maxtext and layout.axes("norm")) and not haliax:
        out = ["_"] * len(out)
    elif role.name == R.NORM and haliax and any(e != "_" for e in out):
        note = (
            "haliax named arrays: split along their `embed` axis, as haliax's own mapping splits every "
            "`embed` axis; `replicated` would keep these small arrays whole on every device"
        )
    return tuple(out), note


def _optional(rule: Draft, kinds: list[Kind], layout: Layout, sizes: dict[str, int]) -> None:
    """Mark with `?` the entries that do not divide every kind's dimension, or
    write `_` for those that divide none; say which in a note. An entry
    written `_` frees its axes for an alias with alternatives (`embed =
    (fsdp, expert) | fsdp` takes `expert` where the experts' entry does not),
    so the entries are gone over again until none changes."""
    if rule.entries is None:
        return
    done: set[int] = set()
    while True:
        changed = False
        for j, entry in enumerate(rule.entries):
            role = _role_of_alias(entry, layout)
            if role is None or j in done:
                continue
            bad: list[Kind] = []
            for index in rule.kinds:
                kind = kinds[index]
                split = math.prod(sizes[a] for a in _chosen(rule, j, layout))
                if split > 1 and kind.shape[rule.dim_of(j, kind.rank)] % split:
                    bad.append(kind)
            if not bad:
                continue
            done.add(j)
            shapes = ", ".join(sorted({str(k.shape) for k in bad})[:3])
            axes = _axes_text(_chosen(rule, j, layout), sizes)
            if len(bad) == len(rule.kinds):
                rule.entries = tuple("_" if k == j else e for k, e in enumerate(rule.entries))
                rule.notes.append(
                    f"`{entry}` ({axes}) divides no {shapes} array here: that dimension is not split"
                )
                changed = True
            else:
                rule.optional.add(j)
                rule.notes.append(
                    f"`{entry}?`: {axes} does not divide {plural(len(bad), 'kind')} of these arrays ({shapes}), "
                    "left unsharded there"
                )
        if not changed:
            return


def _role_of_alias(entry: str, layout: Layout) -> str | None:
    for role, name in layout.names.items():
        if name == entry and any(layout.targets.get(role, ((),))):
            return role
    return None


def _chosen(rule: Draft, j: int, layout: Layout) -> Axes:
    """The axes entry `j` stands for in `kind`'s spec: an alias's first
    alternative whose axes no other entry of the spec uses."""
    assert rule.entries is not None
    role = _role_of_alias(rule.entries[j], layout)
    assert role is not None
    alternatives = layout.targets[role]
    if len(alternatives) == 1:
        return alternatives[0]
    used = set()
    for k, other in enumerate(rule.entries):
        other_role = _role_of_alias(other, layout) if k != j else None
        if other_role is not None and len(layout.targets[other_role]) == 1:
            used.update(layout.targets[other_role][0])
    return next((alt for alt in alternatives if not used & set(alt)), ())


def _axes_text(axes: Axes, sizes: dict[str, int]) -> str:
    if not axes:
        return "no axis"
    return (
        ", ".join(f"{a}={sizes[a]}" for a in axes)
        if len(axes) == 1
        else ("(" + ", ".join(f"{a}={sizes[a]}" for a in axes) + f") = {math.prod(sizes[a] for a in axes)}")
    )
