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
  * Given what the inputs must be (`npy_expected`), the readers check the
    archive's names and every header against it before reading any data, so
    memory is bounded by the signature, not by what the file claims.

Every problem a user can fix is an `InputError` naming the file (and the
archive member) and saying what to do. Arrays come back C-contiguous and in
native byte order, the form the interpreter's kernels assume.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import struct
import zipfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any, BinaryIO

import numpy
import numpy.lib.format
import numpy.typing as npt

from exirc.errors import InputError
from exirc.serialize.files import write_atomically
from exirc.serialize.npy_data import read_growing, read_into, to_array, truncated
from exirc.serialize.npy_expected import ExpectedArray, ExpectedArrays
from exirc.serialize.npy_header import (
    MAX_HEADER_SIZE,
    NPY_MAGIC,
    Header,
    describe_size,
    is_accepted,
    read_header,
)

__all__ = ["MAX_HEADER_SIZE", "MAX_MEMBERS", "load_array", "load_array_files", "load_arrays",
           "save_arrays"]

# A program has a handful of inputs; an archive with thousands of members is
# a mistake or an attack on the time spent walking the zip directory.
MAX_MEMBERS = 1024

_NPY_HINT = (
    "write the array with numpy.save(path, array), using a bool, integer or floating-point array"
)
_NPZ_HINT = (
    "write the arrays with numpy.savez(path, name=array, ...), "
    "using bool, integer or floating-point arrays"
)
_PATH_HINT = "check the path and that the file is readable"


# --------------------------------------------------------------------------- public API


def load_array(path: str | os.PathLike[str],
               expect: ExpectedArray | None = None) -> npt.NDArray[Any]:
    """Read one .npy file without trusting it (and, given `expect`, only if its
    header fits it).

    Used instead of `numpy.load` because numpy allocates what the header
    asks for before noticing the data is missing, and because we want one
    actionable `InputError` per failure instead of numpy's mixed exceptions.
    """
    name = os.fspath(path)
    with _open_regular(name) as f:
        header = _read_file_header(f, name, expect)
        return _read_file_data(f, header, name)


def load_array_files(paths: Sequence[str | os.PathLike[str]],
                     expect: ExpectedArrays) -> list[npt.NDArray[Any]]:
    """Read one .npy file per input of `expect`, in order, without trusting them:
    every header is checked (alone, then all together) before any data is read."""
    expect.check_count(len(paths))
    with contextlib.ExitStack() as files:
        opened = []
        for path, array in zip(paths, expect.arrays):
            name = os.fspath(path)
            f = files.enter_context(_open_regular(name))
            opened.append((name, f, _read_file_header(f, name, array)))
        expect.check_together({array.name: header
                               for array, (_, _, header) in zip(expect.arrays, opened)})
        return [_read_file_data(f, header, name) for name, f, header in opened]


