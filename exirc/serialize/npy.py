"""Reading and writing the arrays a user feeds to a program and gets back.

`exirc run model.pte --inputs x.npy` reads files we did not write, so every
.npy and .npz is treated as hostile:

  * Nothing is ever unpickled: object arrays are how a .npy runs code, and a
    program's inputs are plain tensors anyway, so only bool, integer and
    floating-point dtypes are accepted.
  * The header is parsed by `npy_header`, not by `numpy.load`, and the number of
    data bytes it asks for (computed with Python ints, so it cannot overflow)
    must match the bytes really present *before* anything is allocated. A
    100-byte file whose header claims a 40 GiB array fails at once instead of
    exhausting memory.
  * In a .npz, each member's size from the zip directory must agree with its
    own .npy header before it is decompressed, and it is read through a
    stream that stops at that size, so a zip bomb can never make us hold more
    than the archive declares and the header confirms.

Every problem a user can fix is an `InputError` naming the file (and the
archive member) and saying what to do. Arrays come back C-contiguous and in
native byte order, the form the interpreter's kernels assume.
"""

from __future__ import annotations

import io
import math
import os
import stat
import struct
import zipfile
import zlib
from collections.abc import Mapping
from typing import IO, Any, BinaryIO

import numpy
import numpy.lib.format
import numpy.typing as npt

from exirc.errors import InputError
from exirc.serialize.files import write_atomically
from exirc.serialize.npy_header import (
    MAX_HEADER_SIZE,
    NPY_MAGIC,
    Header,
    describe_size,
    is_accepted,
    read_header,
)

__all__ = ["MAX_HEADER_SIZE", "MAX_MEMBERS", "load_array", "load_arrays", "save_arrays"]

# A program has a handful of inputs; an archive with thousands of members is
# a mistake or an attack on the time spent walking the zip directory.
MAX_MEMBERS = 1024

# Reads go through chunks of this size so that, in a .npz, memory grows only
# as fast as real decompressed data arrives, never by what a header claims.
_CHUNK = 1 << 20

_NPY_HINT = (
    "write the array with numpy.save(path, array), using a bool, integer or floating-point array"
)
_NPZ_HINT = (
    "write the arrays with numpy.savez(path, name=array, ...), "
    "using bool, integer or floating-point arrays"
)
_PATH_HINT = "check the path and that the file is readable"


# --------------------------------------------------------------------------- public API


def load_array(path: str | os.PathLike[str]) -> npt.NDArray[Any]:
    """Read one .npy file without trusting it.

    Used instead of `numpy.load` because numpy allocates what the header
    asks for before noticing the data is missing, and because we want one
    actionable `InputError` per failure instead of numpy's mixed exceptions.
    """
    name = os.fspath(path)
    with _open_regular(name) as f:
        try:
            header = read_header(f, name, _NPY_HINT)
            present = os.fstat(f.fileno()).st_size - header.header_size
            if present != header.nbytes:
                raise _size_mismatch(name, header, present)
            # The file has been shown to hold exactly this many bytes, so
            # allocating them up front costs no more than the file itself.
            data = _read_into(f, header, name)
        except OSError as e:
            raise _read_error(name, e) from e
    return _to_array(data, header, name, _NPY_HINT)


def load_arrays(path: str | os.PathLike[str]) -> dict[str, npt.NDArray[Any]]:
    """Read a .npz archive of named arrays (`x.npy` -> key `x`) without trusting it.

    Keys keep archive order, which is the order they were passed to
    `numpy.savez`, so callers can match them to inputs positionally if they
    must.
    """
    name = os.fspath(path)
    with _open_regular(name) as f:
        try:
            lead = f.read(len(NPY_MAGIC))
            if lead == NPY_MAGIC:
                raise InputError(
                    f"{name}: is a single-array .npy file, not a .npz archive",
                    hint="pass it as a .npy input, or " + _NPZ_HINT,
                )
            f.seek(0)
            try:
                archive = zipfile.ZipFile(f)
            except (
                zipfile.BadZipFile,
                EOFError,
                ValueError,
                struct.error,
                NotImplementedError,  # zipfile's word for zip features it cannot read
            ) as e:
                what = "is empty" if not lead else f"is not a valid .npz (zip) archive ({e})"
                raise InputError(f"{name}: {what}", hint=_NPZ_HINT) from e
            with archive:
                return _load_members(archive, name)
        except OSError as e:
            raise _read_error(name, e) from e


def save_arrays(path: str | os.PathLike[str], arrays: Mapping[str, npt.NDArray[Any]]) -> None:
    """Write named arrays as a .npz that `load_arrays` and `numpy.load` both read.

    The archive goes to a temporary file beside `path` and is renamed over
    it only once complete and flushed to disk, so a crash, a full disk or an
    interrupt leaves either the old file or the new one, never half of one.

    The zip is written here rather than with `numpy.savez` because savez
    takes the arrays as keyword arguments: a key named `file` or
    `allow_pickle` would collide with its own parameters. The path is used
    exactly as given (savez would append `.npz`).

    Raises TypeError or ValueError for arrays we would refuse to read back
    (a caller's bug), and `UsageError` when the file cannot be written.
    """
    for key, array in arrays.items():
        if not isinstance(key, str):
            raise TypeError(f"array names must be str, got {type(key).__name__}: {key!r}")
        if not isinstance(array, numpy.ndarray):
            raise TypeError(f"array {key!r} must be a numpy.ndarray, got {type(array).__name__}")
        if not is_accepted(array.dtype):
            raise ValueError(
                f"array {key!r} has dtype {array.dtype}; only bool, integer and "
                "floating-point arrays can be saved"
            )

    def write_members(file: BinaryIO) -> None:
        with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for key, array in arrays.items():
                with archive.open(key + ".npy", "w", force_zip64=True) as member:
                    numpy.lib.format.write_array(member, array, allow_pickle=False)

    write_atomically(path, write_members)


