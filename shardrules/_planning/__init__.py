"""Planning: `RuleSet` × pytree × mesh → `Plan`, and every check on it.

Which mesh a call uses, matching paths to rules, resolving specs (`?`, `auto`,
`logical`), compiling the plan, the checks (warnings, memory, where inputs
live), bytes per host, shape sources for lint, and the entry points that plan
without moving anything (`plan`, `check`, `specs`, `shardings`).

May import: `_interop`, `_language` and the base modules (`_errors`, `_version`,
`_gcpause`).
"""
