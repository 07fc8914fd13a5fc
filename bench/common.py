"""Timing and comparison helpers shared by the bench sections."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

Row = dict[str, Any]


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


def median_time(fn: Callable[[], Any], budget: float = 0.3, warmup: int = 5) -> float:
    """Median seconds per call, over as many calls as fit in about `budget` seconds."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    deadline = time.perf_counter() + budget
    while len(times) < 5 or (time.perf_counter() < deadline and len(times) < 10_000):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def against_references(row: Row, exirc_s: float, module: torch.nn.Module,
                       inputs: list[Any], pte: bytes) -> Row:
    """Add exirc's time beside torch eager's and ExecuTorch's on the same file."""
    from tests.oracle import load_with_executorch

    with torch.no_grad():
        eager_s = median_time(lambda: module(*inputs))
    row.update({"exirc_ms": exirc_s * 1e3, "eager_ms": eager_s * 1e3,
                "exirc_vs_eager": exirc_s / eager_s})
    try:
        et_module = load_with_executorch(pte)
    except ImportError:
        return row
    et_s = median_time(lambda: et_module.forward(inputs))
    row.update({"executorch_ms": et_s * 1e3, "exirc_vs_executorch": exirc_s / et_s})
    return row


@contextlib.contextmanager
def bench_threads() -> Iterator[int]:
    """Torch on `EXIRC_BENCH_THREADS` threads (1 by default) for the block.

    ExecuTorch's portable kernels are single-threaded, and on a shared
    machine torch's thread pool otherwise measures the neighbours' load
    more than the code. Yields the number of threads.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("EXIRC_BENCH_THREADS", "1")))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)


def executorch_file(module: torch.nn.Module, inputs: tuple[Any, ...], *, xnnpack: bool) -> bytes:
    """ExecuTorch's own .pte of `module`: portable kernels only, or with what
    its XnnpackPartitioner takes lowered to XNNPACK."""
    from executorch.exir import to_edge, to_edge_transform_and_lower

    exported = torch.export.export(module, inputs)
    if not xnnpack:
        return bytes(to_edge(exported).to_executorch().buffer)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    lowered = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
    return bytes(lowered.to_executorch().buffer)
