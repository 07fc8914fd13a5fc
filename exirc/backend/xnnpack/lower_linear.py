"""Emitters of matrix products: addmm and mm (a linear layer, after Edge
decomposed it) as XNNPACK's fully connected operator, bmm as its batch
matrix multiply (or fully connected, when it multiplies by a broadcast
constant matrix).

XNNPACK's fully connected flattens its input's leading dims itself, so the
view_copy pair Edge puts around a linear on a batch of sequences
([B, T, I] -> [B*T, I] -> addmm -> [B*T, O] -> [B, T, O]) costs no nodes:
the operator reads the unflattened input and writes the final shape. A bmm
whose second operand is a transposed copy reads it with TRANSPOSE_B
instead of transposing it first.
"""

from __future__ import annotations

import math

import torch
from torch.fx import Node

from exirc.backend.xnnpack import layout as lay
from exirc.backend.xnnpack.args import as_float, as_node
from exirc.backend.xnnpack.builder import GraphBuilder, Operand, shape_of
from exirc.backend.xnnpack.lower_elementwise import Emitter
from exirc.serialize.xnnpack import graph as G

aten = torch.ops.aten
TRANSPOSE_B = 0x1  # XNN_FLAG_TRANSPOSE_B; XNN_FLAG_TRANSPOSE_WEIGHTS for fully connected
VIEW = aten.view_copy.default


def _flattened_source(b: GraphBuilder, x: Node) -> Node:
    """The [..., K] tensor a view_copy flattened into x ([M, K]), else x."""
    if x.op == "call_function" and x.target == VIEW and isinstance(x.args[0], Node):
        source = x.args[0]
        shape, flat = shape_of(source), shape_of(x)
        if len(shape) > 2 and shape[-1] == flat[1] and math.prod(shape[:-1]) == flat[0] \
                and not b.is_static(source):
            return source
    return x


def _unflattening_user(node: Node, leading: list[int]) -> Node | None:
    """The only user of node if it is a view_copy back to leading + [N]."""
    users = list(node.users)
    if len(users) != 1 or users[0].target != VIEW:
        return None
    view = users[0]
    return view if shape_of(view)[:-1] == leading else None


def fully_connected(b: GraphBuilder, node: Node, x: Node, weight: Operand,
                    bias: torch.Tensor | None, alpha: float, *, define: bool = True) -> int:
    """x @ weight (+ bias) for `node`, weight [K, N]; bias already per output.

    Defines node (or the view_copy unflattening it) unless `define` is
    False; returns the product's value ([M, N] then)."""
    source = _flattened_source(b, x) if define else x
    leading = shape_of(source)[:-1]
    target = _unflattening_user(node, leading) if source is not x else None
    if target is None:
        source, leading = x, shape_of(x)[:-1]
    out = b.value([*leading, shape_of(node)[-1]])
    flags = 0
    static = b.static(weight)
    if static is not None:
        filter_id = b.static_value((static * alpha).t() if alpha != 1 else static.t())
    else:
        # A weight computed at run time is read as it lies, [K, N].
        assert isinstance(weight, Node) and alpha == 1
        filter_id, flags = b.get_contiguous(weight), TRANSPOSE_B
    bias_id = G.INVALID_VALUE_ID if bias is None else b.static_value(bias)
    b.add_node(G.NodeKind.FULLY_CONNECTED,
               G.FullyConnected(b.get_contiguous(source), filter_id, bias_id, out, flags),
               owner=target if target is not None else node)
    if not define:
        return out
    if target is not None:
        b.define(target, out, lay.identity(len(leading) + 1))
        b.define(node, b.reshape(out, shape_of(node)), (0, 1))
    else:
        b.define(node, out, (0, 1))
    return out


def _row_bias(b: GraphBuilder, bias: Operand, n: int) -> torch.Tensor | None:
    """A constant bias the same for every row (shape [N] or [1, N]), flattened."""
    tensor = b.static(bias)
    if tensor is None or tensor.numel() != n or (tensor.dim() == 2 and tensor.shape[0] != 1):
        return None
    return tensor.reshape(n).to(torch.float32)


def emit_addmm(b: GraphBuilder, node: Node) -> None:
    bias, x, weight = (as_node(a) for a in node.args[:3])
    beta, alpha = as_float(node.kwargs.get("beta", 1)), as_float(node.kwargs.get("alpha", 1))
    n = shape_of(node)[-1]
    row_bias = _row_bias(b, bias, n)
    if row_bias is not None:
        fully_connected(b, node, x, weight, row_bias * beta if beta != 1 else row_bias, alpha)
        return
    # Any other bias (per element, or computed): the product, then an add.
    product = fully_connected(b, node, x, weight, None, alpha, define=False)
    static = b.static(bias)
    addend: Operand = static * beta if static is not None and beta != 1 else bias
    out = b.value(shape_of(node))
    b.add_node(G.NodeKind.ADD, G.Node2x1(product, b.broadcast_operand(addend, (0, 1)), out),
               owner=node)
    b.define(node, out, (0, 1))


def emit_mm(b: GraphBuilder, node: Node) -> None:
    x, weight = as_node(node.args[0]), as_node(node.args[1])
    fully_connected(b, node, x, weight, None, 1.0)


def _broadcast_weight(b: GraphBuilder, second: Node) -> torch.Tensor | None:
    """The constant [K, N] matrix `second` ([B, K, N]) is an expand of over the
    batch, else None."""
    node = b.resolve(second)
    if node.op != "call_function" or node.target != aten.expand_copy.default:
        return None
    static = b.static(as_node(node.args[0]))
    if static is None or not 2 <= static.dim() <= 3 or math.prod(static.shape[:-2]) != 1 \
            or list(static.shape[-2:]) != shape_of(second)[-2:]:
        return None
    return static.reshape(static.shape[-2:])


def emit_bmm(b: GraphBuilder, node: Node) -> None:
    """A bmm, or, when its second operand is a constant matrix broadcast over
    the batch (an unrolled RNN's input projection, a linear on a batch of
    sequences, as matmul decomposes them), a fully connected operator on the
    matrix: its [B, M, K] input is flattened by the operator, and the weight
    is stored once, not once per batch entry."""
    first, second = as_node(node.args[0]), as_node(node.args[1])
    weight = _broadcast_weight(b, second)
    if weight is not None:
        out = fully_connected(b, node, first, weight, None, 1.0, define=False)
        b.define(node, out, lay.identity(3))
        return
    flags = 0
    transposed = next((v for v in b.versions(second) if v.layout == (0, 2, 1)), None) \
        if not b.is_static(second) else None
    if transposed is not None and not any(v.layout == (0, 1, 2) for v in b.versions(second)):
        second_id, flags = transposed.id, TRANSPOSE_B
    else:
        second_id = b.get_contiguous(second)
    out_shape = shape_of(node)
    out = b.value(out_shape)
    b.add_node(G.NodeKind.BATCH_MATRIX_MULTIPLY,
               G.Node2x1(b.get_contiguous(first), second_id, out, flags), owner=node)
    b.define(node, out, lay.identity(3))


EMITTERS: dict[object, Emitter] = {
    aten.addmm.default: emit_addmm,
    aten.mm.default: emit_mm,
    aten.bmm.default: emit_bmm,
}
