"""Rule guards: `"kernel" -> (fsdp, model) if bytes >= 1MiB and dtype in (float32, bfloat16)`.

A guard is checked when the rules are built (SR019: a variable, operator or
value that makes no sense) and becomes a `Guard`, which the planner asks
whether it holds for a leaf's shape and dtype. A rule applies to a leaf when
its pattern matches and its guard holds; otherwise matching goes on.

The variables:

- `elements`: the number of elements, the product of the shape;
- `bytes`: elements × the dtype's item size;
- `dtype`: the dtype's name, as NumPy and JAX write it (`float32`, `bfloat16`).

Nothing here needs NumPy: a dtype is anything with `.name` and `.itemsize`.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._errors import Findings, Span, did_you_mean
from ._syntax import Condition, RuleLine

if TYPE_CHECKING:  # the parse tree's types; the parser (which calls these) has loaded Lark
    import lark

VARIABLES = ("elements", "bytes", "dtype")
COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")
DTYPE_OPS = ("==", "!=", "in", "not in")

DTYPES = (
    "bool",
    *("int2", "int4", "int8", "int16", "int32", "int64"),
    *("uint2", "uint4", "uint8", "uint16", "uint32", "uint64"),
    *("float16", "bfloat16", "float32", "float64", "complex64", "complex128"),
    *("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz"),
    *("float8_e3m4", "float8_e4m3", "float8_e8m0fnu", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn"),
)
"""The dtype names a guard may use: NumPy's and JAX's (ml_dtypes) canonical names."""

# Names people write for dtypes that are not their canonical names.
_NICKNAMES = {
    "bf16": "bfloat16",
    "f16": "float16",
    "fp16": "float16",
    "half": "float16",
    "f32": "float32",
    "fp32": "float32",
    "single": "float32",
    "f64": "float64",
    "fp64": "float64",
    "double": "float64",
    "float": "float32` or `float64",
    "int": "int32` or `int64",
    "bool_": "bool",
    "fp8": "float8_e4m3fn` or `float8_e5m2",
}

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


# ------------------------------------------------------------------ parse tree → conditions


def conditions(
    tree: lark.Tree, span: Callable[[Any], Span], byte_size: Callable[[lark.Token], int]
) -> tuple[Condition, ...]:
    """The `Condition`s of a `guard` parse tree. `span` gives a node's span;
    `byte_size` reads a size (SR003 for a bad unit), used for `bytes`."""
    import lark

    return tuple(_condition(c, span, byte_size) for c in tree.children if isinstance(c, lark.Tree))


def _condition(
    tree: lark.Tree, span: Callable[[Any], Span], byte_size: Callable[[lark.Token], int]
) -> Condition:
    import lark

    variable, *rest = tree.children
    tokens = [t for t in rest if isinstance(t, lark.Token)]
    words = [t for t in tokens if t.type in ("NOT", "IN", "COMPARE")]
    values = [t for t in tokens if t.type in ("NAME", "NUMBER")]
    op = " ".join(str(w) for w in words)
    first, last = span(words[0]), span(words[-1])
    op_span = Span(first.file, first.line, first.col, last.end_line, last.end_col)
    parsed = tuple(_value(str(variable), v, byte_size) for v in values)
    return Condition(
        str(variable), op, parsed, span(tree), span(variable), op_span, tuple(span(v) for v in values)
    )


def _value(variable: str, token: lark.Token, byte_size: Callable[[lark.Token], int]) -> int | str:
    """A whole number as an `int` (a size, for `bytes`), anything else as written."""
    if token.type != "NUMBER":
        return str(token)
    if variable == "bytes":
        return byte_size(token)
    return int(token) if re.fullmatch(r"[0-9]{1,18}", token) else str(token)


def in_guard(after_arrow: str) -> bool:
    """Whether a syntax error after a rule's `->` (`after_arrow`: the text up to
    it) is in a guard."""
    return re.search(r"(^|[\s)])if(\s|\(|$)", after_arrow) is not None


def syntax_hint(found: str, before: str = "") -> str:
    """The hint of a syntax error in a guard (`found`: what the parser met, in
    backticks; `before`: the line up to it)."""
    form = (
        "a guard is `if CONDITION`, several joined with `and`; each is `elements OP N`, "
        "`bytes OP SIZE` (OP: <, <=, >, >=, ==, !=), `dtype == NAME`, `dtype != NAME`, "
        "`dtype in (NAME, ...)` or `dtype not in (NAME, ...)`"
    )
    if found == "`or`":
        return (
            "conditions are joined with `and` only: for either of two cases, write a rule for each; " + form
        )
    if found[1:2] in ("'", '"'):
        return "write dtype names without quotes, e.g. `dtype == float32`; " + form
    if re.search(r"[0-9]e$", before.rstrip("`")):
        return (
            "write a number out in full, without an exponent (`1000000`, not `1e6`; for bytes, `1MB`); "
            + form
        )
    if found.startswith("`_") and re.search(r"[0-9]$", before):
        return "write a number without `_` separators (`16384`); " + form
    return form


# ------------------------------------------------------------------ resolved


@dataclasses.dataclass(frozen=True)
class Test:
    """One checked condition: `variable` `op` `values` (ints for `elements`
    and `bytes`, dtype names for `dtype`)."""

    variable: str
    op: str
    values: tuple[int | str, ...]

    def holds(self, elements: int, nbytes: int, dtype_name: str) -> bool:
        if self.variable == "dtype":
            if self.op in ("in", "=="):
                return dtype_name in self.values
            return dtype_name not in self.values
        found = elements if self.variable == "elements" else nbytes
        return _COMPARE[self.op](found, self.values[0])


@dataclasses.dataclass(frozen=True)
class Guard:
    """A rule's checked guard: every test must hold. `text`: as the formatter
    writes it, `if elements >= 16384` (what findings and reports show)."""

    tests: tuple[Test, ...]
    text: str = dataclasses.field(default="", compare=False)
    span: Span | None = dataclasses.field(default=None, compare=False, repr=False)

    def holds(self, shape: tuple[int, ...], dtype: Any) -> bool:
        """Whether every test holds for an array of `shape` and `dtype`
        (anything with `.name` and `.itemsize`, such as a `numpy.dtype`)."""
        elements = math.prod(shape)
        nbytes = elements * dtype.itemsize
        name = dtype.name
        return all(t.holds(elements, nbytes, name) for t in self.tests)

    def __str__(self) -> str:
        return self.text


def check_guard(line: RuleLine, text: str, errors: Findings) -> Guard | None:
    """The `Guard` of a rule line (`None` without one, or when it has an
    error: SR019, recorded in `errors`). `text` is the guard as the formatter
    writes it."""
    if not line.guard:
        return None
    before = len(errors)
    tests = [_test(c, errors) for c in line.guard]
    if len(errors) > before:
        return None
    return Guard(tuple(t for t in tests if t is not None), text, line.guard_span)


def _test(cond: Condition, errors: Findings) -> Test | None:
    if cond.variable not in VARIABLES:
        hint = did_you_mean(cond.variable, VARIABLES) or "a guard tests `elements`, `bytes` or `dtype`"
        errors.error("SR019", f"invalid guard: unknown variable `{cond.variable}`", cond.variable_span, hint)
        return None
    spans = cond.value_spans or (cond.span,) * len(cond.values)
    if cond.variable == "dtype":
        if cond.op not in DTYPE_OPS:
            errors.error(
                "SR019",
                f"invalid guard: `dtype` is not compared with `{cond.op}`",
                cond.op_span,
                "write `dtype == NAME`, `dtype != NAME`, `dtype in (NAME, ...)` or `dtype not in (NAME, ...)`",
            )
            return None
        names = [_dtype(v, s, errors) for v, s in zip(cond.values, spans, strict=True)]
        if any(n is None for n in names):
            return None
        return Test("dtype", cond.op, tuple(n for n in names if n is not None))
    if cond.op not in COMPARISONS:
        errors.error(
            "SR019",
            f"invalid guard: `{cond.variable}` is not compared with `{cond.op}`",
            cond.op_span,
            f"compare `{cond.variable}` with one number: `<`, `<=`, `>`, `>=`, `==` or `!=`",
        )
        return None
    (value,), (span,) = cond.values, spans
    if not isinstance(value, int):
        if cond.variable == "elements" and re.fullmatch(r"[0-9.]+[A-Za-z]+", value):
            hint = f"`elements` counts elements; for a size write `bytes {cond.op} {value}`"
        elif cond.variable == "elements":
            hint = "write a whole number, e.g. `elements >= 16384`"
        else:
            hint = "write a size, e.g. `bytes >= 1MiB` (a bare number is bytes)"
        errors.error(
            "SR019", f"invalid guard: `{cond.variable}` is compared with a number, not `{value}`", span, hint
        )
        return None
    return Test(cond.variable, cond.op, (value,))


def _dtype(value: int | str, span: Span | None, errors: Findings) -> str | None:
    name = str(value)
    if name in DTYPES:
        return name
    nickname = _NICKNAMES.get(name.lower())
    hint = (
        f"did you mean `{nickname}`?"
        if nickname
        else did_you_mean(name, DTYPES)
        or "dtypes are written as NumPy and JAX name them: float32, bfloat16, int8, ..."
    )
    errors.error("SR019", f"invalid guard: unknown dtype `{name}`", span, hint)
    return None
