"""The interpreter's own cost per instruction, and the ways into a kernel.

    python bench/overhead.py           # prints a table
    run(report)                        # from bench/run.py: one row per measurement

Rows:

  * `overhead.chain`: a chain of 1,000 `aten::add.out` calls on 1-element
    tensors (`bench.runtime.add_chain_program`), so the kernels do almost
    nothing. Per instruction: a whole run (less a 1-instruction run, which
    holds the fixed cost of inputs and outputs), the same chain through the
    instruction-by-instruction loop that chains with jumps take, and the
    same 1,000 adds called directly as `torch.add(a, b, out=c)`, eager
    PyTorch's fastest path. `overhead_us` is the run's cost beyond the direct
    calls: what the interpreter adds.
  * `overhead.compiled_chain`: the same 1,000 adds as `exirc compile` writes
    them from `x = x + 1` in a loop (portable target: each add reads an int64
    0-d constant, as the Edge dialect keeps scalars out of kernel
    arguments), run as `exirc run` runs them: one onnxruntime session when
    the chain fuses (`execution` says), per instruction beyond a 1-add
    program's run.
  * `overhead.entry`: one call of the same add through each way torch offers
    into it: the boxed dispatcher call with the operator's handle, the
    overload's `_op`, the `OpOverload` itself, and the Python binding
    (`torch.add`), which `exirc.runtime.kernels.fast_entries` uses where it can.

Each figure is the least of interleaved rounds, so a busy neighbour (this
machine is shared) inflates it least.
"""

from __future__ import annotations

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
from bench.runtime import CHAIN_LENGTH, add_chain_program  # noqa: E402
from exirc.runtime import load  # noqa: E402
from exirc.serialize.writer import serialize  # noqa: E402

ROUNDS = 15


def run(report: Callable[[Row], None] | None = None) -> list[Row]:
    """Measure, report each row as it is ready, and return all rows."""
    rows = []
    with bench_threads() as threads:
        for row in (chain_overhead(), compiled_chain_overhead(), entry_costs()):
            row["threads"] = threads
            if report is not None:
                report(row)
            rows.append(row)
    return rows


def least_seconds(candidates: dict[str, Callable[[], Any]], calls: int,
                  rounds: int = ROUNDS) -> dict[str, float]:
    """Seconds per call of each candidate: the least over `rounds` rounds of
    `calls` calls, the candidates taking turns so that load hits them alike."""
    best = dict.fromkeys(candidates, float("inf"))
    for fn in candidates.values():
        fn()  # warm up
    for _ in range(rounds):
        for name, fn in candidates.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / calls)
    return best


def chain_overhead(length: int = CHAIN_LENGTH) -> Row:
    chain = load(serialize(add_chain_program(length)))
    one = load(serialize(add_chain_program(1)))
    x = torch.zeros(1)
    (result,) = chain.run("forward", [x])
    assert result.item() == float(length), result
    method = chain.method("forward")
    steps = method._chains[0]
    allowance = (length, None)
    a, b, out = torch.zeros(1), torch.ones(1), torch.empty(1)
    add = torch.add

    def direct() -> None:
        for _ in range(length):
            add(a, b, out=out)

    seconds = least_seconds({
        "run": lambda: chain.run("forward", [x]),
        "fixed": lambda: one.run("forward", [x]),
        "step_loop": lambda: method._execute(0, steps, allowance),
        "direct": direct,
    }, calls=10)
    per_instruction = (seconds["run"] - seconds["fixed"]) / (length - 1) * 1e6
    direct_us = seconds["direct"] / length * 1e6
    return {
        "bench": "overhead.chain",
        "instructions": length,
        "run_ms": seconds["run"] * 1e3,
        "us_per_instruction": per_instruction,
        "step_loop_us_per_instruction": seconds["step_loop"] / length * 1e6,
        "direct_call_us": direct_us,
        "overhead_us": per_instruction - direct_us,
    }


def compiled_chain_overhead(length: int = CHAIN_LENGTH) -> Row:
    from exirc.compiler import compile_module
    from tests.models.zoo import AddOnes

    x = torch.zeros(1)
    chain, one = (load(compile_module(AddOnes(n), (x,)).data).method("forward")
                  for n in (length, 1))
    (result,) = chain.run([x])
    assert result.item() == float(length), result
    seconds = least_seconds({"run": lambda: chain.run([x]), "fixed": lambda: one.run([x])},
                            calls=10)
    return {
        "bench": "overhead.compiled_chain",
        "instructions": length,
        "run_ms": seconds["run"] * 1e3,
        "us_per_instruction": (seconds["run"] - seconds["fixed"]) / (length - 1) * 1e6,
        "execution": chain.execution,
    }


def entry_costs() -> Row:
    op = torch.ops.aten.add.out
    a, b, out = torch.zeros(1), torch.ones(1), torch.empty(1)
    boxed, handle, overload = torch._C._dispatch_call_boxed, op._handle, op._op
    seconds = least_seconds({
        "boxed_us": lambda: boxed(handle, a, b, out=out),
        "op_overload_op_us": lambda: overload(a, b, out=out),
        "op_overload_us": lambda: op(a, b, out=out),
        "python_binding_us": lambda: torch.add(a, b, out=out),
    }, calls=2000)
    row: Row = {"bench": "overhead.entry", "op": "aten::add.out"}
    row.update({name: value * 1e6 for name, value in seconds.items()})
    return row


def _print(row: Row) -> None:
    print("  ".join(f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}"
                    for key, value in row.items()))


if __name__ == "__main__":
    run(_print)
