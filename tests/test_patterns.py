"""Rule patterns: matched by RE2 in linear time, whatever the pattern; Python's
syntax, with what RE2 lacks refused at load time (SR017) with what to write
instead; and the same answers as Python's `re.search` (with `re.ASCII`) for
every pattern accepted."""

from __future__ import annotations

import re
import time
import warnings

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardrules as sr
from shardrules._language import _regex, _sets
from shardrules._planning._match import Matcher

REALISTIC = [
    r"attn/(q|k|v)_proj/kernel$",
    r"layers_\d+/attn$",
    r"experts/\d+/(gate|up)_proj/kernel$",
    r"\d+/\d+/\d+/",
    r"[^/]+/[^/]+/[^/]+/kernel",
    r"^(x|y)$",
    r"tokens|targets",
    r"(norm|_norm)/scale$",
    r"model\.layers\.\d+\.mlp\.(gate|up)_proj\.weight",
    r".*attn.*",
    r"(?:block_\d+/)?attn",
    r"(q|k|v)+",
    r"\w+\w+x",
    r"(?i)Kernel",
    r"(?P<name>attn)/o_proj",
    r"[a{,3}]",
    r"\{,3\}",
    r"x\{,\}",
    r"[{,}]",
    r"[a[:x]",  # `[:` with no `:]` after it: a `[` and a `:` to both engines
    r"[a\[:digit:]]",
]

# Patterns that a backtracking engine takes exponential time on, and the paths
# that make it: each took Python's `re` from 20 s to minutes (the last four).
HOSTILE = [
    (r"(x+)+y", "x" * 40),
    (r"(\w+/)*kernel", "a/" * 30 + "kerne"),
    (r".*a.*a.*b", "a" * 300),
    (r"(a|a)*b", "a" * 40),
    ("e" + r"\w*" * 25 + "!", "embed_tokens/embedding"),
    (r"(a|aa)+$", "a" * 60 + "b"),
    ("e" + ".{0,30}" * 10 + "!", "embed_tokens/embedding" * 3),
    ("e" + "(.)*" * 12 + "!", "embed_tokens/embedding"),
]

UNSUPPORTED = {
    r"(attn|mlp)/\1": ("a backreference", "match the text itself"),
    r"(?P<n>a)(?P=n)": ("a backreference", "match the text itself"),
    r"(?<=mlp/)up": ("a lookbehind `(?<=...)`", "earlier in the group"),
    r"(?<=layers_\d+/)kernel": ("a lookbehind `(?<=...)`", "earlier in the group"),
    r"kernel(?=$)": ("a lookahead `(?=...)`", "earlier in the group"),
    r"^(?!norm)": ("a negative lookahead `(?!...)`", "earlier in the group"),
    r"(?<!mlp/)up": ("a negative lookbehind `(?<!...)`", "earlier in the group"),
    r"(a)?(?(1)b|c)": ("a conditional group", "one rule for each case"),
    r"(?>a+)b": ("an atomic group", "RE2 never backtracks"),
    r"a++b": ("possessive repeat", "RE2 never backtracks"),
    r"kernel\Z": ("`\\Z`", "write `$`"),
    r"(?x) kernel  # the weights": ("verbose mode", "without spaces and comments"),
    r"x{,3}": ("`{,3}`, which RE2 reads as literal text", "write `{0,3}`"),
    r"layers/{,}kernel": ("`{,}`, which RE2 reads as literal text", "write `*`"),  # Python: `/*`
    r"x{,}?": ("`{,}`, which RE2 reads as literal text", "write `*`"),
    r"[^[:alpha:]]": ("RE2 reads as a POSIX class", "rather than `[^[:alpha:]]`"),
    r"[_[:digit:]]+": ("RE2 reads as a POSIX class", "write `\\[`"),
    r"[[:alpha:]]+": ("read differently", "`[a-z]` rather than `[[:lower:]]`"),
    r"\u00e9": ("the escape `\\u`", "write the character itself"),
    r"[\b]": ("the escape `\\b`", "`\\x08`"),
    r"(?a)\w": ("`(?a)`", "always ASCII"),
    r"a{2000}": ("a repeat count over 1000", "use `+` or `*`"),
    r"w{01}": ("a count with a leading zero", "write `{1}`"),
    r"w{1,02}": ("a count with a leading zero", "write `{1,2}`"),
    r"\Bproj": (r"`\B`", r"`\w` on the side"),
    ".{0,1000}" * 12: ("too large to match quickly", "split the pattern"),
}


