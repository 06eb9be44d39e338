"""The scope outputs a traced step makes, and what they tell about the
activation rules: a rule matching a scope whose outputs are numbered
(SR201), a rule matching no scope output at all (SR211, with the closest
names seen), and the list `explain --step` and `RuleJit.scopes` show.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._errors import Diagnostic, ShardRulesWarning
from .._language._rules import RuleSet
from .._planning._match import Matcher, by_key, search_all
from .._quiet import warn

if TYPE_CHECKING:
    from ._outputs import Outputs


@dataclasses.dataclass(frozen=True)
class ScopeOutput:
    """An output of a named scope, as a traced step's activation rules see it.

    **Attributes:**

    - `name`: the name it is matched under (the scope's path, or `PATH/0`,
      `PATH/1`, ... for a use that makes several outputs).
    - `shapes`: the shapes it had (one per distinct shape: a scope used
      several times with different shapes has several).
    - `dtype`: its dtype's name.
    - `rule`: the `Rule` of the activations group that lays it out, or `None`.
    - `alias`: the name of its scope's parameter, which rules match where
      none matches `name` (an auto-named scope's: `mlp/Einsum_0` has
      `params/mlp/gating_einsum`), or `None`.
    """

    name: str
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    rule: Any = None
    alias: str | None = None


class Seen:
    """The scope outputs met while a step is traced, by name."""

    def __init__(
        self, rules: RuleSet, matcher: Matcher, alias_of: Callable[[str], str | None] = lambda name: None
    ):
        self.rules, self._matcher, self.alias_of = rules, matcher, alias_of
        self.outputs: dict[str, dict[tuple[int, ...], str]] = {}  # name -> its shapes -> dtype name
        self._warned: set[str] = set()
        self._numbered: set[int] = set()  # id() of the rules warned about with SR201

    def add(self, found: Outputs) -> None:
        """Record the scope outputs `analyse` found in one jaxpr, and warn
        about rules matching a scope whose outputs are numbered (SR201)."""
        self._check_numbered(found)
        for (v, _), name in found.names.items():
            aval = getattr(v, "aval", None)
            shape = tuple(int(d) for d in getattr(aval, "shape", ()))
            self.outputs.setdefault(name, {}).setdefault(shape, str(getattr(aval, "dtype", "")))

    def scope_outputs(self, rule_for: Callable[[str, tuple[int, ...], Any], Any]) -> list[ScopeOutput]:
        """Every scope output seen, in the order first seen, with its rule
        (`rule_for(name, shape, dtype)`)."""
        out = []
        for name, shapes in self.outputs.items():
            shape, dtype = next(iter(shapes.items()))
            rule = rule_for(name, shape, dtype) if shape else None
            out.append(ScopeOutput(name, tuple(shapes), dtype, rule, self.alias_of(name)))
        return out

    def unmatched(self) -> list[Diagnostic]:
        """SR211 for each activation rule whose pattern matches no scope output
        seen, by its name or its parameter's."""
        names = list(self.outputs)
        matched = names + [a for a in map(self.alias_of, names) if a is not None]
        groups = by_key(matched)
        found = []
        for rule in self._matcher.rules:
            if rule.pattern is None or search_all(rule.pattern, matched, groups):
                continue
            found.append(
                Diagnostic(
                    "SR211",
                    "warning",
                    f"activation rule `{rule.pattern}` matches no scope output of this step "
                    f"({_counted(len(names), 'scope output')} seen)",
                    rule.span,
                    None,
                    _unmatched_hint(rule.pattern, names),
                )
            )
        return found

    def warn_unmatched(self) -> None:
        """SR211 (a `ShardRulesWarning`) for each activation rule that matched
        no scope output; once per traced step, and not for a rule SR201 has
        just warned about (one mistake, one warning: that one says more)."""
        numbered = {rule.span for rule in self._matcher.rules if id(rule) in self._numbered}
        for diag in self.unmatched():
            if (diag.span is not None and diag.span in numbered) or self.rules.acknowledges(diag):
                continue
            warning = ShardRulesWarning(diag, self.rules.sources)
            if diag.span is not None:  # shown at the rule's line (the trace's frames are JAX's)
                warn(warning, at=(diag.span.file, diag.span.line))
            else:
                warn(warning, stacklevel=3)

    def _check_numbered(self, found: Outputs) -> None:
        """SR201 (a `ShardRulesWarning`): a rule matches the path of a scope
        whose outputs are matched as `S/0`, `S/1`, ... (one use of it makes
        several), and no rule matches those names; once per scope."""
        for scope, names in found.several.items():
            rule = self._matcher.first(scope)
            if rule is None or scope in self._warned or any(self._matcher.first(n) for n in names):
                continue
            self._warned.add(scope)
            self._numbered.add(id(rule))
            shown = ", ".join(f"`{n}`" for n in dict.fromkeys(names))
            diag = Diagnostic(
                "SR201",
                "warning",
                f"activation rule `{rule.pattern}` matches scope `{scope}` but none of its outputs: "
                f"one use of `{scope}` makes several, matched as {shown}",
                rule.span,
                scope,
                f'match them with `"{re.escape(scope)}/\\d+$"` (or one rule per output), or return one '
                "value from the scope; a scope used several times (a Python loop, a module called twice) "
                'has each use\'s outputs matched on their own, and `jax.named_scope(f"layer_{i}")` names '
                "each layer apart",
            )
            if not self.rules.acknowledges(diag):
                warn(ShardRulesWarning(diag, self.rules.sources), stacklevel=2)


