"""Where a run's time goes: per-operator totals, and latency statistics.

Profiling wraps each prepared step in a timer, so the plain run loop stays
untouched; the figures include the interpreter's own per-step cost.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Step = Callable[[], "int | None"]


@dataclass
class OpTime:
    calls: int = 0
    seconds: float = 0.0


class Profile:
    """Accumulates time per operator label over any number of runs."""

    def __init__(self) -> None:
        self.ops: dict[str, OpTime] = {}

    def wrap(self, steps: Sequence[Step], labels: Sequence[str]) -> list[Step]:
        return [self._timed(step, self.ops.setdefault(label, OpTime()))
                for step, label in zip(steps, labels)]

    @staticmethod
    def _timed(step: Step, slot: OpTime) -> Step:
        clock = time.perf_counter

        def timed() -> int | None:
            start = clock()
            try:
                return step()
            finally:
                slot.seconds += clock() - start
                slot.calls += 1
        return timed

    def rows(self) -> list[dict[str, Any]]:
        """One row per operator that ran, slowest first: op, calls, total_ms, share."""
        total = sum(op.seconds for op in self.ops.values()) or 1.0
        ran = [(name, op) for name, op in self.ops.items() if op.calls]
        ran.sort(key=lambda item: item[1].seconds, reverse=True)
        return [{"op": name, "calls": op.calls, "total_ms": op.seconds * 1e3,
                 "share": op.seconds / total} for name, op in ran]


def latency_stats(seconds: Sequence[float]) -> dict[str, float]:
    """min, median, p90 and max of run times, in milliseconds."""
    ordered = sorted(seconds)
    p90 = ordered[math.ceil(0.9 * len(ordered)) - 1]  # nearest rank
    return {"min_ms": ordered[0] * 1e3, "median_ms": statistics.median(ordered) * 1e3,
            "p90_ms": p90 * 1e3, "max_ms": ordered[-1] * 1e3}
