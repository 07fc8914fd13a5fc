"""Control flow and dynamic shapes: exirc against torch eager and ExecuTorch.

The programs are the models of `tests/control_flow/test_control_flow.py`
(cond, nested cond, map, cond in map, while_loop, cond in while_loop) and of
`tests/control_flow/test_dynamic_shapes.py` (bounded dynamic dims, some
under control flow), imported from there: models added there are measured
here too.

Per model, once: the wall time of one compile from the module to `.pte`
bytes (`torch.export` included on both sides), the size of the file and its
planned arena (the non-constant buffers, see `bench/compile.py`), for exirc
and for ExecuTorch's `to_edge().to_executorch()`. ExecuTorch refuses
`while_loop`: its columns say "n/a" there.

Per model and input size, the latency of one run: exirc's interpreter on
exirc's file (`exirc_ms`), torch eager (`eager_ms`), ExecuTorch's runtime
on exirc's file (`executorch_ms`: the while_loop programs run there too),
and ExecuTorch's runtime on ExecuTorch's own file (`et_own_ms`); "failed"
where ExecuTorch's runtime refuses a file at that size (the note says why).
Dynamic models are measured at size 1 and at their bound, one row each
("mlp@1", "mlp@64"); one file serves both sizes, so the compile columns are
on the first row only. Control-flow models run on their example inputs.

Ratios are exirc / reference (below 1: exirc is faster or smaller). Compiles
are timed once, after one untimed compile by each (one-time imports and
initialisation); latencies are `median_time` medians with torch on
`bench_threads()` threads, as in `bench/runtime.py`.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

from bench.common import Row, against_references, bench_threads, median_time, ratio
from bench.compile import arena_bytes
from exirc.compiler import compile_module
from exirc.runtime import load
from exirc.serialize import deserialize
from exirc.serialize import program as P
from tests.control_flow import test_control_flow, test_dynamic_shapes
from tests.oracle import HAVE_EXECUTORCH, load_with_executorch

NOT_AVAILABLE = "n/a"  # ExecuTorch cannot compile the model
FAILED = "failed"  # ExecuTorch's runtime refused the file at this size


@dataclass(frozen=True)
class Case:
    """One model of the tests, and the inputs it is timed on."""

    name: str
    build: Callable[[], torch.nn.Module]
    example: Callable[[], tuple[torch.Tensor, ...]]
    dynamic_shapes: Callable[[], Any] | None
    sizes: list[tuple[str, Callable[[], tuple[torch.Tensor, ...]]]]  # (row label, inputs)

    def module(self) -> torch.nn.Module:
        torch.manual_seed(0)  # as the tests build it
        return self.build().eval()

    def shapes(self) -> Any:
        return self.dynamic_shapes() if self.dynamic_shapes else None


def cases() -> list[Case]:
    """The tests' control-flow models, then their dynamic-shape models."""
    found = [Case(name, build, example, None, [(name, example)])
             for name, (build, example, _) in test_control_flow.MODELS.items()]
    makers = cast(dict[str, list[Callable[[int], tuple[torch.Tensor, ...]]]],
                  test_dynamic_shapes.SIZES)  # inferred there as a dict of objects
    for name, (build, example, shapes) in test_dynamic_shapes.MODELS.items():
        make = makers[name][0]  # the first of its input makers, given the size
        bound = _bound(shapes())
        found.append(Case(name, build, example, shapes,
                          [(f"{name}@{n}", _sized(make, n)) for n in (1, bound)]))
    return found


def run() -> list[Row]:
    if not HAVE_EXECUTORCH:
        return [{"note": "ExecuTorch not installed: nothing to compare against"}]
    all_cases = cases()
    warm_up = all_cases[0]  # one-time costs (imports, dynamo's first trace) charged to no row
    compile_module(warm_up.module(), warm_up.example(), dynamic_shapes=warm_up.shapes())
    _executorch_compile(warm_up)
    rows: list[Row] = []
    with bench_threads() as threads:
        for case in all_cases:
            rows += _rows(case, threads)
    return rows


