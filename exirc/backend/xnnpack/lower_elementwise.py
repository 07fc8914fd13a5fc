"""Emitters of elementwise operators: unary math, clamps, binary arithmetic.

Elementwise operators do not care how their tensor is laid out, so each
runs in whatever layout its operands already have (binary ones pick the
layout that needs the fewest conversions), and chains of them after a
convolution stay NHWC. A clamp (relu, hardtanh, clamp) whose input is
computed by an operator XNNPACK can clamp becomes that operator's
output_min_max instead of a node.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch.fx import Node

from exirc.backend.xnnpack import layout as lay
from exirc.backend.xnnpack.args import arg, as_float, as_ints, as_node
from exirc.backend.xnnpack.builder import GraphBuilder, Operand, shape_of
from exirc.backend.xnnpack.layout import Layout
from exirc.backend.xnnpack.qdq import clamp_bounds, is_dq, is_q
from exirc.serialize.xnnpack import graph as G

aten = torch.ops.aten
Emitter = Callable[[GraphBuilder, Node], None]

UNARY: dict[object, G.NodeKind] = {
    aten.sigmoid.default: G.NodeKind.SIGMOID,
    aten.tanh.default: G.NodeKind.TANH,
    aten.abs.default: G.NodeKind.ABS,
    aten.neg.default: G.NodeKind.NEGATE,
    aten.sqrt.default: G.NodeKind.SQUARE_ROOT,
    aten.rsqrt.default: G.NodeKind.RECIPROCAL_SQUARE_ROOT,
    aten.floor.default: G.NodeKind.FLOOR,
    aten.ceil.default: G.NodeKind.CEILING,
    aten.exp.default: G.NodeKind.EXP,
    aten.log.default: G.NodeKind.LOG,
    aten.sin.default: G.NodeKind.SIN,
    aten.cos.default: G.NodeKind.COS,
    aten.gelu.default: G.NodeKind.GELU,
    aten.hardswish.default: G.NodeKind.HARDSWISH,
}

BINARY: dict[object, G.NodeKind] = {
    aten.add.Tensor: G.NodeKind.ADD,
    aten.add.Scalar: G.NodeKind.ADD,
    aten.sub.Tensor: G.NodeKind.SUBTRACT,
    aten.sub.Scalar: G.NodeKind.SUBTRACT,
    aten.mul.Tensor: G.NodeKind.MULTIPLY,
    aten.mul.Scalar: G.NodeKind.MULTIPLY,
    aten.div.Tensor: G.NodeKind.DIV,
    aten.div.Scalar: G.NodeKind.DIV,
    aten.minimum.default: G.NodeKind.MINIMUM,
    aten.maximum.default: G.NodeKind.MAXIMUM,
}

INF = math.inf


def unary(b: GraphBuilder, kind: G.NodeKind, node: Node, source: Operand,
          params: Callable[[int, int], G.NodeParams] | None = None) -> None:
    """`node` = kind(source), in a layout source already has (the one its
    users want, when it has several)."""
    version = b.get(source, _existing_layout(b, source, node))
    out = b.value(lay.physical_shape(shape_of(node), version.layout))
    made = params(version.id, out) if params is not None else G.Node1x1(version.id, out)
    b.add_node(kind, made, owner=node)
    b.define(node, out, version.layout)


def _existing_layout(b: GraphBuilder, source: Operand, node: Node) -> Layout | None:
    """Of source's copies, the layout that suits node's users best (None: any)."""
    if not isinstance(source, Node) or b.is_static(source) or len(b.versions(source)) < 2:
        return None
    wanted = demands(node)
    shape = shape_of(node)
    return min((v.layout for v in b.versions(source)),
               key=lambda layout: sum(not lay.same_memory(shape, w, layout) for w in wanted))


# Users that read their input (argument 0) in one layout: NHWC for the
# image operators, PyTorch's for reshapes and matrix products.
NHWC_READERS = frozenset({
    aten.convolution.default, aten.max_pool2d.default, aten.max_pool2d_with_indices.default,
    aten.avg_pool2d.default, aten._adaptive_avg_pool2d.default,
    aten.upsample_bilinear2d.vec, aten.upsample_bilinear2d.default})
PLAIN_READERS = frozenset({aten.view_copy.default, aten.mm.default, aten.bmm.default,
                           aten.native_group_norm.default})


def demands(node: Node) -> list[Layout]:
    """The layouts `node`'s users will ask for (the partition's output: PyTorch's).
    A quantize is seen through: its dequantizes' readers read the same tensor."""
    rank = len(shape_of(node))
    wants = []
    readers = [(user, node) for user in node.users]
    for user in node.users:
        if is_q(user):
            readers += [(reader, dq) for dq in user.users if is_dq(dq) for reader in dq.users]
    for user, source in readers:
        if user.op == "output" or (user.target in PLAIN_READERS and user.args[0] is source):
            wants.append(lay.identity(rank))
        elif user.target in NHWC_READERS and user.args[0] is source and rank in (3, 4):
            wants.append(lay.channels_last(rank))
    return wants


