"""`--target exirc` keeps nn.LSTM whole (exirc.backend.lstm): eager's outputs,
the LSTMs it must leave alone, and a kernel that refuses malformed arguments."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from exirc.backend import lstm as compiler_lstm
from exirc.compiler import CompileOptions, compile_module
from exirc.runtime import load
from exirc.runtime.errors import ExecutionError
from exirc.runtime.kernels import recurrent as runtime_lstm
from exirc.runtime.kernels.registry import KERNELS
from tests.models.zoo import flatten_outputs


class Recurrent(nn.Module):
    """An LSTM (or GRU) returning its output and final states, with or without
    an initial state."""

    def __init__(self, rnn: nn.Module, with_state: bool = False) -> None:
        super().__init__()
        self.rnn, self.with_state = rnn, with_state

    def forward(self, x: torch.Tensor, *state: torch.Tensor) -> Any:
        if self.with_state:
            return self.rnn(x, tuple(state) if len(state) == 2 else state[0])
        return self.rnn(x)


def compiled(module: nn.Module, inputs: tuple[torch.Tensor, ...]
             ) -> tuple[list[torch.Tensor], list[str]]:
    """The exirc target's outputs on `inputs` and the program's operator names."""
    program = load(compile_module(module, inputs, options=CompileOptions(target="exirc")).data)
    plan = program.program.execution_plan[0]
    operators = [f"{op.name}.{op.overload}" for op in plan.operators]
    return list(program.run("forward", list(inputs))), operators


def assert_like_eager(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[str]:
    module.eval()
    with torch.no_grad():
        expected = flatten_outputs(module(*inputs))
    outputs, operators = compiled(module, inputs)
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    return operators


@pytest.mark.parametrize(("layers", "bidirectional", "batch_first", "bias"), [
    (1, False, True, True), (2, False, False, True), (2, True, True, True),
    (1, True, False, False),
])
def test_an_lstm_runs_as_one_call_with_eagers_outputs(layers: int, bidirectional: bool,
                                                      batch_first: bool, bias: bool) -> None:
    torch.manual_seed(0)
    rnn = nn.LSTM(5, 7, num_layers=layers, bidirectional=bidirectional,
                  batch_first=batch_first, bias=bias)
    x = torch.randn(3, 4, 5)
    operators = assert_like_eager(Recurrent(rnn), (x,))
    assert operators.count("exirc::lstm.out") == 1
    assert not any("sigmoid" in name for name in operators)  # not unrolled


def test_an_lstm_with_an_initial_state_and_dropout_off_in_eval() -> None:
    torch.manual_seed(1)
    rnn = nn.LSTM(4, 6, num_layers=2, dropout=0.5, batch_first=True)
    states = (torch.randn(2, 3, 6), torch.randn(2, 3, 6))
    operators = assert_like_eager(Recurrent(rnn, with_state=True),
                                  (torch.randn(3, 5, 4), *states))
    assert "exirc::lstm.out" in operators


def test_lstm_with_projections_and_gru_are_left_unrolled() -> None:
    torch.manual_seed(2)
    projected = assert_like_eager(Recurrent(nn.LSTM(4, 6, proj_size=3)),
                                  (torch.randn(5, 2, 4),))
    gru = assert_like_eager(Recurrent(nn.GRU(4, 6)), (torch.randn(5, 2, 4),))
    for operators in (projected, gru):
        assert "exirc::lstm.out" not in operators
        assert any("sigmoid" in name for name in operators)


def test_the_portable_target_still_unrolls_an_lstm() -> None:
    module = Recurrent(nn.LSTM(3, 4)).eval()
    data = compile_module(module, (torch.randn(2, 1, 3),),
                          options=CompileOptions(target="portable")).data
    plan = load(data).program.execution_plan[0]
    assert all(op.name != "exirc::lstm" for op in plan.operators)


def test_compiler_and_runtime_agree_on_the_schema() -> None:
    assert compiler_lstm.LSTM_OUT_SCHEMA == runtime_lstm.LSTM_OUT_SCHEMA
    kernel = KERNELS.find("exirc::lstm", "out")
    assert kernel is not None and kernel.fn is runtime_lstm.lstm_out


def _arguments(**changes: Any) -> dict[str, Any]:
    """Well-formed arguments of a one-layer LSTM (input 3, hidden 4, seq 2, batch 1)."""
    arguments: dict[str, Any] = dict(
        input=torch.randn(2, 1, 3), hx=[torch.zeros(1, 1, 4), torch.zeros(1, 1, 4)],
        params=[torch.randn(16, 3), torch.randn(16, 4), torch.randn(16), torch.randn(16)],
        has_biases=True, num_layers=1, dropout=0.0, train=False, bidirectional=False,
        batch_first=False, out0=torch.full((2, 1, 4), 7.0), out1=torch.empty(1, 1, 4),
        out2=torch.empty(1, 1, 4))
    arguments.update(changes)
    return arguments


def test_the_kernel_computes_torchs_lstm() -> None:
    arguments = _arguments()
    runtime_lstm.lstm_out(**arguments)
    want = torch.lstm(arguments["input"], arguments["hx"], arguments["params"],
                      True, 1, 0.0, False, False, False)
    for k, expected in enumerate(want):
        torch.testing.assert_close(arguments[f"out{k}"], expected)


@pytest.mark.parametrize(("changes", "words"), [
    ({"train": True}, "inference only"),
    ({"input": torch.randn(2, 1, 3, dtype=torch.float64)}, "but input is torch.float64"),
    ({"input": torch.randint(0, 3, (2, 1, 3))}, "must be float32 or float64"),
    ({"input": torch.randn(2, 1, 1, 3)}, "has 4 dims"),
    ({"hx": [torch.zeros(1, 1, 4)]}, "hx holds 1 tensors"),
    ({"num_layers": 2}, "4 params for num_layers 2"),
    ({"params": [torch.randn(16, 5), torch.randn(16, 4), torch.randn(16), torch.randn(16)]},
     "params[0] has shape [16, 5], expected [16, 3]"),
    ({"params": [torch.randn(16, 3), torch.randn(16, 4), torch.randn(16), torch.randn(12)]},
     "params[3] has shape [12], expected [16]"),
    ({"hx": [torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)]}, "expected [1, 1, 4]"),
    ({"hx": [torch.zeros(1, 1, 4), torch.zeros(1, 1, 5)]}, "hx[1] has shape [1, 1, 5]"),
    ({"hx": [torch.zeros(1, 4), torch.zeros(1, 4)]}, "hx[0] has 2 dims"),
    ({"out0": torch.empty(2, 1, 5)}, "out0 is torch.float32 [2, 1, 5], but the LSTM makes"),
    ({"out2": torch.empty(1, 1, 4, dtype=torch.float64)}, "out2 is torch.float64"),
])
def test_malformed_arguments_are_execution_errors(changes: dict[str, Any], words: str) -> None:
    arguments = _arguments(**changes)
    with pytest.raises(ExecutionError, match="exirc::lstm") as raised:
        runtime_lstm.lstm_out(**arguments)
    assert words in str(raised.value)
    assert raised.value.code == "E0340"
    if "out0" not in changes:
        assert (arguments["out0"] == 7.0).all()  # refused before anything is written
