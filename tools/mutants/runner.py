"""Running mutants, each in its own process, a few at a time.

Each mutant runs in a fresh process forked from a server that has imported
torch and the runtime but never run a kernel (forking a process whose
OpenMP pool has started can deadlock the child), so a mutant starts in
milliseconds instead of the seconds importing torch takes, and nothing one
mutant does (a corrupted heap, a leaked thread) reaches the next.

The runner classifies each process's end: a signal is a `crash`, a process
with one stage (a load, a run, an inspect view) still running after the
timeout is killed and is a `hang`, a stage that
raised anything but a typed exirc error is a `traceback`, an allocation that
failed under the memory limit is `memory`; otherwise the mutant was refused
with a typed error (`typed`) or ran (`ok`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from tools.mutants import crash_site, server
from tools.mutants.child import Limits, Stage, run_mutant
from tools.mutants.generate import Mutant

# A typed error whose cause was an allocation the memory limit refused: the
# runtime did not bound the memory, even if it reported the failure cleanly.
MEMORY_SIGNS = ("can't allocate memory", "MemoryError", "out of memory", "std::bad_alloc",
                 "Cannot allocate memory")


DEFAULT_LIMITS = Limits()
# A mutant has about ten stages, each given the timeout; all of them together
# get this many timeouts, so a mutant of many slow stages still ends.
STAGES_PER_TIMEOUT = 4


@dataclass
class Result:
    index: int
    mutant: Mutant
    outcome: str  # ok, typed, crash, hang, traceback, memory, harness
    stages: list[Stage] = field(default_factory=list)
    seconds: float = 0.0
    peak_rss_kib: int | None = None
    exit_code: int | None = None
    last_stage: str = ""  # the stage running when the process died or was killed
    log: str = ""  # the end of its stderr (a crash's Python stack), if it died
    site: str = ""  # the instruction a crash happened in (`crash_site`), when found

    @property
    def first_error(self) -> str:
        """The first line that explains the outcome."""
        if self.outcome in ("crash", "hang", "harness"):
            where = f" during {self.last_stage}" if self.last_stage else ""
            tail = self.log.strip().splitlines()[-1:] if self.outcome == "crash" else []
            return f"{self.outcome}{where} (exit {self.exit_code})" + \
                (f": {tail[0].strip()}" if tail else "")
        for stage in self.stages:
            if stage.outcome not in ("ok", "skipped"):
                return f"{stage.name}: {stage.outcome} {stage.detail}"
        return ""


@dataclass
class _Running:
    index: int
    mutant: Mutant
    process: Any
    conn: Connection
    log_path: str
    started: float
    stage_started: float = 0.0  # when the current stage began (the clock a hang is timed by)
    last_stage: str = ""
    done: tuple[Any, ...] | None = None
    closed: bool = False  # the child's end of the pipe is closed: wait on its sentinel only

    def deadline(self, timeout: float) -> float:
        """When the process is late: one stage (a load, a run, an inspect view)
        past `timeout`, or the whole mutant past `STAGES_PER_TIMEOUT` of them."""
        return min(self.stage_started + timeout, self.started + STAGES_PER_TIMEOUT * timeout)


def run_mutants(mutants: Iterable[tuple[int, Mutant]], *, jobs: int = 2,
                timeout: float = 10.0, limits: Limits = DEFAULT_LIMITS,
                warm_modules: Sequence[str] = (),
                on_result: Callable[[Result], None] | None = None,
                target: Callable[..., None] = run_mutant) -> list[Result]:
    """Run every mutant (each in a fresh process), at most `jobs` at once.

    `warm_modules`: what the fork server imports first (`warm.discover`);
    the first call in a process starts the server. `target` is what each
    process runs (`child.run_mutant`; `child.pretend` in the runner's tests)."""
    results: list[Result] = []
    pending: Iterator[tuple[int, Mutant]] = iter(mutants)
    running: list[_Running] = []
    with tempfile.TemporaryDirectory(prefix="mutants-logs-") as logs:
        context = server.context(warm_modules)
        exhausted = False
        while running or not exhausted:
            while not exhausted and len(running) < jobs:
                item = next(pending, None)
                if item is None:
                    exhausted = True
                    break
                running.append(_start(context, target, *item, limits, logs))
            if not running:
                break
            now = time.monotonic()
            deadline = min(r.deadline(timeout) for r in running)
            ready = wait([r.conn for r in running if not r.closed]
                         + [r.process.sentinel for r in running],
                         timeout=max(0.0, deadline - now))
            for run in list(running):
                _drain(run)
                finished = run.process.sentinel in ready or not run.process.is_alive()
                late = time.monotonic() > run.deadline(timeout)
                if finished or late:
                    result = _finish(context, run, limits, timeout, hung=late and not finished)
                    running.remove(run)
                    results.append(result)
                    if on_result is not None:
                        on_result(result)
    return sorted(results, key=lambda r: r.index)


def _start(context: Any, target: Callable[..., None], index: int, mutant: Mutant,
           limits: Limits, logs: str) -> _Running:
    receive, send = context.Pipe(duplex=False)
    log_path = os.path.join(logs, f"{index}.log")
    process = context.Process(target=target, daemon=True,
                              args=(mutant.data, mutant.spec.route, mutant.spec.seed, limits,
                                    log_path, send))
    started = time.monotonic()
    server.start(process)
    send.close()  # the child's end: EOF here once the child is gone
    return _Running(index, mutant, process, receive, log_path, started, started)


def _drain(run: _Running) -> None:
    """Read what the process has sent so far (stage markers, the final report)."""
    try:
        while run.conn.poll():
            message = run.conn.recv()
            if message[0] == "stage":
                run.last_stage = message[1]
                run.stage_started = time.monotonic()
            else:
                run.done = message
    except (EOFError, OSError):
        run.closed = True


def _finish(context: Any, run: _Running, limits: Limits, timeout: float, *,
            hung: bool) -> Result:
    peak = None
    if hung:
        peak = _peak_rss_kib(run.process.pid)
        run.process.kill()
    run.process.join(5)
    _drain(run)
    run.conn.close()
    seconds = time.monotonic() - run.started
    result = Result(run.index, run.mutant, "", seconds=seconds, peak_rss_kib=peak,
                    exit_code=run.process.exitcode, last_stage=run.last_stage)
    if run.done is not None:
        _, result.stages, _, result.peak_rss_kib = run.done

    result.outcome = _classify(result, hung)
    if result.outcome in ("crash", "hang", "harness"):
        result.log = _tail(run.log_path)
    if result.outcome == "crash" and run.mutant.spec.route in ("api", "hostile") \
            and result.last_stage.startswith("run "):
        result.site = crash_site.locate(context, run.mutant, limits, run.log_path, timeout)
    with contextlib.suppress(OSError):
        os.unlink(run.log_path)
    return result


def _classify(result: Result, hung: bool) -> str:
    if hung:
        return "hang"
    if result.exit_code is not None and result.exit_code < 0:
        return "crash"
    if not result.stages and result.exit_code != 0:
        return "crash"  # died without a report: e.g. exit() from native code
    outcomes = [stage.outcome for stage in result.stages]
    if "harness" in outcomes:
        return "harness"
    if "traceback" in outcomes:
        return "traceback"
    if any(any(sign in stage.detail for sign in MEMORY_SIGNS) for stage in result.stages):
        return "memory"
    if all(outcome in ("ok", "skipped") for outcome in outcomes):
        return "ok"
    return "typed"


def _peak_rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, errors="replace") as log:
            return "".join(log.readlines()[-lines:])
    except OSError:
        return ""
