"""What a compile returns: the program, its bytes, and the report of the compile.

`CompileResult.save` writes the program, and with external weights the data
file beside it, each atomically; `exirc.compiler` makes these.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from exirc.errors import UsageError
from exirc.passes.runner import Instrumentation
from exirc.serialize import program as P
from exirc.serialize.files import write_atomically

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from exirc.backend.delegation.report import DelegationReport
    from exirc.diagnostics.eager_check import VerificationReport
    from exirc.diagnostics.quantization import QuantizationReport


class StageTimes(dict[str, float]):
    """Stage name -> seconds, telling `listener` of every time recorded: the
    pipeline runner and the self-check record theirs here, so one place sees all."""

    def __init__(self, listener: Callable[[str, float], None] | None = None) -> None:
        super().__init__()
        self.listener = listener

    def __setitem__(self, stage: str, seconds: float) -> None:
        super().__setitem__(stage, seconds)
        if self.listener is not None:
            self.listener(stage, seconds)


@dataclass
class CompileReport:
    stage_seconds: dict[str, float] = field(default_factory=StageTimes)
    instructions: int = 0
    kernel_calls: int = 0
    arena_bytes: int = 0
    lower_bound_bytes: int = 0
    constant_bytes: int = 0
    state_bytes: int = 0  # program state: the shared arena of buffers the model updates
    file_bytes: int = 0
    instrument: Instrumentation | None = None

    @property
    def total_seconds(self) -> float:
        return sum(self.stage_seconds.values())


@dataclass
class CompileResult:
    program: P.Program
    data: bytes
    report: CompileReport
    # The memory-planned graphs the program was emitted from, and per method
    # the node each instruction was made for: what diagnostics map back to.
    planned: dict[str, ExportedProgram] = field(default_factory=dict)
    instruction_nodes: dict[str, list[torch.fx.Node]] = field(default_factory=dict)
    verification: VerificationReport | None = None  # with options.verify: what matched
    bundled_cases: int = 0  # with options.bundle: test cases stored in the program
    quantization: QuantizationReport | None = None  # with options.quantize: sizes, accuracy
    # With options.quantize, per method: the quantized model as torch runs it (what
    # --verify compares with); and every warning, as told to `warn`.
    quantized_modules: dict[str, torch.nn.Module] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # With external weights: the data file's bytes, and where the options said it goes.
    external_data: bytes | None = None
    external_path: str | Path | None = None

    def save(self, path: str | Path, data_path: str | Path | None = None) -> None:
        """Write the program atomically (never a partial file), with the user's umask;
        with external weights, the data file first (to `data_path`, default the
        `external_weights` option), so a program never appears without its data.
        If the program cannot be written, the data file just written is removed."""
        if self.external_data is None:
            write_atomically(path, self.data)
            return
        target = data_path if data_path is not None else self.external_path
        if target is None:
            raise UsageError("the program's weights are external: give the data file's path",
                             hint="save(path, data_path=...), or compile with external_weights=")
        write_atomically(target, self.external_data)
        try:
            write_atomically(path, self.data)
        except BaseException:
            os.unlink(target)
            raise

    @property
    def delegation(self) -> dict[str, DelegationReport]:
        """Per method that ran a delegate pass, what it delegated and what not."""
        from exirc.ir.meta import delegation_report

        reports = {name: delegation_report(p.graph_module) for name, p in self.planned.items()}
        return {name: report for name, report in reports.items() if report is not None}
