"""Reports: a plan (and a step's cost) shown, written, read back and compared.

The plan file `shardrules dump` writes and its strict reader, `diff` between
two plans with the bytes each device must receive, golden plans for tests,
the device pictures of `explain`, and the one-page HTML report.

May import: `_planning`, `_interop`, `_language` and the base modules.
"""
