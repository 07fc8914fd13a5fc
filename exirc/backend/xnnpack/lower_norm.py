"""Emitter of layer norm, which XNNPACK has no operator for, as its
arithmetic: two global average poolings (mean, then variance) and
elementwise nodes, all on the input seen as [outer, normalized, 1, inner]
so that no tensor is converted."""

from __future__ import annotations

import torch
from torch.fx import Node

from exirc.backend.xnnpack import layout as lay
from exirc.backend.xnnpack.args import as_ints, as_node
from exirc.backend.xnnpack.builder import GraphBuilder, shape_of
from exirc.backend.xnnpack.lower_elementwise import Emitter, number
from exirc.backend.xnnpack.lower_shape import global_average, pooling_view
from exirc.serialize.xnnpack import graph as G

aten = torch.ops.aten


def emit_layer_norm(b: GraphBuilder, node: Node) -> None:
    x, weight, bias, eps = as_node(node.args[0]), node.args[2], node.args[3], node.args[4]
    rank, count = len(shape_of(x)), len(as_ints(node.args[1]))
    dims = list(range(rank - count, rank))
    version, view = pooling_view(b, x, dims)
    whole = b.reshape(version.id, view)

    mean = global_average(b, whole, view)
    centered = b.binary_op(G.NodeKind.SUBTRACT, whole, mean)
    squared = b.unary_op(G.NodeKind.SQUARE, centered)
    variance = b.binary_op(G.NodeKind.ADD, global_average(b, squared, view),
                           b.static_value(number(eps)))
    inv_std = b.unary_op(G.NodeKind.RECIPROCAL_SQUARE_ROOT, variance)
    result = b.binary_op(G.NodeKind.MULTIPLY, centered, inv_std, owner=node)
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


EMITTERS: dict[object, Emitter] = {
    aten.native_layer_norm.default: emit_layer_norm,
}
