"""Emitters of layer norm and group norm, which XNNPACK has no operator
for, as their arithmetic: two global average poolings (mean, then
variance) and elementwise nodes, on the input seen as [outer, normalized,
1, inner] (layer norm: in whatever layout it has, so no tensor is
converted; group norm: its groups need PyTorch's layout)."""

from __future__ import annotations

import math

import torch
from torch.fx import Node

from exirc.backend.xnnpack import layout as lay
from exirc.backend.xnnpack.args import as_float, as_int, as_ints, as_node
from exirc.backend.xnnpack.builder import GraphBuilder, shape_of
from exirc.backend.xnnpack.lower_elementwise import Emitter, number
from exirc.backend.xnnpack.lower_shape import global_average, pooling_view
from exirc.serialize.xnnpack import graph as G

aten = torch.ops.aten


def normalize(b: GraphBuilder, whole: int, view: list[int], eps: float, owner: Node) -> int:
    """(x - mean) / sqrt(var + eps) of value `whole` ([outer, n, 1, inner]),
    the statistics over its n axis."""
    mean = global_average(b, whole, view)
    centered = b.binary_op(G.NodeKind.SUBTRACT, whole, mean)
    squared = b.unary_op(G.NodeKind.SQUARE, centered)
    variance = b.binary_op(G.NodeKind.ADD, global_average(b, squared, view),
                           b.static_value(number(eps)))
    inv_std = b.unary_op(G.NodeKind.RECIPROCAL_SQUARE_ROOT, variance)
    return b.binary_op(G.NodeKind.MULTIPLY, centered, inv_std, owner=owner)


def emit_layer_norm(b: GraphBuilder, node: Node) -> None:
    x, weight, bias, eps = as_node(node.args[0]), node.args[2], node.args[3], node.args[4]
    rank, count = len(shape_of(x)), len(as_ints(node.args[1]))
    dims = list(range(rank - count, rank))
    version, view = pooling_view(b, x, dims)
    result = normalize(b, b.reshape(version.id, view), view, as_float(eps), node)
    # The affine parameters vary along the normalized dims only: in the
    # order those lie in memory, as [1, normalized, 1, 1].
    order = [d - (rank - count) for d in version.layout if d in dims]
    for kind, param in ((G.NodeKind.MULTIPLY, weight), (G.NodeKind.ADD, bias)):
        tensor = None if param is None else b.static(as_node(param))
        if tensor is not None:
            arranged = tensor.to(torch.float32).permute(order).reshape(1, view[1], 1, 1)
            result = b.binary_op(kind, result, b.static_value(arranged), owner=node)
    b.define(node, b.reshape(result, lay.physical_shape(shape_of(node), version.layout)),
             version.layout)


def emit_group_norm(b: GraphBuilder, node: Node) -> None:
    """native_group_norm(x, weight, bias, N, C, HxW, group, eps): each
    sample's groups of C/group channels normalized together, then a
    per-channel affine."""
    x, weight, bias = as_node(node.args[0]), node.args[1], node.args[2]
    groups, eps = as_int(node.args[6]), as_float(node.args[7])
    shape = shape_of(x)
    view = [shape[0] * groups, math.prod(shape[1:]) // groups, 1, 1]
    result = normalize(b, b.reshape(b.get_contiguous(x), view), view, eps, node)
    identity = lay.identity(len(shape))
    result = b.reshape(result, shape)
    per_channel = [-1] + [1] * (len(shape) - 2)
    for kind, param in ((G.NodeKind.MULTIPLY, weight), (G.NodeKind.ADD, bias)):
        tensor = None if param is None else b.static(as_node(param))
        if tensor is not None:
            operand = b.broadcast_operand(tensor.to(torch.float32).reshape(per_channel), identity)
            result = b.binary_op(kind, result, operand, owner=node)
    b.define(node, result, identity)


EMITTERS: dict[object, Emitter] = {
    aten.native_layer_norm.default: emit_layer_norm,
    aten.native_group_norm.default: emit_group_norm,
}
