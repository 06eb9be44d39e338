"""The language: rule text → `RuleSet`.

Grammar loading, the parser and its syntax-error hints, the rule syntax tree,
reading files and following includes, names (mesh line, aliases), building
rules, the pattern checks and the formatter. Needs neither a pytree nor a mesh.

May import: the base modules (`_errors`, `_version`, `_gcpause`).
"""
