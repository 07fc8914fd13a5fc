"""`--dump-dir` files that cannot be written are a usage error naming the file
(exit 2), never an internal error after the compile has run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXIRC = str(Path(sys.executable).with_name("exirc"))

MODEL = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 4).eval()
example_inputs = (torch.randn(2, 4),)
"""


def test_a_dump_file_that_cannot_be_written_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(MODEL)
    dump = tmp_path / "dump"
    (dump / "index.txt").mkdir(parents=True)  # the index cannot be written over a directory
    done = subprocess.run([EXIRC, "compile", "model.py", "-o", "model.pte", "--dump-dir", "dump"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "error[E0200]" in done.stderr
    assert "dump/index.txt: cannot write: Is a directory" in done.stderr
    assert not (tmp_path / "model.pte").exists()