def choose_layout(b: GraphBuilder, operands: Sequence[Operand], rank: int,
                  node: Node | None = None) -> Layout:
    """The layout, among those the runtime operands already have, that needs
    the fewest conversions of the operands and, for `node`'s result, of what
    its users will ask for (ties: the first operand's)."""
    runtime = [x for x in operands if isinstance(x, Node) and not b.is_static(x)]
    candidates = [v.layout for x in runtime if len(shape_of(x)) == rank for v in b.versions(x)]
    candidates.append(lay.identity(rank))
    wanted = demands(node) if node is not None else []
    shape = shape_of(node) if node is not None else []

    def cost(layout: Layout) -> int:
        missing = 0
        for x in runtime:
            want = lay.project(layout, rank, len(shape_of(x)))
            if not any(v.layout == want for v in b.versions(x)):
                missing += 1
        return missing + sum(not lay.same_memory(shape, w, layout) for w in wanted)

    return min(candidates, key=cost)


def binary(b: GraphBuilder, kind: G.NodeKind, node: Node, first: Operand, second: Operand,
           min_max: tuple[float, float] | None = None) -> None:
    """`node` = kind(first, second) with broadcasting, in a shared layout."""
    out_shape = shape_of(node)
    layout = choose_layout(b, [first, second], len(out_shape), node)
    a = b.broadcast_operand(first, layout)
    c = b.broadcast_operand(second, layout)
    out = b.value(lay.physical_shape(out_shape, layout))
    b.add_node(kind, G.Node2x1(a, c, out), owner=node, min_max=min_max)
    b.define(node, out, layout)


def number(value: object) -> torch.Tensor:
    """A Python number as the 0-d fp32 constant XNNPACK broadcasts."""
    return torch.tensor(as_float(value), dtype=torch.float32)


def _operand(b: GraphBuilder, arg: object) -> Operand:
    if isinstance(arg, Node):
        tensor = b.static(arg)
        # A constant of another dtype (an integer scalar made a tensor):
        # PyTorch computes in the result's dtype, fp32, so convert it now.
        return tensor.to(torch.float32) if tensor is not None else arg
    return number(arg)


def emit_binary(b: GraphBuilder, node: Node) -> None:
    first, second = _operand(b, node.args[0]), _operand(b, node.args[1])
    alpha = node.kwargs.get("alpha", 1)
    if alpha != 1:
        assert isinstance(second, torch.Tensor)  # support.py takes alpha only then
        second = second * as_float(alpha)
    binary(b, BINARY[node.target], node, first, second)


def emit_unary(b: GraphBuilder, node: Node) -> None:
    if node.target == aten.gelu.default and node.kwargs.get("approximate") == "tanh":
        emit_gelu_tanh(b, node)
        return
    unary(b, UNARY[node.target], node, as_node(node.args[0]))


