"""Running a pipeline on one method: passes, verifiers and instrumentation.

Instrumentation is what a compiler engineer asks for when a pass misbehaves:
the graph after every pass (`--print-ir-after-all`, `--dump-dir`) and a
table of pass timings (`--time-passes`).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from exirc.errors import ExircError, InternalError, PluginError
from exirc.passes.contract import FunctionPass, Pass, PassResult, pass_label
from exirc.passes.pipeline import STAGES, Pipeline

if TYPE_CHECKING:
    from torch.export import ExportedProgram

Verifier = Callable[["ExportedProgram"], None]


@dataclass
class PassRecord:
    method: str
    stage: str
    name: str
    seconds: float
    changed: bool
    nodes: int


@dataclass
class Instrumentation:
    print_ir_after_all: bool = False
    dump_dir: Path | None = None
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    records: list[PassRecord] = field(default_factory=list)

    def after_pass(self, record: PassRecord, program: ExportedProgram) -> None:
        self.records.append(record)
        if not (self.print_ir_after_all or self.dump_dir):
            return
        text = program.graph_module.print_readable(print_output=False)
        header = f"# after {record.stage}/{record.name} ({record.method})"
        if self.print_ir_after_all:
            print(f"{header}\n{text}", file=self.stream)
        if self.dump_dir is not None:
            self.dump_dir.mkdir(parents=True, exist_ok=True)
            index = len(self.records)
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", record.name)
            path = self.dump_dir / f"{record.method}.{index:02d}.{record.stage}.{safe}.txt"
            path.write_text(f"{header}\n{text}")

    def timing_table(self) -> str:
        total = sum(r.seconds for r in self.records) or 1e-9
        lines = [f"{'method':<10} {'stage':<8} {'pass':<28} {'ms':>9} {'share':>6} "
                 f"{'nodes':>6} changed"]
        for r in self.records:
            lines.append(f"{r.method:<10} {r.stage:<8} {r.name:<28} {r.seconds * 1e3:>9.2f} "
                         f"{100 * r.seconds / total:>5.1f}% {r.nodes:>6} "
                         f"{'yes' if r.changed else 'no'}")
        lines.append(f"{'':<10} {'total':<8} {'':<28} {total * 1e3:>9.2f}")
        return "\n".join(lines)


def _node_count(program: ExportedProgram) -> int:
    return len(program.graph_module.graph.nodes)


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
    for stage in STAGES:
        started = time.perf_counter()
        for p in pipeline.stages.get(stage, []):
            t0 = time.perf_counter()
            result = run_pass(p, program)
            program = result.program
            instrument.after_pass(
                PassRecord(method, stage, pass_label(p), time.perf_counter() - t0,
                           result.changed, _node_count(program)), program)
        verify = verifiers.get(stage)
        if verify is not None:
            verify(program)
        stage_seconds[stage] = stage_seconds.get(stage, 0.0) + time.perf_counter() - started
    return program
