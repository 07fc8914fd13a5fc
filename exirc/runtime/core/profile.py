"""Where a run's time goes: per-instruction and per-operator totals, an
optional timeline of every instruction run (for a trace), and latency statistics.

Profiling wraps each prepared step in a timer, so the plain run loop stays
untouched; the figures include the interpreter's own per-step cost.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exirc.runtime.core.steps import Site

Step = Callable[[], "int | None"]

Slice = tuple[int, float, float]
"""One instruction run, on the timeline: (its number in `Profile.instructions`,
start, end), in `time.perf_counter` seconds."""


@dataclass
class InstructionTime:
    """What one instruction cost over the profiled runs."""

    site: Site
    calls: int = 0
    seconds: float = 0.0


class Profile:
    """Accumulates time per instruction (and so per operator) over any number of runs.

    With `timeline=True` it also keeps a `Slice` per instruction run, in
    order, until `stop_timeline()`: what a trace viewer shows."""

    def __init__(self, timeline: bool = False) -> None:
        self.instructions: list[InstructionTime] = []
        self.timeline: list[Slice] | None = [] if timeline else None
        # A cell the timed steps read, so that stopping needs no re-wrapping.
        self._recording = [timeline]
        self._engine_slots: dict[str, InstructionTime] = {}

    def wrap(self, steps: Sequence[Step], sites: Sequence[Site]) -> list[Step]:
        """`steps` (one chain's), each timed into a new slot for its site."""
        wrapped = []
        for step, site in zip(steps, sites):
            slot = InstructionTime(site)
            self.instructions.append(slot)
            if self.timeline is None:
                wrapped.append(_timed(step, slot))
            else:
                number = len(self.instructions) - 1
                wrapped.append(_traced(step, slot, number, self.timeline, self._recording))
        return wrapped

    def time_engine(self, label: str, run: Callable[[Any], Any], inputs: Any) -> Any:
        """`run(inputs)` (an engine's whole-method call), timed into one row named
        `label`: a method an engine took runs there when profiled too, so the
        profile times what plain runs use (per-instruction figures need the
        reference engine, which runs instruction by instruction)."""
        slot = self._engine_slots.get(label)
        if slot is None:
            from exirc.runtime.core.steps import Site

            slot = self._engine_slots[label] = InstructionTime(Site(0, -1, label, ""))
            self.instructions.append(slot)
        number = self.instructions.index(slot)
        start = time.perf_counter()
        try:
            return run(inputs)
        finally:
            end = time.perf_counter()
            slot.seconds += end - start
            slot.calls += 1
            if self.timeline is not None and self._recording[0]:
                self.timeline.append((number, start, end))

    def clear(self) -> None:
        """Forget what was measured so far (warm-up runs), keeping the wrapped steps."""
        for slot in self.instructions:
            slot.calls, slot.seconds = 0, 0.0
        if self.timeline is not None:
            self.timeline.clear()

    def stop_timeline(self) -> None:
        """Keep timing instructions, but add no more slices to the timeline."""
        self._recording[0] = False

    def total_seconds(self) -> float:
        return sum(slot.seconds for slot in self.instructions)

    def rows(self) -> list[dict[str, Any]]:
        """One row per operator that ran, slowest first: op, calls, total_ms, share."""
        ops: dict[str, list[float]] = {}
        for slot in self.instructions:
            if slot.calls:
                totals = ops.setdefault(slot.site.label, [0, 0.0])
                totals[0] += slot.calls
                totals[1] += slot.seconds
        total = self.total_seconds() or 1.0
        ranked = sorted(ops.items(), key=lambda item: item[1][1], reverse=True)
        return [{"op": name, "calls": int(calls), "total_ms": seconds * 1e3,
                 "share": seconds / total} for name, (calls, seconds) in ranked]

    def instruction_rows(self) -> list[dict[str, Any]]:
        """One row per instruction that ran, in program order: chain, index, op,
        calls, total_ms, share, source and module ("" when unknown). An engine's
        whole-method calls (`time_engine`) are rows of `rows`, not of these."""
        total = self.total_seconds() or 1.0
        return [{"chain": slot.site.chain, "index": slot.site.index, "op": slot.site.label,
                 "calls": slot.calls, "total_ms": slot.seconds * 1e3,
                 "share": slot.seconds / total, "source": slot.site.source,
                 "module": slot.site.module}
                for slot in self.instructions if slot.calls and slot.site.index >= 0]

    def slowest(self, count: int) -> list[dict[str, Any]]:
        """The `count` instructions that took the most time in all, slowest first."""
        rows = self.instruction_rows()
        rows.sort(key=lambda row: row["total_ms"], reverse=True)
        return rows[:count]


def _timed(step: Step, slot: InstructionTime) -> Step:
    clock = time.perf_counter

    def timed() -> int | None:
        start = clock()
        try:
            return step()
        finally:
            slot.seconds += clock() - start
            slot.calls += 1
    return timed


def _traced(step: Step, slot: InstructionTime, number: int, timeline: list[Slice],
            recording: list[bool]) -> Step:
    """`_timed`, also putting a slice on the timeline while `recording[0]`."""
    clock = time.perf_counter
    record = timeline.append

    def traced() -> int | None:
        start = clock()
        try:
            return step()
        finally:
            end = clock()
            slot.seconds += end - start
            slot.calls += 1
            if recording[0]:
                record((number, start, end))
    return traced


def latency_stats(seconds: Sequence[float]) -> dict[str, float]:
    """mean, std (sample; 0 for one run), min, median, p90 and max of run times,
    in milliseconds."""
    ordered = sorted(seconds)
    p90 = ordered[math.ceil(0.9 * len(ordered)) - 1]  # nearest rank
    std = statistics.stdev(ordered) if len(ordered) > 1 else 0.0
    # The mean of sorted values can land a rounding error outside [min, max].
    mean = min(max(statistics.fmean(ordered), ordered[0]), ordered[-1])
    return {"mean_ms": mean * 1e3, "std_ms": std * 1e3,
            "min_ms": ordered[0] * 1e3, "median_ms": statistics.median(ordered) * 1e3,
            "p90_ms": p90 * 1e3, "max_ms": ordered[-1] * 1e3}
