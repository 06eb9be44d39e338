"""Interop: how other frameworks' objects look to shardrules.

A pytree's leaves and their `/`-joined paths (Flax `Partitioned` and NNX
`Variable` boxes add no segment), torchax tensors in and out of the API, and
NNX modules (named scopes, sharded creation). Frameworks are never imported
here: only recognised when the user has imported them. Converters from other
projects' rule formats belong here too.

May import: `_language` and the base modules (`_errors`, `_version`, `_gcpause`).
"""
