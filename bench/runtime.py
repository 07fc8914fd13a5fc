"""Benchmarks of the interpreter (`exirc.runtime`).

    python bench/runtime.py            # prints a table
    run(report)                        # from a driver: report(row) per measurement

Two measurements:

  * Per-instruction cost: a hand-built program that is a chain of 1,000
    `aten::add.out` calls on 1-element tensors, so the kernels do almost
    nothing and the time is the interpreter's. Beside it, the same 1,000
    calls made directly from a Python loop; the difference per instruction is
    the interpreter's overhead.
  * Per-model latency of exirc against torch eager and ExecuTorch's portable
    runtime, on ExecuTorch-produced files of the reference models in
    `tests/oracle.py` (skipped without ExecuTorch), and on exirc-compiled
    files of the zoo in `tests/models/zoo.py`, for both targets (`exirc`
    adds the fused backend ops) and, for the portable file, on ExecuTorch's
    runtime too.

Times are medians over repeated runs after a warm-up, with torch on one
thread (`EXIRC_BENCH_THREADS` to change): ExecuTorch's portable kernels are
single-threaded, and on a shared machine torch's thread pool otherwise
measures the neighbours' load more than the code.
"""

from __future__ import annotations

import functools
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for `tests.oracle` when run as a script

import torch  # noqa: E402

from bench.common import Row, against_references, bench_threads, median_time  # noqa: E402
from exirc.runtime import load  # noqa: E402
from exirc.serialize import program as P  # noqa: E402
from exirc.serialize.program import CONSTANT_ALIGNMENT  # noqa: E402
from exirc.serialize.writer import serialize  # noqa: E402

CHAIN_LENGTH = 1000


def run(report: Callable[[Row], None] | None = None) -> list[Row]:
    """Measure, report each row as it is ready, and return all rows."""
    rows = []
    with bench_threads() as threads:
        for row in _rows():
            row["threads"] = threads
            if report is not None:
                report(row)
            rows.append(row)
    return rows


def _rows() -> Any:
    yield per_instruction()
    try:
        from tests.oracle import HAVE_EXECUTORCH, RUNNABLE_MODEL_NAMES
    except ImportError:
        return
    if not HAVE_EXECUTORCH:
        return
    for name in RUNNABLE_MODEL_NAMES:
        yield model_latency(name)
    from tests.models.zoo import ZOO

    for name, zoo_model in ZOO.items():
        if zoo_model.available:
            yield compiled_latency(name)


# ---------------------------------------------------------------------------
# Per-instruction cost.
# ---------------------------------------------------------------------------


def add_chain_program(length: int = CHAIN_LENGTH) -> P.Program:
    """forward(x: f32[1]) = x + 1 + 1 + ... (`length` aten::add.out calls).

    Results alternate between two planned 1-element tensors, so the chain
    needs 48 bytes of arena however long it is.
    """
    def planned(offset: int) -> P.Tensor:
        return P.Tensor(P.ScalarType.FLOAT, [1], [0],
                        allocation_info=P.AllocationDetails.at(1, offset))

    values: list[P.EValue] = [
        planned(0),  # %0 x
        P.Tensor(P.ScalarType.FLOAT, [1], [0], data_buffer_idx=1),  # %1 the constant 1.0
        P.Int(1),  # %2 alpha
        planned(16),  # %3 A
        planned(32),  # %4 B
    ]
    instructions: list[P.Instruction] = []
    previous = 0
    for k in range(length):
        out = 3 + k % 2
        instructions.append(P.KernelCall(0, [previous, 1, 2, out, out]))
        previous = out
    plan = P.ExecutionPlan(
        name="forward", values=values, inputs=[0], outputs=[previous],
        chains=[P.Chain(instructions=instructions)],
        operators=[P.Operator("aten::add", "out")], non_const_buffer_sizes=[0, 48])
    segment, offsets = P.pack_subsegments([b"", struct.pack("<f", 1.0)], CONSTANT_ALIGNMENT)
    return P.Program(execution_plan=[plan], segments=[P.DataSegment(segment)],
                     constant_segment=P.SubsegmentOffsets(0, offsets))


