"""ExecuTorch's runtime without its quantized kernel library, for the tests.

Not a test module. A file that calls one of `quantized_decomposed`'s kernels
fails to load on a runtime built without them; these helpers check that ours
do not by running them in a process that never imports
`executorch.kernels.quantized` (`tests/executorch_clean_worker.py`). That
process is started once per test process and kept: a fresh one per call spent
about 6 s importing ExecuTorch's runtime, for a job of a fraction of that.

Every helper carries `requires_executorch` at its callers; nothing here imports
ExecuTorch itself.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

WORKER = Path(__file__).with_name("executorch_clean_worker.py")
ANSWER = "exirc-clean-executorch-answer: "
# A cap for a process that stopped answering, far above any honest job (the
# slowest generates a few hundred tokens in seconds): not a verdict on speed.
JOB_TIMEOUT_SECONDS = 600.0


class _Worker:
    """The one clean ExecuTorch process of this test process, started on first use
    and again after it died (a crash is reported to the job that caused it)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None  # its stderr: ExecuTorch says there why a load failed
        self.pending = b""  # what the process wrote after the last line read

    def ask(self, job: dict[str, Any]) -> None:
        process = self._started()
        assert process.stdin is not None and self.log is not None
        logged = self.log.stat().st_size
        try:
            process.stdin.write((json.dumps(job) + "\n").encode())
            line = self._answer(process)
        except BrokenPipeError:  # it died after its last answer
            line = None
        if line is None:
            said = self._logged_since(logged)
            self.stop()
            raise AssertionError(f"ExecuTorch's runtime died or stopped answering on "
                                 f"{job['job']} {job['program']}:\n{said}")
        answer = json.loads(line)
        assert answer["ok"], f"{answer['error']}\nExecuTorch's log:\n{self._logged_since(logged)}"

    def _started(self) -> subprocess.Popen[bytes]:
        if self.process is None or self.process.poll() is not None:
            self.stop()
            descriptor, name = tempfile.mkstemp(prefix="clean-executorch-", suffix=".log")
            os.close(descriptor)
            self.log = Path(name)
            # Appending, so the process writes at the end whatever this side reads.
            errors = os.open(name, os.O_WRONLY | os.O_APPEND)
            try:
                self.process = subprocess.Popen(
                    [sys.executable, str(WORKER)], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=errors, bufsize=0)
            finally:
                os.close(errors)
            self.pending = b""
        return self.process

    def _answer(self, process: subprocess.Popen[bytes]) -> str | None:
        """The job's answer line, or None if the process ended or hung. Read from the
        descriptor, not a buffered file: a buffer could hold the answer unseen by select."""
        assert process.stdout is not None
        descriptor = process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(descriptor, selectors.EVENT_READ)
            while True:
                while b"\n" in self.pending:
                    line, _, self.pending = self.pending.partition(b"\n")
                    text = line.decode(errors="replace")
                    if text.startswith(ANSWER):
                        return text[len(ANSWER):]
                if not selector.select(JOB_TIMEOUT_SECONDS):
                    return None
                chunk = os.read(descriptor, 1 << 16)
                if not chunk:
                    return None
                self.pending += chunk

    def _logged_since(self, offset: int) -> str:
        assert self.log is not None
        with self.log.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")[-2000:]

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=60)  # killed: a cap, never reached
            self.process = None
        if self.log is not None:
            self.log.unlink(missing_ok=True)
            self.log = None


_WORKER = _Worker()
atexit.register(_WORKER.stop)


def run_executorch_without_quantized_kernels(data: bytes, inputs: Sequence[Any],
                                             directory: Path) -> list[torch.Tensor]:
    """`forward`'s outputs on ExecuTorch's runtime without its quantized kernels."""
    program, given, got = directory / "m.pte", directory / "in.pt", directory / "out.pt"
    program.write_bytes(data)
    torch.save(list(inputs), given)
    _WORKER.ask({"job": "run", "program": str(program), "inputs": str(given),
                 "outputs": str(got)})
    return list(torch.load(got))


def generate_on_executorch_without_quantized_kernels(
        data: bytes, prompts: list[list[int]], count: int, directory: Path,
        prefill: str | None = None) -> list[list[int]]:
    """Greedy tokens of a decoder file (`(input_ids [1, L], cache_position [L]) ->
    logits [1, L, vocab]`) on ExecuTorch's runtime without its quantized kernels:
    for each prompt in turn (from position 0), the prompt one token a call through
    `forward`, or at once through the method `prefill` (sharing the file's state),
    then `count` tokens one a call."""
    program, got = directory / "decoder.pte", directory / "tokens.json"
    program.write_bytes(data)
    _WORKER.ask({"job": "generate", "program": str(program), "prompts": prompts,
                 "count": count, "prefill": prefill, "outputs": str(got)})
    return list(json.loads(got.read_text()))
