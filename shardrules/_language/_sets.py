"""Character classes whose meaning Python's `re` has announced it will change.

Python's parser warns (`FutureWarning`) about a class that opens with `[[`
("possible nested set") and about `--`, `&&`, `~~` and `||` inside a class
("possible set difference", ...): one day they will be nested sets and set
operations, and RE2 already reads `[[:alpha:]]` as a class of letters. A rule
pattern must mean the same to both engines, so such a pattern is refused
(SR017).

Python's warning itself cannot be what tells: catching it means changing the
process's warning filters (`warnings.catch_warnings`), which is not
thread-safe. Two threads inside it at once can leave "`FutureWarning` is an
error" installed for the whole process, or drop a warning that another thread
made meanwhile. So `ambiguous_set` reads the pattern as Python's parser does,
token by token (`\\` and the character after it are one token; verbose mode's
comments, `(?#...)` comments and group names are skipped), and
finds the first place it would warn, with Python's own words; a pattern with
none is then parsed without a warning. The tests hold the two equal over
generated patterns.

Where a pattern also has a syntax error before that place, Python raises the
error first; here the class is found all the same (SR017 before SR002: the
pattern is refused either way).
"""

from __future__ import annotations

_OPERATIONS = {"-": "difference", "&": "intersection", "~": "symmetric difference", "|": "union"}
_FLAGS = frozenset("iLmsxatu")


class _Tokens:
    """A pattern's tokens as Python's parser reads them: `next` is the token at
    `at` (`None` at the end, and at a lone `\\` ending the pattern, an error to
    Python)."""

    def __init__(self, pattern: str):
        self.pattern, self.at = pattern, 0

    @property
    def next(self) -> str | None:
        token = self.pattern[self.at : self.at + 2 if self.pattern.startswith("\\", self.at) else self.at + 1]
        return token if token and token != "\\" else None

    def get(self) -> str | None:
        token = self.next
        self.at += len(token or "")
        return token

    def match(self, token: str) -> bool:
        if self.next == token:
            self.at += len(token)
            return True
        return False

    def until(self, end: str) -> bool:
        """Skip past the next `end` token (a group name, a character name, a
        comment); `False` if there is none (an error to Python)."""
        while (token := self.get()) is not None:
            if token == end:
                return True
        return False


def ambiguous_set(pattern: str) -> str | None:
    """Python's words for the first character class of `pattern` that its
    parser would warn about (`"Possible nested set at position 1"`), or
    `None` if it warns about none."""
    tokens = _Tokens(pattern)
    verbose = False  # whether `#` starts a comment here (`(?x)`)
    groups: list[bool] = []  # for each open group, whether it was verbose outside it
    while (token := tokens.get()) is not None:
        if token == ")":
            if not groups:
                return None  # unbalanced: an error to Python
            verbose = groups.pop()
        elif verbose and token == "#":
            tokens.until("\n")
        elif token == "[":
            if (found := _in_class(tokens)) is not None:
                return found
        elif token == "(":
            if (group := _group(tokens, verbose)) is None:
                return None  # an error to Python
            opens, inside = group
            if opens:
                groups.append(verbose)
            verbose = inside
    return None


def _group(tokens: _Tokens, verbose: bool) -> tuple[bool, bool] | None:
    """Read what follows a `(`: whether it opens a group (not a comment, a
    named backreference or flags for the whole pattern) and whether what
    follows is read in verbose mode; `None` for an error."""
    if not tokens.match("?"):
        return True, verbose
    char = tokens.get()
    if char == "P":
        if tokens.match("<"):  # a named group: its name, up to `>`
            return (True, verbose) if tokens.until(">") else None
        return (False, verbose) if tokens.match("=") and tokens.until(")") else None
    if char == "#":
        return (False, verbose) if tokens.until(")") else None
    if char in (":", ">", "=", "!"):
        return True, verbose
    if char == "<":
        return (True, verbose) if tokens.next in ("=", "!") else None
    if char == "(":  # a conditional group: its group's name or number, up to `)`
        return (True, verbose) if tokens.until(")") else None
    if char is None or (char not in _FLAGS and char != "-"):
        return None
    on, off = "", ""
    while char in _FLAGS:
        on += char
        char = tokens.get()
    if char == ")" and on:  # flags for the whole pattern, `(?x)`
        return False, verbose or "x" in on
    if char == "-":
        while (char := tokens.get()) in _FLAGS:
            off += char
        if not off:
            return None
    if char != ":":
        return None
    return True, (verbose or "x" in on) and "x" not in off


def _in_class(tokens: _Tokens) -> str | None:
    """Read a character class after its `[`, as Python's parser does: the
    words of its warning about it, or `None`."""
    if tokens.next == "[":
        return f"Possible nested set at position {tokens.at}"
    tokens.match("^")
    items = 0
    while True:
        this = tokens.get()
        if this is None:
            return None  # unterminated: an error to Python
        if this == "]" and items:
            return None
        if this in _OPERATIONS and items and tokens.next == this:
            return f"Possible set {_OPERATIONS[this]} at position {tokens.at - 1}"
        if tokens.match("-"):  # a range, or a `-` before the closing `]`
            that = tokens.get()
            if that is None or that == "]":  # the end of the pattern (an error), or of the class
                return None
            if that == "-":
                return f"Possible set difference at position {tokens.at - 2}"
        items += 1
