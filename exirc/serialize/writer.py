"""Program model -> `.pte` bytes.

The FlatBuffer (`exirc.serialize.flatbuffer`) comes first, the extended
header is inserted at byte 8, and the data segments follow at aligned offsets.
Serializing the same program twice gives identical bytes: nothing here
depends on dict order of unordered data, time or addresses.
"""

from __future__ import annotations

from collections.abc import Sequence

from exirc.errors import InternalError
from exirc.serialize import metadata
from exirc.serialize import program as P
from exirc.serialize.flatbuffer import FORCE_ALIGN, FlatBufferWriter
from exirc.serialize.header import (
    HEADER_LENGTH,
    HEADER_OFFSET,
    SEGMENT_ALIGNMENT,
    ExtendedHeader,
    align_up,
)

# The FlatBuffer's own alignment never exceeds this, so inserting a header
# of a multiple of it keeps every field aligned.
_MAX_FLATBUFFER_ALIGNMENT = FORCE_ALIGN


def serialize(program: P.Program, *, segment_alignment: int = SEGMENT_ALIGNMENT,
              metadata_segment: bool = True) -> bytes:
    """Return the `.pte` bytes of `program`.

    exirc's metadata goes in one segment (`exirc.serialize.metadata`);
    `metadata_segment=False` writes it as exirc did before, a segment per
    kind and stack traces in the chains (for tests of such files).
    """
    if metadata_segment:
        program = metadata.merged(program)
    inside = _segments_inside(program.segments)
    segment_offsets = _segment_offsets(program.segments, inside, segment_alignment)
    flatbuffer = FlatBufferWriter(segment_offsets).program(program)
    return _insert_header(flatbuffer, program.segments, segment_offsets, inside,
                          segment_alignment)


def _segments_inside(segments: Sequence[P.DataSegment]) -> dict[int, tuple[int, int]]:
    """Segment index -> (holder, offset) of each segment stored inside another."""
    found = {}
    for index, segment in enumerate(segments):
        place = _stored_inside(segment, index, segments)
        if place is not None:
            found[index] = place
    return found


def _segment_offsets(segments: Sequence[P.DataSegment], inside: dict[int, tuple[int, int]],
                     alignment: int) -> list[int]:
    """Offsets of each segment from the segment base: one after the other,
    each aligned; then each packed one in the first padding between aligned
    ones it fits (ending before the next begins), or else after them all,
    back to back; a segment stored inside another at its place there.

    Every packed segment starts unaligned (the first after them all one byte
    on if need be), or where a packed one ends: that is how the reader tells
    them (`reader.packed_segments`)."""
    offsets = [-1] * len(segments)  # inside ones are set below, from their holder's
    end = 0
    holes: list[list[int]] = []  # [start, end) of the padding between aligned segments
    for i, segment in enumerate(segments):
        if i not in inside and not segment.packed:
            offsets[i] = align_up(end, alignment)
            if segment.data:
                if offsets[i] > end > 0:
                    holes.append([end, offsets[i]])
                end = offsets[i] + len(segment.data)
    packed = [i for i, segment in enumerate(segments)
              if i not in inside and segment.packed and len(segment.data)]
    after = []
    for i in packed:
        size = len(segments[i].data)
        hole = next((h for h in holes if h[0] + size < h[1]), None)
        if hole is None:
            after.append(i)
        else:
            offsets[i] = hole[0]
            hole[0] += size
    if after and end % alignment == 0:
        end += 1
    for i in after:
        offsets[i] = end
        end += len(segments[i].data)
    for i, segment in enumerate(segments):
        if i not in inside and segment.packed and not segment.data:
            offsets[i] = end  # empty: nothing stored, anywhere will do
    for i, (holder, offset) in inside.items():
        offsets[i] = offsets[holder] + offset
    return offsets


def _stored_inside(segment: P.DataSegment, index: int,
                   segments: Sequence[P.DataSegment]) -> tuple[int, int] | None:
    """Where `segment`'s bytes are stored inside another segment, if they are
    exactly there; otherwise (a program edited since) they are stored on their own."""
    if segment.inside is None or not segment.data:
        return None
    holder, offset = segment.inside
    if not 0 <= holder < len(segments) or holder == index or segments[holder].inside is not None:
        return None
    data = memoryview(segments[holder].data)[offset:offset + len(segment.data)]
    if offset < 0 or data != memoryview(segment.data):
        return None
    return holder, offset


def _insert_header(flatbuffer: bytes, segments: Sequence[P.DataSegment],
                   segment_offsets: list[int], inside: dict[int, tuple[int, int]],
                   segment_alignment: int) -> bytes:
    # Offsets inside a FlatBuffer are relative to where they are stored, so
    # inserting bytes after the root offset only moves the root offset.
    if HEADER_LENGTH % _MAX_FLATBUFFER_ALIGNMENT:
        raise InternalError("extended header length breaks FlatBuffer alignment")
    root_offset = int.from_bytes(flatbuffer[0:4], "little") + HEADER_LENGTH
    program_size = len(flatbuffer) + HEADER_LENGTH
    # Without segments the base is the end of the program, not a padded
    # offset past the end of the file.
    segment_base = program_size
    segment_data_size = 0
    if segments:
        segment_base = align_up(program_size, segment_alignment)
        segment_data_size = max(offset + len(segment.data)
                                for segment, offset in zip(segments, segment_offsets))
    header = ExtendedHeader(program_size, segment_base, segment_data_size)

    out = bytearray()
    out += root_offset.to_bytes(4, "little")
    out += flatbuffer[4:HEADER_OFFSET]
    out += header.to_bytes()
    out += flatbuffer[HEADER_OFFSET:]
    stored = sorted((offset, index) for index, offset in enumerate(segment_offsets)
                    if index not in inside)  # the others' bytes are their holder's
    for offset, index in stored:
        out += b"\0" * (segment_base + offset - len(out))
        out += segments[index].data
    return bytes(out)
