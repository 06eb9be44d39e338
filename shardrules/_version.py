"""The package's version (the same as `version` in pyproject.toml)."""

__version__ = "0.1.0"
