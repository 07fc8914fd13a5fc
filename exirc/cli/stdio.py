"""`-` for stdin and stdout, as LLVM's tools take it.

`exirc compile -o -` writes the program to stdout, `exirc run -o -` the
outputs' .npz, `exirc inspect -` reads a program from stdin. Binary data is
never written to a terminal (it would garble it), nor read from one (a user
typing a program is a mistake): both are usage errors saying what to do.
Messages keep going to stderr, so a pipe carries only the data.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from exirc.errors import UsageError

STDIO = "-"


def is_stdio(path: str | os.PathLike[str] | None) -> bool:
    """Whether `path` is `-` (stdin or stdout); `./-` is a file named `-`."""
    return path is not None and os.fspath(path) == STDIO


def refuse_terminal_stdout(what: str) -> None:
    """UsageError if stdout is a terminal: `what` (binary) belongs in a file or a pipe."""
    if _is_terminal(sys.stdout):
        raise UsageError(f"-o - writes {what} (binary data) to stdout, which is a terminal",
                         hint="redirect stdout to a file or a pipe (`-o - > out` or "
                              "`-o - | ...`), or give a file name with -o")


def write_stdout(data: bytes | memoryview) -> None:
    """`data` to stdout's bytes, flushed (after anything already written as text)."""
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def write_stdout_through_file(suffix: str, write: Callable[[Path], None]) -> None:
    """Run `write(path)` on a temporary file, then copy the file to stdout: for
    writers that take a path (the .npz writer renames a finished file into place)."""
    with tempfile.TemporaryDirectory(prefix="exirc-stdout-") as directory:
        path = Path(directory) / f"out{suffix}"
        write(path)
        sys.stdout.flush()
        with open(path, "rb") as file:
            shutil.copyfileobj(file, sys.stdout.buffer)
        sys.stdout.buffer.flush()


def read_stdin(what: str) -> memoryview:
    """All of stdin's bytes; UsageError if stdin is a terminal or empty."""
    stream: BinaryIO = sys.stdin.buffer
    if _is_terminal(sys.stdin):
        raise UsageError(f"`-` reads the {what} from stdin, which is a terminal",
                         hint=f"pipe or redirect the {what} into it (`... | exirc inspect -` "
                              "or `exirc inspect - < model.pte`), or give its path")
    data = stream.read()
    if not data:
        raise UsageError(f"stdin is empty: no {what} to read",
                         hint=f"pipe a {what} into it, e.g. "
                              "`exirc compile model.py -o - | exirc inspect -`")
    return memoryview(data)


def _is_terminal(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream is no terminal
        return False
