"""TorchScript loops whose trip count depends on the inputs compile to a real loop.

Each archive is scripted, saved, compiled through `compile_model` with its
example inputs in a .npz (as `exirc compile model.pt --example-inputs in.npz`
does), then run by exirc's interpreter for several trip counts, 0 and 1
included, and compared with the scripted module. The program must loop (a
backward JumpFalseCall), not hold one unrolled copy of the body per
iteration of the example inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy
import pytest
import torch

import exirc.serialize.program as P
from exirc.compiler import CompileResult, compile_model
from exirc.errors import ModelError, UnsupportedOperatorError
from exirc.runtime import load
from tests.capture.test_load import write
from tests.oracle import requires_executorch, run_with_executorch

# Scripting and saving test archives: torch 2.13 deprecates TorchScript.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


class WhileUpToN(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        i = 0
        while i < int(n):
            x = x * 2 + 1
            i += 1
        return x


class ForRangeUsingIndex(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        for i in range(int(n)):
            x = x * 0.5 + i
        return x


class BranchInLoop(torch.nn.Module):
    """prim::If inside prim::Loop; one branch passes x through, and an int is carried."""

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, int]:
        steps = 0
        for _ in range(int(n)):
            if x.sum() > 0:
                x = x - 1.5
                steps += 2
            else:
                steps += 1
        return x, steps


class WhileTensorCondition(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        while x.sum() < 100:
            x = x * 2 + 1
        return x


class LinearInLoop(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        for _ in range(int(n)):
            x = torch.tanh(self.linear(x)) + x
        return x


@dataclass(frozen=True)
class Case:
    module: type[torch.nn.Module]
    runs: list[tuple[torch.Tensor, ...]]  # the first is the example input


def _counted(*trip_counts: int) -> list[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(2, 3, generator=generator), torch.tensor(n)) for n in trip_counts]


# 2x3 tensors of one value, summing to 3 (four iterations), 120 (none), 60 (one).
_FILLED: list[tuple[torch.Tensor, ...]] = [
    (torch.full((2, 3), value),) for value in (0.5, 20.0, 10.0, 0.5)]

CASES = {
    "while-up-to-n": Case(WhileUpToN, _counted(3, 0, 1, 5)),
    "for-range-using-index": Case(ForRangeUsingIndex, _counted(3, 0, 1, 4)),
    "branch-in-loop": Case(BranchInLoop, _counted(3, 0, 1, 6)),
    "while-tensor-condition": Case(WhileTensorCondition, _FILLED),
    "linear-in-loop": Case(LinearInLoop, _counted(3, 0, 1, 7)),
}


def compile_archive(tmp_path: Path, scripted: torch.jit.ScriptModule,
                    example_inputs: tuple[torch.Tensor, ...]) -> CompileResult:
    """Save a scripted module, then compile the archive with inputs from a .npz."""
    archive = tmp_path / "model.pt"
    torch.jit.save(scripted, str(archive))
    inputs = tmp_path / "inputs.npz"
    numpy.savez(inputs, *(tensor.numpy() for tensor in example_inputs))
    return compile_model(str(archive), example_inputs_path=str(inputs))


def eager(scripted: torch.jit.ScriptModule, inputs: tuple[torch.Tensor, ...]
          ) -> list[torch.Tensor]:
    outputs = scripted(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return [torch.as_tensor(output) for output in outputs]


def assert_same(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(got) == len(expected)
    for ours, theirs in zip(got, expected):
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours.to(theirs.dtype), theirs)


def loops_back(program: P.Program) -> bool:
    """Whether the forward method has a JumpFalseCall to an earlier instruction."""
    (plan,) = program.execution_plan
    instructions = plan.chains[0].instructions
    return any(isinstance(instruction, P.JumpFalseCall)
               and instruction.destination_instruction <= index
               for index, instruction in enumerate(instructions))


@pytest.mark.parametrize("name", list(CASES))
def test_a_data_dependent_loop_runs_like_eager(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    scripted = torch.jit.script(case.module().eval())
    result = compile_archive(tmp_path, scripted, case.runs[0])
    assert loops_back(result.program), "the loop was unrolled"
    program = load(result.data)
    for inputs in case.runs:
        assert_same(program.run("forward", inputs), eager(scripted, inputs))


@requires_executorch
def test_executorch_runs_the_loop_like_eager(tmp_path: Path) -> None:
    scripted = torch.jit.script(LinearInLoop().eval())
    runs = CASES["linear-in-loop"].runs
    result = compile_archive(tmp_path, scripted, runs[0])
    for inputs in runs:
        assert_same(run_with_executorch(result.data, inputs), eager(scripted, inputs))


class ConstantTrips(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = x * 2
        return x


def test_a_constant_trip_loop_is_still_unrolled(tmp_path: Path) -> None:
    x = torch.randn(2, 3)
    result = compile_archive(tmp_path, torch.jit.script(ConstantTrips().eval()), (x,))
    assert not loops_back(result.program)
    assert_same(load(result.data).run("forward", (x,)), [x * 8])


class AddsRowCount(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        rows = x.size(0)
        for _ in range(int(n)):
            x = x + rows
        return x


def test_dynamic_shapes_reach_a_loop_body(tmp_path: Path) -> None:
    """A symbolic size read inside the loop stays symbolic, and inputs are named."""
    torch.jit.save(torch.jit.script(AddsRowCount().eval()), str(tmp_path / "rows.pt"))
    model = write(tmp_path, "model.py", """
    import os
    import torch

    model = torch.jit.load(os.path.join(os.path.dirname(__file__), "rows.pt"))
    example_inputs = (torch.zeros(4, 3), torch.tensor(2))
    dynamic_shapes = {"x": {0: torch.export.Dim("rows", min=1, max=64)}, "n": None}
    """)
    program = load(compile_model(str(model)).data)
    for rows, n in ((5, 2), (1, 0), (9, 3)):
        x = torch.zeros(rows, 3)
        assert_same(program.run("forward", (x, torch.tensor(n))), [x + rows * n])


# --------------------------------------------------------------------------- refused


class CountsCalls(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        for _ in range(int(n)):
            self.calls += 1
            x = x + 1
        return x


class Grows(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        for _ in range(int(n)):
            x = torch.cat([x, x])
        return x


def test_module_state_changed_in_a_loop_is_refused_at_its_line(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedOperatorError) as raised:
        compile_archive(tmp_path, torch.jit.script(CountsCalls().eval()), _counted(2)[0])
    message = str(raised.value)
    assert "model.pt: TorchScript prim::SetAttr assigns the module attribute 'calls'" in message
    assert "test_torchscript_loops.py:" in message  # the scripted source line


def test_a_carried_tensor_that_changes_shape_is_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError) as raised:
        compile_archive(tmp_path, torch.jit.script(Grows().eval()), _counted(2)[0])
    message = str(raised.value)
    assert "running TorchScript prim::Loop failed" in message
    assert "x = torch.cat([x, x])" in message or "for _ in range(int(n))" in message
    assert raised.value.hint is not None and "keep their shape and dtype" in raised.value.hint
