"""A program file's bytes, and a guard that says when the file changed under them.

Programs are mapped, not read, so that loading a 50 MB program costs the time
to decode its small FlatBuffer and its weights are used in place. A mapping
has one danger: if the file is truncated on disk, touching a page past the
new end raises SIGBUS and kills the process, and Python cannot recover from
it (a handler returns to the faulting load, which faults again). So:

  * Files under `COPY_BELOW` (1 MiB) are copied into anonymous memory
    instead: no change to the file can reach a copy, so small programs
    cannot SIGBUS at all. Measured cold in a fresh process on a busy 2-core
    machine, copying 1 MiB costs 0.5 ms (mapping: 0.01 ms); 3 MiB cost
    1.2-6 ms, too much of the 5 ms a load may take, so the line is at 1 MiB.
  * Larger files are mapped, and `MappedFile.check()` (one `fstat` on the
    descriptor kept open, about 1 microsecond) raises a `FormatError` if the
    file's size or modification time differ from when it was mapped. A
    runtime calls it before each run, so a file truncated or rewritten in
    place between runs is a clear error, not a crash or silently different
    weights. A file *replaced* (renamed over, as `exirc compile` writes)
    is harmless: the mapping keeps the old file's pages.

What remains: a file truncated *during* a run (or during the load itself)
can still SIGBUS before the next check. Closing that window needs a copy of
every large program (36 ms and 50 MB of memory for 50 MB) or kernel help
(leases), which is the wrong trade for a runtime meant to start in
milliseconds; write programs with a rename and it cannot happen.

Opening never blocks: the file is opened O_NONBLOCK and refused unless it is
a regular file, so a FIFO or a device is an error rather than a hang.
"""

from __future__ import annotations

import mmap
import os
import stat
import weakref
from dataclasses import dataclass

from exirc.errors import FormatError, UsageError

# Files smaller than this are copied rather than mapped (see the module docstring).
COPY_BELOW = 1 << 20
# Pre-faulting the copy's pages in one call halves the cost of faulting them one by one.
_ANONYMOUS_POPULATED = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)

_CHANGED_HINT = ("load the program again once the file is complete; write program files "
                 "with a rename (as `exirc compile` does), never in place")


@dataclass(frozen=True)
class FileIdentity:
    """What `fstat` says about a file that changes when its bytes change."""

    size: int
    mtime_ns: int

    @classmethod
    def of(cls, status: os.stat_result) -> FileIdentity:
        return cls(status.st_size, status.st_mtime_ns)


class MappedFile:
    """A file's bytes (`view`), mapped or copied, and `check()` for changes since."""

    def __init__(self, path: str, view: memoryview, identity: FileIdentity,
                 fd: int | None) -> None:
        self.path = path
        self.view = view
        self.identity = identity
        self._fd = fd
        if fd is not None:
            # The descriptor lives as long as this object; fstat needs it.
            weakref.finalize(self, os.close, fd)

    @property
    def copied(self) -> bool:
        """Whether the bytes are a private copy, which no change to the file can reach."""
        return self._fd is None

    def check(self) -> None:
        """Raise FormatError if the mapped file changed on disk since it was opened.

        A no-op for a copied file. Cheap enough (one fstat) to call before
        every run.
        """
        if self._fd is None:
            return
        try:
            now = FileIdentity.of(os.fstat(self._fd))
        except OSError as error:
            raise FormatError(f"the program file {self.path} cannot be checked any more "
                              f"({error.strerror or error})", hint=_CHANGED_HINT) from None
        if now != self.identity:
            raise FormatError(f"the program file {self.path} changed on disk since it was "
                              f"loaded ({_difference(self.identity, now)}): reload it",
                              hint=_CHANGED_HINT)


