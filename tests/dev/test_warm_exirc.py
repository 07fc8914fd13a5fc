"""`tests.warm_exirc`: a command forked from the warm server is a process of its
own, as a real `python -m exirc` is, and one it cannot stand in for is real."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.warm_exirc import exirc

# A model file that tells, as the compile imports it, what process it runs in.
REPORTING_MODEL = textwrap.dedent("""\
    import atexit, json, os, sys
    import torch

    report = {"pid": os.getpid(), "parent": os.getppid(), "cwd": os.getcwd(),
              "marker": os.environ.get("WARM_EXIRC_MARKER"), "argv": sys.argv[1:],
              "path0": sys.path[0]}
    with open("report.json", "w") as file:
        json.dump(report, file)
    atexit.register(lambda: open("exited", "w").close())
    if os.environ.get("WARM_EXIRC_HANG"):
        import time
        time.sleep(600)

    class Twice(torch.nn.Module):
        def forward(self, x):
            return x * 2

    model = Twice().eval()
    example_inputs = (torch.ones(2),)
""")


def _report(folder: Path) -> dict[str, object]:
    import json

    report: dict[str, object] = json.loads((folder / "report.json").read_text())
    return report


def test_a_command_runs_in_its_own_process_with_its_directory_environment_and_argv(
        tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(REPORTING_MODEL)
    done = exirc(["compile", "model.py", "-o", "m.pte"], cwd=tmp_path, text=True, timeout=300,
                 env={**os.environ, "WARM_EXIRC_MARKER": "seen"})
    assert done.returncode == 0, done.stderr
    assert "compiled model.py -> m.pte" in done.stderr
    report = _report(tmp_path)
    assert report["pid"] != os.getpid() and report["parent"] != os.getpid()  # forked warm
    assert report["cwd"] == str(tmp_path)
    assert report["marker"] == "seen"
    assert report["argv"] == ["compile", "model.py", "-o", "m.pte"]
    assert report["path0"] == str(tmp_path)  # as `python -m` sets it
    assert (tmp_path / "exited").exists(), "the command's atexit handlers did not run"
    inspected = exirc(["inspect", "-"], cwd=tmp_path, timeout=300,
                      input=(tmp_path / "m.pte").read_bytes())  # stdin is a pipe
    assert inspected.returncode == 0, inspected.stderr
    assert inspected.stdout.startswith(b"<stdin>: program file (ET12")


def test_exit_codes_and_streams_are_the_commands(tmp_path: Path) -> None:
    done = exirc(["no-such-command"], cwd=tmp_path, text=True, timeout=120)
    assert done.returncode == 2
    assert "No such command 'no-such-command'" in done.stderr and done.stdout == ""
    version = exirc(["--version"], cwd=tmp_path, text=True, timeout=120)
    assert version.returncode == 0 and version.stdout.startswith("exirc")


def test_a_command_past_its_timeout_is_killed(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(REPORTING_MODEL)
    with pytest.raises(subprocess.TimeoutExpired):
        exirc(["compile", "model.py", "-o", "m.pte"], cwd=tmp_path, timeout=8,
              env={**os.environ, "WARM_EXIRC_HANG": "1"})
    pid = int(str(_report(tmp_path)["pid"]))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped
    assert exirc(["--version"], cwd=tmp_path, timeout=120).returncode == 0  # the server lives


def test_a_file_size_limit_applies_to_the_command(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(REPORTING_MODEL)
    done = exirc(["compile", "model.py", "-o", "m.pte"], cwd=tmp_path, text=True, timeout=300,
                 file_size_limit=64)
    assert done.returncode != 0
    assert not (tmp_path / "m.pte").exists()


def test_an_environment_read_at_start_gets_a_real_process(tmp_path: Path) -> None:
    """OMP_NUM_THREADS is read when the process starts: the server's would not do."""
    (tmp_path / "model.py").write_text(REPORTING_MODEL)
    threads = "3" if os.environ.get("OMP_NUM_THREADS") != "3" else "2"
    real = exirc(["compile", "model.py", "-o", "m.pte"], cwd=tmp_path, timeout=300,
                 env={**os.environ, "OMP_NUM_THREADS": threads})
    assert real.returncode == 0 and _report(tmp_path)["parent"] == os.getpid()


def test_a_dead_server_costs_no_command(tmp_path: Path) -> None:
    """Killed, the server is started again, or (killed while the command is sent)
    the command runs as a real process: either way the command runs."""
    import signal

    from tests import warm_exirc

    first = warm_exirc._server()
    if first is None:
        pytest.skip("EXIRC_TEST_REAL_PROCESSES: no server")
    assert exirc(["--version"], cwd=tmp_path, timeout=120).returncode == 0
    os.kill(first.process.pid, signal.SIGKILL)
    done = exirc(["--version"], cwd=tmp_path, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("exirc")
    again = exirc(["--version"], cwd=tmp_path, timeout=120)
    assert again.returncode == 0
    assert warm_exirc._server() is not first
