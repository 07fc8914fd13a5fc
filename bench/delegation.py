"""Delegation to XNNPACK: exirc's `--target xnnpack` file against ExecuTorch's
own XNNPACK-lowered file for the same model, both on ExecuTorch's runtime.

For each model: latency of both files measured interleaved in one process
(round after round, ours then theirs, so drift hits both alike), the ratio
(below 1: ours is faster), and how much of the graph each compiler
delegated: the share of compute nodes inside delegates, the number of
partitions, and the kernel calls left on portable kernels. Torch eager is
the third column, for scale.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.common import Row, bench_threads  # noqa: E402

MODELS = ["mlp", "cnn_bn_pool", "resnet_tiny", "mobilenet_tiny", "unet_tiny", "vit_tiny",
          "causal_attention", "gpt2_lm_head", "bert"]
ROUNDS = 15


def run(report: Callable[[Row], None] | None = None) -> list[Row]:
    try:
        import executorch  # noqa: F401
    except ImportError:
        return []
    rows = []
    with bench_threads() as threads:
        for name in MODELS:
            row = _model_row(name)
            if row is None:
                continue
            row["threads"] = threads
            if report is not None:
                report(row)
            rows.append(row)
    if rows:
        ratios = [r["ours_vs_executorch"] for r in rows]
        summary: Row = {"bench": "delegation.geomean", "model": "geomean",
                        "ours_vs_executorch": statistics.geometric_mean(ratios)}
        rows.append(summary)
        if report is not None:
            report(summary)
    return rows


def _count_kernel_calls(pte: bytes) -> tuple[int, int]:
    from exirc.serialize import deserialize
    from exirc.serialize import program as P

    plan = deserialize(pte).execution_plan[0]
    kernels = sum(isinstance(i, P.KernelCall) for c in plan.chains for i in c.instructions)
    return kernels, len(plan.delegates)


def _executorch_file(module: torch.nn.Module, inputs: tuple[Any, ...]) -> tuple[bytes, float]:
    """ExecuTorch's XNNPACK-lowered file, and the share of compute nodes it delegated."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge, to_edge_transform_and_lower

    exported = torch.export.export(module, inputs)
    total = _compute_nodes(to_edge(torch.export.export(module, inputs)).exported_program())
    lowered = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
    left = _compute_nodes(lowered.exported_program(), skip_delegates=True)
    return lowered.to_executorch().buffer, 1 - left / max(total, 1)


def _compute_nodes(program: Any, skip_delegates: bool = False) -> int:
    import operator

    count = 0
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if skip_delegates and "call_delegate" in str(node.target):
            continue
        count += 1
    return count


def _interleaved_ms(first: Callable[[], Any], second: Callable[[], Any]) -> tuple[float, float]:
    for _ in range(3):
        first()
        second()
    a, b = [], []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        first()
        a.append(time.perf_counter() - start)
        start = time.perf_counter()
        second()
        b.append(time.perf_counter() - start)
    return statistics.median(a) * 1e3, statistics.median(b) * 1e3


def _model_row(name: str) -> Row | None:
    from exirc.compiler import CompileOptions, compile_module
    from tests.models.zoo import ZOO
    from tests.oracle import load_with_executorch

    model = ZOO[name]
    if not model.available:
        return None
    module, inputs = model.module(), tuple(model.inputs())
    ours = compile_module(module, inputs, options=CompileOptions(target="xnnpack"))
    reports = ours.delegation.values()
    ours_share = sum(r.delegated_nodes for r in reports) / max(
        sum(r.compute_nodes for r in reports), 1)
    theirs_pte, theirs_share = _executorch_file(module, inputs)
    ours_module = load_with_executorch(ours.data)
    theirs_module = load_with_executorch(theirs_pte)
    args = list(inputs)
    ours_ms, theirs_ms = _interleaved_ms(lambda: ours_module.forward(args),
                                         lambda: theirs_module.forward(args))
    with torch.no_grad():
        eager_ms, _ = _interleaved_ms(lambda: module(*inputs), lambda: None)
    ours_kernels, ours_delegates = _count_kernel_calls(ours.data)
    theirs_kernels, theirs_delegates = _count_kernel_calls(theirs_pte)
    return {"bench": "delegation.xnnpack", "model": name, "ours_ms": ours_ms,
            "executorch_ms": theirs_ms, "eager_ms": eager_ms,
            "ours_vs_executorch": ours_ms / theirs_ms,
            "delegated_ours": round(ours_share, 3), "delegated_theirs": round(theirs_share, 3),
            "partitions_ours": ours_delegates, "partitions_theirs": theirs_delegates,
            "kernel_calls_ours": ours_kernels, "kernel_calls_theirs": theirs_kernels}


if __name__ == "__main__":
    from bench.run import format_table

    print(format_table(run()))
