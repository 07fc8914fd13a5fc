"""Quantized node kinds built by hand, on numbers whose XNNPACK result is known:
ties rounding to even, saturation, per-row dynamic parameters, clamp fusion.
(The ExecuTorch-made quantized zoo checks the same code against XNNPACK itself.)"""

from __future__ import annotations

import torch

from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.graph import NodeKind as K
from tests.runtime.delegates.xnnpack.graphs import GraphBuilder

NONE = G.INVALID_VALUE_ID


def qint8(g: GraphBuilder, dims: list[int], scale: float, zero_point: int) -> int:
    value = g.value(dims, G.Datatype.QINT8)
    g.graph.values[value].quant = G.PerTensorQuant(scale, zero_point)
    return value


def test_quantize_rounds_ties_to_even_and_saturates() -> None:
    x = torch.tensor([0.25, 0.75, -100.0, 100.0, 1.0])
    g = GraphBuilder()
    a, out = g.input([5]), g.output([5])
    q = qint8(g, [5], 0.5, 3)
    g.node(K.CONVERT, G.Node1x1(a, q))
    g.node(K.CONVERT, G.Node1x1(q, out))
    # 0.5 -> 0, 1.5 -> 2 (even), saturated at -128 and 127, 2 exactly; plus 3.
    integers = torch.tensor([3, 5, -128, 127, 5])
    assert torch.equal(g.run(x)[0], (integers - 3) * 0.5)


def test_dynamic_quantization_per_row_and_fully_connected() -> None:
    """A row of [-0.5, 0.5]: multiplier 255, zero point 0, and 0.5 * 255 = 127.5 -> 127."""
    x = torch.tensor([[-0.5, 0.5, 0.25, 0.0], [1.0, 2.0, 3.0, 4.0]])
    g = GraphBuilder()
    a = g.input([2, 4])
    q = g.value([2, 4], G.Datatype.QDINT8)
    g.graph.values[q].quant = G.PerTokenDynamicQuant(1)
    w = g.constant(torch.eye(4, dtype=torch.int8), datatype=G.Datatype.QCINT8)
    g.graph.values[w].quant = G.PerChannelQuant([1.0] * 4, 0)
    out = g.output([2, 4])
    g.node(K.CONVERT, G.Node1x1(a, q))
    g.node(K.FULLY_CONNECTED, G.FullyConnected(q, w, NONE, out))
    ours = g.run(x)[0]
    first = torch.tensor([-128.0, 127.0, 64.0, 0.0]) * (1.0 / torch.tensor(255.0))
    torch.testing.assert_close(ours[0], first, rtol=0, atol=1e-7)
    # Row 2: range [0, 4]: multiplier 63.75, zero point -128.
    second = (torch.round(torch.tensor([1.0, 2.0, 3.0, 4.0]) * 63.75) - 128 + 128) / 63.75
    torch.testing.assert_close(ours[1], second, rtol=1e-6, atol=1e-6)


def test_static_fully_connected_requantizes_and_fuses_a_following_clamp() -> None:
    """FC (int8 in, int8 weights, int32 bias) then Clamp with other quantization: as in
    XNNPACK, the clamp folds into the FC, which requantizes straight to its output."""
    g = GraphBuilder()
    a = g.input([1, 3], G.Datatype.QINT8)
    g.graph.values[a].quant = G.PerTensorQuant(0.5, 0)
    w = g.constant(torch.tensor([[1, 2, 3], [-4, 5, -6]], dtype=torch.int8),
                   datatype=G.Datatype.QCINT8)
    g.graph.values[w].quant = G.PerChannelQuant([0.25, 0.5], 0)
    b = g.constant(torch.tensor([4, -8], dtype=torch.int32), datatype=G.Datatype.QCINT32)
    g.graph.values[b].quant = G.PerChannelQuant([0.125, 0.25], 0)
    h = qint8(g, [1, 2], 0.1, 0)
    out = g.output([1, 2], G.Datatype.QINT8)
    g.graph.values[out].quant = G.PerTensorQuant(0.25, -10)
    g.node(K.FULLY_CONNECTED, G.FullyConnected(a, w, b, h))
    g.node(K.CLAMP, G.Node1x1(h, out), output_min_max=(0.0, 6.0))
    x = torch.tensor([[10, -20, 30]], dtype=torch.int8)
    ours = g.run(x)[0]
    # acc = x @ w.T + bias = [10 - 40 + 90 + 4, -40 - 100 - 180 - 8] = [64, -328];
    # scales 0.5 * [0.25, 0.5] / 0.25 = [0.5, 1]: [32, -328] + -10, clamped to
    # [quantize(0) = -10, quantize(6) = 14].
    assert torch.equal(ours, torch.tensor([[14, -10]], dtype=torch.int8))


def test_quantized_add_and_multiply() -> None:
    g = GraphBuilder()
    a = g.input([4], G.Datatype.QINT8)
    b = g.input([4], G.Datatype.QINT8)
    g.graph.values[a].quant = G.PerTensorQuant(0.5, 1)
    g.graph.values[b].quant = G.PerTensorQuant(0.25, -2)
    s = g.output([4], G.Datatype.QINT8)
    p = g.output([4], G.Datatype.QINT8)
    g.graph.values[s].quant = G.PerTensorQuant(0.5, 0)
    g.graph.values[p].quant = G.PerTensorQuant(0.125, 0)
    g.node(K.ADD, G.Node2x1(a, b, s))
    g.node(K.MULTIPLY, G.Node2x1(a, b, p))
    x = torch.tensor([1, 3, -5, 100], dtype=torch.int8)
    y = torch.tensor([-2, 2, 7, 100], dtype=torch.int8)
    added, multiplied = g.run(x, y)
    real_sum = (x.float() - 1) * 0.5 + (y.float() + 2) * 0.25
    steps = (real_sum / 0.5).clamp(-128, 127)  # saturated
    assert (added.float() - steps).abs().max() <= 0.5  # within half a step
    real_product = ((x.float() - 1) * 0.5) * ((y.float() + 2) * 0.25)
    expected = torch.round(real_product / 0.125).clamp(-128, 127)
    assert torch.equal(multiplied, expected.to(torch.int8))
