"""JSON written as it is made: `exirc inspect --json` in bounded memory.

A program file of a few megabytes can hold hundreds of thousands of
instructions, values or buffers. Building the whole `--json` document as
Python objects, then one string, costs a hundred times the file. Instead,
the long parts of the document are `Lazy` lists, which make their items one
at a time, and `write_json` streams the document: each item is made,
encoded and written, then dropped.

The text is exactly what `json.dumps(document, indent=2)` would print for
the same data, so readers see no difference.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TextIO, TypeVar, overload

T = TypeVar("T")

_INDENT = "  "
_SHORT = 64  # a Lazy list this short is made whole when its dict is written in one go
_FLUSH_AT = 1 << 14  # pieces of text gathered before a write


class Lazy(Generic[T]):
    """A list whose items are made when iterated, each time anew.

    `len()` is known up front (the count is cheap; the items are not).
    Indexing makes the items up to the one asked for: meant for tests and
    small lists, not for walking a long one.
    """

    __slots__ = ("count", "make")

    def __init__(self, count: int, make: Callable[[], Iterable[T]]) -> None:
        self.count = count
        self.make = make

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[T]:
        return iter(self.make())

    def __bool__(self) -> bool:
        return self.count > 0

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            return list(self)[index]
        if index < 0:
            index += self.count
        if not 0 <= index < self.count:
            raise IndexError(index)
        return next(itertools.islice(iter(self), index, None))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Lazy, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Lazy({self.count} items)"


def materialize(document: Any) -> Any:
    """`document` with every `Lazy` list made into a plain list (for tests and
    small programs; the CLI streams instead)."""
    if isinstance(document, Mapping):
        return {key: materialize(value) for key, value in document.items()}
    if isinstance(document, (Lazy, list, tuple)):
        return [materialize(item) for item in document]
    return document


def write_json(document: Any, out: TextIO) -> None:
    """Write `document` to `out` as `json.dumps(document, indent=2)` would, and a
    newline; `Lazy` lists are made and written item by item."""
    writer = _Writer(out)
    writer.value(document, 0)
    writer.text("\n")
    writer.flush()


class _Writer:
    """Gathers the text in `parts` and writes it every `_FLUSH_AT` pieces.

    The hot loop is `container`: a document of 200,000 arenas is tens of
    millions of pieces, so it appends to `parts` directly and encodes scalar
    items inline rather than through a method call per piece.
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.parts: list[str] = []

    def text(self, text: str) -> None:
        self.parts.append(text)
        if len(self.parts) >= _FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        self.out.write("".join(self.parts))
        self.parts.clear()

    def value(self, value: Any, level: int) -> None:
        """Dicts, Lazy lists and lists of dicts are walked (they may hold Lazy
        lists); anything else is encoded whole by `json`."""
        scalar = _scalar(value)
        if scalar is not None:
            self.text(scalar)
        elif isinstance(value, Mapping):
            flat = _flat_mapping(value, level)
            if flat is not None:
                self.text(flat)
            else:
                self.container("{", "}", value.items(), level, keyed=True)
        elif isinstance(value, Lazy) or (isinstance(value, (list, tuple)) and any(
                isinstance(item, (Mapping, Lazy)) for item in value)):
            self.container("[", "]", iter(value), level, keyed=False)
        elif (text := _scalar_list(value, level)) is not None:
            self.text(text)
        else:
            text = json.dumps(value, indent=2)
            self.text(text.replace("\n", "\n" + _INDENT * level) if level else text)

    def container(self, opening: str, closing: str, items: Iterable[Any], level: int, *,
                  keyed: bool) -> None:
        inner = "\n" + _INDENT * (level + 1)
        separator = opening + inner
        parts = self.parts
        for item in items:
            parts.append(separator)
            separator = "," + inner
            if keyed:
                key, item = item
                parts.append((_string(key) if type(key) is str else _string(_key(key))) + ": ")
            scalar = _scalar(item)
            if scalar is not None:
                parts.append(scalar)
            else:
                self.value(item, level + 1)
            if len(parts) >= _FLUSH_AT:
                self.flush()
        if separator.startswith(opening):  # nothing written: `{}` or `[]`
            self.text(opening + closing)
        else:
            self.text("\n" + _INDENT * level + closing)


_string = json.encoder.encode_basestring_ascii


def _scalar_list(value: Any, level: int) -> str | None:
    """The text of a list or tuple of scalars (`json`'s pure-Python indented
    encoder is most of the cost of a long document); None for anything else."""
    if not isinstance(value, (list, tuple)):
        return None
    if not value:
        return "[]"
    pieces = []
    for item in value:
        text = _scalar(item)
        if text is None:
            return None
        pieces.append(text)
    inner = "\n" + _INDENT * (level + 1)
    return "[" + inner + ("," + inner).join(pieces) + "\n" + _INDENT * level + "]"


def _flat_mapping(value: Mapping[Any, Any], level: int) -> str | None:
    """The text of a non-empty dict whose values are all scalars or empty
    containers, in one join; None for any other (the writer walks it)."""
    pieces = []
    for key, item in value.items():
        text = _scalar(item)
        if text is None:
            if isinstance(item, (list, tuple)):
                text = _scalar_list(item, level + 1)
            elif isinstance(item, Lazy) and len(item) <= _SHORT:
                text = _scalar_list(list(item), level + 1)
            elif isinstance(item, Mapping) and not item:
                text = "{}"
            if text is None:
                return None
        pieces.append((_string(key) if type(key) is str else _string(_key(key))) + ": " + text)
    if not pieces:
        return None
    inner = "\n" + _INDENT * (level + 1)
    return "{" + inner + ("," + inner).join(pieces) + "\n" + _INDENT * level + "}"


def _scalar(value: Any) -> str | None:
    """`json.dumps(value)` of a string, number, bool or None, quickly; None
    for anything else. (Most of a document is these: one call of `json`
    each would be most of its cost.)"""
    kind = type(value)
    if kind is str:
        return _string(value)
    if kind is int:
        return int.__repr__(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is float:
        return float.__repr__(value) if math.isfinite(value) else json.dumps(value)
    return None


def _key(key: Any) -> str:
    """A dict key as `json` spells it: keys are strings in JSON."""
    if isinstance(key, str):
        return key
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, float):
        return json.dumps(key)
    if isinstance(key, int):
        return int.__repr__(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")
