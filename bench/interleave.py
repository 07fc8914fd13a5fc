"""Timing several engines in interleaved rounds, so machine load hits all alike.

One round runs every engine once (a sample: enough back-to-back calls to
last a couple of milliseconds, so a fast model is not lost in timer
resolution), starting with a different engine each round so none always
runs right after the same neighbour. Rounds go on until the time budget is
spent (and at least `min_rounds` ran); each engine's figure is the median of
its samples, which a burst of load from another process moves little.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

SAMPLE_SECONDS = 0.002


def calls_per_sample(fn: Callable[[], Any], sample_seconds: float = SAMPLE_SECONDS,
                     warmup: int = 3) -> int:
    """How many back-to-back calls of `fn` last about `sample_seconds` (warms it up too)."""
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    return max(1, math.ceil(sample_seconds / max(once, 1e-9)))


def interleaved_medians(runners: Mapping[str, Callable[[], Any]], budget_seconds: float,
                        *, min_rounds: int = 5, max_rounds: int = 200) -> dict[str, float]:
    """Median seconds per call of each runner, timed round after round."""
    names = list(runners)
    calls = {name: calls_per_sample(runners[name]) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    deadline = time.perf_counter() + budget_seconds
    rounds = 0
    while rounds < max_rounds and (rounds < min_rounds or time.perf_counter() < deadline):
        shift = rounds % max(len(names), 1)
        for name in names[shift:] + names[:shift]:
            fn, count = runners[name], calls[name]
            start = time.perf_counter()
            for _ in range(count):
                fn()
            samples[name].append((time.perf_counter() - start) / count)
        rounds += 1
    return {name: statistics.median(values) for name, values in samples.items() if values}
