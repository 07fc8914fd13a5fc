"""An unrolled LSTM layer in the ONNX form is one ONNX LSTM node
(exirc.runtime.engines.onnx_form.rewrites.lstm): nn.LSTM layers compiled for XNNPACK (one or
two layers, batch first or not, given or zero states, no biases,
bidirectional, one step, batch one) run on onnxruntime with the torch engine's
and eager's answers, and with the expected number of LSTM nodes. Hand-written
cells that are not exactly an LSTM (a gate read elsewhere, a tanh where a
sigmoid belongs) stay as they are and still give eager's answers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from torch import nn

from tests.runtime.engines.onnx_form.test_fusions import (  # noqa: F401 (onnx_ops: a fixture)
    compiled_against_eager,
    onnx_ops,
)

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

RTOL, ATOL = 1e-4, 1e-5  # the conformance zoo's, lstm_tagger's included (tests/models/zoo.py)


class Layer(nn.Module):
    """An nn.LSTM returning its sequence and final states (from given ones if any)."""

    def __init__(self, **options: object) -> None:
        super().__init__()
        self.lstm = nn.LSTM(**options)  # type: ignore[arg-type]

    def forward(self, x: torch.Tensor, *state: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out, (h, c) = self.lstm(x, (state[0], state[1]) if state else None)
        return out, h, c


class HandWritten(nn.Module):
    """One LSTM layer written out step by step, time major; `variant` breaks it:
    "gate_read" also returns the sum of the forget gates, "tanh_output_gate" uses
    tanh for the output gate."""

    def __init__(self, variant: str = "", size: int = 4, hidden: int = 6) -> None:
        super().__init__()
        self.variant, self.hidden = variant, hidden
        self.w_ih = nn.Parameter(torch.randn(4 * hidden, size) * 0.5)
        self.w_hh = nn.Parameter(torch.randn(4 * hidden, hidden) * 0.5)
        self.bias = nn.Parameter(torch.randn(4 * hidden) * 0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.zeros(x.shape[1], self.hidden)
        c, forgets, outs = torch.zeros_like(h), torch.zeros_like(h), []
        for t in range(x.shape[0]):
            gates = x[t] @ self.w_ih.T + h @ self.w_hh.T + self.bias
            i, f, g, o = gates.chunk(4, dim=-1)
            f = torch.sigmoid(f)
            forgets = forgets + f
            output_gate = torch.tanh(o) if self.variant == "tanh_output_gate" else torch.sigmoid(o)
            c = f * c + torch.sigmoid(i) * torch.tanh(g)
            h = output_gate * torch.tanh(c)
            outs.append(h)
        return torch.stack(outs), (forgets if self.variant == "gate_read" else c)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    module: Callable[[], nn.Module]
    shapes: list[tuple[int, ...]]  # x, then h0 and c0 if given
    lstms: int  # LSTM nodes in the delegates' ONNX form
    # MatMuls left there (None: not counted): an input projection over the whole
    # sequence is folded into its LSTM node (onnx_lstm_input), except where both
    # directions read it or the steps were projected one by one.
    matmuls: int | None = 0


def _layer(**options: object) -> Callable[[], nn.Module]:
    return lambda: Layer(**options)


CASES = [
    Case("one_layer", _layer(input_size=8, hidden_size=16), [(5, 2, 8)], 1),
    Case("two_layers_batch_first", _layer(input_size=8, hidden_size=16, num_layers=2,
                                          batch_first=True), [(2, 4, 8)], 2),
    Case("given_state", _layer(input_size=3, hidden_size=5), [(3, 2, 3), (1, 2, 5), (1, 2, 5)], 1),
    Case("no_bias_batch_one_given_state_two_layers",
         _layer(input_size=4, hidden_size=4, num_layers=2, bias=False),
         [(3, 1, 4), (2, 1, 4), (2, 1, 4)], 2),
    # The reverse direction runs its steps on the reversed sequence: one node each.
    Case("bidirectional", _layer(input_size=3, hidden_size=5, bidirectional=True,
                                 batch_first=True), [(2, 3, 3)], 2, matmuls=1),
    Case("one_step_batch_one", _layer(input_size=4, hidden_size=6, num_layers=2,
                                      batch_first=True), [(1, 1, 4)], 2),
    Case("hand_written", HandWritten, [(4, 2, 4)], 1, matmuls=4),
    Case("a_gate_read_elsewhere", lambda: HandWritten("gate_read"), [(4, 2, 4)], 0, None),
    Case("tanh_for_a_sigmoid", lambda: HandWritten("tanh_output_gate"), [(4, 2, 4)], 0, None),
]


def ops_compiled_against_eager(module: Callable[[], nn.Module], shapes: list[tuple[int, ...]],
                               onnx_ops: list[list[str]],  # noqa: F811
                               monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ONNX op types of `module` compiled for XNNPACK, once its answers on both
    engines were checked against eager's (random inputs of `shapes`)."""
    torch.manual_seed(0)
    model = module().eval()
    inputs = [torch.randn(*shape) for shape in shapes]
    compiled_against_eager(model, inputs, monkeypatch, RTOL, ATOL)
    return [op for delegate in onnx_ops for op in delegate]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_lstm_layers_are_lstm_nodes_with_eager_answers(
        case: Case, onnx_ops: list[list[str]],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    ops = ops_compiled_against_eager(case.module, case.shapes, onnx_ops, monkeypatch)
    assert ops.count("LSTM") == case.lstms, ops
    assert case.matmuls is None or ops.count("MatMul") == case.matmuls, ops
    if case.lstms:
        assert "Sigmoid" not in ops, ops  # every step is in the LSTM nodes
