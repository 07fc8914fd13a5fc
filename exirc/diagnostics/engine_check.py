"""Does the engine `exirc run` would use here compute what the reference does?

`--verify` checks the program on the reference interpreter against eager
PyTorch (a mismatch there is the compiler's, localized to a pass). Then, where
an optional engine would run the program (`exirc.runtime.engines`: the default
policy, or EXIRC_ENGINE), the same cases run on it and each output is compared
with the reference's: a mismatch there is the engine's, and the error names
it, not a pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from exirc.diagnostics.compare import Tolerance, compare, describe_failures
from exirc.errors import ExircError

if TYPE_CHECKING:
    from exirc.diagnostics.reference import Reference
    from exirc.runtime.core.loader import LoadedProgram
    from exirc.runtime.kernels.registry import KernelRegistry


def engine_mismatch(data: bytes, references: dict[str, Reference],
                    outputs: Mapping[str, Sequence[int]], tolerance: Tolerance,
                    kernels: KernelRegistry, max_steps: int,
                    external_data: bytes | None = None) -> str | None:
    """Why the engines' run of the program differs from the reference's, or None
    (also when no engine would run any of it). `outputs`: per method, the
    positions of the outputs the model returns."""
    from exirc.runtime import load

    accelerated = load(data, data=external_data, kernels=kernels, max_steps=max_steps)
    if not any(_uses_engine(accelerated, name) for name in references):
        return None
    reference = load(data, data=external_data, kernels=kernels, max_steps=max_steps,
                     engine="reference")
    for name, cases in references.items():
        if not _uses_engine(accelerated, name):
            continue
        for case in cases.cases:
            if case.call == 0:
                reference.method(name).reset_state()
                accelerated.method(name).reset_state()
            want = reference.method(name).run(case.inputs)
            try:
                got = accelerated.method(name).run(case.inputs)
            except ExircError as error:
                return (f"{_engines(accelerated, name)} fails on {case.label} where the "
                        f"reference interpreter does not: {error.message}")
            differences = [(p, compare(got[p], want[p], tolerance)) for p in outputs[name]]
            failures = describe_failures("", differences)
            if failures:
                lines = [f"{case.label} differs between the reference interpreter and "
                         f"{_engines(accelerated, name)}, which `exirc run` uses here "
                         f"({tolerance.describe([])}); the program itself matches eager "
                         "PyTorch on the reference"]
                return "\n".join(lines + [f"    {failure}" for failure in failures])
    return None


def _uses_engine(program: LoadedProgram, method: str) -> bool:
    loaded = program.method(method)
    return loaded.engine != "reference" or any(
        not engine.startswith("reference") for engine in loaded.delegate_engines)


def _engines(program: LoadedProgram, method: str) -> str:
    """`the litert engine (method 'forward')`, or its delegates' engines."""
    loaded = program.method(method)
    if loaded.engine != "reference":
        return f"the {loaded.engine} engine (method {method!r}: {loaded.execution})"
    used = sorted({e.split(" ")[0] for e in loaded.delegate_engines} - {"reference"})
    return f"the {', '.join(used)} engine (method {method!r}'s delegates)"
