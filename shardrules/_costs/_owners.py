"""The arrays of a `shardrules.jit` step and the rule lines that lay them out
(`Owners`), for attributing its collectives (`_attribute`).

The argument leaves are named as JAX names them in the compiled HLO's
parameters (`params['blocks'][0]['kernel']`: the argument's name and the
leaf's key path), shown as rules match them (`params/blocks/0/kernel`), each
with the rule of its `in_groups` group. The output's leaves are shown under
the name of the argument planned with the same group (an updated parameter
under `params/...`), else `output N/...`, with the rule of its `out_groups`
group. Activation rules come from the step's trace: the rule of each scope
output, and the scopes whose layouts the model's code states.
"""

from __future__ import annotations

import math
from typing import Any

import jax

from .._interop._paths import path_str
from .._language._format import spec_text
from .._tracing._groups import param_names
from .._tracing._slips import leaf_origins, output_origins
from ._attribute import Leaf, Owners


def rule_key(rule: Any) -> tuple[str | None, str]:
    """A rule's `"file:line"` and its text as written (`None, ""` for none)."""
    if rule is None:
        return None, ""
    span = rule.span
    where = f"{span.file}:{span.line}" if span is not None else "<rules>"
    head = "default" if rule.pattern is None else f'"{rule.pattern}"'
    return where, f"{head} -> {spec_text(rule.written)}"


def _leaf(label: str, rule: Any, value: Any = None) -> Leaf:
    where, text = rule_key(rule)
    nbytes = math.prod(getattr(value, "shape", ())) * getattr(getattr(value, "dtype", None), "itemsize", 0)
    return Leaf(label, where, text, getattr(rule, "span", None), int(nbytes))


def owners_of(step: Any, args: tuple[Any, ...], mesh: Any, traced: Any) -> Owners:
    """The `Owners` of `step` (a `RuleJit`) called with arguments like `args`
    on `mesh`, its trace `traced` (a `Traced`: scopes, decisions, output)."""
    names = [n or str(k) for k, n in enumerate(param_names(step.fn, len(args)))]
    groups = step._in_groups(len(args))
    origins = leaf_origins(step.fn, args, groups, step.rules, mesh)
    inputs: dict[str, Leaf] = {}
    numbered: list[Leaf] = []
    for name, arg in zip(names, args, strict=True):
        for keypath, value in jax.tree_util.tree_flatten_with_path(arg)[0]:
            label, rule = origins[len(numbered)]
            # the path as rules match it (`leaf_origins`' label: a penzai parameter's label, not its
            # `data_array`), as the output's leaves are shown
            path = (
                label.partition(", leaf `")[2].removesuffix("`") if ", leaf `" in label else path_str(keypath)
            )
            leaf = _leaf(f"{name}/{path}" if path else name, rule, value)
            inputs[f"{name}{jax.tree_util.keystr(keypath)}"] = leaf
            numbered.append(leaf)
    outputs: list[Leaf] = []
    if traced.out_shape is not None:
        by_group: dict[str, str] = {
            g: n for g, n in zip(groups or (), names, strict=False) if isinstance(g, str)
        }
        out_groups = step.out_groups
        tupled = isinstance(out_groups, (list, tuple)) and isinstance(traced.out_shape, (list, tuple))
        values = jax.tree.leaves(traced.out_shape)
        for k, (path, rule) in enumerate(output_origins(traced.out_shape, out_groups, step.rules, mesh)):
            position, _, rest = path.partition("/") if tupled else ("", "", path)
            group = _group_at(out_groups, position)
            head = by_group.get(group) if group is not None else None
            label = f"{head}/{rest}" if head and rest else f"output {path}" if path else "output"
            outputs.append(_leaf(label, rule, values[k] if k < len(values) else None))
    scopes = {s.name: _leaf(s.name, s.rule) for s in traced.scopes if s.rule is not None}
    stated = frozenset(d.scope for d in traced.decisions if d.by == "model")
    return Owners(inputs, tuple(numbered), tuple(outputs), scopes, stated)


def _group_at(groups: Any, position: str) -> str | None:
    """The output group of the output at `position` (`"0"`), for a tuple of
    groups; the one group of the whole output otherwise."""
    if isinstance(groups, (list, tuple)):
        return groups[int(position)] if position.isdigit() and int(position) < len(groups) else None
    return groups if isinstance(groups, str) else None