# --------------------------------------------------------------------------- .npz members


def _load_members(archive: zipfile.ZipFile, name: str) -> dict[str, npt.NDArray[Any]]:
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise InputError(
            f"{name}: archive has {len(infos)} members, more than the {MAX_MEMBERS} allowed",
            hint="a program's inputs fit in a few arrays; split the archive or check the file",
        )
    arrays: dict[str, npt.NDArray[Any]] = {}
    for info in infos:
        where = f"{name}: member {info.filename!r}"
        if info.is_dir() or not info.filename.endswith(".npy"):
            raise InputError(f"{where} is not a .npy array", hint=_NPZ_HINT)
        key = info.filename[: -len(".npy")]
        if key in arrays:
            raise InputError(f"{where}: key {key!r} appears twice in the archive", hint=_NPZ_HINT)
        arrays[key] = _load_member(archive, info, f"{where} (key {key!r})")
    return arrays


def _load_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> npt.NDArray[Any]:
    if info.flag_bits & 0x1:
        raise InputError(f"{where} is encrypted", hint=_NPZ_HINT)
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise InputError(
            f"{where} uses zip compression method {info.compress_type}; only stored and "
            "deflate (numpy.savez and numpy.savez_compressed) are supported",
            hint=_NPZ_HINT,
        )
    if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
        raise InputError(
            f"{where}: corrupt zip entry: stored (uncompressed) but its sizes disagree "
            f"({info.compress_size} vs {info.file_size} bytes)",
            hint=_NPZ_HINT,
        )
    try:
        # ZipExtFile never yields more than info.file_size bytes, and checks
        # the CRC once it reaches that size.
        with archive.open(info) as stream:
            header = read_header(stream, where, _NPZ_HINT)
            declared = info.file_size - header.header_size
            if declared != header.nbytes:
                raise InputError(
                    f"{where}: zip entry declares {describe_size(max(declared, 0))} of array data, "
                    f"but its .npy header says {header.describe()}",
                    hint=_NPZ_HINT,
                )
            data = _read_growing(stream, header, where)
            if stream.read(1):  # also forces the CRC check at end of entry
                raise InputError(f"{where}: entry holds more data than declared", hint=_NPZ_HINT)
    except (
        zipfile.BadZipFile,
        zlib.error,
        EOFError,
        ValueError,
        struct.error,
        NotImplementedError,  # zipfile's word for zip features it cannot read
    ) as e:
        raise InputError(f"{where}: corrupt or unsupported zip entry ({e})", hint=_NPZ_HINT) from e
    return _to_array(data, header, where, _NPZ_HINT)


# --------------------------------------------------------------------------- data


def _to_array(data: bytearray, header: Header, where: str, hint: str) -> npt.NDArray[Any]:
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


def _read_into(stream: io.BufferedIOBase, header: Header, where: str) -> bytearray:
    """Read data whose size the file has already been shown to hold."""
    data = bytearray(header.nbytes)
    view = memoryview(data)
    done = 0
    while done < header.nbytes:
        count = stream.readinto(view[done : done + _CHUNK])
        if not count:  # the file shrank since we measured it
            raise _truncated(where, header, done, _NPY_HINT)
        done += count
    return data


def _read_growing(stream: IO[bytes], header: Header, where: str) -> bytearray:
    """Read data whose size is only claimed, so memory tracks what actually arrives."""
    data = bytearray()
    while len(data) < header.nbytes:
        part = stream.read(min(_CHUNK, header.nbytes - len(data)))
        if not part:
            raise _truncated(where, header, len(data), _NPZ_HINT)
        data += part
    return data


# --------------------------------------------------------------------------- files and errors


def _open_regular(name: str) -> io.BufferedReader:
    """Open for reading, refusing anything whose size cannot be trusted.

    The size check needs a regular file: a FIFO or a device has no size, and
    O_NONBLOCK keeps a FIFO with no writer from hanging the open.
    """
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(name, flags)
    except OSError as e:
        raise _read_error(name, e) from e
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise InputError(f"{name}: is a directory, not a file", hint=_PATH_HINT)
        if not stat.S_ISREG(mode):
            raise InputError(
                f"{name}: is not a regular file (a pipe or device cannot be checked)",
                hint="save the data to a file first",
            )
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _read_error(name: str, e: OSError) -> InputError:
    if isinstance(e, FileNotFoundError):
        what = "no such file"
    elif isinstance(e, IsADirectoryError):
        what = "is a directory, not a file"
    elif isinstance(e, PermissionError):
        what = "cannot read: permission denied"
    else:
        what = f"cannot read: {e.strerror or e}"
    return InputError(f"{name}: {what}", hint=_PATH_HINT)


def _size_mismatch(where: str, header: Header, present: int) -> InputError:
    if present < header.nbytes:
        return _truncated(where, header, present, _NPY_HINT)
    return InputError(
        f"{where}: {describe_size(present - header.nbytes)} of unexpected data after the array "
        f"(the header's {header.describe()}; the file holds {describe_size(present)})",
        hint=_NPY_HINT,
    )


def _truncated(where: str, header: Header, present: int, hint: str) -> InputError:
    return InputError(
        f"{where}: truncated: the header's {header.describe()}, "
        f"but only {describe_size(present)} of data follow",
        hint="the file is incomplete or the header is wrong; " + hint,
    )


