"""Emitters of quantized convolutions and linear layers (`qdq.Gemm` groups).

One XNNPACK node reads the integers of the activation's quantize and writes
those of the result's quantize, as ExecuTorch's XNNPACK payloads do:

  - the filter is the int8 weight rearranged as for float (`weights.conv_filter`;
    [out, in] for fully connected), qcint8 with its per-channel scales along the
    output channels (dim 3 of a depthwise filter, 0 otherwise), or qint8 with one;
  - the bias is int32, round(bias / (input_scale * weight_scale)) per channel, as
    PyTorch's quantize_per_channel rounds it; XNNPACK adds it to the accumulator;
  - scales are float32 buffers in the program's named data under "scale_<sha256>".

The clamp of the group (relu, relu6) becomes the node's output range.
"""

from __future__ import annotations

import torch

from exirc.backend.xnnpack import layout as lay
from exirc.backend.xnnpack.builder import GraphBuilder, shape_of
from exirc.backend.xnnpack.lower_nn import ConvArgs
from exirc.backend.xnnpack.qdq import QParams
from exirc.backend.xnnpack.qdq_gemm import Gemm, bias_scales, quantized_bias
from exirc.backend.xnnpack.weights import ConvShape, conv_filter
from exirc.serialize.xnnpack import graph as G

aten = torch.ops.aten


def quantized_value(b: GraphBuilder, dims: list[int], params: QParams) -> int:
    """A new internal qint8 value with per-tensor `params`."""
    vid = b.value(dims)
    value = b.graph.values[vid]
    value.datatype, value.quant = G.Datatype.QINT8, params.xnnpack
    return vid


def _scales(b: GraphBuilder, scales: torch.Tensor, channel_dim: int) -> G.PerChannelQuant:
    raw = scales.to(torch.float32).contiguous().numpy().tobytes()
    return G.PerChannelQuant([], channel_dim, scale_buffer_idx=b.constant_entry(raw, "scale_"),
                             num_scales=scales.numel())


def _filter(b: GraphBuilder, gemm: Gemm, data: torch.Tensor, channel_dim: int) -> int:
    weight = gemm.weight
    if weight.per_channel:
        return b.constant_value(data, G.Datatype.QCINT8, _scales(b, weight.scale, channel_dim))
    return b.constant_value(data, G.Datatype.QINT8,
                            G.PerTensorQuant(float(weight.scale), 0))


def _bias(b: GraphBuilder, gemm: Gemm) -> int:
    values = quantized_bias(gemm)
    if values is None:
        return G.INVALID_VALUE_ID
    data = values.to(torch.int32)
    scales = bias_scales(gemm)
    if gemm.weight.per_channel:
        return b.constant_value(data, G.Datatype.QCINT32, _scales(b, scales, 0))
    return b.constant_value(data, G.Datatype.QINT32, G.PerTensorQuant(float(scales), 0))


def emit_gemm(b: GraphBuilder, gemm: Gemm) -> None:
    if gemm.node.target == aten.convolution.default:
        _convolution(b, gemm)
    else:
        _fully_connected(b, gemm)


def _convolution(b: GraphBuilder, gemm: Gemm) -> None:
    node, out_q = gemm.node, gemm.output.q
    cargs = ConvArgs.of(node)
    integers = gemm.weight.integers
    conv = ConvShape.of(list(integers.shape), cargs.groups, cargs.transposed)
    if cargs.one_d:
        integers = integers.unsqueeze(2)
    filter_id = _filter(b, gemm, conv_filter(integers, conv).contiguous(),
                        3 if conv.depthwise else 0)
    out = quantized_value(b, cargs.out_dims(shape_of(out_q)), gemm.output.params)
    kind, params = cargs.node(conv, integers.shape[2:], [0, 0, 0, 0],
                              cargs.read(b, gemm.input_q), filter_id, _bias(b, gemm), out)
    b.add_node(kind, params, owner=out_q, min_max=gemm.output.bounds)
    cargs.define(b, out_q, out)


def _fully_connected(b: GraphBuilder, gemm: Gemm) -> None:
    """XNNPACK's fully connected flattens its input's leading dims itself: a view
    doing only that costs no node, nor one putting them back after."""
    x, out_q = gemm.input_q, gemm.output.q
    channels, inputs = (int(d) for d in gemm.weight.integers.shape)
    source = b.get_contiguous(x)
    if gemm.view is not None and shape_of(x)[-1] != inputs:
        source = b.reshape(source, shape_of(gemm.view))
    dims = [*b.graph.values[source].dims[:-1], channels]
    out = quantized_value(b, dims, gemm.output.params)
    filter_id = _filter(b, gemm, gemm.weight.integers.contiguous(), 0)
    b.add_node(G.NodeKind.FULLY_CONNECTED,
               G.FullyConnected(source, filter_id, _bias(b, gemm), out),
               owner=out_q, min_max=gemm.output.bounds)
    shape = shape_of(out_q)
    b.define(out_q, b.reshape(out, shape), lay.identity(len(shape)))
