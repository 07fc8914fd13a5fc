"""Self-verifying compiles: does the program compute what eager PyTorch does?

    references = reference.prepare(loaded.methods)       # eager outputs, before compiling
    result = compile_methods(...)
    report = verify_result(result, references)           # run the program on each case
    report.raise_if_failed()                             # VerificationError (exit 5)

Each case's inputs go through exirc's interpreter (on the serialized bytes,
as `exirc run` would load them); every output is compared with the eager
one (`exirc.diagnostics.compare`). For the first failing case of a method,
`exirc.diagnostics.localize` finds the first instruction whose result
diverges and names its op, node, source line and module.

`kernels` replaces the interpreter's kernel registry, so a test can inject a
wrong kernel and check that verification finds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.export.graph_signature import OutputKind

from exirc.diagnostics.bundle import make_bundle
from exirc.diagnostics.compare import (
    Difference,
    Tolerance,
    compare,
    describe_failures,
    float_dtypes,
    worst,
)
from exirc.diagnostics.divergence import PLANNED, Divergence, describe_failure
from exirc.diagnostics.engine_check import engine_mismatch
from exirc.diagnostics.localize import first_divergence
from exirc.diagnostics.reference import Reference, ReferenceCase, prepare
from exirc.diagnostics.tolerance import DEFAULT_TOLERANCE
from exirc.errors import InputError, VerificationError
from exirc.runtime.core.method import DEFAULT_MAX_STEPS
from exirc.runtime.errors import ExecutionError
from exirc.runtime.kernels.registry import KERNELS, KernelRegistry
from exirc.serialize.bundled_cases import Bundle

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.fx import GraphModule

    from exirc.capture import MethodSource
    from exirc.compiler import CompileResult
    from exirc.runtime.core.loader import LoadedProgram

__all__ = ["CaseResult", "Tolerance", "VerificationReport", "bundle_references", "prepare",
           "user_outputs", "verify_compiled", "verify_result"]


@dataclass
class CaseResult:
    """One case of one method: each output's comparison, and where it went wrong."""

    case: ReferenceCase
    outputs: list[tuple[int, Difference]] = field(default_factory=list)  # (program output, ...)
    problem: str = ""  # a mismatch of the outputs as a whole (their number)
    divergence: Divergence | None = None
    localization_note: str = ""  # why there is no divergence to show, if there is not

    @property
    def ok(self) -> bool:
        return not self.problem and all(d.ok for _, d in self.outputs)

    @property
    def max_abs(self) -> float:
        return worst([d for _, d in self.outputs])

    def failures(self) -> list[str]:
        """`output_0: max abs error ...` per output that differs."""
        return describe_failures(self.problem, self.outputs)


