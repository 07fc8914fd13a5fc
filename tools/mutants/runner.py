"""Running mutants, each in its own process, a few at a time.

Each mutant runs in a fresh process forked from a server that has imported
torch and the runtime but never run a kernel (forking a process whose
OpenMP pool has started can deadlock the child), so a mutant starts in
milliseconds instead of the seconds importing torch takes, and nothing one
mutant does (a corrupted heap, a leaked thread) reaches the next.

The runner classifies each process's end: a signal is a `crash`, a process
killed as hung is a `hang`, a stage that raised anything but a typed exirc
error is a `traceback`, an allocation that failed under the memory limit is
`memory`; otherwise the mutant was refused with a typed error (`typed`) or
ran (`ok`).

A hang is judged by work, not by the clock: a stage (a load, a run, an
inspect view) that has spent more than its budget of CPU time is killed, so
a process that is merely slow because the machine is busy (its CPU time
grows slowly) is never called hung. A process that makes no progress at
all (waiting on a lock, asleep) spends no CPU time: it is killed when its
stage has lasted `WALL_CAP_FACTOR` budgets of wall-clock time, far more than
any stage takes on a loaded machine.
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
# CPU seconds one stage may spend: an honest stage takes well under a second
# (inspecting 200,000 arenas, 0.4 s).
CPU_BUDGET = 10.0
# A mutant has about ten stages, each given the budget; all of them together
# get this many budgets of CPU time, so a mutant of many slow stages still ends.
STAGES_PER_BUDGET = 4
# A stage still running after this many budgets of wall-clock time is killed
# whatever CPU time it spent: with a 10 s budget, five minutes, which only a
# process making no progress reaches (a machine loaded 6-fold makes an honest
# 1 s stage last 3 s).
WALL_CAP_FACTOR = 30
# How often the runner reads the CPU time of the processes it runs.
POLL_SECONDS = 0.25
_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    index: int
    mutant: Mutant
    outcome: str  # ok, typed, crash, hang, traceback, memory, harness, wrong
    stages: list[Stage] = field(default_factory=list)
    seconds: float = 0.0
    peak_rss_kib: int | None = None
    exit_code: int | None = None
    last_stage: str = ""  # the stage running when the process died or was killed
    log: str = ""  # the end of its stderr (a crash's Python stack), if it died
    site: str = ""  # the instruction a crash happened in (`crash_site`), when found
    cpu_seconds: float | None = None  # the process's CPU time when it ended or was killed
    killed_for: str = ""  # a hang's reason: "CPU budget" or "no progress" (`_Running.overdue`)

    @property
    def first_error(self) -> str:
        """The first line that explains the outcome."""
        if self.outcome in ("crash", "hang", "harness"):
            where = f" during {self.last_stage}" if self.last_stage else ""
            if self.killed_for:
                where += f", {self.killed_for}"
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
    stage_started: float = 0.0  # wall-clock time the current stage began at
    stage_cpu: float = 0.0  # the process's CPU time when the current stage began
    last_stage: str = ""
    done: tuple[Any, ...] | None = None
    closed: bool = False  # the child's end of the pipe is closed: wait on its sentinel only

    def overdue(self, cpu_budget: float, wall_cap: float) -> str:
        """Why the process is to be killed as hung, or "" if it is not: its
        stage has spent more than `cpu_budget` seconds of CPU time (or the whole
        mutant more than `STAGES_PER_BUDGET` budgets), or, spending none, has
        lasted `wall_cap` seconds."""
        cpu = process_cpu_seconds(self.process.pid)
        if cpu is not None and (cpu - self.stage_cpu > cpu_budget
                                or cpu > STAGES_PER_BUDGET * cpu_budget):
            return "CPU budget"
        if time.monotonic() - self.stage_started > wall_cap:
            return "no progress"
        return ""


def process_cpu_seconds(pid: int) -> float | None:
    """The user and system CPU time of process `pid` (all its threads), or None
    if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()  # after the command's name
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_SECOND  # utime, stime


def run_mutants(mutants: Iterable[tuple[int, Mutant]], *, jobs: int = 2,
                cpu_budget: float = CPU_BUDGET, wall_cap: float | None = None,
                limits: Limits = DEFAULT_LIMITS, warm_modules: Sequence[str] = (),
                on_result: Callable[[Result], None] | None = None,
                target: Callable[..., None] = run_mutant) -> list[Result]:
    """Run every mutant (each in a fresh process), at most `jobs` at once.

    A stage is given `cpu_budget` seconds of CPU time, and `wall_cap` seconds
    of wall-clock time (by default `WALL_CAP_FACTOR` budgets) in case it makes
    no progress at all. `warm_modules`: what the fork server imports first
    (`warm.discover`); the first call in a process starts the server.
    `target` is what each process runs (`child.run_mutant`; `child.pretend` in
    the runner's tests)."""
    cap = WALL_CAP_FACTOR * cpu_budget if wall_cap is None else wall_cap
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
            # Woken by a message or an exit, else every POLL_SECONDS to read CPU times.
            ready = wait([r.conn for r in running if not r.closed]
                         + [r.process.sentinel for r in running], timeout=POLL_SECONDS)
            for run in list(running):
                _drain(run)
                finished = run.process.sentinel in ready or not run.process.is_alive()
                killed_for = "" if finished else run.overdue(cpu_budget, cap)
                if finished or killed_for:
                    result = _finish(context, run, limits, cpu_budget, killed_for)
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
            if message[0] == "stage":  # ("stage", name, the child's CPU time then)
                run.last_stage, run.stage_cpu = message[1], message[2]
                run.stage_started = time.monotonic()
            else:
                run.done = message
    except (EOFError, OSError):
        run.closed = True


def _finish(context: Any, run: _Running, limits: Limits, cpu_budget: float,
            killed_for: str) -> Result:
    """The result of a process that ended, or is killed now for `killed_for`."""
    peak = cpu = None
    if killed_for:
        peak = _peak_rss_kib(run.process.pid)
        cpu = process_cpu_seconds(run.process.pid)
        run.process.kill()
    run.process.join(5)
    _drain(run)
    run.conn.close()
    seconds = time.monotonic() - run.started
    result = Result(run.index, run.mutant, "", seconds=seconds, peak_rss_kib=peak,
                    exit_code=run.process.exitcode, last_stage=run.last_stage,
                    cpu_seconds=cpu, killed_for=killed_for)
    if run.done is not None:
        _, result.stages, result.cpu_seconds, result.peak_rss_kib = run.done

    result.outcome = _classify(result, hung=bool(killed_for))
    if result.outcome in ("crash", "hang", "harness"):
        result.log = _tail(run.log_path)
    if result.outcome == "crash" and run.mutant.spec.route in ("api", "hostile") \
            and result.last_stage.startswith("run "):
        result.site = crash_site.locate(context, run.mutant, limits, run.log_path,
                                        WALL_CAP_FACTOR * cpu_budget)
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
    if "wrong" in outcomes:
        return "wrong"  # an engine answered otherwise than the reference, without an error
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
