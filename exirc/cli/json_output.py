"""`--json` for `compile` and `run`, and the JSON error object of every `--json`.

Each document is versioned as `inspect --json` is: `"format"` names it
(`exirc.compile`, `exirc.run`, `exirc.error`) and `"format_version"` is
bumped when a key is renamed or removed; keys may be added within a version.
Numbers that JSON cannot hold (NaN, infinities) are written as strings.
"""

from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING, Any

from exirc.errors import ExircError

if TYPE_CHECKING:
    from exirc.compiler import CompileResult

FORMAT_VERSION = 1


def document(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """`body` headed by its format name (`exirc.KIND`) and version."""
    return {"format": f"exirc.{kind}", "format_version": FORMAT_VERSION, **body}


def write_document(kind: str, body: dict[str, Any]) -> None:
    """The versioned document as indented JSON on stdout, newline-terminated."""
    sys.stdout.write(json.dumps(_finite(document(kind, body)), indent=2) + "\n")
    sys.stdout.flush()


def error_document(error: ExircError) -> dict[str, Any]:
    """What `--json` prints on stdout when a command fails."""
    return document("error", {"error": {"code": error.code, "message": error.message,
                                        "hint": error.hint, "exit_code": error.exit_code}})


def compile_body(result: CompileResult, output: str) -> dict[str, Any]:
    """What `exirc compile --json` reports: the file, its parts, the plan, the stages."""
    report = result.report
    program = result.program
    from exirc.cli.compile_memory import working_arenas

    constant = program.constant_segment.segment_index \
        if program.constant_segment is not None else None
    verification = result.verification
    return {
        "output": output,
        "file_size": report.file_bytes,
        "segments": [{"index": i, "size": len(segment.data),
                      "role": "constants" if i == constant else "data"}
                     for i, segment in enumerate(program.segments)],
        "instructions": report.instructions,
        "kernel_calls": report.kernel_calls,
        "arena_bytes": report.arena_bytes,
        "arena_lower_bound_bytes": report.lower_bound_bytes,
        # per method, what `inspect --show memory` reports (arena_bytes sums methods)
        "arenas": working_arenas(program),
        "constant_bytes": report.constant_bytes,
        "state_bytes": report.state_bytes,
        "stage_seconds": dict(report.stage_seconds),
        "total_seconds": report.total_seconds,
        "methods": [plan.name for plan in program.execution_plan],
        "bundled_cases": result.bundled_cases,
        # with --external-weights: the data file the weights went to (null otherwise)
        "external_data": None if result.external_data is None else {
            "path": str(result.external_path), "size": len(result.external_data)},
        # with --quantize: sizes, accuracy per output, and its warnings (also in
        # "warnings", every warning the compile gave)
        "quantization": None if result.quantization is None else result.quantization.to_json(),
        "warnings": list(result.warnings),
        "verification": None if verification is None else {
            "ok": verification.ok, "outputs_compared": verification.outputs_compared,
            "max_abs_error": verification.max_abs, "summary": verification.summary()},
    }


def output_facts(index: int, value: Any, name: str | None = None) -> dict[str, Any]:
    """One output of `exirc run --json`: name, index, and for a tensor its shape,
    dtype and min/max/mean (null when empty or opaque); a number as its value."""
    import torch

    from exirc.runtime.core.arenas import SCALAR_TYPES

    facts: dict[str, Any] = {"index": index, "name": name or f"output_{index}"}
    if not isinstance(value, torch.Tensor):
        facts["kind"] = "none" if value is None else type(value).__name__
        facts["value"] = value if isinstance(value, (bool, int, float, str)) else None
        return facts
    dtype = SCALAR_TYPES[value.dtype].short_name if value.dtype in SCALAR_TYPES \
        else str(value.dtype).removeprefix("torch.")
    facts.update(kind="tensor", dtype=dtype, shape=list(value.shape),
                 min=None, max=None, mean=None)
    if value.numel():
        try:
            numbers = value.detach().reshape(-1).to(torch.float64)
        except (NotImplementedError, RuntimeError):  # opaque element types (bits16)
            return facts
        facts.update(min=numbers.min().item(), max=numbers.max().item(),
                     mean=numbers.mean().item())
    return facts


def _finite(value: Any) -> Any:
    """`value` with NaN and infinities as strings ("nan", "inf", "-inf")."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value
