"""Converters from other projects' sharding rules to rule files.

Each converter reads one format and writes rule-file text that gives, leaf by
leaf, the layout the source gives: MaxText YAML configs (`_maxtext`), Flax
`logical_axis_rules` (`_flax`, sharing `_logical` with MaxText), transformers
tensor-parallel plans (`_hf`), EasyLM/scalax `(regex, PartitionSpec)` lists
(`_regex`), and EasyDeL configs' `get_partition_rules()` (`_easydel`). What
cannot be said exactly in the language is reported in `Conversion.notes` and
in the text as comments, never dropped silently (`_common`).

May import: `_language` and the base modules.
"""
