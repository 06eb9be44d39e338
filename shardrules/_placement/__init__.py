"""Placement: putting arrays where the plan says.

`apply` (one batched `device_put`, or each process's own shards), sharded
initialisation, safetensors and Orbax checkpoint loading, and the check that
the processes of a multi-process run hold the same tree.

May import: `shardrules._planning` and everything below it. Not `_tracing`.
"""
