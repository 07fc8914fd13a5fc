"""One size grammar for `compile --max-arena/--max-memory` and `run --max-memory`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from exirc.cli.sizes import parse_size
from exirc.errors import UsageError
from exirc.serialize.writer import serialize
from tests import warm_exirc
from tests.programs import add_constant_program


def exirc(*args: str) -> subprocess.CompletedProcess[str]:
    return warm_exirc.exirc(args, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})


@pytest.mark.parametrize(("text", "nbytes"), [
    ("1000000", 1_000_000), ("0", 0), ("300B", 300), (" 64 ", 64),
    ("512K", 512 << 10), ("512k", 512 << 10), ("512KiB", 512 << 10), ("512 KB", 512 << 10),
    ("64M", 64 << 20), ("64mb", 64 << 20), ("1.5G", 3 << 29), ("1GiB", 1 << 30),
    ("2T", 2 << 40), ("0.5K", 512), (".25M", 1 << 18), ("1.5", 1),
])
def test_sizes_are_bytes_or_binary_units_with_decimals(text: str, nbytes: int) -> None:
    assert parse_size(text, "--max-memory") == nbytes


@pytest.mark.parametrize("text", ["12Q", "", "K", "-5", "1 M B", "0x100", "1e6", "iB",
                                  "5iB", "nan", "1.2.3M", "1,000"])
def test_anything_else_is_a_usage_error_naming_the_option(text: str) -> None:
    with pytest.raises(UsageError) as raised:
        parse_size(text, "--max-memory")
    assert str(raised.value) == f"--max-memory: {text!r} is not a size"
    assert raised.value.hint is not None and "1.5G" in raised.value.hint


@pytest.fixture()
def add_pte(tmp_path: Path) -> Path:
    path = tmp_path / "add.pte"
    path.write_bytes(serialize(add_constant_program()))
    return path


def test_run_max_memory_takes_the_new_spellings_and_the_old(add_pte: Path) -> None:
    # The program plans a 64-byte arena. The spellings themselves are checked in
    # process above (parse_size); here that `exirc run` reads them through it.
    for size in ("1.5K", "2gb"):
        ran = exirc("run", str(add_pte), "--random", "--max-memory", size)
        assert ran.returncode == 0, (size, ran.stderr)
    refused = exirc("run", str(add_pte), "--random", "--max-memory", "0.03K")  # 30 bytes
    assert refused.returncode == 3
    assert "error[E0350]" in refused.stderr and "more than the 30 bytes allowed" in refused.stderr
    bad = exirc("run", str(add_pte), "--random", "--max-memory", "lots")
    assert bad.returncode == 2
    assert bad.stderr.startswith("error[E0200]: --max-memory: 'lots' is not a size")


def test_compile_takes_max_memory_as_another_name_for_max_arena(tmp_path: Path) -> None:
    never_read = str(tmp_path / "never_read.py")
    bad = exirc("compile", never_read, "--max-memory", "12Q")
    assert bad.returncode == 2
    assert bad.stderr.startswith("error[E0200]: --max-memory: '12Q' is not a size")
    clash = exirc("compile", never_read, "--max-arena", "1K", "--max-memory", "2K")
    assert clash.returncode == 2
    assert "--max-arena (1024 bytes) and --max-memory (2048 bytes) are the same limit" \
        in clash.stderr


@pytest.mark.parametrize("command", ["compile", "run"])
def test_help_documents_the_grammar(command: str) -> None:
    shown = exirc(command, "--help")
    assert shown.returncode == 0
    flat = " ".join(shown.stdout.split())
    assert "--max-memory SIZE" in flat
    assert "SIZE is bytes, or a number with K, M, G or T (binary: 1K = 1024" in flat
    assert "1.5G, 1GiB" in flat
