"""A sample of mutants through the real command line, each in its own process.

The fork-server runner calls the commands' code in-process; this runs
`exirc run FILE --random` and `exirc inspect FILE --json` as a user does:
a new interpreter on a file on disk (which the runtime maps rather than
reads), with the memory limit and a CPU-time limit (RLIMIT_CPU: the kernel
stops a command past it with SIGXCPU, a `hang`; a busy machine only makes
the command take longer). Exit codes are the CLI's: 1 is an internal error
(E0100, a traceback), any other signal a crash. A command still running
after `WALL_CAP_FACTOR` CPU budgets of wall-clock time, making no progress,
is a hang too.
"""

from __future__ import annotations

import math
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools.mutants.child import Stage
from tools.mutants.generate import Mutant
from tools.mutants.runner import WALL_CAP_FACTOR, Result

INSPECT = ["inspect", "{path}", "--json", "--show", "memory", "--show", "size"]
RUN = ["run", "{path}", "--random", "--max-steps", "100000"]


def run_sample(mutants: Sequence[tuple[int, Mutant]], *, runs: int | None = None,
               jobs: int = 2, cpu_budget: float = 30.0, memory_bytes: int = 4 << 30
               ) -> list[Result]:
    """Each mutant through `exirc inspect`, and the first `runs` (all if None)
    through `exirc run` too (which imports torch: seconds each), `jobs`
    processes at a time, each command given `cpu_budget` seconds of CPU time."""
    with tempfile.TemporaryDirectory(prefix="mutants-cli-") as folder, \
            ThreadPoolExecutor(max_workers=jobs) as pool:
        work = [(index, mutant, Path(folder) / f"{index}.pte") for index, mutant in mutants]
        for _, mutant, path in work:
            path.write_bytes(mutant.data)
        futures = [pool.submit(_one, index, mutant, path,
                               [RUN, INSPECT] if runs is None or n < runs else [INSPECT],
                               cpu_budget, memory_bytes)
                   for n, (index, mutant, path) in enumerate(work)]
        return [future.result() for future in futures]


def _one(index: int, mutant: Mutant, path: Path, commands: list[list[str]],
         cpu_budget: float, memory_bytes: int) -> Result:
    result = Result(index, mutant, "ok")
    started = time.monotonic()
    for command in commands:
        args = [arg.format(path=path) for arg in command]
        name = f"process: exirc {' '.join(command[:1] + command[2:])}"
        result.last_stage = name
        try:
            done = subprocess.run([sys.executable, "-m", "exirc", *args], capture_output=True,
                                  text=True, timeout=WALL_CAP_FACTOR * cpu_budget,
                                  preexec_fn=_limit(memory_bytes, cpu_budget))
        except subprocess.TimeoutExpired:
            result.outcome, result.killed_for = "hang", "no progress"
            break
        if done.returncode == -signal.SIGXCPU:
            result.outcome, result.killed_for = "hang", "CPU budget"
            break
        stage = _stage(name, done)
        result.stages.append(stage)
        if stage.outcome == "crash":
            result.outcome, result.exit_code = "crash", done.returncode
            result.log = done.stderr[-3000:]
            break
    result.seconds = time.monotonic() - started
    if result.outcome == "ok":
        outcomes = {stage.outcome for stage in result.stages}
        result.outcome = "traceback" if "traceback" in outcomes else \
            "ok" if outcomes <= {"ok"} else "typed"
    return result


def _stage(name: str, done: subprocess.CompletedProcess[str]) -> Stage:
    error = next((line for line in done.stderr.splitlines() if line.startswith("error[")), "")
    if done.returncode < 0:
        return Stage(name, "crash", f"signal {-done.returncode}")
    if done.returncode == 0:
        return Stage(name, "ok")
    if done.returncode == 1 or "Traceback (most recent call last)" in done.stderr \
            or "E0100" in error:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return Stage(name, "traceback", error or last)
    code = error[len("error["):error.index("]")] if error else f"exit{done.returncode}"
    return Stage(name, code, error)


def _limit(memory_bytes: int, cpu_budget: float) -> Callable[[], None]:
    """Limits for the command's process: its memory, and its CPU time (SIGXCPU
    at the budget, SIGKILL a second later if it ignores that)."""
    seconds = max(1, math.ceil(cpu_budget))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
    return limit
