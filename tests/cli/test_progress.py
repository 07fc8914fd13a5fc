"""`exirc compile` shows each stage as it finishes, on a terminal only."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from exirc.cli.progress import stage_printer, wants_progress
from tests.cli.tiny_model import TINY_MODEL

TIMEOUT = 300  # seconds: a cap on a hung compile


def compile_on_terminal(directory: Path, *flags: str) -> tuple[int, str]:
    """(exit code, what the terminal showed) of a compile whose stderr is a pty."""
    controller, terminal = pty.openpty()
    env = {key: value for key, value in os.environ.items() if key != "EXIRC_PROGRESS"}
    process = subprocess.Popen([sys.executable, "-m", "exirc", "compile", "tiny.py", *flags],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=terminal, cwd=directory, env={**env, "NO_COLOR": "1"})
    os.close(terminal)
    shown = b""
    deadline = time.monotonic() + TIMEOUT
    while True:  # read as it runs: a full pty would block the compile
        if not select.select([controller], [], [], max(0.0, deadline - time.monotonic()))[0]:
            process.kill()  # hung: a cap on the wait, never a verdict on its speed
            break
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # EIO: the compile closed its end
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    return process.wait(timeout=TIMEOUT), shown.decode().replace("\r\n", "\n")


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "tiny.py").write_text(textwrap.dedent(TINY_MODEL))
    return tmp_path


def test_a_line_per_stage_on_a_terminal_before_the_summary(model_dir: Path) -> None:
    code, shown = compile_on_terminal(model_dir, "--verify", "-o", "tiny.pte")
    assert code == 0, shown
    lines = shown.splitlines()
    stages = [line.split()[0] for line in lines if line.endswith(" s") and "...." in line]
    assert stages[:2] == ["capture", "aten"]
    assert {"edge", "plan", "emit", "serialize", "verify"} <= set(stages)
    summary = next(i for i, line in enumerate(lines) if line.startswith("compiled tiny.py"))
    assert all(lines.index(line) < summary for line in lines if "...." in line)


def test_quiet_turns_progress_off_even_on_a_terminal(model_dir: Path) -> None:
    code, shown = compile_on_terminal(model_dir, "-q", "-o", "tiny.pte")
    assert code == 0, shown
    assert shown == ""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_when_progress_is_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXIRC_PROGRESS", raising=False)
    assert wants_progress(Terminal(), quiet=False, as_json=False)
    assert not wants_progress(io.StringIO(), quiet=False, as_json=False)  # a pipe or file
    assert not wants_progress(Terminal(), quiet=True, as_json=False)
    assert not wants_progress(Terminal(), quiet=False, as_json=True)
    monkeypatch.setenv("EXIRC_PROGRESS", "1")
    assert wants_progress(io.StringIO(), quiet=False, as_json=False)
    assert not wants_progress(io.StringIO(), quiet=True, as_json=False)
    monkeypatch.setenv("EXIRC_PROGRESS", "0")
    assert not wants_progress(Terminal(), quiet=False, as_json=False)


def test_the_line_format() -> None:
    out = io.StringIO()
    stage_printer(out)("capture", 2.456)
    assert out.getvalue() == "  capture ........   2.46 s\n"
