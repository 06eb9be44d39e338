"""Acknowledged warnings: `# noqa: SR204` at the end of a line.

A warning says a plan is probably not what was meant. Where it is what was
meant (a whole embedding kept on every device on purpose, an axis left for
another file's rules), the line it points at can say so, as linters' `noqa`
comments do: the warnings of the codes named, about that line, are no longer
reported, by `plan`, `check`, `shardrules lint` or the `ShardRulesWarning`s of
`apply` and `jit`. The acknowledgement sits in the file, next to the rule, where
a reviewer reads it; nothing else is silenced.

- Only warnings (SR2xx) about a line of a rule file can be acknowledged: an
  error means the plan cannot work as written, and stays; SR208 and SR210
  are about the model's code, SR213 about a leaf, and SR207 is an error
  where `jit` applies the rule (`ELSEWHERE`).
- The codes must be named (`# noqa: SR204` or `# noqa: SR204, SR205`); a bare
  `# noqa`, an unknown code, an error's code, or a `noqa` on a line with no
  statement is an SR020 error when the file is loaded.
- The comment may say more before it, ended by `;`: `# kept whole on purpose;
  noqa: SR204`, or after the codes (`# noqa: SR204 (reviewed)`). `noqa`
  elsewhere in a comment's text, or followed by words rather than a colon,
  is prose.

The comment stays a comment for the grammar (`grammar/shardrules.lark`): a
file with acknowledgements reads the same to a version that knows nothing of
them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from .._errors import Diagnostic, Findings, Span, did_you_mean
from ._syntax import Comment, Item

WARNING_CODES = frozenset(
    {
        "SR201",
        "SR202",
        "SR203",
        "SR204",
        "SR205",
        "SR206",
        "SR209",
        "SR211",
        "SR212",
        "SR214",
        "SR215",
        "SR216",
        "SR217",
        "SR218",
        "SR219",
        "SR220",
    }
)
"""The codes a `noqa` comment may name: the warnings about a line of a rule file."""

ELSEWHERE = {
    "SR207": "`jit` and `auto_constrain` raise it as an error, which lint's warning tells of in advance",
    "SR208": "it is about an operation in the model's code, not a line of this file",
    "SR210": "it is about an operation in the model's code, not a line of this file",
    "SR213": "it is about a leaf of the tree, not a line of this file",
}
"""The warnings a `noqa` comment may not name, and why."""

# A directive is `noqa` right after a `#` that starts the comment or follows a space, or after a
# `;`, and then a colon (its codes), a code (a colon forgotten) or nothing more; elsewhere the
# word is prose.
_NOQA = re.compile(r"(?:(?:^|(?<=\s))#|;)\s*(noqa)(?=\s*:|\s*(?:[;#]|$)|\s+SR[0-9])", re.IGNORECASE)
_CODE = r"[A-Za-z0-9_]+"
_CODES = re.compile(rf"\s*:\s*({_CODE}(?:\s*,\s*{_CODE})*)")
_LIST_GOES_ON = re.compile(r"\s*[,\-+/&]|\s+[A-Za-z]+[0-9]+(?![A-Za-z0-9_])")
"""After the codes: a separator or another code, a list written other than `SR204, SR205`."""

Acknowledged = dict[tuple[str, int], frozenset[str]]
"""(file, line) → the warning codes acknowledged there; the file is named by
its resolved path, not by the name errors show for it: two files shown under
one name (reached through a symbolic link, or by `..`) never share a `noqa`."""


def read(items: Iterable[Item], name: str, real: str, into: Acknowledged, errors: Findings) -> None:
    """Add the `noqa` comments of one file's `items` (as parsed) to `into`, under
    the file's resolved path `real`; what is wrong with them to `errors` (SR020),
    at spans in the file `name`."""
    for item in items:
        if isinstance(item, Comment) and item.span is not None:
            for found in _NOQA.finditer(item.text):
                named = _directive(item, found, name, errors)
                if named:
                    key = (real, item.span.line)
                    into[key] = into.get(key, frozenset()) | named


def _directive(item: Comment, found: re.Match[str], name: str, errors: Findings) -> frozenset[str]:
    """The codes one `noqa` directive acknowledges; what is wrong with it to `errors`."""
    assert item.span is not None
    line, col = item.span.line, item.span.col

    def span(start: int, end: int) -> Span:
        return Span(name, line, col + start, line, col + end)

    at = span(found.start(1), found.end(1))
    if not item.trailing:
        errors.error(
            "SR020",
            "`noqa` on a line with no statement: it acknowledges nothing",
            at,
            'put it at the end of the line a warning points at, e.g. `"embed_tokens" -> replicated  # noqa: SR204`',
        )
        return frozenset()
    codes = _CODES.match(item.text, found.end(1))
    if codes is None and re.match(r"\s+SR[0-9]", item.text[found.end(1) :], re.IGNORECASE):
        errors.error(
            "SR020",
            "`noqa` without a colon before its codes",
            at,
            "write `# noqa: SR204`, a colon after `noqa`",
        )
        return frozenset()
    if codes is None:
        errors.error(
            "SR020",
            "`noqa` without codes: name the warnings it acknowledges",
            at,
            "write `# noqa: SR204` (several: `# noqa: SR204, SR205`); only the codes named are "
            "acknowledged, so a new warning on the line is still reported",
        )
        return frozenset()
    more = _LIST_GOES_ON.match(item.text, codes.end())
    if more is not None:
        errors.error(
            "SR020",
            "`noqa` codes written other than as a list separated by commas",
            span(codes.start(1), more.end()),
            "write them as `# noqa: SR204, SR205`: each code once, a comma between two",
        )
        return frozenset()
    named: set[str] = set()
    for code_match in re.finditer(_CODE, codes.group(1)):
        code = code_match.group(0).upper()
        where = span(codes.start(1) + code_match.start(), codes.start(1) + code_match.end())
        if code in WARNING_CODES:
            named.add(code)
        elif code in ELSEWHERE:
            errors.error(
                "SR020",
                f"`noqa: {code}`: {code} cannot be acknowledged in a rule file: {ELSEWHERE[code]}",
                where,
                f"docs/diagnostics.md has {code}'s fix",
            )
        elif re.fullmatch(r"SR[01][0-9]{2}", code):
            errors.error(
                "SR020",
                f"`noqa: {code}`: SR0xx and SR1xx codes are errors, and only warnings (SR2xx) can be acknowledged",
                where,
                f"an error means the plan cannot work as written: fix what it reports (docs/diagnostics.md has {code}'s fix)",
            )
        else:
            errors.error(
                "SR020",
                f"`noqa: {code}`: no warning has this code",
                where,
                did_you_mean(_digits(code), sorted(WARNING_CODES))
                or f"the warnings a rule file can acknowledge are {', '.join(sorted(WARNING_CODES))}",
            )
    return frozenset(named)


def _digits(code: str) -> str:
    """`code` with the letters that look like digits after `SR` read as them
    (`SR2O5` as `SR205`), so that the code meant is the one suggested."""
    return code[:2] + code[2:].translate(str.maketrans("OIL", "011"))


def acknowledges(
    acknowledged: Mapping[tuple[str, int], frozenset[str]], files: Mapping[str, str], diagnostic: Diagnostic
) -> bool:
    """Whether `diagnostic` is a warning that a `noqa` comment on its line names;
    `files` maps each file's name, as spans give it, to its resolved path (the
    key of `acknowledged`). A span in a file not in `files` is acknowledged by none."""
    if diagnostic.severity != "warning" or diagnostic.span is None:
        return False
    real = files.get(diagnostic.span.file)
    return real is not None and diagnostic.code in acknowledged.get((real, diagnostic.span.line), ())
