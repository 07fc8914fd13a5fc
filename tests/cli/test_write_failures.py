"""Writes that cannot happen are refused before the work; writes that fail or are
killed leave the old file and nothing else.

The kills are real: a child process writes a file slowly and gets SIGKILL in
the middle. The CLI cases run the real `exirc` in a process of its own
(`tests.warm_exirc`) and check the exit code, the error code and the words a user reads.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from exirc.serialize import files
from exirc.serialize.files import remove_stale_temporaries, write_atomically
from tests import warm_exirc

MODEL = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(256, 256).eval()  # a 257 KiB program
example_inputs = (torch.randn(2, 256),)
"""


def exirc(*args: str, cwd: Path, limit_file_size: int | None = None,
          timeout: float = 120) -> tuple[int, list[str]]:
    """(exit code, stderr lines) of a real `exirc ARGS`."""
    done = warm_exirc.exirc(args, cwd=cwd, text=True, timeout=timeout,
                            file_size_limit=limit_file_size)
    return done.returncode, done.stderr.splitlines()


# --------------------------------------------------------------------------- killed writes


SLOW_WRITER = """
import sys, time
from exirc.serialize import files
if sys.argv[2] == "named":
    files._create_unnamed = lambda directory: None  # as where O_TMPFILE is unsupported
def slowly(file):
    file.write(b"x" * (8 << 20))
    file.flush()
    print("writing", flush=True)
    time.sleep(120)
files.write_atomically(sys.argv[1], slowly)
"""


def _kill_mid_write(target: Path, how: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(target), how],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        # A cap on a child hung before it writes, never a verdict on its speed.
        assert select.select([child.stdout], [], [], 300)[0], "the writer never started"
        assert child.stdout.readline() == "writing\n"  # 8 MiB are in the file now
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=120)


def test_a_write_killed_midway_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "model.pte"
    target.write_bytes(b"the old program")
    _kill_mid_write(target, "unnamed")
    assert os.listdir(tmp_path) == ["model.pte"]
    assert target.read_bytes() == b"the old program"


def test_where_temporaries_need_names_the_next_write_removes_a_killed_ones(
        tmp_path: Path) -> None:
    target = tmp_path / "model.pte"
    _kill_mid_write(target, "named")
    (left,) = os.listdir(tmp_path)  # the price of a named temporary: it outlives a kill
    assert left.startswith(".model.pte.exirc-") and left.endswith(".tmp")
    assert (tmp_path / left).stat().st_size == 8 << 20
    write_atomically(target, b"new")
    assert os.listdir(tmp_path) == ["model.pte"]


def test_a_temporary_of_a_live_writer_is_left_alone(tmp_path: Path) -> None:
    live = tmp_path / f".other.pte.exirc-{os.getpid()}-0123abcd.tmp"
    live.write_bytes(b"being written")
    unrelated = tmp_path / ".other.pte.tmp"
    unrelated.write_bytes(b"not ours")
    remove_stale_temporaries(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, unrelated.name])


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    saved = os.umask(mask)
    try:
        yield
    finally:
        os.umask(saved)


@pytest.mark.parametrize("named", [False, True])
def test_both_ways_give_the_mode_of_the_users_umask(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    named: bool) -> None:
    if named:
        monkeypatch.setattr(files, "_create_unnamed", lambda directory: None)
    target = tmp_path / "model.pte"
    with _umask(0o027):
        write_atomically(target, b"program")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert target.read_bytes() == b"program"
    assert os.listdir(tmp_path) == ["model.pte"]


# --------------------------------------------------------------------------- before the compile


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "model.py").write_text(MODEL)
    return tmp_path


def _refused(model_dir: Path, *args: str) -> list[str]:
    """stderr of a compile refused with a usage error before compiling anything."""
    code, err = exirc("compile", "model.py", *args, cwd=model_dir, timeout=60)
    assert code == 2, err
    assert err[0].startswith("error[E0200]: "), err
    assert len(err) == 3 and err[2] == "  see: exirc explain E0200", err
    assert not any(line.startswith("compiled") for line in err)
    return err


@pytest.mark.parametrize("output, words", [
    ("/proc/model.pte", "cannot write the program /proc/model.pte: it is under /proc, a kernel "
                        "file system, not storage"),
    ("/sys/model.pte", "cannot write the program /sys/model.pte: it is under /sys"),
    ("/proc/self/../model.pte", "it is under /proc"),
    ("/dev/null", "cannot write the program /dev/null: it is a character device"),
    ("missing/model.pte", "cannot write the program missing/model.pte: directory "),
])
def test_an_output_that_cannot_be_written_is_refused_before_compiling(
        model_dir: Path, output: str, words: str) -> None:
    err = _refused(model_dir, "-o", output)
    assert words in err[0]


def test_a_fifo_as_output_is_refused_without_blocking(model_dir: Path) -> None:
    os.mkfifo(model_dir / "out.pte")
    err = _refused(model_dir, "-o", "out.pte")
    assert err[0] == "error[E0200]: cannot write the program out.pte: it is a FIFO (named pipe)"
    assert stat.S_ISFIFO((model_dir / "out.pte").stat().st_mode)  # not replaced


def test_the_default_output_is_checked_too(model_dir: Path) -> None:
    os.mkfifo(model_dir / "model.pte")  # where MODEL's name with .pte points
    err = _refused(model_dir)
    assert "cannot write the program model.pte: it is a FIFO" in err[0]


@pytest.mark.parametrize("dump_dir, words", [
    ("/proc/dump", "cannot write the --dump-dir directory /proc/dump: it is under /proc"),
    ("model.py/dump", "the --dump-dir directory model.py/dump cannot be created: "),
])
def test_a_dump_dir_that_cannot_be_written_is_refused_before_compiling(
        model_dir: Path, dump_dir: str, words: str) -> None:
    err = _refused(model_dir, "--dump-dir", dump_dir)
    assert words in err[0]


@contextlib.contextmanager
def _read_only(directory: Path) -> Iterator[None]:
    """`directory` made unwritable: immutable for root (who ignores modes), else 0555."""
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(
                ["chattr", "+i", str(directory)], capture_output=True,
                timeout=120).returncode != 0:
            pytest.skip("root, and no chattr +i to make a directory read-only")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(directory)], check=True, timeout=120)
    else:
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)


def test_a_read_only_directory_is_refused_before_compiling(model_dir: Path) -> None:
    out = model_dir / "out"
    out.mkdir()
    with _read_only(out):
        err = _refused(model_dir, "-o", "out/model.pte")
    assert err[0].startswith("error[E0200]: cannot write the program out/model.pte: directory ")
    assert err[0].endswith(("Operation not permitted", "Permission denied"))
    assert os.listdir(out) == []


def test_a_write_that_fails_midway_is_a_usage_error_naming_the_file(model_dir: Path) -> None:
    """A full disk, as near as a test gets: a file size limit below the program's size,
    so the write fails with EFBIG halfway, after the compile."""
    (model_dir / "out").mkdir()
    code, err = exirc("compile", "model.py", "-o", "out/model.pte", cwd=model_dir,
                      limit_file_size=64 << 10)
    assert code == 2, err
    assert err == ["error[E0200]: out/model.pte: cannot write: File too large",
                   "  hint: check that the directory exists, is writable and has free space",
                   "  see: exirc explain E0200"]
    assert os.listdir(model_dir / "out") == []  # no partial file, no temporary