def _counted(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _likeness(text: str, name: str) -> float:
    """How alike a pattern's text and a scope output's name are, 0 to 1: the
    better of the whole name's and its last segment's likeness, an
    abbreviation of the last segment (`attn`, `attention`) counting as 0.8."""
    tail = name.rsplit("/", 1)[-1]
    score = max(
        difflib.SequenceMatcher(None, text, name).ratio(), difflib.SequenceMatcher(None, text, tail).ratio()
    )
    if len(text) >= 3 and text[0] == tail[:1] and _in_order(text, tail):
        score = max(score, 0.8)
    return score


def _in_order(short: str, long: str) -> bool:
    """Whether the characters of `short` appear in `long` in the same order."""
    it = iter(long)
    return all(ch in it for ch in short)


def _unmatched_hint(pattern: str, names: Sequence[str]) -> str:
    """How to fix an activation rule that matches none of `names`: the names
    it would match without its anchors (`embedder$` and `embedder.encode`),
    else the names closest to its text, else some of the names seen."""
    if not names:
        return (
            "this step makes no named scope at all: name the code with `jax.named_scope(NAME)`, or pass "
            "the framework's modules as arguments (see the cookbook's scope names per framework)"
        )
    listing = "`shardrules explain --step` lists every scope output with its shapes"
    near: list[str] = []
    relaxed = re.sub(r"\$$|^\^", "", pattern)
    if relaxed != pattern and relaxed:
        try:
            near = [names[i] for i in search_all(relaxed, names, by_key(names))]
        except Exception:  # a relaxed pattern that does not compile suggests nothing
            near = []
    if not near:
        text = re.sub(r"\\d[+*]?", "0", pattern)
        text = re.sub(r"[\\^$()|?*+\[\]{}]", "", text)
        scored = sorted(((_likeness(text, n), n) for n in names), key=lambda x: (-x[0], len(x[1])))
        near = [n for score, n in scored if score >= 0.75]
    near = near[:3]
    if near:
        shown = " or ".join(f'"{n}"' for n in near)
        return f"did you mean {shown}? {listing}"
    some = ", ".join(f'"{n}"' for n in names[:5]) + (", ..." if len(names) > 5 else "")
    return f"scope outputs seen: {some}; {listing}"
