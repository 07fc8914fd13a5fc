"""Writing output files: atomically, with the user's umask, failures as usage errors.

Every file exirc writes (programs, `.npz` outputs, HTML reports) goes through
`write_atomically`, so a failed or interrupted write never leaves a partial
file, and never a temporary one either:

  * On Linux the bytes go to an unnamed file in the target's directory
    (`O_TMPFILE`), which gets a name (`linkat` through /proc/self/fd) only
    once complete and flushed, and is at once renamed over the target. A
    compile killed mid-write (SIGKILL, out of memory) leaves nothing behind:
    the kernel frees an unnamed file when its last descriptor closes. Only a
    kill in the microseconds between link and rename leaves a (complete)
    temporary file, which the next write there removes, as below.
  * Elsewhere (or where the file system refuses O_TMPFILE) the bytes go to a
    named temporary file beside the target, `.NAME.exirc-PID-XXXX.tmp`, and
    the next write to that directory removes those whose process is gone.

Files get the mode a plain `open()` would give (0666 less the umask), so a
program is readable by the server or the `adb push` of another user, as the
user's shell would make it. `check_output_path` refuses, before any work, a
target that cannot be written (a missing or read-only directory, a path under
/proc or /sys, a directory, a FIFO or a device).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from collections.abc import Callable
from typing import BinaryIO

from exirc.errors import UsageError
from exirc.serialize.mapped_file import describe_file_type

_WRITE_HINT = "check that the directory exists, is writable and has free space"
# Pseudo-file systems: writing there is never what a user meant, and can
# change the kernel's settings when run as root.
_PSEUDO_FILE_SYSTEMS = ("/proc", "/sys")


def write_atomically(path: str | os.PathLike[str],
                     data: bytes | Callable[[BinaryIO], None]) -> None:
    """Write `data` (bytes, or a function writing into the open file) to `path`."""
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    # A rename over /dev/null or a FIFO would replace it: never what was meant.
    _check_target(target, "file")
    if not os.path.isdir(directory):
        raise UsageError(f"cannot write {target}: directory {directory} does not exist",
                         hint="create it, or write somewhere else")
    remove_stale_temporaries(directory)
    try:
        directory_fd = os.open(directory, os.O_RDONLY | _O_DIRECTORY)
    except OSError as error:
        raise write_error(target, error) from error
    try:
        _write(directory_fd, target, data)
    except OSError as error:
        raise write_error(target, error) from error
    finally:
        os.close(directory_fd)


def _write(directory: int, target: str, data: bytes | Callable[[BinaryIO], None]) -> None:
    """Write into a new file in `directory` (a descriptor of the directory of
    `target`), which gets the name `target` only once complete and on disk."""
    unnamed = _create_unnamed(directory)
    fd, temporary = (unnamed, None) if unnamed is not None else _create_named(directory, target)
    try:
        with os.fdopen(fd, "wb") as file:
            if isinstance(data, bytes):
                file.write(data)
            else:
                data(file)
            file.flush()
            os.fsync(file.fileno())
            if temporary is None:
                # Named only now, for the instant before the rename below.
                temporary = _temporary_name(target)
                _link(file.fileno(), directory, temporary)
        os.replace(_beside(target, temporary), target)
        with contextlib.suppress(OSError):
            os.fsync(directory)  # the new name is durable too, not just the data
    except BaseException:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=directory)
        raise


def write_error(name: str, error: OSError) -> UsageError:
    return UsageError(f"{name}: cannot write: {error.strerror or error}", hint=_WRITE_HINT)


def check_output_path(path: str | os.PathLike[str], what: str = "output file") -> None:
    """Raise UsageError, before any work, if `path` cannot be written as a file.

    What cannot be known in advance (the disk filling up during the write)
    is still reported by `write_atomically`, as the same kind of error.
    """
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    _check_target(target, what)
    if not os.path.isdir(directory):
        raise UsageError(f"cannot write the {what} {target}: directory {directory} does not "
                         "exist", hint="create it, or write somewhere else")
    _check_writable_directory(directory, f"the {what} {target}")


def check_output_directory(path: str | os.PathLike[str], what: str = "output directory") -> None:
    """Raise UsageError, before any work, if files cannot be written into the
    directory `path` (created, with its parents, if missing)."""
    target = os.path.abspath(os.fspath(path))
    _refuse_pseudo_file_system(target, what)
    existing = target
    while not os.path.exists(existing):  # the first ancestor that exists gets the new ones
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        problem = "is not a directory" if existing == target else \
            f"cannot be created: {existing} is not a directory"
        raise UsageError(f"the {what} {os.fspath(path)} {problem}",
                         hint="give the path of a directory, or of one to create")
    _check_writable_directory(existing, f"the {what} {os.fspath(path)}")


def remove_stale_temporaries(directory: str) -> None:
    """Delete our named temporary files in `directory` whose writer is gone.

    Only files named as `_create_named` names them, and only when the
    process in their name no longer exists: a write in progress is left
    alone. Errors are ignored: cleaning up is a courtesy, not the task.
    """
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            match = _TEMPORARY.fullmatch(entry.name)
            if match and not _process_exists(int(match.group(1))):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


# --------------------------------------------------------------------------- creating


_TEMPORARY = re.compile(r"\..+\.exirc-(\d+)-[0-9a-f]{8}\.tmp")
# How kernels and file systems without O_TMPFILE refuse it (EISDIR: kernels
# older than 3.11, which see only the O_DIRECTORY bits of the flag).
_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOTSUP})
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# st_dev -> whether an O_TMPFILE file can be linked there (see _create_unnamed).
_LINKABLE: dict[int, bool] = {}


def _create_unnamed(directory: int) -> int | None:
    """An unnamed file in `directory` (O_TMPFILE), or None where one cannot be
    created and then linked (not Linux, /proc missing, a file system without
    O_TMPFILE). Whether linking works is tried once per file system, on an
    empty file, so data is never written to a file that cannot be named."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag:
        return None
    device = os.fstat(directory).st_dev
    if device not in _LINKABLE:
        _LINKABLE[device] = _can_link_unnamed(directory, flag)
    if not _LINKABLE[device]:
        return None
    # Mode 0666: the umask applies as for any new file.
    return os.open(".", flag | os.O_WRONLY | os.O_CLOEXEC, 0o666, dir_fd=directory)


