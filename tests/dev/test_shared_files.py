"""tests.shared_files: a thing several modules make alike is made once per run,
by whichever worker asks first, and read back equal by the others."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import shared_files

REPO = Path(__file__).resolve().parents[2]

_MAKE_IN_A_PROCESS = """
import sys, time
from pathlib import Path
from tests import shared_files
shared_files.set_root(Path(sys.argv[1]))
def make():
    with open(sys.argv[2], "a") as log:
        log.write("made\\n")
    time.sleep(0.5)  # long enough for the other process to ask meanwhile
    return {"value": [1, 2, 3]}
print(shared_files.shared("one key", make))
"""


def test_a_key_is_made_once_and_read_back_equal(tmp_path: Path) -> None:
    calls: list[int] = []

    def make() -> dict[str, list[int]]:
        calls.append(1)
        return {"rows": [4, 5]}

    previous = shared_files._root
    shared_files.set_root(tmp_path / "shared")
    try:
        first = shared_files.shared("a key", make)
        again = shared_files.shared("a key", make)
        other = shared_files.shared("another key", lambda: b"bytes")
    finally:
        shared_files.set_root(previous)
    assert first == again == {"rows": [4, 5]} and first is not again
    assert calls == [1] and other == b"bytes"


def test_two_processes_asking_at_once_make_it_once(tmp_path: Path) -> None:
    log = tmp_path / "made.log"
    command = [sys.executable, "-c", _MAKE_IN_A_PROCESS, str(tmp_path / "shared"), str(log)]
    processes = [subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
                 for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0]
    assert outputs == ["{'value': [1, 2, 3]}\n"] * 2
    assert log.read_text() == "made\n"


def test_a_digest_tells_apart_models_of_one_name() -> None:
    import torch

    torch.manual_seed(0)
    first, second = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    assert shared_files.module_digest(first) == shared_files.module_digest(first)
    assert shared_files.module_digest(first) != shared_files.module_digest(second)
    assert shared_files.module_digest(first) != \
        shared_files.module_digest(torch.nn.Linear(4, 3, bias=False))
