"""Tracing: layouts inside `jax.jit`.

`constrain` (by path or by name), `auto_constrain` (on every named scope's
output, found by interpreting the traced program) and `jit`.

May import: `shardrules._planning` and everything below it. Not `_placement`.
"""
