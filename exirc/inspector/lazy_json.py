"""JSON written as it is made: `exirc inspect --json` in bounded memory.

A program file of a few megabytes can hold hundreds of thousands of
instructions, values or buffers. Building the whole `--json` document as
Python objects, then one string, costs a hundred times the file. Instead,
the long parts of the document are `Lazy` lists, which make their items one
at a time, and `write_json` streams the document: each item is made,
encoded and written, then dropped.

A hostile or generated file can also hold a hundred thousand items that
differ in a number or two (empty arenas, the buffers of a plan): those are
`Template.rows` lists: the text of their dicts is made once per indent
level, and each item only has its numbers put in, instead of being walked.

The text is exactly what `json.dumps(document, indent=2)` would print for
the same data, so readers see no difference.
"""

from __future__ import annotations

import io
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


class _Slot:
    """The marker of a `Template` field that each row fills."""

    def __repr__(self) -> str:
        return "SLOT"


SLOT: Any = _Slot()

# What a slot is written as while a template's text is made: a string no
# document holds, replaced by `%s` afterwards.
_SLOT_MARK = "\x00slot\x00"


class Template:
    """Dicts that share their keys and all their values but a few scalars.

    `Template({"id": SLOT, "bytes": SLOT, "tensors": []})` describes them;
    a row `(3, 512)` is one of them, with 3 and 512 in its slots (in key
    order). The writer makes the template's text once per indent level and
    writes each row as that text with its values put in (`Rows`).
    """

    __slots__ = ("fields", "slots", "_texts")

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.fields = dict(fields)
        self.slots = tuple(key for key, value in self.fields.items() if value is SLOT)
        self._texts: dict[int, str] = {}

    def rows(self, count: int, make: Callable[[], Iterable[Any]]) -> Rows:
        """A Lazy list of `count` items, most of them this template's dicts:
        `make` yields each of those as the tuple of its slot values, and any
        other item (a dict of another shape) as itself."""
        return Rows(count, self, make)

    def text(self, level: int) -> str:
        """The dicts' text at indent `level`, with `%s` for each slot."""
        text = self._texts.get(level)
        if text is None:
            marked = {key: _SLOT_MARK if value is SLOT else value
                      for key, value in self.fields.items()}
            out = io.StringIO()
            writer = _Writer(out)
            writer.value(marked, level)
            writer.flush()
            text = out.getvalue().replace("%", "%%").replace(_string(_SLOT_MARK), "%s")
            self._texts[level] = text
        return text


class Filled(Mapping[str, Any]):
    """A `Template`'s dict with its slots filled: what iterating `Rows` gives
    any reader, as a read-only mapping."""

    __slots__ = ("template", "row")

    def __init__(self, template: Template, row: tuple[Any, ...]) -> None:
        self.template = template
        self.row = row  # the values of the slots, in key order

    def _dict(self) -> dict[str, Any]:
        whole = dict(self.template.fields)
        whole.update(zip(self.template.slots, self.row, strict=True))
        return whole

    def __getitem__(self, key: str) -> Any:
        return self._dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.template.fields)

    def __len__(self) -> int:
        return len(self.template.fields)

    def __repr__(self) -> str:
        return f"Filled({self._dict()!r})"


class Rows(Lazy[Any]):
    """`Template.rows`: iterated, its tuples are `Filled` dicts; the writer
    puts them into the template's text without making them."""

    __slots__ = ("template", "make_rows")

    def __init__(self, count: int, template: Template, make: Callable[[], Iterable[Any]]
                 ) -> None:
        super().__init__(count, self._items)
        self.template = template
        self.make_rows = make

    def _items(self) -> Iterator[Any]:
        template = self.template
        for row in self.make_rows():
            yield Filled(template, row) if type(row) is tuple else row


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
        elif type(value) is Rows:
            self.container("[", "]", value.make_rows(), level, keyed=False,
                           template=value.template)
        elif type(value) is dict or isinstance(value, Mapping):
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
                  keyed: bool, template: Template | None = None) -> None:
        """The items between `opening` and `closing`, a line each; with a
        `template`, a tuple item is a row of it (`Rows`)."""
        inner = "\n" + _INDENT * (level + 1)
        separator = opening + inner
        parts = self.parts
        filled = ""  # the template's text, made at the first row (a list may have none)
        for item in items:
            parts.append(separator)
            separator = "," + inner
            if keyed:
                key, item = item
                parts.append((_string(key) if type(key) is str else _string(_key(key))) + ": ")
            if template is not None and type(item) is tuple:
                filled = filled or template.text(level + 1)
                # Inline, for ints (most slots: their own text for %s); else by `_fill`.
                for value in item:
                    if type(value) is not int:
                        text = _fill(filled, item)
                        break
                else:
                    text = filled % item
                if text is None:  # a slot holds more than a scalar: walk the dict
                    item = dict(Filled(template, item))
            else:
                text = _scalar(item)
            if text is not None:
                parts.append(text)
            else:
                self.value(item, level + 1)
            if len(parts) >= _FLUSH_AT:
                self.flush()
        if separator.startswith(opening):  # nothing written: `{}` or `[]`
            self.text(opening + closing)
        else:
            self.text("\n" + _INDENT * level + closing)


_string = json.encoder.encode_basestring_ascii


def _fill(text: str, values: tuple[Any, ...]) -> str | None:
    """A template's `text` with `values` in its slots; None if a value is not
    a scalar."""
    texts = tuple(map(_scalar, values))
    return None if None in texts else text % texts


def _scalar_list(value: Any, level: int, outer: bool = True) -> str | None:
    """The text of a list or tuple of scalars, or of such lists (`json`'s
    pure-Python indented encoder is most of the cost of a long document); None
    for anything else."""
    if not isinstance(value, (list, tuple)):
        return None
    if not value:
        return "[]"
    pieces = []
    for item in value:
        text = _scalar(item)
        if text is None:  # a list of lists of scalars (lifetimes, steps) is one too
            text = _scalar_list(item, level + 1, False) if outer else None
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
