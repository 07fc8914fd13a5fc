"""The data after a checked .npy header: read within its size, made an array.

`exirc.serialize.npy` checks a header (and the file's or the zip entry's
size) before calling these; they read exactly the bytes the header needs,
in chunks, and give the interpreter the one layout its kernels assume.
"""

from __future__ import annotations

import io
import math
from typing import IO, Any

import numpy
import numpy.typing as npt

from exirc.errors import InputError
from exirc.serialize.npy_header import Header, describe_size

# Reads go through chunks of this size so that, in a .npz, memory grows only
# as fast as real decompressed data arrives, never by what a header claims.
_CHUNK = 1 << 20


def to_array(data: bytearray, header: Header, where: str, hint: str) -> npt.NDArray[Any]:
    """Give the interpreter the one layout its kernels assume: C order, native endian."""
    try:
        flat = numpy.frombuffer(data, dtype=header.dtype, count=math.prod(header.shape))
        array = flat.reshape(header.shape, order="F" if header.fortran_order else "C")
    except (ValueError, OverflowError) as e:
        # The byte count matched, yet numpy cannot represent the shape: too
        # many dimensions, or an empty array such as (0, 2**62, 2**62).
        raise InputError(
            f"{where}: shape {header.shape} in the .npy header cannot be built ({e})", hint=hint
        ) from e
    # Not numpy.ascontiguousarray: it turns a 0-d array into shape (1,).
    # No copy when the data is already C-ordered and native.
    return numpy.asarray(array, dtype=header.dtype.newbyteorder("="), order="C")


def read_into(stream: io.BufferedIOBase, header: Header, where: str, hint: str) -> bytearray:
    """Read data whose size the file has already been shown to hold."""
    data = bytearray(header.nbytes)
    view = memoryview(data)
    done = 0
    while done < header.nbytes:
        count = stream.readinto(view[done : done + _CHUNK])
        if not count:  # the file shrank since we measured it
            raise truncated(where, header, done, hint)
        done += count
    return data


def read_growing(stream: IO[bytes], header: Header, where: str, hint: str) -> bytearray:
    """Read data whose size is only claimed, so memory tracks what actually arrives."""
    data = bytearray()
    while len(data) < header.nbytes:
        part = stream.read(min(_CHUNK, header.nbytes - len(data)))
        if not part:
            raise truncated(where, header, len(data), hint)
        data += part
    return data


def truncated(where: str, header: Header, present: int, hint: str) -> InputError:
    return InputError(
        f"{where}: truncated: the header's {header.describe()}, "
        f"but only {describe_size(present)} of data follow",
        hint="the file is incomplete or the header is wrong; " + hint,
    )