@dataclass
class VerificationReport:
    tolerance: Tolerance
    cases: list[CaseResult] = field(default_factory=list)
    # Where the reference matches eager but an engine `exirc run` would use does not.
    engine_problem: str | None = None

    @property
    def ok(self) -> bool:
        return all(case.ok for case in self.cases) and self.engine_problem is None

    @property
    def outputs_compared(self) -> int:
        return sum(len(case.outputs) for case in self.cases)

    @property
    def max_abs(self) -> float:
        return max((case.max_abs for case in self.cases), default=0.0)

    def summary(self) -> str:
        """`3 outputs in 2 cases match eager (max abs error 1.2e-07)`."""
        count = self.outputs_compared
        cases = len(self.cases)
        where = f" in {cases} cases" if cases > 1 else ""
        verb = "matches" if count == 1 else "match"
        return (f"{count} output{'' if count == 1 else 's'}{where} {verb} eager PyTorch "
                f"(max abs error {self.max_abs:.3g}; {self.tolerance.describe(self._dtypes())})")

    def _dtypes(self, cases: Sequence[CaseResult] | None = None) -> list[str]:
        """The floating-point dtypes of the outputs compared, which set the tolerance."""
        return float_dtypes(c.case.expected for c in (self.cases if cases is None else cases))

    def failure_message(self) -> str:
        """What differs, and for each failing method where it starts diverging."""
        failed = [case for case in self.cases if not case.ok]
        if not failed and self.engine_problem is not None:
            return self.engine_problem
        lines = []
        for case in failed:
            label = case.case.label if len(self.cases) > 1 else f"method {case.case.method!r}"
            origin = case.case.origin
            lines.append(f"{label} differs from eager PyTorch on "
                         f"{'the ' if origin == 'example inputs' else ''}{origin} "
                         f"({self.tolerance.describe(self._dtypes([case]))})")
            lines.extend(f"    {failure}" for failure in case.failures())
            if case.divergence is not None:
                lines.extend(f"    {line}" for line in case.divergence.lines())
            elif case.localization_note:
                lines.append(f"    {case.localization_note}")
        return "\n".join(lines)

    def hint(self) -> str | None:
        if self.engine_problem is not None and all(case.ok for case in self.cases):
            return ("the optional engine is wrong, not the program: run it on the reference "
                    "interpreter (`exirc run --engine reference`, EXIRC_ENGINE=reference) "
                    "and report the engine's mismatch")
        divergence = next((c.divergence for c in self.cases if c.divergence is not None), None)
        if divergence is None:
            return None  # VerificationError's default
        if divergence.against == PLANNED:
            return (f"instruction {divergence.instruction} ({divergence.op}) computes something "
                    "else than torch's kernel on the same inputs: check the kernel registered "
                    "for it (a plugin?) or the interpreter")
        return (f"a pass rewrote %{divergence.node} into something that computes another "
                "value: `exirc compile --print-ir-diff` shows which pass changed it")

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise VerificationError(self.failure_message(), hint=self.hint())


def verify_compiled(result: CompileResult, sources: dict[str, MethodSource], *,
                    input_files: Sequence[str | Path] = (),
                    tolerance: Tolerance = DEFAULT_TOLERANCE,
                    kernels: KernelRegistry | None = None,
                    max_steps: int = DEFAULT_MAX_STEPS) -> VerificationReport:
    """Verify `result` against the eager models of `sources` (as `load_model` gives
    them), on their example inputs or the `.npz` `input_files`."""
    return verify_result(result, prepare(sources, input_files), tolerance=tolerance,
                         kernels=kernels, max_steps=max_steps)


def verify_result(result: CompileResult, references: dict[str, Reference], *,
                  tolerance: Tolerance = DEFAULT_TOLERANCE,
                  kernels: KernelRegistry | None = None,
                  max_steps: int = DEFAULT_MAX_STEPS) -> VerificationReport:
    """Run every reference case through the program and compare (module docstring).

    `max_steps` bounds each run, as in `exirc run` (a wrong kernel can make a
    loop endless: that is a failing case, localized like the others)."""
    from exirc.runtime import load

    registry = kernels or KERNELS
    program = load(result.data, data=result.external_data, kernels=registry,
                   max_steps=max_steps, engine="reference")
    report = VerificationReport(tolerance)
    for name, reference in references.items():
        planned = result.planned[name]
        outputs = user_outputs(planned, len(program.method(name).output_values))
        localized = False
        for case in reference.cases:
            if case.call == 0:
                program.method(name).reset_state()
            checked = check_case(program, case, outputs, tolerance)
            if not checked.ok and not localized:
                localized = True
                if case.call == 0:
                    _localize(checked, program, planned, result.instruction_nodes.get(name, []),
                              reference, tolerance, registry)
                else:
                    checked.localization_note = (
                        f"(the calls before this one matched: the program's state after "
                        f"{case.call} call{'s' if case.call > 1 else ''} differs from the "
                        "model's buffers, so an update of a buffer is lost or applied wrongly)")
            report.cases.append(checked)
    if report.ok:
        positions = {name: user_outputs(result.planned[name],
                                        len(program.method(name).output_values))
                     for name in references}
        report.engine_problem = engine_mismatch(result.data, references, positions, tolerance,
                                                registry, max_steps, result.external_data)
    return report