def _rows(case: Case, threads: int) -> list[Row]:
    module = case.module()
    try:
        started = time.perf_counter()
        result = compile_module(module, case.example(), dynamic_shapes=case.shapes())
        ours_s = time.perf_counter() - started
    except Exception as error:  # a bench row, not a test: report and go on
        return [{"model": case.name, "note": _note("exirc", error)}]
    ours, ours_arena = result.data, result.report.arena_bytes
    compiled: Row = {"exirc_compile_s": ours_s, "et_compile_s": NOT_AVAILABLE,
                     "compile_ratio": None, "exirc_pte_b": len(ours),
                     "et_pte_b": NOT_AVAILABLE, "pte_ratio": None,
                     "exirc_arena_b": ours_arena, "et_arena_b": NOT_AVAILABLE,
                     "arena_ratio": None}
    note = None
    theirs_module = None
    try:
        started = time.perf_counter()
        theirs = _executorch_compile(case)
        theirs_s = time.perf_counter() - started
    except Exception as error:  # ExecuTorch refuses while_loop
        note = _note("ET", error)
    else:
        theirs_arena = arena_bytes(theirs)
        compiled.update({"et_compile_s": theirs_s, "compile_ratio": ratio(ours_s, theirs_s),
                         "et_pte_b": len(theirs), "pte_ratio": ratio(len(ours), len(theirs)),
                         "et_arena_b": theirs_arena,
                         "arena_ratio": ratio(ours_arena, theirs_arena)})
        theirs_module = load_with_executorch(theirs)
    program = load(ours)
    rows: list[Row] = []
    for label, make_inputs in case.sizes:
        torch.manual_seed(1)
        inputs = list(make_inputs())
        notes = [note] if note else []
        row: Row = {"model": label}
        row.update(compiled if not rows else dict.fromkeys(compiled))
        exirc_s = median_time(functools.partial(program.run, "forward", inputs))
        try:
            against_references(row, exirc_s, module, inputs, ours)
        except RuntimeError as error:  # ExecuTorch's runtime refused our file
            row.update({"executorch_ms": FAILED, "exirc_vs_executorch": None})
            notes.append(_note("ET runtime, our file", error))
        row.update({"et_own_ms": NOT_AVAILABLE, "exirc_vs_et_own": None})
        if theirs_module is not None:
            try:
                et_own_s = median_time(functools.partial(theirs_module.forward, inputs))
                row.update({"et_own_ms": et_own_s * 1e3, "exirc_vs_et_own": exirc_s / et_own_s})
            except RuntimeError as error:  # e.g. its file does not take this size
                row["et_own_ms"] = FAILED
                notes.append(_too_small(theirs, inputs) or _note("ET's own file", error))
        row["threads"] = threads
        if notes:
            row["note"] = "; ".join(notes)
        rows.append(row)
    return rows


def _executorch_compile(case: Case) -> bytes:
    """ExecuTorch's default pipeline: the `.pte` bytes."""
    from executorch.exir import to_edge  # type: ignore[import-untyped]

    exported = torch.export.export(case.module(), case.example(),
                                   dynamic_shapes=case.shapes(), strict=False)
    return bytes(to_edge(exported).to_executorch().buffer)


def _note(who: str, error: Exception) -> str:
    """`who: the first line of the error`, without the wrappers' boilerplate."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    message = lines[0]
    for boilerplate in ("Failed with error: ", "Failed to execute method forward, "):
        message = message.removeprefix(boilerplate)
    return f"{who}: {message}"[:60]


def _too_small(pte: bytes, inputs: list[torch.Tensor]) -> str | None:
    """Which input a file planned smaller than it is given, if one."""
    plan = deserialize(pte).execution_plan[0]
    for i, (index, given) in enumerate(zip(plan.inputs, inputs)):
        planned = plan.values[index]
        if isinstance(planned, P.Tensor) and given.numel() > math.prod(planned.sizes):
            return f"ET's own file plans input {i} at {planned.sizes} only"
    return None


def _bound(shapes: tuple[dict[int, Any] | None, ...]) -> int:
    """The upper bound of the first dynamic dim: the size the tests' `SIZES`
    makers take (their batch or sequence length)."""
    return int(next(dim for spec in shapes if spec for dim in spec.values()).max)


def _sized(make: Callable[[int], tuple[torch.Tensor, ...]], n: int,
           ) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: make(n)