def per_instruction(length: int = CHAIN_LENGTH) -> Row:
    program = load(serialize(add_chain_program(length)))
    x = torch.zeros(1)
    (result,) = program.run("forward", [x])
    assert result.item() == float(length), result
    run_seconds = median_time(lambda: program.run("forward", [x]))
    empty = load(serialize(add_chain_program(1)))
    base_seconds = median_time(lambda: empty.run("forward", [x]))  # inputs, outputs, one op

    a, one, out = torch.zeros(1), torch.ones(1), torch.empty(1)
    add = torch.add  # eager PyTorch's own fastest path to the same kernel

    def direct() -> None:
        for _ in range(length):
            add(a, one, out=out)
    direct_seconds = median_time(direct)
    per_instruction_us = (run_seconds - base_seconds) / (length - 1) * 1e6
    direct_us = direct_seconds / length * 1e6
    return {
        "bench": "runtime.per_instruction",
        "instructions": length,
        "run_ms": run_seconds * 1e3,
        "us_per_instruction": per_instruction_us,
        "direct_call_us": direct_us,
        "overhead_us": per_instruction_us - direct_us,
    }


# ---------------------------------------------------------------------------
# Per-model latency.
# ---------------------------------------------------------------------------


def model_latency(name: str) -> Row:
    """An ExecuTorch-produced file, run by exirc, ExecuTorch and eager."""
    from tests.oracle import MODELS, executorch_pte

    model = MODELS[name]
    pte, _ = executorch_pte(name)
    inputs = list(model.inputs())
    module = model.module()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.pte"
        path.write_bytes(pte)
        start = time.perf_counter()
        program = load(path)
        load_ms = (time.perf_counter() - start) * 1e3
        exirc_s = median_time(lambda: program.run("forward", inputs))
    row: Row = {"bench": "runtime.model", "model": name, "load_ms": load_ms}
    return against_references(row, exirc_s, module, inputs, pte)


def compiled_latency(name: str) -> Row:
    """A zoo model compiled by exirc (both targets), run by exirc, ExecuTorch and eager."""
    from exirc.compiler import CompileOptions, compile_module
    from tests.models.zoo import ZOO

    model = ZOO[name]
    module, inputs = model.module(), list(model.inputs())
    portable = compile_module(module, tuple(inputs)).data
    fused = compile_module(module, tuple(inputs), options=CompileOptions(target="exirc")).data
    exirc_s = median_time(functools.partial(load(portable).run, "forward", inputs))
    fused_s = median_time(functools.partial(load(fused).run, "forward", inputs))
    row: Row = {"bench": "runtime.compiled", "model": name, "exirc_target_ms": fused_s * 1e3}
    return against_references(row, exirc_s, module, inputs, portable)


def _print(row: Row) -> None:
    if row["bench"] == "runtime.per_instruction":
        print(f"chain of {row['instructions']} aten::add.out: {row['us_per_instruction']:.2f} us "
              f"per instruction; direct calls {row['direct_call_us']:.2f} us; interpreter "
              f"overhead {row['overhead_us']:.2f} us per instruction")
        print(f"{'model':<14}{'exirc ms':>10}{'eager ms':>10}{'ET ms':>10}"
              f"{'vs eager':>10}{'vs ET':>8}{'load ms':>9}")
        return
    et = row.get("executorch_ms")
    print(f"{row['model']:<14}{row['exirc_ms']:>10.3f}{row['eager_ms']:>10.3f}"
          f"{et if et is None else format(et, '.3f'):>10}{row['exirc_vs_eager']:>9.2f}x"
          f"{row.get('exirc_vs_executorch', float('nan')):>7.2f}x"
          f"{row.get('load_ms', float('nan')):>9.2f}")


if __name__ == "__main__":
    run(_print)
