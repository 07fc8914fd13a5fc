""".pte bytes (or a path) -> program model, checking everything.

Reading a path maps the file, so constant segments come back as
`memoryview`s into the mapping: weights are never copied, and a 50 MB
program loads in the time it takes to decode its (small) FlatBuffer.
Mapping, and what protects it from a file changed on disk, is
`exirc.serialize.mapped_file`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from exirc.errors import FormatError
from exirc.serialize import metadata
from exirc.serialize import program as P
from exirc.serialize.checked_buffer import CheckedBuffer
from exirc.serialize.decode import decode_program, segment_ranges
from exirc.serialize.header import (
    FILE_IDENTIFIER,
    HEADER_LENGTH,
    HEADER_OFFSET,
    SEGMENT_ALIGNMENT,
    ExtendedHeader,
)
from exirc.serialize.mapped_file import open_mapped
from exirc.serialize.validate import validate_program

Source = bytes | bytearray | memoryview | str | os.PathLike[str]


@dataclass
class ProgramFile:
    """A program and the layout of the file it came from (for `inspect`)."""

    program: P.Program
    file_size: int
    header: ExtendedHeader | None
    # (file offset, size) of each segment, parallel to program.segments.
    segment_spans: list[tuple[int, int]]

    @property
    def program_size(self) -> int:
        """Bytes of the FlatBuffer, header included."""
        return self.header.program_size if self.header else self.file_size


def deserialize(source: Source) -> P.Program:
    """Read a `.pte` file or its bytes; raise FormatError if malformed."""
    return read_program_file(source).program


def read_program_file(source: Source) -> ProgramFile:
    data = map_file(source) if isinstance(source, (str, os.PathLike)) else memoryview(source)
    if not data.c_contiguous:
        data = memoryview(data.tobytes())
    if data.ndim != 1 or data.itemsize != 1:
        data = data.cast("B")
    return _read(data)


def map_file(path: str | os.PathLike[str], *, copy_on_write: bool = False) -> memoryview:
    """The file's bytes, mapped (read-only, or private copy-on-write pages).

    Small files are copied instead; `open_mapped` says which, and gives the
    guard (`MappedFile.check`) that refuses a mapped file changed since.
    """
    return open_mapped(path, copy_on_write=copy_on_write).view


def _read(data: memoryview) -> ProgramFile:
    size = len(data)
    if size < HEADER_OFFSET:
        raise FormatError(f"file is {size} bytes, too short to be a program", field="header")
    identifier = bytes(data[4:8])
    if identifier != FILE_IDENTIFIER:
        raise FormatError(
            f"file identifier is {identifier!r}, expected {FILE_IDENTIFIER!r}: not a .pte "
            "program, or one written for an incompatible schema version", field="header")
    header = ExtendedHeader.parse(data)
    program_size = size
    if header is not None:
        if not HEADER_OFFSET + header.length <= header.program_size <= size:
            raise FormatError(f"program_size {header.program_size} does not fit the "
                              f"{size}-byte file", field="header.program_size")
        program_size = header.program_size
        segments_end = header.segment_base_offset + header.segment_data_size
        if header.segment_data_size and not program_size <= header.segment_base_offset:
            raise FormatError(f"segment_base_offset {header.segment_base_offset} lies inside "
                              f"the {program_size}-byte program",
                              field="header.segment_base_offset")
        if segments_end > size:
            raise FormatError(f"segment data ends at {segments_end}, past the end of the "
                              f"{size}-byte file", field="header.segment_data_size")

    buf = CheckedBuffer(data[:program_size])
    program = decode_program(buf)
    spans = _segment_spans(buf, header, size)
    program.segments = [P.DataSegment(data[start:start + length]) for start, length in spans]
    inside = segments_inside(spans)
    for index, place in inside.items():
        program.segments[index].inside = place
    base = header.segment_base_offset if header else 0
    for index in packed_segments([(start - base, length) for start, length in spans], inside):
        program.segments[index].packed = True
    metadata.restore_stack_traces(program)
    validate_program(program)
    return ProgramFile(program, size, header, spans)


def _segment_spans(buf: CheckedBuffer, header: ExtendedHeader | None,
                   file_size: int) -> list[tuple[int, int]]:
    ranges = segment_ranges(buf)
    # ExecuTorch writes one empty segment, and no header, when a program has
    # no constant data; only segments with bytes need a header to be found.
    if header is None and any(length for _, length in ranges):
        raise FormatError("the program has data segments but the file has no extended header "
                          "to locate them", field="segments")
    spans = []
    base = header.segment_base_offset if header else 0
    # Older headers (24 bytes) do not say how much segment data there is.
    limit = header.segment_data_size if header and header.length >= HEADER_LENGTH \
        else file_size - base
    for i, (offset, length) in enumerate(ranges):
        if length and offset + length > limit:
            raise FormatError(f"segment of {length} bytes at offset {offset} runs past the "
                              f"{limit} bytes of segment data", field=f"segments[{i}]")
        spans.append((base + offset, length))
    return spans


def packed_segments(spans: list[tuple[int, int]], inside: dict[int, tuple[int, int]]
                    ) -> list[int]:
    """The segments the writer stored packed (`DataSegment.packed`), so that
    writing the program again gives the same bytes: it starts each one
    unaligned (in padding between aligned segments, or after them all), or
    where another packed one ends."""
    stored = sorted((offset, index) for index, (offset, length) in enumerate(spans)
                    if length and index not in inside)
    found, packed_ends = [], set()
    for offset, index in stored:
        if offset % SEGMENT_ALIGNMENT or offset in packed_ends:
            found.append(index)
            packed_ends.add(offset + spans[index][1])
    return found


def segments_inside(spans: list[tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """Segment index -> (holder, offset) of each segment whose bytes lie inside
    another's (`DataSegment.inside`), as the writer stores them: the holder is
    the earliest-starting, widest segment holding them (the first of equals)."""
    order = sorted((i for i, (_, length) in enumerate(spans) if length),
                   key=lambda i: (spans[i][0], -spans[i][1], i))
    found: dict[int, tuple[int, int]] = {}
    holder: int | None = None
    for index in order:
        start, length = spans[index]
        if holder is not None:
            holder_start, holder_length = spans[holder]
            if start + length <= holder_start + holder_length:
                found[index] = (holder, start - holder_start)
                continue
        holder = index
    return found
