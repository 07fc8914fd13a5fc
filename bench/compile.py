"""Compiling the zoo: exirc against ExecuTorch's `to_edge().to_executorch()`.

Per zoo model (`tests/models/zoo.py`): the wall time of one compile from the
eval-mode module to `.pte` bytes (`torch.export` included on both sides),
the size of the file, and the planned memory ("arena": the bytes of all
non-constant buffers the program asks its runtime for), with exirc's lower
bound on that arena (the most bytes live at any one moment) beside them.

Compiles take seconds, so each is timed once; one small model is compiled
by both first, so that one-time import and initialisation costs are not
charged to the first row. A model exirc cannot compile yet gets a row with
its error instead of numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from bench.common import ratio
from exirc.serialize import deserialize
from tests.models.zoo import ZOO, ZooModel
from tests.oracle import HAVE_EXECUTORCH

T = TypeVar("T")

WARM_UP_MODEL = "mlp"


def run() -> list[dict[str, Any]]:
    if not HAVE_EXECUTORCH:
        return [{"note": "ExecuTorch not installed: nothing to compare against"}]
    warm_up = ZOO[WARM_UP_MODEL]
    exirc_compile(warm_up)
    executorch_compile(warm_up)

    rows = []
    for model in ZOO.values():
        if model.available:
            rows.append(_row(model))
    rows.append(_total(rows))
    return rows


def exirc_compile(model: ZooModel) -> tuple[bytes, int, int]:
    """exirc: the `.pte` bytes, the arena bytes and their lower bound."""
    from exirc.compiler import CompileOptions, compile_module

    dynamic_shapes = model.dynamic_shapes() if model.dynamic_shapes else None
    result = compile_module(
        model.module(), model.inputs(), dynamic_shapes=dynamic_shapes,
        options=CompileOptions(target="portable"),
    )
    return result.data, result.report.arena_bytes, result.report.lower_bound_bytes


def executorch_compile(model: ZooModel) -> bytes:
    """ExecuTorch's default pipeline: the `.pte` bytes."""
    from executorch.exir import to_edge

    dynamic_shapes = model.dynamic_shapes() if model.dynamic_shapes else None
    exported = torch.export.export(
        model.module(), model.inputs(), dynamic_shapes=dynamic_shapes, strict=False
    )
    return bytes(to_edge(exported).to_executorch().buffer)


def arena_bytes(data: bytes) -> int:
    """Planned memory a program asks for: its non-constant buffers, all methods."""
    program = deserialize(data)
    return sum(sum(plan.non_const_buffer_sizes) for plan in program.execution_plan)


def _row(model: ZooModel) -> dict[str, Any]:
    theirs_s, theirs = _timed(lambda: executorch_compile(model))
    theirs_arena = arena_bytes(theirs)
    ours_s: float | None = None
    ours_bytes: int | None = None
    ours_arena: int | None = None
    lower_bound: int | None = None
    note = None
    try:
        ours_s, (ours, ours_arena, lower_bound) = _timed(lambda: exirc_compile(model))
        ours_bytes = len(ours)
    except Exception as error:  # a bench row, not a test: report and go on
        note = f"exirc: {type(error).__name__}: {error}"[:60]
    row = {
        "model": model.name,
        "exirc compile s": ours_s,
        "ET compile s": theirs_s,
        "compile ratio": ratio(ours_s, theirs_s),
        "exirc pte B": ours_bytes,
        "ET pte B": len(theirs),
        "pte ratio": ratio(ours_bytes, len(theirs)),
        "exirc arena B": ours_arena,
        "ET arena B": theirs_arena,
        "arena ratio": ratio(ours_arena, theirs_arena),
        "lower bound B": lower_bound,
    }
    if note:
        row["note"] = note
    return row


def _total(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Sums over the models both compiled; ratios of the sums."""
    both = [row for row in rows if "note" not in row]
    total: dict[str, Any] = {"model": f"total ({len(both)} of {len(rows)})"}
    for column in ("exirc compile s", "ET compile s", "exirc pte B", "ET pte B",
                   "exirc arena B", "ET arena B", "lower bound B"):
        total[column] = sum(row[column] for row in both)
    total["compile ratio"] = ratio(total["exirc compile s"], total["ET compile s"])
    total["pte ratio"] = ratio(total["exirc pte B"], total["ET pte B"])
    total["arena ratio"] = ratio(total["exirc arena B"], total["ET arena B"])
    return total


def _timed(fn: Callable[[], T]) -> tuple[float, T]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value