def _rule_file(pattern: str) -> str:
    return f'mesh x\nrules params:\n  "{pattern}" -> replicated\n'


@pytest.mark.parametrize("pattern", REALISTIC)
def test_realistic_patterns_are_accepted(pattern):
    rules = sr.loads(_rule_file(pattern))
    assert rules.group("params")[0].pattern == pattern


@pytest.mark.parametrize(("pattern", "path"), HOSTILE)
def test_patterns_that_backtracking_engines_hang_on_are_accepted_and_answered(pattern, path):
    rules = sr.loads(_rule_file(pattern) + "  default -> replicated\n")
    start = time.perf_counter()
    plan = sr.plan({path: jax.ShapeDtypeStruct((4,), jnp.float32)}, rules, {})
    elapsed = time.perf_counter() - start
    assert plan.ok
    want = "default" if rules.group("params")[0].regex.search(path) is None else pattern
    got = "default" if plan.leaves[0].rule.pattern is None else plan.leaves[0].rule.pattern
    assert got == want
    # A hang guard, not a benchmark: Python's `re` took 20 s to minutes on each of these.
    assert elapsed < 5.0, f"{pattern!r} took {elapsed:.1f} s"


@pytest.mark.parametrize(("pattern", "expected"), sorted(UNSUPPORTED.items()))
def test_what_re2_lacks_is_refused_with_what_to_write_instead(pattern, expected):
    reason, hint = expected
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads(_rule_file(pattern), name="hostile.shard")
    err = info.value
    assert err.code == "SR017"
    assert "unsupported regular expression" in str(err)
    assert reason in err.diagnostics[0].message, err.diagnostics[0].message
    assert hint in err.hint and "docs/language.md#patterns" in err.hint
    assert err.span is not None and (err.span.file, err.span.line, err.span.col) == ("hostile.shard", 3, 3)


def test_a_python_syntax_error_is_still_sr002_with_its_column():
    with pytest.raises(sr.RuleSyntaxError) as info:
        sr.loads(_rule_file(r"attn/(q|k"), name="bad.shard")
    assert info.value.code == "SR002"


def test_re2_prints_nothing_of_its_own(capfd):
    with pytest.raises(sr.RuleSyntaxError):
        sr.loads(_rule_file(r"(a)\1"))
    assert capfd.readouterr().err == ""


def test_a_rule_regex_is_the_re2_pattern_it_is_matched_with():
    rule = sr.loads('rules params:\n  "experts/\\d+/up" -> replicated\n').group("params")[0]
    assert rule.regex.search("layers/0/experts/12/up") is not None
    assert rule.regex.search("layers/0/experts/x/up") is None


# Classes that Python's parser warns about (`FutureWarning`: one day nested sets
# and set operations), refused in its words; and look-alikes it reads as before.
AMBIGUOUS_SETS = {
    r"[[a]": "possible nested set at position 1",
    r"x[a--b]": "possible set difference at position 3",
    r"[a&&b]": "possible set intersection at position 2",
    r"[a~~b]": "possible set symmetric difference at position 2",
    r"[a||b]": "possible set union at position 2",
    r"[]&&]": "possible set intersection at position 2",  # a leading `]` is a character
    r"[^]&&]": "possible set intersection at position 3",
    r"[\d--]": "possible set difference at position 3",
    r"(?x)[a&&] # [[": "possible set intersection at position 6",  # in verbose mode too
    r"(?x:a)#[[a]": "possible nested set at position 8",  # verbose mode ends with its group
    r"(?x)(?-x:#[[a])": "possible nested set at position 11",
    r"(?#[[)[a||b]": "possible set union at position 8",
    r"(?P<n>a)[\N{EM DASH}&&x]": "possible set intersection at position 20",
}
NOT_AMBIGUOUS = [r"[\[a]", r"[a\-\-b]", r"[&&]", r"[-&]", r"[a&]", r"a||b", r"[^[a]", r"\[\[a\]"]
NOT_AMBIGUOUS_REFUSED = [r"(?x)a # [[", r"(?#[[)a", "(?x:a # [[\n)b"]  # refused for other reasons


