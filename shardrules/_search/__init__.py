"""Searching meshes and drafted rule files by what each costs: `suggest(search=True)`."""
