"""Element types; schema: enum ScalarType (scalar_type.fbs)."""

from __future__ import annotations

import enum


class ScalarType(enum.IntEnum):
    """Element types; schema: enum ScalarType (scalar_type.fbs)."""

    BYTE = 0
    CHAR = 1
    SHORT = 2
    INT = 3
    LONG = 4
    HALF = 5
    FLOAT = 6
    DOUBLE = 7
    BOOL = 11
    QINT8 = 12
    QUINT8 = 13
    QINT32 = 14
    BFLOAT16 = 15
    QUINT4X2 = 16
    QUINT2X4 = 17
    BITS16 = 22
    FLOAT8E5M2 = 23
    FLOAT8E4M3FN = 24
    FLOAT8E5M2FNUZ = 25
    FLOAT8E4M3FNUZ = 26
    UINT16 = 27
    UINT32 = 28
    UINT64 = 29

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def short_name(self) -> str:
        """The compact spelling used in listings, e.g. `f32`."""
        return _SHORT_NAME[self]


_ITEMSIZE = {
    ScalarType.BYTE: 1, ScalarType.CHAR: 1, ScalarType.SHORT: 2, ScalarType.INT: 4,
    ScalarType.LONG: 8, ScalarType.HALF: 2, ScalarType.FLOAT: 4, ScalarType.DOUBLE: 8,
    ScalarType.BOOL: 1, ScalarType.QINT8: 1, ScalarType.QUINT8: 1, ScalarType.QINT32: 4,
    ScalarType.BFLOAT16: 2, ScalarType.QUINT4X2: 1, ScalarType.QUINT2X4: 1,
    ScalarType.BITS16: 2, ScalarType.FLOAT8E5M2: 1, ScalarType.FLOAT8E4M3FN: 1,
    ScalarType.FLOAT8E5M2FNUZ: 1, ScalarType.FLOAT8E4M3FNUZ: 1, ScalarType.UINT16: 2,
    ScalarType.UINT32: 4, ScalarType.UINT64: 8,
}

_SHORT_NAME = {
    ScalarType.BYTE: "u8", ScalarType.CHAR: "i8", ScalarType.SHORT: "i16", ScalarType.INT: "i32",
    ScalarType.LONG: "i64", ScalarType.HALF: "f16", ScalarType.FLOAT: "f32",
    ScalarType.DOUBLE: "f64", ScalarType.BOOL: "bool", ScalarType.QINT8: "qi8",
    ScalarType.QUINT8: "qu8", ScalarType.QINT32: "qi32", ScalarType.BFLOAT16: "bf16",
    ScalarType.QUINT4X2: "qu4x2", ScalarType.QUINT2X4: "qu2x4", ScalarType.BITS16: "bits16",
    ScalarType.FLOAT8E5M2: "f8e5m2", ScalarType.FLOAT8E4M3FN: "f8e4m3fn",
    ScalarType.FLOAT8E5M2FNUZ: "f8e5m2fnuz", ScalarType.FLOAT8E4M3FNUZ: "f8e4m3fnuz",
    ScalarType.UINT16: "u16", ScalarType.UINT32: "u32", ScalarType.UINT64: "u64",
}
