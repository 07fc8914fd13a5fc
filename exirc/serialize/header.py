"""The extended header (`eh00`) and the file layout facts around it.

A `.pte` file starts like any FlatBuffer: a 4-byte root table offset and the
4-byte file identifier `ET12`. The extended header follows at byte 8, so a
loader can learn the program's size and where the data segments start
without parsing the FlatBuffer:

    offset  size  field
         0     4  magic "eh00"
         4     4  header length in bytes (32; 24 in files without the last field)
         8     8  program_size: bytes of the FlatBuffer, header included
        16     8  segment_base_offset: file offset of the first data segment
        24     8  segment_data_size: bytes from segment_base_offset to the end of data

All integers are little-endian.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from exirc.errors import FormatError

FILE_IDENTIFIER = b"ET12"
HEADER_MAGIC = b"eh00"
HEADER_OFFSET = 8
HEADER_LENGTH = 32
# Files from before segment_data_size existed have a 24-byte header.
MIN_HEADER_LENGTH = 24
# Segments start at multiples of this, so mapped weights are well aligned.
SEGMENT_ALIGNMENT = 128


@dataclass(frozen=True)
class ExtendedHeader:
    program_size: int
    segment_base_offset: int
    segment_data_size: int
    length: int = HEADER_LENGTH

    def to_bytes(self) -> bytes:
        return HEADER_MAGIC + struct.pack(
            "<IQQQ", HEADER_LENGTH, self.program_size, self.segment_base_offset,
            self.segment_data_size,
        )

    @classmethod
    def parse(cls, data: bytes | memoryview) -> ExtendedHeader | None:
        """Read the header of a whole file; None when the file has none."""
        start = HEADER_OFFSET
        if len(data) < start + 8 or bytes(data[start:start + 4]) != HEADER_MAGIC:
            return None
        (length,) = struct.unpack_from("<I", data, start + 4)
        if length < MIN_HEADER_LENGTH or start + length > len(data):
            raise FormatError(
                f"extended header length {length} is invalid for a {len(data)}-byte file",
                field="header.length",
            )
        program_size, segment_base_offset = struct.unpack_from("<QQ", data, start + 8)
        segment_data_size = 0
        if length >= HEADER_LENGTH:
            (segment_data_size,) = struct.unpack_from("<Q", data, start + 24)
        return cls(program_size, segment_base_offset, segment_data_size, length)


def align_up(value: int, alignment: int) -> int:
    return value + (-value % alignment)
