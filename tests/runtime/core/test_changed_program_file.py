"""A mapped program file truncated or rewritten after `load` is refused before the
next run (a FormatError), instead of faulting with SIGBUS when a kernel reads a
constant that is no longer there.

The run happens in a child process, so a regression shows as a signal there
rather than killing the test session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from exirc.compiler import compile_module

CHILD = """
import os, sys, numpy
from exirc.errors import FormatError
from exirc.runtime import load

path, change = sys.argv[1], sys.argv[2]
program = load(path)
x = numpy.ones((1, 1024), numpy.float32)
program.run("forward", [x])
if change == "truncate":
    os.truncate(path, 4096)
else:  # rewritten in place, same size: the constants would change under us
    with open(path, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"\\x00" * 8)
try:
    program.run("forward", [x])
except FormatError as error:
    print("refused:", error)
"""


def _program(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 512).eval()  # 2 MiB of weights: mapped, not copied
    path = tmp_path / "linear.pte"
    compile_module(model, (torch.randn(1, 1024),)).save(str(path))
    assert path.stat().st_size > 2 << 20
    return path


def test_truncated_or_rewritten_file_is_refused_before_the_next_run(tmp_path: Path) -> None:
    original = _program(tmp_path)
    for change in ("truncate", "rewrite"):
        path = tmp_path / f"{change}.pte"
        path.write_bytes(original.read_bytes())
        os.utime(path, ns=(1, 1))  # an older mtime, so an in-place rewrite changes it
        done = subprocess.run([sys.executable, "-c", CHILD, str(path), change],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (change, done.returncode, done.stderr[-2000:])
        assert f"refused: the program file {path} changed on disk since it was loaded" \
            in done.stdout, done.stdout