def open_mapped(path: str | os.PathLike[str], *, copy_on_write: bool = False,
                copy_below: int = COPY_BELOW) -> MappedFile:
    """Open the regular file `path` for reading its bytes in place.

    `copy_on_write` gives writable private pages (writes never reach the
    file); otherwise the view is read-only. Files smaller than `copy_below`
    bytes are copied. Raises UsageError when the path cannot be read as a
    regular file, FormatError when it is empty.
    """
    name = os.fspath(path)
    fd = open_regular(name, what="program file")
    try:
        status = os.fstat(fd)
        if status.st_size == 0:
            raise FormatError(f"{name} is empty, not a program file")
        identity = FileIdentity.of(status)
        if status.st_size < copy_below:
            view = _copy(fd, name, status.st_size)
            os.close(fd)
            return MappedFile(name, view if copy_on_write else view.toreadonly(), identity,
                              None)
        access = mmap.ACCESS_COPY if copy_on_write else mmap.ACCESS_READ
        # The mapping outlives this function: memoryviews of it keep it alive.
        mapped = mmap.mmap(fd, 0, access=access)
    except (OSError, ValueError) as error:
        os.close(fd)
        raise UsageError(f"cannot map {name}: {getattr(error, 'strerror', None) or error}",
                         hint="programs are loaded from regular files") from None
    except BaseException:
        os.close(fd)
        raise
    return MappedFile(name, memoryview(mapped), identity, fd)


def open_regular(name: str, *, what: str = "file") -> int:
    """A read-only descriptor of the regular file `name`; UsageError otherwise.

    O_NONBLOCK makes opening a FIFO with no writer return at once instead of
    waiting for one; the fstat then refuses it, a device or a directory.
    """
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0) \
        | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags)
    except FileNotFoundError:
        raise UsageError(f"no such file: {name}", hint="check the path") from None
    except IsADirectoryError:
        raise UsageError(f"{name} is a directory, not a {what}") from None
    except PermissionError:
        raise UsageError(f"cannot read {name}: permission denied") from None
    except OSError as error:
        raise UsageError(f"cannot open {name}: {error.strerror or error}",
                         hint="check the path") from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError as error:
        os.close(fd)
        raise UsageError(f"cannot read {name}: {error.strerror or error}") from None
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UsageError(f"{name} is {describe_file_type(mode)}, not a regular {what}",
                         hint=f"give the path of a {what} on disk (save piped data to a "
                              "file first)")
    return fd


def refuse_special_file(path: str | os.PathLike[str], what: str) -> None:
    """Raise UsageError if `path` is a FIFO, a device or a socket.

    For files read by code that opens them blindly (a model, a pipeline):
    checked before, with a stat, which never blocks. A missing file or a
    directory is left to that code, which says what it expected.
    """
    name = os.fspath(path)
    try:
        mode = os.stat(name).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise UsageError(f"{name} is {describe_file_type(mode)}, not a regular {what}",
                         hint=f"give the path of a {what} on disk (save piped data to a "
                              "file first)")


def describe_file_type(mode: int) -> str:
    """`a directory`, `a FIFO (named pipe)`, ...: what a non-regular file is."""
    kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket")]
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _copy(fd: int, name: str, size: int) -> memoryview:
    """The file's `size` bytes in anonymous pages (page-aligned, as a mapping is)."""
    memory = mmap.mmap(-1, size, flags=_ANONYMOUS_POPULATED)
    view = memoryview(memory)
    done = 0
    while done < size:
        count = os.readv(fd, [view[done:]])
        if not count:
            break
        done += count
    # One byte more than fstat said means the file grew while we read it.
    if done != size or os.read(fd, 1):
        raise FormatError(f"{name} changed while it was being read ({size} bytes when opened, "
                          f"{'more' if done == size else done} when read)",
                          hint=_CHANGED_HINT)
    return view


def _difference(before: FileIdentity, after: FileIdentity) -> str:
    if after.size < before.size:
        return f"truncated from {before.size} to {after.size} bytes"
    if after.size > before.size:
        return f"grew from {before.size} to {after.size} bytes"
    return "rewritten in place: same size, new modification time"
