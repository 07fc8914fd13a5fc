"""The clocks a run's loops read, besides their step budget.

Steps (`exirc.runtime.core.method`) are the budget: an estimate of work, the same
on every machine. Two clocks back it up, read as loops repeat:

- CPU time, always: a backstop for work the estimates miss (a delegate's
  graph, a user's kernel), allowed in proportion to the step limit. A busy
  machine does not stretch it (another process's work is not ours), so the
  same program and inputs end the same way however loaded the machine is.
- wall-clock time, only when the caller asks (`load(..., max_seconds=)`,
  `exirc run --max-seconds`): a deadline for the whole run.

Reading CPU time is a system call, dearer than a cheap loop's pass, so loops
read a fast clock (`time.monotonic`) at each pass and these only when it has
moved `CLOCK_INTERVAL` on.
"""

from __future__ import annotations

import time

from exirc.runtime.errors import StepLimitError

CPU_SECONDS_PER_STEP = 2.5e-6
"""The CPU time a run's loops may spend grows with the step limit, by this
much per step (2,500 s for the default limit): raising `max_steps` raises both."""

MIN_LOOP_CPU_SECONDS = 1.0
"""The least CPU time allowed for loops, however low the step limit, so that
a small limit fails on steps, predictably, rather than on CPU time."""

CLOCK_INTERVAL = 0.01
"""Seconds between readings of the clocks while loops run."""


def loop_cpu_seconds(max_steps: int) -> float:
    """The CPU time allowed for a run's loops under a step limit of `max_steps`."""
    return max(MIN_LOOP_CPU_SECONDS, max_steps * CPU_SECONDS_PER_STEP)


class LoopClocks:
    """One method's clocks: its limits, and the deadlines of the run in progress."""

    def __init__(self, method: str, max_steps: int, max_seconds: float | None) -> None:
        self.method = method
        self.max_steps = max_steps
        self.max_cpu_seconds = loop_cpu_seconds(max_steps)
        self.max_seconds = max_seconds
        self._cpu_deadline: float | None = None
        self._wall_deadline: float | None = None

    def start(self) -> float:
        """A run starts: its wall-clock deadline is set (its CPU deadline is, at
        the first reading: when its loops start). When to read the clocks first."""
        self._cpu_deadline = None
        self._wall_deadline = None if self.max_seconds is None \
            else time.monotonic() + self.max_seconds
        return 0.0  # at the first pass of a loop

    def read(self, chain: int, pc: int) -> float:
        """Stop the run (before instruction `pc` of `chain` runs again) if it is
        past a deadline; else when (`time.monotonic`) to read the clocks next."""
        cpu = time.process_time()
        if self._cpu_deadline is None:
            self._cpu_deadline = cpu + self.max_cpu_seconds
        elif cpu > self._cpu_deadline:
            raise StepLimitError(
                f"method {self.method!r} did not finish within {self.max_cpu_seconds:g} s "
                f"of CPU time in loops (the limit that comes with a step limit of "
                f"{self.max_steps}); it was about to run instruction {pc} of chain {chain} "
                "again: a loop that does not end?")
        now = time.monotonic()
        if self._wall_deadline is not None and now > self._wall_deadline:
            raise StepLimitError(
                f"method {self.method!r} did not finish within {self.max_seconds:g} s (its "
                f"wall-clock limit); it was about to run instruction {pc} of chain {chain} "
                "again: a loop that does not end?",
                hint="if the program really runs this long, raise the limit "
                     "(`exirc run --max-seconds S`, or `load(..., max_seconds=S)`)")
        return now + CLOCK_INTERVAL
