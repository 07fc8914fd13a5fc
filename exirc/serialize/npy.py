"""Reading and writing the arrays a user feeds to a program and gets back.

`exirc run model.pte --inputs x.npy` reads files we did not write, so every
.npy and .npz is treated as hostile:

  * Nothing is ever unpickled: object arrays are how a .npy runs code, and a
    program's inputs are plain tensors anyway, so only bool, integer and
    floating-point dtypes are accepted.
  * The header is parsed here rather than by `numpy.load`, and the number of
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

import ast
import contextlib
import io
import math
import os
import stat
import struct
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

import numpy
import numpy.lib.format
import numpy.typing as npt

from exirc.errors import InputError, UsageError

__all__ = ["MAX_HEADER_SIZE", "MAX_MEMBERS", "load_array", "load_arrays", "save_arrays"]

# numpy.load's own default cap: a real header for any array we accept is a
# few hundred bytes, and the cap bounds the work `ast.literal_eval` can do.
MAX_HEADER_SIZE = 10_000

# A program has a handful of inputs; an archive with thousands of members is
# a mistake or an attack on the time spent walking the zip directory.
MAX_MEMBERS = 1024

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

_NPY_MAGIC = numpy.lib.format.MAGIC_PREFIX  # b"\x93NUMPY"
_ZIP_MAGIC = b"PK"
_VERSIONS = {(1, 0): "<H", (2, 0): "<I", (3, 0): "<I"}  # -> header-length field

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


@dataclass(frozen=True)
class _Header:
    """What a .npy header promises, checked, before any data is trusted."""

    dtype: numpy.dtype[Any]
    shape: tuple[int, ...]
    fortran_order: bool
    header_size: int  # bytes from the start of the .npy to its first data byte
    nbytes: int  # data bytes the dtype and shape require

    def describe(self) -> str:
        return f"shape {self.shape} of {self.dtype.name} needs {_bytes(self.nbytes)}"


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
            header = _read_header(f, name, _NPY_HINT)
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
            lead = f.read(len(_NPY_MAGIC))
            if lead == _NPY_MAGIC:
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
        if not _is_accepted(array.dtype):
            raise ValueError(
                f"array {key!r} has dtype {array.dtype}; only bool, integer and "
                "floating-point arrays can be saved"
            )

    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    try:
        fd, tmp = tempfile.mkstemp(
            dir=directory, prefix=f".{os.path.basename(target)}.", suffix=".tmp"
        )
    except OSError as e:
        raise _write_error(target, e) from e
    try:
        with os.fdopen(fd, "wb") as f:
            with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
                for key, array in arrays.items():
                    with archive.open(key + ".npy", "w", force_zip64=True) as member:
                        numpy.lib.format.write_array(member, array, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates the file 0600; give it the mode a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise _write_error(target, e) from e
        raise


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
            header = _read_header(stream, where, _NPZ_HINT)
            declared = info.file_size - header.header_size
            if declared != header.nbytes:
                raise InputError(
                    f"{where}: zip entry declares {_bytes(max(declared, 0))} of array data, "
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


# --------------------------------------------------------------------------- .npy header


def _read_header(stream: IO[bytes], where: str, hint: str) -> _Header:
    """Parse and validate a .npy header (format versions 1.0, 2.0 and 3.0).

    Done by hand, not with numpy.lib.format's readers, because those cover
    only versions 1.0 and 2.0 publicly, accept any dtype (including object
    and structured ones) and report problems as bare ValueErrors.
    """
    lead = _read_up_to(stream, len(_NPY_MAGIC) + 2)
    if not lead:
        raise InputError(f"{where}: is empty, not a .npy file", hint=hint)
    if not lead.startswith(_NPY_MAGIC):
        if lead.startswith(_ZIP_MAGIC):
            raise InputError(
                f"{where}: is a .npz (zip) archive, not a single-array .npy file", hint=hint
            )
        raise InputError(f"{where}: not a .npy file (bad magic bytes {lead[:6]!r})", hint=hint)
    if len(lead) < len(_NPY_MAGIC) + 2:
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
    return _Header(
        dtype=dtype,
        shape=shape,
        fortran_order=fortran_order,
        header_size=len(_NPY_MAGIC) + 2 + length_size + header_length,
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
    if not _is_accepted(dtype):
        raise InputError(
            f"{where}: dtype {descr!r} ({_KIND_NAMES.get(dtype.kind, dtype.kind)}) is not "
            "supported; only bool, integer and floating-point arrays are",
            hint=hint,
        )
    return dtype


def _is_accepted(dtype: numpy.dtype[Any]) -> bool:
    return dtype.kind in _ACCEPTED_KINDS and dtype.fields is None and dtype.subdtype is None


# --------------------------------------------------------------------------- data


def _to_array(data: bytearray, header: _Header, where: str, hint: str) -> npt.NDArray[Any]:
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


def _read_into(stream: io.BufferedIOBase, header: _Header, where: str) -> bytearray:
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


def _read_growing(stream: IO[bytes], header: _Header, where: str) -> bytearray:
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


def _write_error(name: str, e: OSError) -> UsageError:
    return UsageError(
        f"{name}: cannot write: {e.strerror or e}",
        hint="check that the directory exists, is writable and has free space",
    )


def _size_mismatch(where: str, header: _Header, present: int) -> InputError:
    if present < header.nbytes:
        return _truncated(where, header, present, _NPY_HINT)
    return InputError(
        f"{where}: {_bytes(present - header.nbytes)} of unexpected data after the array "
        f"(the header's {header.describe()}; the file holds {_bytes(present)})",
        hint=_NPY_HINT,
    )


def _truncated(where: str, header: _Header, present: int, hint: str) -> InputError:
    return InputError(
        f"{where}: truncated: the header's {header.describe()}, "
        f"but only {_bytes(present)} of data follow",
        hint="the file is incomplete or the header is wrong; " + hint,
    )


def _bytes(n: int) -> str:
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


def _umask() -> int:
    # The only portable way to read the umask is to set it and put it back.
    mask = os.umask(0)
    os.umask(mask)
    return mask
