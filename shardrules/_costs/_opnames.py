"""The named scopes an HLO instruction's `op_name` metadata names: JAX's
transforms unwrapped (`jvp(...)`, `transpose(...)` marks the gradient's),
the segments its loops and calls add dropped, a fused operation's several."""

from __future__ import annotations

import functools
import re

from .._tracing._outputs import is_subscripts


def _split(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside parentheses."""
    if "(" not in text:
        return text.split(sep)
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == sep and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return out


_WRAPPER = re.compile(r"(?P<name>[\w-]+)\((?P<inner>.*)\)")
_NOT_SCOPES = {"jit", "pjit", "pmap", "jvp", "vmap", "transpose", "remat", "checkpoint", "shard_map"}


def _segments(path: str) -> tuple[list[str], bool]:
    """The scope names in `path` (transforms unwrapped), and whether a
    `transpose` wraps any of them."""
    names: list[str] = []
    backward = False
    for segment in _split(path, "/"):
        m = _WRAPPER.fullmatch(segment)
        if m is None:
            if segment and not is_subscripts(segment):  # `jnp.einsum`'s scope: not one (see `_outputs`)
                names.append(segment)
            continue
        backward = backward or m["name"] == "transpose"
        inner, inner_backward = _segments(m["inner"])
        backward = backward or inner_backward
        if m["name"] not in _NOT_SCOPES or inner:
            names.extend(inner)
    return names, backward


_LOOP_PARTS = {"while": ("body", "cond"), "cond": ("branch",)}
_CALLS = {
    "closed_call",
    "core_call",
    "custom_jvp_call",
    "custom_vjp_call",
    "checkpoint",
    "remat",
    "rematted_computation",
}


def _own(names: list[str]) -> list[str]:
    """`names` without the segments JAX's loops and calls add to a scope
    (`layers/while/body/closed_call/attn` is `layers/attn`)."""
    out: list[str] = []
    skip = False
    for i, name in enumerate(names):
        if skip:
            skip = False
            continue
        follows = _LOOP_PARTS.get(name)
        if follows is not None and i + 1 < len(names) and names[i + 1].startswith(follows):
            skip = True
            continue
        if name in _CALLS:
            continue
        out.append(name)
    return out


def scope_of(op_name: str) -> list[str]:
    """The named scopes an HLO `op_name` names (several for a fused one,
    `(a/op:b/op)`), `SCOPE (backward)` under a `transpose`; `""` outside
    every scope."""
    return list(_scopes(op_name))


@functools.lru_cache(maxsize=65536)
def _scopes(op_name: str) -> tuple[str, ...]:
    """`scope_of`, read once per `op_name` (a program repeats each many times)."""
    parts = _split(op_name, "/")
    while (
        parts
        and (outer := _WRAPPER.fullmatch(parts[0])) is not None
        and outer["name"] in ("jit", "pjit", "pmap")
    ):
        parts.pop(0)
    text = "/".join(parts)
    fused = text.startswith("(") and text.endswith(")")  # one operation made of several
    out = []
    for piece in _split(text[1:-1], ":") if fused else [text]:
        pieces = _split(piece, "/")
        names, backward = _segments("/".join(pieces[:-1]))  # the last is the primitive
        scope = "/".join(_own(names))
        out.append(f"{scope} (backward)" if backward and scope else scope)
    return tuple(out)