def emit_gelu_tanh(b: GraphBuilder, node: Node) -> None:
    """GELU's tanh form, which XNNPACK's (exact) gelu is not: as
    x * sigmoid(2k * (x + 0.044715 x^3)), k = sqrt(2 / pi), the same function
    (0.5 * (1 + tanh(z)) = sigmoid(2z)) in six nodes."""
    version = b.get(as_node(node.args[0]))
    x, two_k = version.id, 2 * math.sqrt(2 / math.pi)
    cubic = b.binary_op(G.NodeKind.MULTIPLY, b.unary_op(G.NodeKind.SQUARE, x),
                        b.static_value(number(two_k * 0.044715)))
    inner = b.binary_op(G.NodeKind.MULTIPLY, x, b.binary_op(
        G.NodeKind.ADD, cubic, b.static_value(number(two_k))))
    gate = b.unary_op(G.NodeKind.SIGMOID, inner)
    b.define(node, b.binary_op(G.NodeKind.MULTIPLY, x, gate, owner=node), version.layout)


def emit_clamp(b: GraphBuilder, node: Node) -> None:
    source = as_node(node.args[0])
    low, high = clamp_bounds(node)
    producer = b.fusable_producer(node, source)
    if producer is not None:
        old_low, old_high = producer.output_min_max or (-INF, INF)
        producer.output_min_max = (max(low, old_low), min(high, old_high))
        b.alias(node, source)
        return
    version = b.get(source)
    out = b.value(lay.physical_shape(shape_of(node), version.layout))
    b.add_node(G.NodeKind.CLAMP, G.Node1x1(version.id, out), owner=node, min_max=(low, high))
    b.define(node, out, version.layout)


def emit_leaky_relu(b: GraphBuilder, node: Node) -> None:
    slope = as_float(arg(node, 1, "negative_slope", 0.01))
    unary(b, G.NodeKind.LEAKY_RELU, node, as_node(node.args[0]),
          lambda i, o: G.LeakyReLU(slope, i, o))


def emit_elu(b: GraphBuilder, node: Node) -> None:
    alpha = as_float(arg(node, 1, "alpha", 1.0))
    unary(b, G.NodeKind.ELU, node, as_node(node.args[0]), lambda i, o: G.ELU(alpha, i, o))


# pow(x, e) for the exponents XNNPACK has an operator for.
POWERS = {2.0: G.NodeKind.SQUARE, 0.5: G.NodeKind.SQUARE_ROOT,
          -0.5: G.NodeKind.RECIPROCAL_SQUARE_ROOT}


def emit_pow(b: GraphBuilder, node: Node) -> None:
    source, exponent = as_node(node.args[0]), as_float(node.args[1])
    if exponent == 1.0:
        b.alias(node, source)
    elif exponent == -1.0:
        binary(b, G.NodeKind.DIV, node, number(1.0), source)
    elif exponent in (3.0, 4.0):
        # x*x*x (GELU's tanh form has it) and (x*x)**2, from the square.
        version = b.get(source)
        square = b.value(b.graph.values[version.id].dims)
        b.add_node(G.NodeKind.SQUARE, G.Node1x1(version.id, square))
        out = b.value(b.graph.values[version.id].dims)
        if exponent == 3.0:
            b.add_node(G.NodeKind.MULTIPLY, G.Node2x1(square, version.id, out), owner=node)
        else:
            b.add_node(G.NodeKind.SQUARE, G.Node1x1(square, out), owner=node)
        b.define(node, out, version.layout)
    else:
        unary(b, POWERS[exponent], node, source)


def emit_reciprocal(b: GraphBuilder, node: Node) -> None:
    binary(b, G.NodeKind.DIV, node, number(1.0), as_node(node.args[0]))


def emit_same(b: GraphBuilder, node: Node) -> None:
    """clone, a same-dtype _to_copy, alias: the same tensor, no node (an
    output that is also an input still gets its own copy, see mark_output)."""
    b.alias(node, as_node(node.args[0]))