def bundle_references(result: CompileResult, references: dict[str, Reference],
                      tolerance: Tolerance) -> Bundle:
    """The reference cases as a bundle: inputs, and eager outputs at the positions of
    the program's outputs that the model returns (the others are not checked)."""
    cases = []
    for name, reference in references.items():
        plan = result.program.method(name)
        positions = user_outputs(result.planned[name], len(plan.outputs))
        for case in reference.cases:
            if len(positions) != len(case.expected):
                raise VerificationError(
                    f"cannot bundle {case.label}: the program returns {len(positions)} "
                    f"outputs, eager PyTorch {len(case.expected)}",
                    hint="compile with --verify to see how the program differs")
            expected: list[Any] = [None] * len(plan.outputs)
            for position, value in zip(positions, case.expected):
                expected[position] = value
            cases.append((name, case.inputs, expected, case.call))
    # One tolerance for the bundle: the loosest its outputs' dtypes get by default.
    return make_bundle(cases, *tolerance.loosest(float_dtypes(c[2] for c in cases)))


def user_outputs(planned: ExportedProgram, count: int) -> list[int]:
    """The positions of the program's outputs that the model returns (not the
    updated buffers that precede them)."""
    specs = planned.graph_signature.output_specs
    if len(specs) != count:
        return list(range(count))
    return [i for i, spec in enumerate(specs) if spec.kind == OutputKind.USER_OUTPUT]


def check_case(program: LoadedProgram, case: ReferenceCase, outputs: Sequence[int],
               tolerance: Tolerance) -> CaseResult:
    """Run one case; compare the outputs at positions `outputs` with the expected ones.

    A run that fails (a kernel raising, a loop that does not end) where eager
    PyTorch succeeded is a mismatch too, localized like any other."""
    try:
        got = program.method(case.method).run(case.inputs)
    except InputError as error:
        raise InputError(f"{case.origin}: {error.message}",
                         hint="the program takes inputs of the shapes it was exported for "
                              "(a dynamic dim within its range)") from None
    except ExecutionError as error:
        return CaseResult(case, problem=f"the program fails where eager PyTorch does not: "
                                        f"{error.message}")
    return compare_outputs(case, got, list(outputs), case.expected, tolerance)


def compare_outputs(case: ReferenceCase, got: Sequence[Any], positions: list[int],
                    expected: Sequence[Any], tolerance: Tolerance) -> CaseResult:
    checked = CaseResult(case)
    if len(positions) != len(expected):
        checked.problem = (f"the program returns {len(positions)} outputs, eager PyTorch "
                           f"{len(expected)}")
        return checked
    for position, want in zip(positions, expected):
        checked.outputs.append((position, compare(got[position], want, tolerance)))
    return checked


def _localize(checked: CaseResult, program: LoadedProgram, planned: ExportedProgram,
              nodes: Sequence[Any], reference: Reference, tolerance: Tolerance,
              kernels: KernelRegistry) -> None:
    """Fill in `checked.divergence`; best effort: a failure to localize is a note."""
    if not nodes:
        checked.localization_note = "(no instruction map to localize the difference with)"
        return
    try:
        checked.divergence = first_divergence(
            program, checked.case.method, planned, nodes, checked.case.inputs, tolerance,
            kernels, captured=lambda: _captured_graph(reference))
    except Exception as error:  # noqa: BLE001 (the mismatch stands; only its location is lost)
        checked.localization_note = (f"(could not localize the difference: "
                                     f"{describe_failure(error)})")
        return
    if checked.divergence is None:
        checked.localization_note = (
            "every instruction agrees with the planned graph, and no node of it differs "
            "from the captured model under the same name: the difference is in how "
            "values flow between them (control flow, outputs)")


def _captured_graph(reference: Reference) -> GraphModule | None:
    """A fresh capture of the model, for naming the node a pass changed."""
    from exirc.capture import capture

    source = reference.source
    if source.exported is not None:
        # Possibly rewritten in place by the passes: the reference's own copy
        # (a .pt2 archive's graph, made before compiling) is the one to trust.
        module = reference.eager
        return module if isinstance(module, torch.fx.GraphModule) else None
    return capture(source).module()
