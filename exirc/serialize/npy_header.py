"""The .npy header: what a file claims about its array, parsed and checked.

A .npy file is a magic string, a format version, a header (a Python dict
literal naming the dtype, the shape and the memory order) and the raw data.
The header comes from a file we did not write, so it is parsed here rather
than by numpy: with `ast.literal_eval` under a size cap (nothing is ever
evaluated or unpickled), accepting only bool, integer and floating-point
dtypes, and computing the data size it asks for with Python ints, so the
readers in `exirc.serialize.npy` can compare it with the bytes really present
before allocating anything.
"""

from __future__ import annotations

import ast
import math
import struct
import sys
from dataclasses import dataclass
from typing import IO, Any

import numpy
import numpy.lib.format

from exirc.errors import InputError

# numpy.load's own default cap: a real header for any array we accept is a
# few hundred bytes, and the cap bounds the work `ast.literal_eval` can do.
MAX_HEADER_SIZE = 10_000

# dtype kinds a program tensor can have: bool, signed, unsigned, float.
_ACCEPTED_KINDS = "biuf"

# How to name a refused dtype kind in a message ("V" also covers sub-arrays).
_KIND_NAMES = {
    "c": "complex",
    "U": "text",
    "S": "bytes",
    "T": "text",
    "M": "datetime",
    "m": "timedelta",
    "V": "structured or raw bytes",
}

NPY_MAGIC = numpy.lib.format.MAGIC_PREFIX  # b"\x93NUMPY"
_ZIP_MAGIC = b"PK"
_VERSIONS = {(1, 0): "<H", (2, 0): "<I", (3, 0): "<I"}  # -> header-length field


@dataclass(frozen=True)
class Header:
    """What a .npy header promises, checked, before any data is trusted."""

    dtype: numpy.dtype[Any]
    shape: tuple[int, ...]
    fortran_order: bool
    header_size: int  # bytes from the start of the .npy to its first data byte
    nbytes: int  # data bytes the dtype and shape require

    def describe(self) -> str:
        return f"shape {self.shape} of {self.dtype.name} needs {describe_size(self.nbytes)}"


def read_header(stream: IO[bytes], where: str, hint: str) -> Header:
    """Parse and validate a .npy header (format versions 1.0, 2.0 and 3.0).

    Done by hand, not with numpy.lib.format's readers, because those cover
    only versions 1.0 and 2.0 publicly, accept any dtype (including object
    and structured ones) and report problems as bare ValueErrors.
    """
    lead = _read_up_to(stream, len(NPY_MAGIC) + 2)
    if not lead:
        raise InputError(f"{where}: is empty, not a .npy file", hint=hint)
    if not lead.startswith(NPY_MAGIC):
        if lead.startswith(_ZIP_MAGIC):
            raise InputError(
                f"{where}: is a .npz (zip) archive, not a single-array .npy file", hint=hint
            )
        raise InputError(f"{where}: not a .npy file (bad magic bytes {lead[:6]!r})", hint=hint)
    if len(lead) < len(NPY_MAGIC) + 2:
        raise InputError(f"{where}: truncated inside the .npy magic string", hint=hint)
    version = (lead[6], lead[7])
    length_format = _VERSIONS.get(version)
    if length_format is None:
        raise InputError(
            f"{where}: unsupported .npy format version {version[0]}.{version[1]} "
            "(exirc reads versions 1.0, 2.0 and 3.0)",
            hint=hint,
        )
    length_size = struct.calcsize(length_format)
    raw_length = _read_up_to(stream, length_size)
    if len(raw_length) < length_size:
        raise InputError(f"{where}: truncated inside the .npy header length", hint=hint)
    (header_length,) = struct.unpack(length_format, raw_length)
    if header_length > MAX_HEADER_SIZE:
        raise InputError(
            f"{where}: .npy header is {header_length} bytes, more than the "
            f"{MAX_HEADER_SIZE} allowed",
            hint=hint,
        )
    raw = _read_up_to(stream, header_length)
    if len(raw) < header_length:
        raise InputError(
            f"{where}: truncated: the .npy header ends after {len(raw)} of {header_length} bytes",
            hint=hint,
        )
    text = raw.decode("utf-8" if version == (3, 0) else "latin-1", errors="replace")
    try:
        # literal_eval builds only literals (never calls anything); the size
        # cap above bounds its work, and deep nesting fails as an error.
        fields = ast.literal_eval(text)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        fields = None
    if not isinstance(fields, dict) or set(fields) != {"descr", "fortran_order", "shape"}:
        raise InputError(
            f"{where}: malformed .npy header: expected a dict with the keys 'descr', "
            f"'fortran_order' and 'shape', got {_clip(text)}",
            hint=hint,
        )
    dtype = _header_dtype(fields["descr"], where, hint)
    shape = fields["shape"]
    if not isinstance(shape, tuple) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise InputError(
            f"{where}: bad shape {_clip(shape)} in the .npy header: "
            "it must be a tuple of non-negative integers",
            hint=hint,
        )
    fortran_order = fields["fortran_order"]
    if not isinstance(fortran_order, bool):
        raise InputError(
            f"{where}: bad fortran_order {_clip(fortran_order)} in the .npy header: "
            "it must be True or False",
            hint=hint,
        )
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > sys.maxsize or any(n > sys.maxsize for n in shape):
        # No array can be that big, and numbers this large would not even
        # print (Python refuses int -> str beyond 4300 digits).
        raise InputError(
            f"{where}: shape {_clip(shape)} of {dtype.name} in the .npy header is too large "
            f"for any array (more than {sys.maxsize} bytes or elements)",
            hint=hint,
        )
    return Header(
        dtype=dtype,
        shape=shape,
        fortran_order=fortran_order,
        header_size=len(NPY_MAGIC) + 2 + length_size + header_length,
        nbytes=nbytes,
    )


