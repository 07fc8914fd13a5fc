"""`DataFile` -> `.ptd` bytes.

The FlatBuffer is built with the flatc-generated builder functions
(`schema/data_file.fbs`), the header is inserted at byte 8, and each distinct
content follows as a segment at a 128-byte aligned offset, so a mapped file
gives aligned weights. Entries with equal bytes share one segment. The same
`DataFile` always gives the same bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import flatbuffers

from exirc.serialize.data_file import FILE_IDENTIFIER, DataFile, TensorLayout
from exirc.serialize.data_file.generated import DataFile as DataFileTable
from exirc.serialize.data_file.generated import Entry, Layout, Segment
from exirc.serialize.data_file.header import (
    HEADER_AT,
    PADDED_LENGTH,
    SEGMENT_ALIGNMENT,
    DataFileHeader,
)
from exirc.serialize.header import align_up


def write_data_file(data: DataFile) -> bytes:
    """The `.ptd` bytes of `data`."""
    segments: list[bytes | memoryview] = []
    segment_of: dict[tuple[int, bytes], int] = {}
    placed = []
    for key, stored in data.entries.items():
        content = (len(stored.data), hashlib.sha256(stored.data).digest())
        if content not in segment_of:
            segment_of[content] = len(segments)
            segments.append(stored.data)
        placed.append((key, segment_of[content], stored.layout))
    offsets, end = [], 0
    for segment in segments:
        offsets.append(align_up(end, SEGMENT_ALIGNMENT))
        end = offsets[-1] + len(segment)
    flatbuffer = _flatbuffer(data.version, segments, offsets, placed)
    base = align_up(PADDED_LENGTH + len(flatbuffer), SEGMENT_ALIGNMENT)
    header = DataFileHeader(PADDED_LENGTH, len(flatbuffer), base, end)
    # FlatBuffer offsets are relative to where they are stored, so inserting
    # the header after the root offset moves only the root offset.
    root = int.from_bytes(flatbuffer[0:4], "little") + PADDED_LENGTH
    out = bytearray(root.to_bytes(4, "little"))
    out += flatbuffer[4:HEADER_AT]
    out += header.to_bytes()
    out += flatbuffer[HEADER_AT:]
    out += b"\0" * (base - len(out))  # to the segment base even without segments, as ExecuTorch
    for segment, offset in zip(segments, offsets):
        out += b"\0" * (base + offset - len(out))
        out += segment
    return bytes(out)


def _flatbuffer(version: int, segments: list[bytes | memoryview], offsets: list[int],
                placed: list[tuple[str, int, TensorLayout | None]]) -> bytes:
    b = flatbuffers.Builder(1024)

    def table(module: Any, *fields: tuple[Callable[[Any, Any], None], Any]) -> int:
        module.Start(b)
        for add, value in fields:
            add(b, value)
        return int(module.End(b))

    def vector(start: Callable[[Any, int], None], prepend: Callable[[Any], None],
               items: list[Any]) -> int:
        start(b, len(items))
        for item in reversed(items):
            prepend(item)
        return int(b.EndVector())

    segment_tables = [table(Segment, (Segment.AddOffset, offset),
                            (Segment.AddSize, len(data)))
                      for data, offset in zip(segments, offsets)]
    entry_tables = []
    for key, index, layout in placed:
        name = b.CreateString(key)
        fields: list[tuple[Callable[[Any, Any], None], Any]] = [
            (Entry.AddKey, name), (Entry.AddSegmentIndex, index)]
        if layout is not None:
            sizes = vector(Layout.StartSizesVector, b.PrependInt32, list(layout.sizes))
            order = vector(Layout.StartDimOrderVector, b.PrependUint8, list(layout.dim_order))
            fields.append((Entry.AddLayout, table(
                Layout, (Layout.AddScalarType, int(layout.scalar_type)),
                (Layout.AddSizes, sizes), (Layout.AddDimOrder, order))))
        entry_tables.append(table(Entry, *fields))
    segment_vector = vector(DataFileTable.StartSegmentsVector, b.PrependUOffsetTRelative,
                            segment_tables)
    entry_vector = vector(DataFileTable.StartEntriesVector, b.PrependUOffsetTRelative,
                          entry_tables)
    root = table(DataFileTable, (DataFileTable.AddVersion, version),
                 (DataFileTable.AddSegments, segment_vector),
                 (DataFileTable.AddEntries, entry_vector))
    b.Finish(root, file_identifier=FILE_IDENTIFIER)
    return bytes(b.Output())
