"""Sibling slices as one ONNX Split (exirc.runtime.engines.onnx_form.rewrites.split): an LSTM's
gates run as one Split per step on onnxruntime, with the torch engine's and
eager's answers; slices that leave gaps still split (the gaps go to unread
outputs); overlapping slices, slices cut along two axes and a lone slice are
emitted one by one, and every case gives the torch path's answer exactly."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from exirc.compiler import CompileOptions, compile_module
from exirc.runtime.engines.onnx_form import xnnpack_graph as onnx_graph
from exirc.serialize.xnnpack import graph as G
from tests.runtime.delegates.xnnpack.graphs import GraphBuilder
from tests.runtime.engines.onnx_form.test_fusions import (  # noqa: F401 (onnx_ops: a fixture)
    on_both_engines,
    onnx_ops,
    run_hand_built,
)

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

Kind = G.NodeKind


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


def test_lstm_gates_are_one_split_a_step(onnx_ops: list[list[str]],  # noqa: F811
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The cells as emitted: the LSTM pass (tested in test_xnnpack_onnx_lstm) would
    # make them one LSTM node and leave no gates to split.
    monkeypatch.setattr(onnx_graph, "DELEGATE_RULES", tuple(
        rule for rule in onnx_graph.DELEGATE_RULES if rule.name != "lstm"))
    torch.manual_seed(0)
    model, x = Recurrent().eval(), torch.randn(2, 5, 8)
    data = compile_module(model, (x,), options=CompileOptions(target="xnnpack")).data
    ours = on_both_engines(data, [x], monkeypatch)
    with torch.no_grad():
        torch.testing.assert_close(ours[0], model(x), rtol=1e-3, atol=1e-4)
    ops = [op for delegate in onnx_ops for op in delegate]
    assert "Slice" not in ops, ops
    assert ops.count("Split") >= 5  # one per step at least: the four gates


def _slices_graph(cuts: list[tuple[list[int], list[int]]]
                  ) -> tuple[GraphBuilder, list[torch.Tensor]]:
    """x [2, 6, 4] -> one STATIC_SLICE (offsets, sizes) per cut, each an output."""
    g = GraphBuilder()
    x = g.input([2, 6, 4])
    for offsets, sizes in cuts:
        dims = [dim - offset if size == 0 else size
                for offset, size, dim in zip(offsets, sizes, [2, 6, 4])]
        g.node(Kind.STATIC_SLICE, G.StaticSlice(3, offsets, sizes, x, g.output(dims)))
    return g, [torch.randn(2, 6, 4)]


CASES: list[tuple[str, list[tuple[list[int], list[int]]], int]] = [
    ("a tiling, out of order", [([0, 2, 0], [2, 4, 4]), ([0, 0, 0], [2, 2, 4])], 1),
    ("with gaps and a to-the-end size", [([0, 1, 0], [2, 1, 4]), ([0, 4, 0], [0, 0, 0])], 1),
    ("the last axis", [([0, 0, 0], [2, 6, 1]), ([0, 0, 1], [2, 6, 3])], 1),
    ("overlapping", [([0, 0, 0], [2, 4, 4]), ([0, 3, 0], [2, 3, 4])], 0),
    ("cut along two axes", [([0, 0, 0], [1, 3, 4]), ([1, 3, 0], [1, 3, 4])], 0),
    ("one slice alone", [([0, 2, 0], [2, 2, 4])], 0),
]


@pytest.mark.parametrize(("name", "cuts", "splits"), CASES, ids=[c[0] for c in CASES])
def test_hand_built_slices(name: str, cuts: Any, splits: int,
                           onnx_ops: list[list[str]],  # noqa: F811
                           monkeypatch: pytest.MonkeyPatch) -> None:
    g, inputs = _slices_graph(cuts)
    outputs, expected = run_hand_built(g, inputs, monkeypatch)
    assert len(outputs) == len(expected)
    for ours, theirs in zip(outputs, expected):
        assert torch.equal(ours, theirs), name  # a copy of the same elements: exact
    (ops,) = onnx_ops
    assert ops.count("Split") == splits, ops
    assert ops.count("Slice") == (0 if splits else len(cuts)), ops