def emit_expand(b: GraphBuilder, node: Node) -> None:
    """expand as a multiply by ones shaped like the expanded dims: XNNPACK has
    no broadcast operator, but its binary operators broadcast, exactly."""
    source = as_node(node.args[0])
    out_shape = shape_of(node)
    padded = [1] * (len(out_shape) - len(shape_of(source))) + shape_of(source)
    ones_shape = [o if p == 1 and o != 1 else 1 for p, o in zip(padded, out_shape)]
    if all(d == 1 for d in ones_shape) and len(padded) == len(shape_of(source)):
        b.alias(node, source)
        return
    binary(b, G.NodeKind.MULTIPLY, node, source, torch.ones(ones_shape))


def tile(b: GraphBuilder, node: Node, source: Node, factors: dict[int, int],
         outer: bool) -> None:
    """`node` = source with logical dim d copied factors[d] times: each whole
    dim over again (`outer`, repeat) or each element in place (nearest
    upsampling). XNNPACK has no tiling operator; give each copied dim an
    axis of its own next to it, multiply by ones that long on those axes
    (broadcasting copies exactly), and reshape. Any layout of source works."""
    version = b.get(source)
    rank = len(shape_of(node))
    shape = [1] * (rank - len(shape_of(source))) + shape_of(source)
    offset = rank - len(shape_of(source))
    layout = tuple(range(offset)) + tuple(d + offset for d in version.layout)
    spread, ones = [], []
    for dim in layout:
        copies = factors.get(dim, 1)
        pieces = [(shape[dim], 1)]
        if copies > 1:
            pieces.insert(0 if outer else 1, (1, copies))
        for size, count in pieces:
            spread.append(size)
            ones.append(count)
    wide = b.binary_op(G.NodeKind.MULTIPLY, b.reshape(version.id, spread),
                       b.static_value(torch.ones(ones)), owner=node)
    b.define(node, b.reshape(wide, lay.physical_shape(shape_of(node), layout)), layout)


def emit_repeat(b: GraphBuilder, node: Node) -> None:
    repeats = as_ints(node.args[1])
    tile(b, node, as_node(node.args[0]), dict(enumerate(repeats)), outer=True)


def emit_clamp_tensor(b: GraphBuilder, node: Node) -> None:
    """clamp with tensor bounds: maximum with the low one, minimum with the high one."""
    source = as_node(node.args[0])
    low, high = arg(node, 1, "min"), arg(node, 2, "max")
    operands = [source] + [_operand(b, t) for t in (low, high) if t is not None]
    layout = choose_layout(b, operands, len(shape_of(node)), node)
    result = b.broadcast_operand(source, layout)
    for kind, bound in ((G.NodeKind.MAXIMUM, low), (G.NodeKind.MINIMUM, high)):
        if bound is not None:
            result = b.binary_op(kind, result, b.broadcast_operand(_operand(b, bound), layout),
                                 owner=node)
    b.define(node, b.reshape(result, lay.physical_shape(shape_of(node), layout)), layout)


EMITTERS: dict[object, Emitter] = {
    **{op: emit_unary for op in UNARY},
    **{op: emit_binary for op in BINARY},
    aten.relu.default: emit_clamp,
    aten.hardtanh.default: emit_clamp,
    aten.clamp.default: emit_clamp,
    aten.leaky_relu.default: emit_leaky_relu,
    aten.elu.default: emit_elu,
    aten.pow.Tensor_Scalar: emit_pow,
    aten.reciprocal.default: emit_reciprocal,
    aten.clone.default: emit_same,
    aten._to_copy.default: emit_same,
    aten.alias_copy.default: emit_same,
    aten.expand_copy.default: emit_expand,
    aten.repeat.default: emit_repeat,
    aten.clamp.Tensor: emit_clamp_tensor,
}
