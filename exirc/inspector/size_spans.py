"""A FlatBuffer reader that records the byte span of every object it visits.

The size report decodes a FlatBuffer again with it (the program's, an
XNNPACK payload's graph) and charges each span to the part of the file its
field path names. It is the checked reader, so a hostile buffer fails the
same way it fails when read for real.
"""

from __future__ import annotations

from exirc.serialize.checked_buffer import CheckedBuffer, Path, TableView


class SpanRecorder(CheckedBuffer):
    """A checked reader that records (start, end, field path) of each object."""

    def __init__(self, data: bytes | memoryview) -> None:
        super().__init__(data)
        self.spans: list[tuple[int, int, str]] = []

    def view(self, pos: int, vtable: int, vtable_len: int, table_len: int,
             path: str | Path) -> TableView:
        text = str(path)
        self.spans.append((pos, pos + table_len, text))
        self.spans.append((vtable, vtable + vtable_len, text))
        return _RecordingTable(self, pos, vtable, vtable_len, table_len, path)


class _RecordingTable(TableView):
    __slots__ = ()

    def _vector(self, slot: int, elem_size: int, name: str) -> tuple[int, int] | None:
        found = super()._vector(slot, elem_size, name)
        if found is not None:
            start, count = found
            path = str(self.field_path(name))
            spans = self._spans()
            # The length prefix apart, so inline data can be charged alone.
            spans.append((start - 4, start, path + "#length"))
            spans.append((start, start + count * elem_size, path))
        return found

    def string(self, slot: int, name: str) -> str | None:
        text = super().string(slot, name)
        if text is not None:
            # `_vector` just recorded the string's bytes; add its terminator.
            spans = self._spans()
            _, end, path = spans[-1]
            spans.append((end, end + 1, path))
        return text

    def _spans(self) -> list[tuple[int, int, str]]:
        assert isinstance(self.buf, SpanRecorder)
        return self.buf.spans
