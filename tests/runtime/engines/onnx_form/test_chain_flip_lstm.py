"""A flip between XNNPACK delegates is a Slice in the fused chain
(exirc.runtime.engines.onnx_form.chain_ops.flip), and a bidirectional LSTM, whose backward
direction reads its sequence flipped, becomes one chain of LSTM nodes with
nothing per step left: each direction's input projection folded into its node
(the backward one through the flip), each output sequence a Reshape of the
node's Y (the backward one reversed), answering as the kernels and eager do."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

from exirc.compiler import CompileOptions, compile_module
from exirc.runtime import load
from exirc.runtime.core.method import Method

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

RTOL, ATOL = 1e-4, 1e-5  # the conformance zoo's (tests/models/zoo.py)


def fused(model: nn.Module, inputs: list[torch.Tensor]) -> tuple[Method, Counter[str]]:
    """The xnnpack program's method, checked to answer as the kernels and eager do,
    and the op types of its fused chain."""
    data = compile_module(model, inputs, options=CompileOptions(target="xnnpack")).data
    method = load(data).method("forward")
    assert method.accelerated is not None, "the chain was expected to fuse"
    with torch.no_grad():
        expected = model(*inputs)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    got = method.run(inputs)
    kernels = method.run(inputs, observer=lambda chain, index: None)
    for a, b, want in zip(got, kernels, expected, strict=True):
        torch.testing.assert_close(a, want, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
    model = onnx.load_from_string(method.accelerated.form.model)
    ops = Counter(node.op_type for node in model.graph.node)
    return method, ops


class Flipped(nn.Module):
    def __init__(self, dims: tuple[int, ...]) -> None:
        super().__init__()
        self.dims, self.first, self.second = dims, nn.Linear(6, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.flip(self.first(x), self.dims))


@pytest.mark.parametrize("dims", [(0,), (-1,), (0, 1, 2), (1, -1)],
                         ids=["first", "last_negative", "all", "two"])
def test_a_flip_between_delegates_is_a_slice_of_the_chain(dims: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    _, ops = fused(Flipped(dims).eval(), [torch.randn(3, 5, 6)])
    assert ops["Slice"] == 1, ops


class Tagger(nn.Module):
    """Embedding, a bidirectional recurrent layer (LSTM or GRU), a Linear."""

    def __init__(self, layers: int, batch_first: bool,
                 recurrent: type[nn.LSTM | nn.GRU] = nn.LSTM) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.recurrent = recurrent(8, 6, num_layers=layers, bidirectional=True,
                                   batch_first=batch_first)
        self.out = nn.Linear(12, 5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.recurrent(self.embed(tokens))[0])


@pytest.mark.parametrize(("layers", "batch_first"), [(1, True), (2, False)],
                         ids=["one_layer_batch_first", "two_layers"])
def test_a_bidirectional_lstm_is_lstm_nodes_with_nothing_per_step(layers: int,
                                                                  batch_first: bool) -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, 50, (2, 7) if batch_first else (7, 2))
    _, ops = fused(Tagger(layers, batch_first).eval(), [tokens])
    assert ops["LSTM"] == 2 * layers, ops
    assert ops["MatMul"] == 1, ops  # the output Linear's: every projection is in its node
    assert ops["Gather"] == 1, ops  # the embedding's: no step is gathered from a Y
    assert ops["Slice"] == 2 * layers, ops  # per layer, x and Y reversed
    assert "Sigmoid" not in ops, ops