def _can_link_unnamed(directory: int, flag: int) -> bool:
    try:
        fd = os.open(".", flag | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=directory)
    except OSError as error:
        if error.errno in _UNSUPPORTED:
            return False
        raise  # a real problem (permissions, a full disk), for the caller to report
    try:
        probe = _temporary_name("probe")
        _link(fd, directory, probe)
        os.unlink(probe, dir_fd=directory)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _create_named(directory: int, target: str) -> tuple[int, str]:
    """A new file beside `target` named as `remove_stale_temporaries` recognises."""
    temporary = _temporary_name(target)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    return os.open(temporary, flags, 0o666, dir_fd=directory), temporary


def _link(fd: int, directory: int, name: str) -> None:
    """linkat(/proc/self/fd/FD, directory/name, AT_SYMLINK_FOLLOW).

    Giving `src_dir_fd` makes Python call linkat, which follows the /proc
    link to the open file; without it Python calls link(), which does not.
    """
    os.link(f"/proc/self/fd/{fd}", name, src_dir_fd=directory, dst_dir_fd=directory,
            follow_symlinks=True)


def _temporary_name(target: str) -> str:
    return f".{os.path.basename(target)}.exirc-{os.getpid()}-{secrets.token_hex(4)}.tmp"


def _beside(target: str, name: str) -> str:
    return os.path.join(os.path.dirname(target), name)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, but is another user's
    return True


# --------------------------------------------------------------------------- checking


def _check_target(target: str, what: str) -> None:
    """Refuse a target under /proc or /sys, or one that exists and is no regular file."""
    _refuse_pseudo_file_system(target, what)
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return  # missing (to be created), or a problem the write itself will report
    if not stat.S_ISREG(mode):
        raise UsageError(f"cannot write the {what} {target}: it is {describe_file_type(mode)}",
                         hint="give the path of a file to create or replace")


def _refuse_pseudo_file_system(target: str, what: str) -> None:
    real = os.path.realpath(target)
    for root in _PSEUDO_FILE_SYSTEMS:
        if real == root or real.startswith(root + os.sep):
            raise UsageError(f"cannot write the {what} {target}: it is under {root}, a "
                             "kernel file system, not storage",
                             hint="write it somewhere on disk")


def _check_writable_directory(directory: str, what: str) -> None:
    """Create and drop a file in `directory`: the one test that sees everything
    (permissions, a read-only file system, ACLs, a full inode table)."""
    try:
        directory_fd = os.open(directory, os.O_RDONLY | _O_DIRECTORY)
        try:
            unnamed = _create_unnamed(directory_fd)
            if unnamed is not None:
                os.close(unnamed)
            else:
                fd, name = _create_named(directory_fd, "probe")
                os.close(fd)
                os.unlink(name, dir_fd=directory_fd)
        finally:
            os.close(directory_fd)
    except OSError as error:
        raise UsageError(f"cannot write {what}: directory {directory}: "
                         f"{error.strerror or error}", hint=_WRITE_HINT) from None
