"""Running a pipeline on one method: each stage's passes in order, then its verifier.

What happens around each pass (printing, diffs, dumps, timings) is
`exirc.passes.instrument`'s; this module only runs passes and says who is to
blame when one fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from exirc.errors import ExircError, InternalError, PluginError
from exirc.passes.contract import FunctionPass, Pass, PassResult, pass_label
from exirc.passes.instrument import Instrumentation
from exirc.passes.pipeline import STAGES, Pipeline
from exirc.passes.record import PassRecord

if TYPE_CHECKING:
    from torch.export import ExportedProgram

Verifier = Callable[["ExportedProgram"], None]

__all__ = ["Instrumentation", "PassRecord", "Verifier", "run_pass", "run_pipeline"]


def _node_count(program: ExportedProgram) -> int:
    """Nodes of the graph and of its subgraphs (control-flow branches and bodies), as
    the graph text shows them."""
    from torch.fx import GraphModule

    return sum(len(module.graph.nodes) for module in program.graph_module.modules()
               if isinstance(module, GraphModule))


def _is_ours(p: Pass) -> bool:
    implementation = p.function if isinstance(p, FunctionPass) else type(p)
    return str(getattr(implementation, "__module__", "")).startswith("exirc.")


def run_pass(p: Pass, program: ExportedProgram) -> PassResult:
    try:
        result = p.run(program)
    except ExircError:
        raise
    except Exception as error:
        message = f"pass {pass_label(p)} failed: {type(error).__name__}: {error}"
        # A plugin's failure is its author's to fix, not a bug to report to us.
        if not _is_ours(p):
            raise PluginError(message, hint="the error is in your pass; rerun with --debug "
                                            "for its traceback") from error
        raise InternalError(message) from error
    if not isinstance(result, PassResult):
        raise InternalError(f"pass {pass_label(p)} returned {type(result).__name__}, "
                            "not a PassResult")
    return result


def run_pipeline(program: ExportedProgram, pipeline: Pipeline, *, method: str,
                 verifiers: dict[str, Verifier], instrument: Instrumentation,
                 stage_seconds: dict[str, float]) -> ExportedProgram:
    """Run every stage's passes in order; each stage's verifier after it."""
    instrument.begin_method(program, method)
    for stage in STAGES:
        started = time.perf_counter()
        for p in pipeline.stages.get(stage, []):
            nodes_before = _node_count(program)
            t0 = time.perf_counter()
            result = run_pass(p, program)
            program = result.program
            instrument.after_pass(
                PassRecord(method, stage, pass_label(p), time.perf_counter() - t0,
                           result.changed, _node_count(program), nodes_before), program)
        verify = verifiers.get(stage)
        if verify is not None:
            verify(program)
        stage_seconds[stage] = stage_seconds.get(stage, 0.0) + time.perf_counter() - started
    return program
