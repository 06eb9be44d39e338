"""Reading the JSON and YAML documents converters take, with bounds.

Sources come from other people's repositories, like rule files, so reading
one must not hang or exhaust memory whatever it holds:

- JSON nested deeper than Python's recursion limit is a `SourceError`, not a
  `RecursionError`; so is a number too long to convert (`ValueError`).
- YAML is read with its parser's events watched (`_Bounds`), and a document
  is refused at the event that takes it over a bound, before anything is
  constructed: nested more than `MAX_DEPTH` deep, an alias inside the node it
  names (a recursive structure), or more than `MAX_NODES` nodes, each alias
  counted as the nodes it stands for: a 482-byte "billion laughs" document
  (nine levels of nine aliases) stands for 387 million nodes. Only a document
  within the bounds is constructed (PyYAML's safe loader: no Python objects,
  no tags beyond YAML's own), so whatever walks the data afterwards
  (converters, messages) sees at most `MAX_NODES` nodes, aliases expanded.
  With libyaml the C parser's events are checked before the C loader reads
  the text; without it, PyYAML's loader is checked as it composes (one parse).
"""

from __future__ import annotations

import json
from typing import Any

from ._common import SourceError, shown

MAX_DEPTH = 64
"""The deepest nesting of YAML collections read: configs nest 3 or 4 deep."""

MAX_NODES = 100_000
"""The most YAML nodes a document may stand for, each alias counted as the
nodes it names. MaxText's base.yml has about 2,000; 10,000 logical axis rules
(the most a rule file may hold) about 60,000."""

EXTRA_HINT = 'pip install "shardrules[yaml]"'


def parse_json(text: str, where: str) -> Any:
    """The JSON document `text`, or a `SourceError` saying where it is malformed
    (`where`: the source, for messages)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise SourceError(f"{where}: not JSON: {err}") from None
    except RecursionError:
        raise SourceError(
            f"{where}: nested too deeply to read (arrays or objects inside each other)"
        ) from None
    except ValueError as err:  # a number with more digits than Python converts
        raise SourceError(f"{where}: not JSON this reads: {err}") from None


def yaml_module() -> Any:
    """PyYAML, or an `ImportError` naming the extra to install."""
    try:
        import yaml
    except ImportError as err:
        raise ImportError(f"reading MaxText's YAML configs needs PyYAML: {EXTRA_HINT}") from err
    return yaml


def parse_yaml(text: str, where: str) -> Any:
    """The YAML document `text` as Python data (PyYAML's safe loader), once
    its nesting and its size with aliases expanded are known to be within
    `MAX_DEPTH` and `MAX_NODES`.

    With libyaml (`yaml.CSafeLoader`), the C parser's events are checked
    first and the C loader reads the text only if they are within the bounds
    (its composer cannot be watched). Without it, PyYAML's own loader is
    watched as it composes: each event is checked as the composer takes it,
    so the text is parsed once, and a document over the bounds is refused at
    the event that crosses them, its nodes composed (each alias one node) but
    nothing constructed.

    **Raises:** `ImportError` naming the extra to install when PyYAML is
    missing; `SourceError` for text that is not YAML or is over the bounds."""
    yaml = yaml_module()
    c_loader = getattr(yaml, "CSafeLoader", None)  # libyaml's parser when PyYAML has it
    try:
        if c_loader is not None:
            bounds = _Bounds(yaml, where)
            for event in yaml.parse(text, Loader=c_loader):
                bounds.see(event)
            return yaml.load(text, Loader=c_loader)
        loader = _watched(yaml)(text, where)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except SourceError:
        raise
    except yaml.YAMLError as err:
        raise SourceError(f"{where}: not a YAML file: {err}") from None
    except RecursionError:
        raise SourceError(f"{where}: nested too deeply to read") from None
    except ValueError as err:  # an integer with more digits than Python converts
        raise SourceError(f"{where}: not YAML this reads: {err}") from None


def _watched(yaml: Any) -> Any:
    """PyYAML's `SafeLoader`, each event it composes seen by `_Bounds` first."""

    class Watched(yaml.SafeLoader):
        def __init__(self, text: str, where: str) -> None:
            super().__init__(text)
            self.bounds = _Bounds(yaml, where)

        def get_event(self) -> Any:  # the composer takes every event through here, once
            event = super().get_event()
            self.bounds.see(event)
            return event

    return Watched


class _Bounds:
    """A YAML event stream, looked at event by event: `see` refuses
    (`SourceError`) the event that takes the document over the bounds, before
    any node is built from it; an alias adds the size its anchor was found to
    have."""

    def __init__(self, yaml: Any, where: str) -> None:
        self.yaml, self.where = yaml, where
        self.sizes: dict[str, int] = {}  # anchor -> nodes it stands for (closed nodes only)
        self.opened: list[tuple[str | None, int]] = []  # open collections: (anchor, nodes before it)
        self.nodes = 0

    def see(self, event: Any) -> None:
        yaml, where, opened = self.yaml, self.where, self.opened
        if isinstance(event, yaml.AliasEvent):
            size = self.sizes.get(event.anchor)
            if size is None:
                if any(anchor == event.anchor for anchor, _ in opened):
                    raise SourceError(
                        f"{where}:{_line(event)}: the alias *{shown(event.anchor)} is inside the node it names "
                        "(a structure that contains itself); write the data out"
                    )
                return  # undefined: the loader says so
            self.nodes += size
        elif isinstance(event, yaml.ScalarEvent):
            self.nodes += 1
            if event.anchor is not None:
                self.sizes[event.anchor] = 1
        elif isinstance(event, yaml.CollectionStartEvent):
            self.nodes += 1
            opened.append((event.anchor, self.nodes - 1))
            if len(opened) > MAX_DEPTH:
                raise SourceError(
                    f"{where}:{_line(event)}: nested more than {MAX_DEPTH} deep; configs nest a few levels"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, before = opened.pop()
            if anchor is not None:
                self.sizes[anchor] = self.nodes - before
        elif isinstance(event, yaml.DocumentEndEvent):
            self.sizes.clear()  # anchors belong to their document
        if self.nodes > MAX_NODES:
            raise SourceError(
                f"{where}:{_line(event)}: holds more than {MAX_NODES:,} values (each alias counted as the "
                "values it stands for); a config holds a few thousand: check that this is the file you meant"
            )


def _line(event: Any) -> int:
    mark = getattr(event, "start_mark", None)
    return mark.line + 1 if mark is not None else 0
