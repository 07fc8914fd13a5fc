"""Output files: written whole or not at all, with the mode the user's umask gives."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

import pytest

from exirc.errors import UsageError
from exirc.serialize.files import write_atomically


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_get_the_mode_of_the_users_umask(tmp_path: Path, umask: int, mode: int) -> None:
    saved = os.umask(umask)
    try:
        write_atomically(tmp_path / "model.pte", b"program")
    finally:
        os.umask(saved)
    assert stat.S_IMODE((tmp_path / "model.pte").stat().st_mode) == mode
    assert (tmp_path / "model.pte").read_bytes() == b"program"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "model.pte"
    target.write_bytes(b"old")

    def fails(file: BinaryIO) -> None:
        file.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(UsageError, match="model.pte: cannot write: No space left on device"):
        write_atomically(target, fails)
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["model.pte"]


def test_a_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        write_atomically(tmp_path / "nowhere" / "model.pte", b"x")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_directory_is_a_usage_error(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(UsageError, match="cannot write"):
            write_atomically(tmp_path / "model.pte", b"x")
    finally:
        tmp_path.chmod(0o700)