def load_arrays(path: str | os.PathLike[str],
                expect: ExpectedArrays | None = None) -> dict[str, npt.NDArray[Any]]:
    """Read a .npz archive of named arrays (`x.npy` -> key `x`) without trusting it
    (and, given `expect`, only if its names and headers fit it).

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
                return _load_members(archive, name, expect)
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


def _load_members(archive: zipfile.ZipFile, name: str,
                  expect: ExpectedArrays | None) -> dict[str, npt.NDArray[Any]]:
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise InputError(
            f"{name}: archive has {len(infos)} members, more than the {MAX_MEMBERS} allowed",
            hint="a program's inputs fit in a few arrays; split the archive or check the file",
        )
    keys: list[str] = []
    for info in infos:
        where = f"{name}: member {info.filename!r}"
        if info.is_dir() or not info.filename.endswith(".npy"):
            raise InputError(f"{where} is not a .npy array", hint=_NPZ_HINT)
        key = info.filename[: -len(".npy")]
        if key in keys:
            raise InputError(f"{where}: key {key!r} appears twice in the archive", hint=_NPZ_HINT)
        keys.append(key)
    if expect is not None:
        keys = expect.check_keys(keys, name)  # before decompressing anything
    with contextlib.ExitStack() as streams:
        opened = []
        for key, info in zip(keys, infos):
            where = f"{name}: member {info.filename!r} (key {key!r})"
            with _zip_errors(where):
                stream = streams.enter_context(archive.open(_checked_entry(info, where)))
                header = _read_member_header(stream, info, where,
                                             expect.named(key) if expect is not None else None)
            opened.append((key, where, stream, header))
        if expect is not None:
            expect.check_together({key: header for key, _, _, header in opened})
        arrays = {}
        for key, where, stream, header in opened:
            with _zip_errors(where):
                arrays[key] = _read_member_data(stream, header, where)
        return arrays


def _checked_entry(info: zipfile.ZipInfo, where: str) -> zipfile.ZipInfo:
    """`info`, if it is an entry we read: not encrypted, stored or deflated."""
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
    return info


def _read_member_header(stream: IO[bytes], info: zipfile.ZipInfo, where: str,
                        expect: ExpectedArray | None) -> Header:
    """The member's .npy header, checked against `expect` and the zip directory's size."""
    header = read_header(stream, where, _NPZ_HINT)
    if expect is not None:
        expect.check(header, where)  # before inflating a byte of data
    declared = info.file_size - header.header_size
    if declared != header.nbytes:
        raise InputError(
            f"{where}: zip entry declares {describe_size(max(declared, 0))} of array data, "
            f"but its .npy header says {header.describe()}",
            hint=_NPZ_HINT,
        )
    return header


def _read_member_data(stream: IO[bytes], header: Header, where: str) -> npt.NDArray[Any]:
    # ZipExtFile never yields more than the entry's declared size (which the
    # header has confirmed), inflates at most what each read asks for, and
    # checks the CRC once it reaches the end.
    data = read_growing(stream, header, where, _NPZ_HINT)
    if stream.read(1):  # also forces the CRC check at end of entry
        raise InputError(f"{where}: entry holds more data than declared", hint=_NPZ_HINT)
    return to_array(data, header, where, _NPZ_HINT)


@contextlib.contextmanager
def _zip_errors(where: str) -> Iterator[None]:
    """zipfile's and zlib's many exceptions for a bad entry, as one InputError."""
    try:
        yield
    except (
        zipfile.BadZipFile,
        zlib.error,
        EOFError,
        ValueError,
        struct.error,
        NotImplementedError,  # zipfile's word for zip features it cannot read
    ) as e:
        raise InputError(f"{where}: corrupt or unsupported zip entry ({e})", hint=_NPZ_HINT) from e


# --------------------------------------------------------------------------- .npy files


def _read_file_header(f: io.BufferedReader, name: str, expect: ExpectedArray | None) -> Header:
    """The .npy header of the open file `name`, checked against `expect` and the file's size."""
    try:
        header = read_header(f, name, _NPY_HINT)
        if expect is not None:
            expect.check(header, name)
        present = os.fstat(f.fileno()).st_size - header.header_size
    except OSError as e:
        raise _read_error(name, e) from e
    if present != header.nbytes:
        raise _size_mismatch(name, header, present)
    return header


def _read_file_data(f: io.BufferedReader, header: Header, name: str) -> npt.NDArray[Any]:
    try:
        # The file has been shown to hold exactly this many bytes, so
        # allocating them up front costs no more than the file itself.
        data = read_into(f, header, name, _NPY_HINT)
    except OSError as e:
        raise _read_error(name, e) from e
    return to_array(data, header, name, _NPY_HINT)


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
        return truncated(where, header, present, _NPY_HINT)
    return InputError(
        f"{where}: {describe_size(present - header.nbytes)} of unexpected data after the array "
        f"(the header's {header.describe()}; the file holds {describe_size(present)})",
        hint=_NPY_HINT,
    )
