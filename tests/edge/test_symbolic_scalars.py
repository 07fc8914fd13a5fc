"""A size computed at run time, used as a Tensor operand, becomes a run-time 0-d tensor.

transformers' static cache advances its position with `pos.add_(seq_len)`; under
a dynamic length the SymInt reached the file as an Int where `aten::add.out`
reads a Tensor (E0300 on exirc, a refusal on ExecuTorch). `scalars_to_tensors`
now wraps it in `aten.scalar_tensor`, with the dtype that keeps the result's.
"""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from exirc.compiler import CompileOptions, compile_module
from exirc.edge.scalars_to_tensors import ScalarsToTensors
from exirc.edge.to_edge import ToEdge
from exirc.edge.verify import verify_edge
from exirc.edge.views_to_copies import ViewsToCopies
from exirc.runtime import load
from tests.oracle import requires_executorch

aten = torch.ops.aten
BOUND = 6


class Advance(torch.nn.Module):
    """A position buffer advanced by the input's length, and used."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("pos", torch.zeros((), dtype=dtype), persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.pos.add_(x.shape[1])
        return x * self.pos, self.pos + 0


def _export(dtype: torch.dtype) -> torch.export.ExportedProgram:
    return torch.export.export(Advance(dtype), (torch.ones(1, 3),),
                               dynamic_shapes=({1: Dim("seq", min=1, max=BOUND)},),
                               strict=False)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
def test_a_symint_operand_becomes_a_scalar_tensor_of_the_result_dtype(dtype: torch.dtype) -> None:
    program = _export(dtype)
    for step in (ToEdge(), ViewsToCopies(), ScalarsToTensors()):
        program = step.run(program).program
    nodes = list(program.graph_module.graph.nodes)
    (wrap,) = [n for n in nodes if n.target is aten.scalar_tensor.default]
    assert isinstance(wrap.args[0].meta["val"], torch.SymInt)
    # An int32 0-d position plus a size stays int32, as eager's does.
    assert wrap.kwargs["dtype"] == dtype and wrap.meta["val"].shape == ()
    for node in nodes:
        if node.op == "call_function" and node.target is not aten.scalar_tensor.default:
            for argument, value in zip(node.target._schema.arguments, node.args):
                if str(argument.type) == "Tensor" and hasattr(value, "meta"):
                    assert isinstance(value.meta["val"], torch.Tensor), (node, argument.name)
    verify_edge(program)


@requires_executorch
@pytest.mark.parametrize("target", ["portable", "xnnpack"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_a_position_advanced_by_a_dynamic_length_runs_on_both_runtimes(
        target: str, dtype: torch.dtype) -> None:
    from executorch.runtime import Runtime

    model = Advance(dtype)
    result = compile_module(model, (torch.ones(1, 3),),
                            dynamic_shapes=({1: Dim("seq", min=1, max=BOUND)},),
                            options=CompileOptions(target=target))
    ours = load(result.data)
    program = Runtime.get().load_program(result.data)  # alive while its method runs
    theirs = program.load_method("forward")
    # Every length, one after another: the position is state and accumulates.
    for length in [*range(1, BOUND + 1), 2]:
        x = torch.randn(1, length, generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            expected = [t.clone() for t in model(x)]
        for name, got in (("exirc", ours.run("forward", [x])),
                          ("ExecuTorch", theirs.execute((x,)))):
            for a, b in zip(got, expected, strict=True):
                assert a.dtype == b.dtype, (name, length)
                torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"{name}, length {length}")


class TimesLength(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x.shape[0]


@requires_executorch
def test_a_size_times_a_tensor_delegates_the_multiply_on_both_runtimes() -> None:
    """The run-time 0-d tensor stays on the interpreter (XNNPACK cannot fold it),
    the multiply by it is delegated, at every length."""
    from executorch.runtime import Runtime

    result = compile_module(TimesLength(), (torch.randn(4, 3),),
                            dynamic_shapes=({0: Dim("n", min=2, max=BOUND)},),
                            options=CompileOptions(target="xnnpack"))
    assert "mul" not in {e.op for e in result.delegation["forward"].left_out}
    ours = load(result.data)
    program = Runtime.get().load_program(result.data)  # alive while its method runs
    method = program.load_method("forward")
    for n in range(2, BOUND + 1):
        x = torch.randn(n, 3, generator=torch.Generator().manual_seed(n))
        torch.testing.assert_close(ours.run("forward", [x])[0], x * n)
        torch.testing.assert_close(method.execute([x])[0], x * n)