@pytest.mark.parametrize(("pattern", "words"), sorted(AMBIGUOUS_SETS.items()))
def test_classes_python_warns_about_are_refused_in_its_words_and_it_never_warns(pattern, words):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(sr.RuleSyntaxError) as info:
            sr.loads(_rule_file(pattern), name="sets.shard")
    assert not caught, [str(w.message) for w in caught]
    err = info.value
    assert err.code == "SR017"
    assert f"a character class that Python and RE2 read differently ({words})" in err.diagnostics[0].message
    assert "escape `[`, `-`, `&`, `~` and `|` inside a class" in err.hint


@pytest.mark.parametrize("pattern", NOT_AMBIGUOUS + NOT_AMBIGUOUS_REFUSED)
def test_look_alikes_python_reads_as_before_are_not_taken_for_sets(pattern):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _regex.check(pattern)
            accepted = True
        except _regex.UnsupportedPattern as err:
            assert "read differently" not in err.reason, err.reason
            accepted = False
    assert not caught, [str(w.message) for w in caught]
    assert accepted == (pattern in NOT_AMBIGUOUS)


_SET_TOKENS = st.sampled_from(
    [
        *"[]-&~|^\\()?:#x \nPan<>=!{},1",
        *("(?x)", "(?x:", "(?-x:", "(?i-x:", "(?#", "(?P<n>", "(?P=n)", "(?(1)", "(?<="),
        *(r"\N{", r"\N{EM DASH}", r"\x2d", r"\0", r"\d", "[[", "--", "&&", "||", "~~", "[^"),
    ]
)


