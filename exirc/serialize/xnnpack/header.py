"""The header in front of an XNNPACK payload, and the layout facts around it.

The payload ExecuTorch hands to `XnnpackBackend` is three parts: this header,
the FlatBuffer (`schema/xnnpack.fbs`) and a region of constant bytes. The
header says where the other two are, so the FlatBuffer can be read without
copying and the constants can follow it at an aligned offset:

    offset  size  field
         0     4  zeros
         4     4  magic "XH00"
         8     2  header length in bytes (30)
        10     4  flatbuffer_offset
        14     4  flatbuffer_size
        18     4  constant_data_offset
        22     8  constant_data_size

All integers are little-endian; offsets count from the payload's first byte.
The magic sits at bytes 4..8, where a FlatBuffer keeps its file identifier,
so a reader tells a headed payload from a bare FlatBuffer (files older than
the header) by those four bytes alone.

Writers put the FlatBuffer at the header length rounded up to `ALIGNMENT`
and the constant region right after the FlatBuffer, also rounded up, with
zero padding in between; every constant in the region starts aligned too.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from exirc.errors import FormatError

HEADER_MAGIC = b"XH00"
HEADER_LENGTH = 30
# The FlatBuffer's file identifier; older payloads carry LEGACY_FILE_IDENTIFIER,
# with the same table layout.
FILE_IDENTIFIER = b"XN01"
LEGACY_FILE_IDENTIFIER = b"XN00"
FILE_IDENTIFIERS = (FILE_IDENTIFIER, LEGACY_FILE_IDENTIFIER)
# Alignment of the FlatBuffer, the constant region and each constant in it.
ALIGNMENT = 16

_LAYOUT = struct.Struct("<4s4sHIIIQ")
assert _LAYOUT.size == HEADER_LENGTH


def align_up(value: int, alignment: int = ALIGNMENT) -> int:
    return value + (-value % alignment)


@dataclass(frozen=True)
class XnnpackHeader:
    flatbuffer_offset: int
    flatbuffer_size: int
    constant_data_offset: int
    constant_data_size: int
    length: int = HEADER_LENGTH

    @classmethod
    def for_sizes(cls, flatbuffer_size: int, constant_data_size: int) -> XnnpackHeader:
        """The header a writer puts before a FlatBuffer and constants of these sizes."""
        flatbuffer_offset = align_up(HEADER_LENGTH)
        return cls(flatbuffer_offset, flatbuffer_size,
                   flatbuffer_offset + align_up(flatbuffer_size), constant_data_size)

    def to_bytes(self) -> bytes:
        try:
            return _LAYOUT.pack(bytes(4), HEADER_MAGIC, HEADER_LENGTH, self.flatbuffer_offset,
                                self.flatbuffer_size, self.constant_data_offset,
                                self.constant_data_size)
        except struct.error:
            raise FormatError(
                "payload too large for the XNNPACK header's 32-bit offsets", field="header",
            ) from None

    @classmethod
    def parse(cls, data: bytes | memoryview) -> XnnpackHeader | None:
        """The header of a whole payload, checked against its size; None for
        a bare FlatBuffer (a payload written before the header existed)."""
        if len(data) < 8:
            raise FormatError(f"payload of {len(data)} bytes is too short", field="header")
        magic = bytes(data[4:8])
        if magic in FILE_IDENTIFIERS:
            return None
        if magic != HEADER_MAGIC:
            raise FormatError(
                f"bytes 4..8 are {magic!r}: neither the header magic {HEADER_MAGIC!r} "
                f"nor a FlatBuffer identifier {' / '.join(map(repr, FILE_IDENTIFIERS))}",
                field="header.magic",
            )
        if len(data) < HEADER_LENGTH:
            raise FormatError(f"payload of {len(data)} bytes ends inside the header",
                              field="header")
        zeros, _, length, fb_offset, fb_size, const_offset, const_size = \
            _LAYOUT.unpack_from(data, 0)
        header = cls(fb_offset, fb_size, const_offset, const_size, length)
        if zeros != bytes(4):
            raise FormatError(f"leading bytes are {zeros.hex()}, not zeros", field="header")
        header._check(len(data))
        return header

    def _check(self, size: int) -> None:
        # A longer header (fields appended by a newer writer) is fine; the
        # FlatBuffer must still come after it.
        if not HEADER_LENGTH <= self.length <= self.flatbuffer_offset:
            raise FormatError(
                f"header length {self.length} is not between {HEADER_LENGTH} and the "
                f"flatbuffer offset {self.flatbuffer_offset}", field="header.length")
        if self.flatbuffer_size < 8:
            raise FormatError(f"flatbuffer size {self.flatbuffer_size} is too small",
                              field="header.flatbuffer_size")
        fb_end = self.flatbuffer_offset + self.flatbuffer_size
        if fb_end > size:
            raise FormatError(
                f"flatbuffer [{self.flatbuffer_offset}, {fb_end}) runs past the "
                f"{size}-byte payload", field="header.flatbuffer_size")
        if self.constant_data_offset < fb_end:
            raise FormatError(
                f"constant data offset {self.constant_data_offset} lies inside the "
                f"flatbuffer (which ends at {fb_end})", field="header.constant_data_offset")
        const_end = self.constant_data_offset + self.constant_data_size
        if const_end > size:
            raise FormatError(
                f"constant data [{self.constant_data_offset}, {const_end}) runs past the "
                f"{size}-byte payload", field="header.constant_data_size")
