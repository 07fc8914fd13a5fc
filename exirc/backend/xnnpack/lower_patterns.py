"""Emitters of the operators `patterns` finds decomposed: hardswish and PReLU,
one XNNPACK node each instead of three to five; and dynamically quantized
linear layers (`dynamic_linear`), a Convert to qdint8 and a FullyConnected
(layers reading one input share its Convert, which quantizes it once); and
weight-only quantized ones, a FullyConnected of the float input with a qcint8 /
qcint4 filter (and an Add of the bias)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.fx import Node

from exirc.backend.xnnpack import layout as lay
from exirc.backend.xnnpack.builder import GraphBuilder, shape_of
from exirc.backend.xnnpack.dynamic_linear import (
    DynamicLinear,
    dynamic_linear,
    match_dynamic_linear,
    match_weight_only_linear,
    weight_only_linear,
)
from exirc.backend.xnnpack.lower_elementwise import unary
from exirc.backend.xnnpack.patterns import Match, match_hardswish, match_prelu
from exirc.serialize.xnnpack import graph as G

aten = torch.ops.aten


def emit_hardswish(b: GraphBuilder, match: Match) -> None:
    unary(b, G.NodeKind.HARDSWISH, match.root, match.x)


def emit_prelu(b: GraphBuilder, match: Match) -> None:
    """XNNPACK's PReLU takes one slope per element of the last physical axis:
    use a copy of x whose last axis is the slope's dim (NHWC for a
    convolution's output), and spread a single slope over that axis."""
    assert match.weight is not None
    weight = b.static(match.weight)
    assert weight is not None
    shape = shape_of(match.x)
    rank = len(shape)
    full = weight.to(torch.float32).reshape([1] * (rank - weight.dim()) + list(weight.shape))
    dims = [d for d in range(rank) if full.shape[d] != 1]
    if dims:
        dim = dims[0]
        version = next((v for v in b.versions(match.x) if v.layout[-1] == dim), None)
        if version is None:
            first = b.get(match.x).layout
            version = b.get(match.x, tuple(d for d in first if d != dim) + (dim,))
        slope = full.reshape(-1)
    else:
        version = b.get(match.x)
        slope = full.reshape(1).expand(shape[version.layout[-1]]).contiguous()
    out = b.value(lay.physical_shape(shape_of(match.root), version.layout))
    b.add_node(G.NodeKind.PRELU, G.Node2x1(version.id, b.static_value(slope), out),
               owner=match.root)
    b.define(match.root, out, version.layout)


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """[rows, columns] int8 in [-8, 7] (columns even) -> [rows, columns / 2] uint8:
    each value + 8, two a byte, the even column in the low nibble (XNNPACK's qc4w)."""
    nibbles = (values.to(torch.int16) + 8).to(torch.uint8)
    return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)


def emit_dynamic_linear(b: GraphBuilder, match: Match) -> None:
    found = dynamic_linear(match.root, b.static)
    assert found is not None
    layer = found[0]
    source = b.get_contiguous(layer.x)
    dims = list(b.graph.values[source].dims)
    quantized = b.per_token.get(source)
    if quantized is None:
        quantized = b.per_token[source] = b.value(dims)
        value = b.graph.values[quantized]
        value.datatype, value.quant = G.Datatype.QDINT8, G.PerTokenDynamicQuant(1)
        b.add_node(G.NodeKind.CONVERT, G.Node1x1(source, quantized), owner=match.root)
    channels = int(layer.integers.shape[0])
    filter_id = _filter(b, layer)
    bias_id = G.INVALID_VALUE_ID if layer.bias is None else \
        b.static_value(layer.bias.to(torch.float32).contiguous())
    out = b.value([*dims[:-1], channels])
    b.add_node(G.NodeKind.FULLY_CONNECTED, G.FullyConnected(quantized, filter_id, bias_id, out),
               owner=match.root)
    shape = shape_of(match.root)
    b.define(match.root, b.reshape(out, shape), lay.identity(len(shape)))


def _filter(b: GraphBuilder, layer: DynamicLinear) -> int:
    """The layer's weights as a static filter value: qbint4 in blocks (bf16 scales),
    else qcint4 / qcint8 per output channel (float32 scales)."""
    channels, inputs = (int(d) for d in layer.integers.shape)
    if layer.group_size:
        scales = layer.scales.to(torch.bfloat16).contiguous()
        raw = scales.view(torch.int16).numpy().tobytes()
        quant: G.Quantization = G.PerChannelGroupQuant(
            [], 0, layer.group_size, scale_buffer_idx=b.constant_entry(raw, "scale_"),
            num_scales=scales.numel())
        kind = G.Datatype.QBINT4
    else:
        raw = layer.scales.to(torch.float32).contiguous().numpy().tobytes()
        quant = G.PerChannelQuant([], 0, scale_buffer_idx=b.constant_entry(raw, "scale_"),
                                  num_scales=channels)
        if layer.bits == 8:
            return b.constant_value(layer.integers.contiguous(), G.Datatype.QCINT8, quant)
        kind = G.Datatype.QCINT4
    filter_id = len(b.graph.values)
    b.graph.values.append(G.TensorValue(
        kind, [channels, inputs], filter_id, quant=quant,
        constant_buffer_idx=b.constant_entry(
            pack_int4(layer.integers).contiguous().numpy().tobytes())))
    return filter_id


def emit_weight_only_linear(b: GraphBuilder, match: Match) -> None:
    found = weight_only_linear(match.root, b.static)
    assert found is not None
    layer = found[0]
    source = b.get_contiguous(layer.x)
    dims = list(b.graph.values[source].dims)
    channels = int(layer.integers.shape[0])
    filter_id = _filter(b, layer)
    out = b.value([*dims[:-1], channels])
    b.add_node(G.NodeKind.FULLY_CONNECTED,
               G.FullyConnected(source, filter_id, G.INVALID_VALUE_ID, out), owner=match.root)
    if layer.bias is not None:  # not the FullyConnected's: ExecuTorch would scale it
        out = b.binary_op(G.NodeKind.ADD, out,
                          b.static_value(layer.bias.to(torch.float32).contiguous()),
                          owner=match.root)
    shape = shape_of(match.root)
    b.define(match.root, b.reshape(out, shape), lay.identity(len(shape)))


FINDERS: tuple[tuple[Callable[[Node, Callable[[Node], torch.Tensor | None]], Match | None],
                     Callable[[GraphBuilder, Match], None]], ...] = (
    (match_hardswish, emit_hardswish),
    (match_prelu, emit_prelu),
    (match_dynamic_linear, emit_dynamic_linear),
    (match_weight_only_linear, emit_weight_only_linear),
)


def find_patterns(b: GraphBuilder, nodes: list[Node]) -> dict[Node, Callable[[GraphBuilder], None]]:
    """For each pattern in `nodes`: its root -> what emits it; the nodes it
    absorbs go to `b.absorbed`, and are not emitted."""
    inside = set(nodes)
    found: dict[Node, Callable[[GraphBuilder], None]] = {}
    for node in nodes:
        for finder, emit in FINDERS:
            match = finder(node, b.static)
            if match is None or not set(match.absorbed) <= inside:
                continue
            b.absorbed.update(match.absorbed)
            found[node] = lambda builder, m=match, e=emit: e(builder, m)  # type: ignore[misc]
            break
    return found