def _python_parse(pattern: str) -> tuple[str | None, bool]:
    """Python's first `FutureWarning` about `pattern` (parsed afresh: `re`
    caches), and whether it is a syntax error."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _regex._p.parse(pattern)
            error = False
        except (re.error, OverflowError, ValueError, RecursionError):
            error = True
    future = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    return (future[0] if future else None), error


@settings(deadline=None, max_examples=1500)
@given(pattern=st.lists(_SET_TOKENS, min_size=1, max_size=14).map("".join))
def test_sets_are_found_exactly_where_python_warns(pattern: str) -> None:
    """Where Python's parser warns about a class, the check refuses the
    pattern in the same words; where it parses the pattern without a warning,
    the check finds no set (where Python's syntax error comes first, either
    may be said). The check itself never lets Python warn."""
    python, error = _python_parse(pattern)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _regex.check(pattern)
            reason = None
        except _regex.UnsupportedPattern as err:
            reason = err.reason
        except (re.error, OverflowError, ValueError, RecursionError):
            reason = None
    assert not [w for w in caught if issubclass(w.category, FutureWarning)], pattern
    if python is not None:
        assert reason is not None and f"({python.lower()})" in reason, (pattern, python, reason)
    elif not error:
        assert _sets.ambiguous_set(pattern) is None, pattern


# ------------------------------------------------------------- differential

# Pattern pieces that both engines accept; combined at random.
_ATOMS = st.sampled_from(
    [
        "a",
        "b",
        "0",
        "7",
        "/",
        "_",
        r"\d",
        r"\w",
        r"\s",
        r"\W",
        r"\D",
        ".",
        "[a-c]",
        "[^/]",
        "[0-3]",
        r"\.",
        "é",
        "٣",
        "[^[:alpha:]]",
        "[a[:digit:]]",
        "[a[:x]",
    ]
)
_SUFFIXES = st.sampled_from(["", "", "*", "+", "?", "{2}", "{1,3}", "{0,2}", "*?", "+?", "{,}", "{,2}"])


@st.composite
def _patterns(draw: st.DrawFn) -> str:
    def piece() -> str:
        if draw(st.integers(0, 4)) == 0:
            inner = "|".join(draw(st.lists(_ATOMS, min_size=1, max_size=3)))
            group = draw(st.sampled_from(["(", "(?:"]))
            return f"{group}{inner})" + draw(_SUFFIXES)
        return draw(_ATOMS) + draw(_SUFFIXES)

    body = "".join(piece() for _ in range(draw(st.integers(1, 5))))
    anchor_start = draw(st.sampled_from(["", "", "^", r"\b"]))
    anchor_end = draw(st.sampled_from(["", "", "$", r"\b", r"\B"]))
    flags = draw(st.sampled_from(["", "", "(?i)", "(?s)"]))
    return flags + anchor_start + body + anchor_end


_PATHS = st.text(alphabet=st.sampled_from(list("ab07/_.xAB é٣\t\x0b")), max_size=24)


@settings(deadline=None)
@given(pattern=_patterns(), paths=st.lists(_PATHS, min_size=1, max_size=8))
def test_rules_match_as_python_re_search_with_ascii_classes(pattern: str, paths: list[str]) -> None:
    """For every pattern the loader accepts, RE2 finds it in exactly the paths
    where Python's `re.search(pattern, path, re.ASCII)` does (paths without a
    newline: there `$` also matches before a final newline in Python)."""
    try:
        _regex.check(pattern)
    except (_regex.UnsupportedPattern, re.error):
        return
    python = re.compile(pattern, re.ASCII)
    for path in paths:
        assert _regex.search(pattern, path) == (python.search(path) is not None), (pattern, path)


@settings(deadline=None)
@given(
    patterns=st.lists(_patterns(), min_size=1, max_size=5), paths=st.lists(_PATHS, min_size=1, max_size=20)
)
def test_the_matcher_is_the_first_re_search_hit(patterns: list[str], paths: list[str]) -> None:
    """The matcher (keys, digit-blind rules decided once per key) gives the
    first rule whose pattern Python's `re.search` (ASCII classes) finds."""
    accepted = []
    for pattern in patterns:
        try:
            _regex.check(pattern)
        except (_regex.UnsupportedPattern, re.error):
            continue
        accepted.append(pattern)
    if not accepted:
        return
    body = "\n".join(f'  "{p}" -> replicated' for p in accepted)
    rules = sr.loads(f"rules params:\n{body}\n")
    matcher = Matcher(rules.group("params"))
    for path in paths:
        want = next((p for p in accepted if re.search(p, path, re.ASCII)), None)
        got = matcher.first(path)
        assert (got.pattern if got is not None else None) == want, (path, accepted)


@pytest.mark.parametrize(
    ("pattern", "path", "found"),
    [
        (r"\s", "a\x0bb", True),  # Python's ASCII `\s` has the vertical tab; RE2's alone has not
        (r"^\S$", "\x0b", False),
        (r"[\s]", "\x0b", True),
        (r"[^\S]", "\x0b", True),
        (r"[^\s/]+", "a b", True),
        (r"\\s", "\\s", True),  # an escaped backslash, then `s`
    ],
)
def test_space_classes_mean_what_they_mean_to_python(pattern, path, found):
    _regex.check(pattern)
    assert _regex.search(pattern, path) is found is (re.search(pattern, path, re.ASCII) is not None)


def test_the_patterns_of_one_load_are_bounded_in_total():
    """Each under the per-pattern bound, 10,000 together took 12 s and 2.5 GB."""
    text = "rules params:\n" + "".join(f'  "[^a]{{1000}}{i:05d}" -> replicated\n' for i in range(9999))
    start = time.perf_counter()
    with pytest.raises(sr.RuleDefinitionError) as info:
        sr.loads(text, name="heavy.shard")
    assert info.value.code == "SR009" and "RE2 instructions" in str(info.value)
    assert time.perf_counter() - start < 10  # a hang guard: refused after the first few patterns


def test_case_folding_is_unicodes():
    """The one documented difference with `re.ASCII`: `(?i)` folds case by
    Unicode's rules (as Python does without `re.ASCII`)."""
    for pattern, path in [("(?i)k", "\u212a"), ("(?i)é", "É"), ("(?i)s", "\u017f")]:
        _regex.check(pattern)
        assert _regex.search(pattern, path) and re.search(pattern, path) is not None
