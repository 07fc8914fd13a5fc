"""Writing output files: atomically, with the user's umask, failures as usage errors.

Every file exirc writes (programs, `.npz` outputs, HTML reports) goes through
`write_atomically`: the bytes go to a temporary file beside the target, which
is renamed over it only when complete, so a failed or interrupted write never
leaves a partial file. `mkstemp` creates files 0600; they get the mode a plain
`open()` would give (0666 less the umask), so a program is readable by the
server or the `adb push` of another user, as the user's shell would make it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from typing import BinaryIO

from exirc.errors import UsageError


def write_atomically(path: str | os.PathLike[str],
                     data: bytes | Callable[[BinaryIO], None]) -> None:
    """Write `data` (bytes, or a function writing into the open file) to `path`."""
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(directory):
        raise UsageError(f"cannot write {target}: directory {directory} does not exist",
                         hint="create it, or write somewhere else")
    try:
        fd, temporary = tempfile.mkstemp(
            dir=directory, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
    except OSError as error:
        raise write_error(target, error) from error
    try:
        with os.fdopen(fd, "wb") as file:
            if isinstance(data, bytes):
                file.write(data)
            else:
                data(file)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, target)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(error, OSError):
            raise write_error(target, error) from error
        raise


def write_error(name: str, error: OSError) -> UsageError:
    return UsageError(f"{name}: cannot write: {error.strerror or error}",
                      hint="check that the directory exists, is writable and has free space")


def _umask() -> int:
    # The only portable way to read the umask is to set it and put it back.
    mask = os.umask(0)
    os.umask(mask)
    return mask
