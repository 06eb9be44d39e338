"""The matcher against the obvious loop, on paths that differ only in their digits.

The matcher decides a rule once per path *key* (the path with every digit
written as `0`) when the rule's pattern treats all digits alike, and per path
otherwise. These tests pin down both halves: which patterns count as
digit-blind, and that one matcher used on many paths sharing keys gives, for
every path, the first rule that `re.search`es it.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

import shardrules as sr
from shardrules._language._load import iter_rules
from shardrules._planning._match import Matcher, by_key, digit_blind, search_all


@pytest.mark.parametrize(
    "pattern",
    [
        r"kernel$",
        r"layers_\d+/attn",
        r"experts/\d{2}/",
        r"^\w+/\W",
        r".",
        r"[^/]+/kernel",
        r"[a-z0-9_]+",
        r"[^a-z]",
        r"\bq\b",
        r"(?i)Kernel",
        r"\D+",
        r"\s|\S",
        r"(?=\d)x",
        r"[\d]",
    ],
)
def test_patterns_that_treat_every_digit_alike_are_digit_blind(pattern: str) -> None:
    assert digit_blind(pattern)
    for digit in "123456789":  # and indeed: the same answer for each digit as for 0
        for text in ("x0y", "layers_0/attn", "experts/00/", "a/0", "0", "q 0"):
            swapped = text.replace("0", digit)
            assert (re.search(pattern, text) is None) == (re.search(pattern, swapped) is None)


@pytest.mark.parametrize(
    "pattern",
    [r"layers_0/", r"[0-3]", r"[^5]", r"experts/1\d", r"a|7", r"(?:x|[13579])$", r"[a-f0-4]", r"(?!3)\d"],
)
def test_patterns_that_tell_digits_apart_are_not_digit_blind(pattern: str) -> None:
    assert not digit_blind(pattern)
    # and indeed: two texts with the same key (digits written as 0) get different answers
    texts = [f"{a}{b}" for a in "0123456789" for b in "0123456789"]
    texts += [f"layers_{d}/" for d in "0123456789"] + [
        f"experts/{d}{e}" for d in "0123" for e in "0123456789"
    ]
    answers: dict[str, set[bool]] = {}
    for text in texts:
        key = text.translate(str.maketrans("123456789", "0" * 9))
        answers.setdefault(key, set()).add(re.search(pattern, text) is None)
    assert any(len(seen) == 2 for seen in answers.values()), pattern


_DIGIT_FRAGMENTS = [
    r"\d",
    r"\d+",
    r"\d{2}",
    "[0-4]",
    "[^3]",
    "[a-z0-9]",
    r"\D",
    r"\b",
    r"\w",
    ".",
    "0",
    "1",
    "7",
    "10",
    "layers_",
    "experts/",
    "/",
    "kernel",
    "(1|2)",
    "(q|k|v)",
    "_",
    "٣",
]

_SEGMENTS = st.one_of(
    st.sampled_from(["layers_", "experts", "kernel", "q", "k", "attn", "x", "٣", "mu"]),
    st.integers(0, 120).map(str),
    st.tuples(st.sampled_from(["layers_", "block", "w"]), st.integers(0, 40)).map(lambda t: f"{t[0]}{t[1]}"),
)


@st.composite
def _digit_patterns(draw: st.DrawFn) -> str:
    body = draw(st.lists(st.sampled_from(_DIGIT_FRAGMENTS), min_size=1, max_size=4))
    start = draw(st.sampled_from(["", "", "^"]))
    end = draw(st.sampled_from(["", "", "$"]))
    return start + "".join(body) + end


@given(
    patterns=st.lists(_digit_patterns(), min_size=1, max_size=6),
    paths=st.lists(st.lists(_SEGMENTS, min_size=1, max_size=5).map("/".join), min_size=1, max_size=40),
)
def test_matcher_is_the_first_re_search_hit_on_paths_sharing_keys(
    patterns: list[str], paths: list[str]
) -> None:
    """One matcher, many paths (several per key): each gets the first rule, in
    order, whose pattern `re.search`es it, or none."""
    text = "rules params:\n" + "".join(f'  "{p}" -> replicated\n' for p in patterns)
    try:
        rules = sr.loads(text)
    except sr.ShardRulesError:  # e.g. SR017: outside the safe subset
        return
    note(text)
    group = [r for r in iter_rules(rules, "params") if r.pattern is not None]
    matcher = Matcher(group)
    # every path twice, and its digits shifted, so keys repeat with other digits
    shifted = [p.translate(str.maketrans("0123456789", "1234567890")) for p in paths]
    for path in [*paths, *shifted, *paths]:
        want = next((r for r in group if r.pattern is not None and re.search(r.pattern, path)), None)
        assert matcher.first(path) is want, (path, want)


@given(
    pattern=_digit_patterns(),
    paths=st.lists(st.lists(_SEGMENTS, min_size=1, max_size=5).map("/".join), min_size=1, max_size=40),
)
def test_search_all_finds_exactly_the_paths_re_search_finds(pattern: str, paths: list[str]) -> None:
    """The scan lint uses for rules that match nothing: every path the pattern
    `re.search`es, in order, with digit-blind patterns tried once per key."""
    try:
        compiled = re.compile(pattern)
    except re.error:
        return
    paths = paths + [p.translate(str.maketrans("0123456789", "9876543210")) for p in paths]
    want = [i for i, path in enumerate(paths) if compiled.search(path)]
    assert search_all(pattern, paths, by_key(paths)) == want