def _header_dtype(descr: object, where: str, hint: str) -> numpy.dtype[Any]:
    if isinstance(descr, list):
        raise InputError(
            f"{where}: dtype is a structured (record) dtype; only bool, integer and "
            "floating-point arrays are supported",
            hint=hint,
        )
    if not isinstance(descr, str):
        raise InputError(f"{where}: bad dtype {_clip(descr)} in the .npy header", hint=hint)
    try:
        dtype = numpy.dtype(descr)
    except Exception as e:  # numpy's dtype parser raises many types on odd strings
        raise InputError(
            f"{where}: unknown dtype {_clip(descr)} in the .npy header", hint=hint
        ) from e
    if dtype.hasobject:
        raise InputError(
            f"{where}: dtype {descr!r} is an object dtype; object arrays are stored with "
            "pickle, which can run arbitrary code, so exirc refuses them",
            hint=hint,
        )
    if not is_accepted(dtype):
        raise InputError(
            f"{where}: dtype {descr!r} ({_KIND_NAMES.get(dtype.kind, dtype.kind)}) is not "
            "supported; only bool, integer and floating-point arrays are",
            hint=hint,
        )
    return dtype


def is_accepted(dtype: numpy.dtype[Any]) -> bool:
    """Whether arrays of `dtype` are read and written: bool, integer, floating point."""
    return dtype.kind in _ACCEPTED_KINDS and dtype.fields is None and dtype.subdtype is None


def _read_up_to(stream: IO[bytes], n: int) -> bytes:
    """Read n bytes, fewer only at end of stream (raw reads may return short)."""
    parts: list[bytes] = []
    left = n
    while left > 0:
        part = stream.read(left)
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def describe_size(n: int) -> str:
    """`123 bytes`, `2048 bytes (2.0 KiB)`: a size for messages."""
    if n < 1024:
        return f"{n} bytes"
    size = float(n)
    units = ["KiB", "MiB", "GiB", "TiB", "PiB"]
    for unit in units[:-1]:
        size /= 1024
        if size < 1024:
            return f"{n} bytes ({size:.1f} {unit})"
    return f"{n} bytes ({size / 1024:.1f} {units[-1]})"


def _clip(value: object, limit: int = 80) -> str:
    """Quote header content in a message without echoing kilobytes of it."""
    text = repr(value.strip() if isinstance(value, str) else value)
    return text if len(text) <= limit else text[:limit] + "..."
