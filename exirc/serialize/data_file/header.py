"""The data file's extended header (`FH01`) and its layout facts.

Like a `.pte`, a `.ptd` starts as a FlatBuffer: a 4-byte root table offset
and the file identifier `FT01`. The header is inserted at byte 8, padded to
16 bytes so the FlatBuffer's fields stay aligned:

    offset  size  field
         0     4  magic "FH01"
         4     4  header length in bytes (40)
         8     8  flatbuffer_offset: the header's padded end (48), where the
                  FlatBuffer's own bytes resume
        16     8  flatbuffer_size: bytes of the FlatBuffer without the header
        24     8  segment_base_offset: file offset of the first data segment
        32     8  segment_data_size: bytes of segment data

The FlatBuffer with its header is the first flatbuffer_offset +
flatbuffer_size bytes of the file. All integers are little-endian.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from exirc.errors import FormatError

HEADER_MAGIC = b"FH01"
HEADER_AT = 8
HEADER_LENGTH = 40
PADDED_LENGTH = 48  # HEADER_LENGTH rounded up to the FlatBuffer's 16-byte alignment
SEGMENT_ALIGNMENT = 128
_FIELDS = struct.Struct("<4sIQQQQ")


@dataclass(frozen=True)
class DataFileHeader:
    flatbuffer_offset: int
    flatbuffer_size: int
    segment_base_offset: int
    segment_data_size: int

    def to_bytes(self) -> bytes:
        packed = _FIELDS.pack(HEADER_MAGIC, HEADER_LENGTH, self.flatbuffer_offset,
                              self.flatbuffer_size, self.segment_base_offset,
                              self.segment_data_size)
        return packed + b"\0" * (PADDED_LENGTH - HEADER_LENGTH)

    @classmethod
    def parse(cls, data: bytes | memoryview) -> DataFileHeader:
        """The header of a whole file, checked against the file's size."""
        size = len(data)
        if size < HEADER_AT + _FIELDS.size:
            raise FormatError(f"file is {size} bytes, too short to be a data file",
                              field="header")
        magic, length, offset, fb_size, base, data_size = _FIELDS.unpack_from(data, HEADER_AT)
        if magic != HEADER_MAGIC:
            raise FormatError(f"header magic is {magic!r}, expected {HEADER_MAGIC!r}",
                              field="header")
        if length < HEADER_LENGTH:
            raise FormatError(f"header length {length} is shorter than {HEADER_LENGTH}",
                              field="header.length")
        if not HEADER_AT + length <= offset <= size or offset + fb_size > size:
            raise FormatError(f"FlatBuffer of {fb_size} bytes at offset {offset} does not "
                              f"fit the {size}-byte file", field="header.flatbuffer_size")
        if data_size and not offset + fb_size <= base:
            raise FormatError(f"segment_base_offset {base} lies inside the FlatBuffer",
                              field="header.segment_base_offset")
        if base + data_size > size:
            raise FormatError(f"segment data ends at {base + data_size}, past the end of "
                              f"the {size}-byte file", field="header.segment_data_size")
        return cls(offset, fb_size, base, data_size)
