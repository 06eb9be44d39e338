"""Drafting rule files: `suggest` reads a tree's paths and shapes and writes rules."""
