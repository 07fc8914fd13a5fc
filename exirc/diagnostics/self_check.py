"""`--verify` and `--bundle`: eager references taken before the pipeline runs,
then the program checked against them and stored with them.

The compiler calls these in order: `check_options` before anything runs,
`eager_references` right after capture (and quantization), and
`verify_and_bundle` on the compiled result.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from exirc.diagnostics.load_check import refused_by_own_loader
from exirc.diagnostics.tolerance import DEFAULT_ATOL, DEFAULT_RTOL
from exirc.errors import FormatError, UsageError

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from exirc.capture import MethodSource
    from exirc.compiler import CompileOptions, CompileResult
    from exirc.diagnostics.reference import Reference
    from exirc.runtime.kernels.registry import KernelRegistry


def check_options(options: CompileOptions) -> None:
    """UsageError for options that only apply with others, or out of range."""
    if (options.calibration_inputs or options.quantize_group_size) and not options.quantize:
        raise UsageError("calibration inputs and a group size apply to --quantize",
                         hint="add --quantize int8 (or a weight-only mode)")
    if options.quantize_embeddings not in (None, "none") \
            and options.quantize not in ("int8", "8da4w", "8da8w"):
        raise UsageError("--quantize-embeddings applies to --quantize int8, 8da4w and 8da8w",
                         hint="the weight-only modes quantize embeddings already")
    if options.verify_inputs and not (options.self_check or options.quantize):
        raise UsageError("verification inputs apply to --verify, --bundle and --quantize",
                         hint="add --verify (or --bundle to store them in the program)")
    if options.min_sqnr_db is not None:
        if not options.quantize:
            raise UsageError("a minimum SQNR applies to --quantize",
                             hint="add --quantize MODE, or drop --min-sqnr")
        if math.isnan(options.min_sqnr_db):
            raise UsageError("the minimum SQNR must be a number of dB, not NaN")
    rtol = DEFAULT_RTOL if options.rtol is None else options.rtol
    atol = DEFAULT_ATOL if options.atol is None else options.atol
    if not (rtol >= 0 and atol >= 0):
        raise UsageError(f"tolerances must be >= 0, got rtol {rtol}, atol {atol}")


def eager_references(sources: dict[str, MethodSource], exported: dict[str, ExportedProgram],
                     options: CompileOptions) -> dict[str, Reference] | None:
    """Eager outputs for verifying or bundling, computed before any pass runs (a
    pass may rewrite the captured graphs, and the weights they share, in place).

    A method with program state is called several times in a row, so a
    program that loses an update cannot pass."""
    if not options.self_check:
        return None
    from exirc.diagnostics.reference import STATEFUL_CALLS, prepare
    from exirc.ir.state import is_stateful, plan_state

    plan_state(exported)
    calls = {name: STATEFUL_CALLS for name, program in exported.items() if is_stateful(program)}
    return prepare(sources, options.verify_inputs, calls=calls)


def verify_and_bundle(result: CompileResult, references: dict[str, Reference],
                      options: CompileOptions, kernels: KernelRegistry | None) -> None:
    """Verify first (a mismatch raises, so nothing is bundled or written), then bundle.

    The interpreter must have the kernels of backend ops bound to patterns
    (`exirc.compiler.install_backend_kernels`, which the compiler calls first)."""
    from exirc.diagnostics.eager_check import bundle_references, verify_result
    from exirc.diagnostics.tolerance import Tolerance
    from exirc.serialize.bundled_cases import write_bundle
    from exirc.serialize.writer import serialize

    tolerance = Tolerance(options.rtol, options.atol)
    stages = result.report.stage_seconds
    if options.verify:
        started = time.perf_counter()
        try:
            result.verification = verify_result(result, references, tolerance=tolerance,
                                                kernels=kernels)
        except FormatError as error:  # only if the load check let it through
            raise refused_by_own_loader(error) from error
        stages["verify"] = time.perf_counter() - started
        result.verification.raise_if_failed()
    if options.bundle:
        started = time.perf_counter()
        bundle = bundle_references(result, references, tolerance)
        write_bundle(result.program, bundle)
        result.data = serialize(result.program)
        result.report.file_bytes = len(result.data)
        result.bundled_cases = len(bundle.cases)
        stages["bundle"] = time.perf_counter() - started
