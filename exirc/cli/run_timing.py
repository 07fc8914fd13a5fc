"""`exirc run`'s timed runs: warm-up, torch's thread count, and the runs kept
on a profile's timeline for `--trace`.

The default is one thread. Measured on 2 cores (torch's default there is 2):
idle, a 33 MB MLP ran in 8.7 ms on 2 threads against 14.7 ms on 1; with one
other busy process, 2 threads took 100 ms against 15 ms, and a small LSTM's
p90 went from 0.9 ms to 270 ms, as torch's threads wait for each other at
every operator. One thread is what ExecuTorch's portable kernels use, and
gives latency that does not depend on what else the machine runs;
`--threads N` uses more cores, for large models on an idle machine.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

from exirc.errors import UsageError

if TYPE_CHECKING:
    from exirc.runtime.core.method import Method
    from exirc.runtime.core.profile import Profile

DEFAULT_THREADS = 1
MAX_THREADS = 1024  # beyond any machine's cores; a typo's 10**9 threads would fail to start

MAX_WARMUP = 10
TRACE_SLICE_LIMIT = 200_000
"""Instruction slices a trace keeps at most (about 45 MB of JSON, which trace
viewers still open): whole runs, from the first, and always the first run."""


def default_warmup(repeat: int) -> int:
    """Warm-up runs before `repeat` measured ones: none for a single run, else a
    tenth as many, at least 1 and at most `MAX_WARMUP`."""
    return 0 if repeat == 1 else max(1, min(MAX_WARMUP, repeat // 10))


def threads_option(ctx: click.Context, param: click.Parameter, value: int | None) -> int:
    """click callback: the thread count, `DEFAULT_THREADS` when not given."""
    if value is None:
        return DEFAULT_THREADS
    if not 1 <= value <= MAX_THREADS:
        raise UsageError(f"--threads must be between 1 and {MAX_THREADS}, not {value}",
                         hint="1 (the default) gives the steadiest latency; a larger count "
                              "helps large models on an otherwise idle machine")
    return value


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op thread count set to `count` for a while, then restored."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class Runs:
    """What the measured runs gave: the last outputs, each run's seconds, and the
    (start, end) `perf_counter` times of the runs kept on the profile's timeline."""

    outputs: list[Any]
    seconds: list[float] = field(default_factory=list)
    on_timeline: list[tuple[float, float]] = field(default_factory=list)


def timed_runs(method: Method, inputs: Sequence[Any] | Mapping[str, Any], repeat: int,
               warmup: int, profile: Profile | None) -> Runs:
    """Run `warmup` times uncounted (the profile forgets them), then `repeat`
    times timed. A profile with a timeline keeps the whole runs that fit in
    `TRACE_SLICE_LIMIT` slices."""
    outputs: list[Any] = []
    for _ in range(warmup):
        outputs = method.run(inputs, profile=profile)
    if profile is not None:
        profile.clear()
    runs = Runs(outputs)
    timeline = profile.timeline if profile is not None else None
    clock = time.perf_counter
    for _ in range(repeat):
        before = len(timeline) if timeline is not None else 0
        start = clock()
        runs.outputs = method.run(inputs, profile=profile)
        end = clock()
        runs.seconds.append(end - start)
        if timeline is None or profile is None:
            continue
        runs.on_timeline.append((start, end))
        if len(timeline) + (len(timeline) - before) > TRACE_SLICE_LIMIT:
            # Another run like this one would not fit.
            profile.stop_timeline()
            timeline = None
    return runs
