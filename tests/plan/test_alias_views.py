"""Static reshapes of planned tensors become views: no instruction, no memory."""

from __future__ import annotations

import torch
from torch._higher_order_ops.while_loop import while_loop
from torch.export import Dim

from exirc.compiler import CompileResult, compile_module
from exirc.runtime import load
from exirc.serialize import program as P
from tests.oracle import run_with_executorch


class Reshapes(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x.reshape(4, 6)).relu()  # a view of the input, then of a result
        return y.reshape(2, 2, 6).unsqueeze(0).squeeze(0) * 2


class ParameterViewInBranch(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: x * self.weight.reshape(2, 3),
                          lambda x: x - 1, (x,))


class LoopReshapingItsState(torch.nn.Module):
    """The body reads its state through views (aliased: planned memory)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def more(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a.sum() < 100

        def step(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return a * 2 + b, a.reshape(6).reshape(2, 3).clone()

        return while_loop(more, step, (a, b))


def _operators(result: CompileResult) -> set[str]:
    return {op.qualified_name for op in result.program.execution_plan[0].operators}


def _check(model: torch.nn.Module, result: CompileResult, *inputs: torch.Tensor) -> None:
    expected = model(*inputs)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    for got in (load(result.data).run("forward", list(inputs)),
                run_with_executorch(result.data, inputs)):
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e)


def test_static_reshapes_cost_no_instruction_and_no_memory() -> None:
    torch.manual_seed(0)
    model = Reshapes().eval()
    x = torch.randn(2, 2, 6)
    result = compile_module(model, (x,))
    copies = {"aten::view_copy.out", "aten::squeeze_copy.dim_out",
              "aten::unsqueeze_copy.out"}
    assert not _operators(result) & copies
    plan = result.program.execution_plan[0]
    offsets = [v.allocation_info.offset for v in plan.values
               if isinstance(v, P.Tensor) and v.allocation_info is not None]
    assert len(offsets) > len(set(offsets))  # views share their input's place
    _check(model, result, x)


class Flatten(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 1).reshape(-1) * 2


def test_a_dynamic_reshape_keeps_its_instruction() -> None:
    model = Flatten()
    result = compile_module(model, (torch.randn(3, 6),),
                            dynamic_shapes=({0: Dim("n", min=1, max=8)},))
    assert "aten::view_copy.out" in _operators(result)
    _check(model, result, torch.randn(5, 6))


def test_views_of_constants_are_copied() -> None:
    torch.manual_seed(0)
    model = ParameterViewInBranch().eval()
    result = compile_module(model, (torch.randn(2, 3),))
    _check(model, result, torch.ones(2, 3))
    _check(model, result, -torch.ones(2, 3))


def test_a_loop_reading_its_state_through_views_matches_eager() -> None:
    model = LoopReshapingItsState()
    a, b = torch.arange(1.0, 7.0).reshape(2, 3), torch.ones(2, 3)
    result = compile_module(model, (a, b))
    _check(model, result, a, b)
