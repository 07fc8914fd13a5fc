"""Timing helpers shared by the bench sections."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def best_seconds(fn: Callable[[], object], *, repeat: int = 7, min_time: float = 0.05) -> float:
    """Median over `repeat` rounds of the mean time of one call.

    Each round runs enough calls to last `min_time`, so fast calls are not
    lost in timer resolution; the median resists a busy neighbour.
    """
    fn()  # warm up: caches, lazy imports, allocator
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            break
        calls *= 2
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls)
    return statistics.median(rounds)


def ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or not theirs:
        return None
    return ours / theirs
