"""Program files: small ones copied, large ones mapped with a guard against changes on disk.

A mapped file truncated on disk kills the process with SIGBUS when a page
past its new end is touched; these tests truncate real files and check that
the copy never sees it and the guard reports it before anything is touched.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from exirc.errors import FormatError, UsageError
from exirc.serialize.mapped_file import COPY_BELOW, open_mapped
from exirc.serialize.reader import map_file


def _file(tmp_path: Path, size: int, name: str = "program.bin") -> Path:
    path = tmp_path / name
    path.write_bytes(bytes(range(256)) * (size // 256) + bytes(size % 256))
    return path


def test_small_files_are_copied_and_survive_truncation(tmp_path: Path) -> None:
    path = _file(tmp_path, COPY_BELOW - 1)
    original = path.read_bytes()
    mapped = open_mapped(path, copy_on_write=True)
    assert mapped.copied
    os.truncate(path, 100)
    mapped.check()  # a copy cannot change: nothing to report
    assert bytes(mapped.view) == original  # every page readable, none from the file


def test_large_files_are_mapped_not_copied(tmp_path: Path) -> None:
    path = _file(tmp_path, COPY_BELOW + 4096)
    mapped = open_mapped(path)
    assert not mapped.copied
    assert bytes(mapped.view[:512]) == path.read_bytes()[:512]
    mapped.check()  # unchanged


def _truncate(path: Path) -> None:
    os.truncate(path, 4096)


def _append(path: Path) -> None:
    with path.open("ab") as file:
        file.write(b"more")


def _rewrite_in_place(path: Path) -> None:
    with path.open("r+b") as file:
        file.write(b"XX")
    os.utime(path, ns=(1, 1))  # a new modification time, as any write gives


@pytest.mark.parametrize("change, words", [(_truncate, "truncated from"), (_append, "grew from"),
                                           (_rewrite_in_place, "rewritten in place")])
def test_the_guard_reports_a_mapped_file_changed_on_disk(
        tmp_path: Path, change: Callable[[Path], None], words: str) -> None:
    path = _file(tmp_path, COPY_BELOW + 4096)
    mapped = open_mapped(path)
    change(path)
    with pytest.raises(FormatError) as raised:
        mapped.check()
    message = raised.value.message
    assert f"the program file {path} changed on disk since it was loaded" in message
    assert words in message and message.endswith("reload it")
    assert "rename" in (raised.value.hint or "")


def test_a_file_replaced_by_rename_is_no_change_to_the_mapping(tmp_path: Path) -> None:
    path = _file(tmp_path, COPY_BELOW + 4096)
    first = path.read_bytes()[:4096]
    mapped = open_mapped(path)
    replacement = tmp_path / "new.bin"
    replacement.write_bytes(b"new")
    os.replace(replacement, path)  # how exirc compile writes: the old inode lives on
    mapped.check()
    assert bytes(mapped.view[:4096]) == first


def test_copy_on_write_views_are_writable_and_read_views_are_not(tmp_path: Path) -> None:
    for size in (4096, COPY_BELOW + 4096):
        path = _file(tmp_path, size, f"f{size}")
        writable = open_mapped(path, copy_on_write=True).view
        writable[0] = 7  # private: the file is untouched
        assert path.read_bytes()[0] == 0
        assert open_mapped(path).view.readonly


def _run_child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=60)


def test_truncation_between_runs_is_an_error_in_a_real_process(tmp_path: Path) -> None:
    """The whole story in a child process, so that a regression is a SIGBUS the
    test sees as an exit status, not the test runner dying."""
    code = """
        import os, sys
        from exirc.serialize.mapped_file import open_mapped
        from exirc.errors import FormatError
        for name in sys.argv[1:]:
            mapped = open_mapped(name, copy_on_write=True)
            os.truncate(name, 4096)
            try:
                mapped.check()  # what a runtime does before each run
            except FormatError as error:
                print("refused:", error.message)
                continue
            print("ran:", sum(mapped.view[-4096:]))  # touches the pages past 4096
    """
    small = _file(tmp_path, COPY_BELOW - 4096, "small.bin")
    large = _file(tmp_path, COPY_BELOW + (1 << 20), "large.bin")
    done = _run_child(code, str(small), str(large))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ran: ")
    assert lines[1].startswith(f"refused: the program file {large} changed on disk")


@pytest.mark.parametrize("reader", [open_mapped, map_file])
def test_a_fifo_is_refused_at_once(tmp_path: Path, reader: Callable[..., object]) -> None:
    fifo = tmp_path / "program.pte"
    os.mkfifo(fifo)
    # In a child with a timeout: a regression would block forever in open().
    done = _run_child(f"""
        from exirc.errors import UsageError
        from exirc.serialize.mapped_file import open_mapped
        from exirc.serialize.reader import map_file
        try:
            {reader.__name__}({str(fifo)!r})
        except UsageError as error:
            print(error.message)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{fifo} is a FIFO (named pipe), not a regular program file"


def test_devices_and_directories_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="/dev/zero is a character device, not a regular"):
        open_mapped("/dev/zero")
    with pytest.raises(UsageError, match="is a directory"):
        open_mapped(tmp_path)
    with pytest.raises(UsageError, match="no such file"):
        open_mapped(tmp_path / "missing.pte")
    empty = tmp_path / "empty.pte"
    empty.write_bytes(b"")
    with pytest.raises(FormatError, match="is empty"):
        open_mapped(empty)
