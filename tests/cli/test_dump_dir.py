"""`exirc compile --dump-dir` through the real CLI: every link of the index
leads to a file, and the final listing is what `exirc inspect` shows of the
written program."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXIRC = str(Path(sys.executable).with_name("exirc"))

MODEL = """\
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
example_inputs = (torch.randn(2, 4),)
"""


def test_the_index_links_every_file_and_the_listing_is_inspects(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(MODEL)
    done = subprocess.run([EXIRC, "compile", "model.py", "-o", "model.pte", "--dump-dir", "dump"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    dump = tmp_path / "dump"
    index = (dump / "index.html").read_text()
    links = set(re.findall(r'href="([^"]+)"', index))
    assert {"forward.00.captured.txt", "memory-plan.html", "program.txt"} <= links
    assert any(link.endswith(".diff.html") for link in links)
    assert links == {p.name for p in dump.iterdir()} - {"index.txt", "index.html"} - \
        {p.name for p in dump.glob("*.diff")}  # the plain diffs are index.txt's
    inspected = subprocess.run([EXIRC, "inspect", "model.pte", "--show", "instructions"],
                               cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert inspected.returncode == 0, inspected.stderr
    assert (dump / "program.txt").read_text() == inspected.stdout
    assert "# captured forward\n" in (dump / "forward.00.captured.txt").read_text()
