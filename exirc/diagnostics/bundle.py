"""Bundled test cases: making them from tensors, and checking a program against them.

`exirc compile --bundle` stores, per method, the inputs it was verified on
and eager PyTorch's outputs for them; `exirc run --check` runs them again
and compares. The cases live in a named-data segment of the program, whose
format is `exirc.serialize.bundled_cases` (which `exirc inspect` reads
without torch); this module turns tensors into bundled values and back, and
runs the checks.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from exirc.diagnostics.compare import Difference, Tolerance, compare, describe_failures, worst
from exirc.errors import FormatError, UsageError
from exirc.serialize.bundled_cases import (
    ITEMSIZE,
    SEGMENT_FIELD,
    Bundle,
    BundledCase,
    BundledTensor,
    BundledValue,
    read_bundle,
)

if TYPE_CHECKING:
    from exirc.runtime.core.loader import LoadedProgram


# ---------------------------------------------------------------------------
# Tensors <-> bundled values.
# ---------------------------------------------------------------------------


def from_torch(value: Any) -> BundledValue:
    """A tensor or a scalar, as the bundle stores it."""
    if isinstance(value, (bool, int, float)):
        return value
    if not isinstance(value, torch.Tensor):
        raise UsageError(f"cannot bundle a {type(value).__name__}; inputs and outputs must be "
                         "tensors or numbers")
    if sys.byteorder != "little":
        raise UsageError("bundling test cases needs a little-endian host")
    dtype = str(value.dtype).removeprefix("torch.")
    if dtype not in ITEMSIZE:
        raise UsageError(f"cannot bundle a tensor of dtype {dtype}")
    tensor = value.detach().cpu().contiguous().reshape(-1)
    data = tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
    return BundledTensor(dtype, tuple(value.shape), data)


def to_torch(value: BundledValue) -> Any:
    """A bundled value as a tensor (a copy) or a number."""
    if not isinstance(value, BundledTensor):
        return value
    dtype = getattr(torch, value.dtype)
    if not value.data:
        return torch.empty(value.shape, dtype=dtype)
    raw = torch.frombuffer(bytearray(value.data), dtype=torch.uint8)
    return raw.view(dtype).reshape(value.shape)


def make_bundle(cases: Sequence[tuple[str, Sequence[Any], Sequence[Any | None], int]],
                rtol: float, atol: float) -> Bundle:
    """A bundle of (method, inputs, expected outputs, call) cases of tensors and numbers."""
    return Bundle(tuple(BundledCase(method, tuple(from_torch(v) for v in inputs),
                                    tuple(None if v is None else from_torch(v) for v in outputs),
                                    call)
                        for method, inputs, outputs, call in cases), rtol, atol)


# ---------------------------------------------------------------------------
# `exirc run --check`.
# ---------------------------------------------------------------------------


@dataclass
class CheckedCase:
    method: str
    number: int
    differences: list[tuple[int, Difference]]  # (output, comparison) of the checked outputs
    problem: str = ""
    call: int = 0  # of consecutive calls on a method with state

    @property
    def ok(self) -> bool:
        return not self.problem and all(d.ok for _, d in self.differences)

    @property
    def label(self) -> str:
        label = f"{self.method} case {self.number}"
        return f"{label} (call {self.call + 1} in a row)" if self.call else label

    def line(self) -> str:
        """`forward case 0: pass (max abs error 0)`, or FAIL and what differs."""
        if self.ok:
            error = worst([d for _, d in self.differences])
            return f"{self.label}: pass ({len(self.differences)} output"\
                   f"{'' if len(self.differences) == 1 else 's'}, max abs error {error:.3g})"
        return f"{self.label}: FAIL: " + "; ".join(self.failures())

    def failures(self) -> list[str]:
        return describe_failures(self.problem, self.differences)


def check_bundled(program: LoadedProgram, method: str | None = None,
                  bundle: Bundle | None = None) -> tuple[Bundle, list[CheckedCase]]:
    """Run every bundled case (of `method`, if given) and compare its outputs."""
    bundle = bundle if bundle is not None else read_bundle(program.program)
    if bundle is None or not bundle.cases:
        raise UsageError("the program has no bundled test cases",
                         hint="compile it with `exirc compile MODEL --bundle` to store its "
                              "inputs and expected outputs in the file")
    tolerance = Tolerance(bundle.rtol, bundle.atol)
    results = []
    for number, case in bundle.numbered():
        if method is not None and case.method != method:
            continue
        if case.method not in program.methods:
            raise FormatError(f"bundled {case.method} case {number} is for a method the "
                              f"program does not have (methods: {', '.join(program.methods)})",
                              field=SEGMENT_FIELD)
        runner = program.method(case.method)
        if case.call == 0:
            runner.reset_state()  # a sequence of calls starts from the initial state
        got = runner.run([to_torch(v) for v in case.inputs])
        checked = CheckedCase(case.method, number, [], call=case.call)
        if len(got) != len(case.outputs):
            checked.problem = (f"the program returns {len(got)} outputs, the case expects "
                               f"{len(case.outputs)}")
        else:
            checked.differences = [(i, compare(g, to_torch(want), tolerance))
                                   for i, (g, want) in enumerate(zip(got, case.outputs))
                                   if want is not None]
        results.append(checked)
    if method is not None and not results:
        raise UsageError(f"no bundled test cases for method {method!r} (cases for: "
                         f"{', '.join(bundle.counts())})")
    return bundle, results
