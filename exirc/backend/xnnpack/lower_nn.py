"""Emitters of the image operators XNNPACK runs on NHWC values: convolution
(1-d, 2-d, depthwise, transposed), max and average pooling, and resizing.

Their inputs are asked for in NHWC (the builder converts only values that
are not NHWC yet) and their outputs are defined as NHWC, so a chain of them
stays NHWC. A convolution whose only user is a batch norm of constants
takes the batch norm into its filter and bias.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

from exirc.backend.xnnpack import layout as lay
from exirc.backend.xnnpack.args import arg, as_float, as_int, as_ints, as_node, pair
from exirc.backend.xnnpack.builder import GraphBuilder, shape_of
from exirc.backend.xnnpack.lower_elementwise import Emitter, tile
from exirc.backend.xnnpack.weights import (
    ConvShape,
    batch_norm_affine,
    conv_filter,
    fold_batch_norm,
)
from exirc.serialize.xnnpack import graph as G

aten = torch.ops.aten
NHWC = lay.channels_last(4)
NLC = lay.channels_last(3)
ALIGN_CORNERS = 0x8  # XNN_FLAG_ALIGN_CORNERS
KEEP_DIMS = 0x40  # XNN_FLAG_KEEP_DIMS
BATCH_NORM = aten._native_batch_norm_legit_no_training.default


def folded_batch_norm(b: GraphBuilder, conv: Node) -> Node | None:
    """The batch norm `conv`'s filter absorbs: its only user, with constant statistics."""
    users = list(conv.users)
    if len(users) != 1 or users[0].target != BATCH_NORM or users[0].args[0] is not conv:
        return None
    bn = users[0]
    if not all(a is None or b.is_static(as_node(a)) for a in bn.args[1:5]):
        return None
    return bn


def _statistics(b: GraphBuilder, bn: Node) -> tuple[Any, Any, Any, Any]:
    """A batch norm's weight, bias, running mean and variance (None if absent)."""
    weight, bias, mean, var = (None if a is None else b.static(as_node(a)) for a in bn.args[1:5])
    return weight, bias, mean, var


def _zero_pad_of_spatial_dims(b: GraphBuilder, x: Node, spatial: int) -> Node | None:
    """The input of x if x only zero-pads the last `spatial` dims for this
    convolution alone: XNNPACK convolutions take padding per side, so the
    pad (say, TensorFlow's asymmetric "same") costs no node of its own."""
    if x.op != "call_function" or x.target != aten.constant_pad_nd.default \
            or len(x.users) != 1:
        return None
    pads, value = as_ints(x.args[1]), arg(x, 2, "value", 0.0)
    if (value or 0.0) != 0.0 or any(p < 0 for p in pads) or any(pads[2 * spatial:]):
        return None
    source = as_node(x.args[0])
    return None if b.is_static(source) else source


@dataclass(frozen=True)
class ConvArgs:
    """A convolution's arguments as a 2-d one's: a 1-d convolution is a 2-d one of
    height 1 (its NLC input read as N,1,L,C)."""

    one_d: bool
    pad: list[int]
    step: list[int]
    dil: list[int]
    adj: list[int]
    groups: int
    transposed: bool

    @classmethod
    def of(cls, node: Node) -> ConvArgs:
        args: list[Any] = list(node.args[3:9])
        stride, padding, dilation, transposed, out_pad, groups = args
        one_d = len(shape_of(as_node(node.args[1]))) == 3
        if one_d:
            stride, padding, dilation, out_pad = ([1, *stride], [0, *padding],
                                                  [1, *dilation], [0, *out_pad])
        return cls(one_d, pair(padding, 0), pair(stride, 1), pair(dilation, 1),
                   pair(out_pad, 0), as_int(groups), bool(transposed))

    def read(self, b: GraphBuilder, x: Node) -> int:
        """x as the operator reads it: NHWC (1-d: NLC as N,1,L,C)."""
        if not self.one_d:
            return b.get(x, NHWC).id
        n, c, length = shape_of(x)
        return b.reshape(b.get(x, NLC).id, [n, 1, length, c])

    def out_dims(self, out_shape: list[int]) -> list[int]:
        return ([out_shape[0], 1, out_shape[2], out_shape[1]] if self.one_d
                else lay.physical_shape(out_shape, NHWC))

    def define(self, b: GraphBuilder, node: Node, out: int) -> None:
        """node is the operator's output value `out` (1-d: seen as NLC)."""
        if self.one_d:
            b.define(node, b.reshape(out, lay.physical_shape(shape_of(node), NLC)), NLC)
        else:
            b.define(node, out, NHWC)

    def node(self, conv: ConvShape, kernel: Sequence[int], extra: Sequence[int], source: int,
             filter_id: int, bias_id: int, out: int) -> tuple[G.NodeKind, G.Conv]:
        """The XNNPACK node; `extra` is [top, bottom, left, right] padding added to the
        convolution's own (a zero pad it absorbs)."""
        kind = (G.NodeKind.DEPTHWISE_CONV2D if conv.depthwise else
                G.NodeKind.CONV_TRANSPOSE2D if conv.transposed else G.NodeKind.CONV2D)
        pad, step, dil, adj = self.pad, self.step, self.dil, self.adj
        return kind, G.Conv(
            padding_top=pad[0] + extra[0], padding_right=pad[1] + extra[3],
            padding_bottom=pad[0] + extra[1], padding_left=pad[1] + extra[2],
            kernel_height=int(kernel[0]), kernel_width=int(kernel[1]),
            subsampling_height=step[0], subsampling_width=step[1],
            dilation_height=dil[0], dilation_width=dil[1],
            group_input_channels=conv.group_input_channels,
            group_output_channels=conv.group_output_channels, groups=conv.groups,
            adjustment_height=adj[0] if conv.transposed else 0,
            adjustment_width=adj[1] if conv.transposed else 0,
            input1_id=source, filter_id=filter_id, bias_id=bias_id, output_id=out)


def emit_convolution(b: GraphBuilder, node: Node) -> None:
    x, w, bias = as_node(node.args[0]), as_node(node.args[1]), node.args[2]
    cargs = ConvArgs.of(node)
    weight = b.static(w)
    assert weight is not None
    bias_t = b.static(as_node(bias)) if bias is not None else None
    conv = ConvShape.of(list(weight.shape), cargs.groups, cargs.transposed)
    bn = folded_batch_norm(b, node)
    if bn is not None:
        weight, bias_t = fold_batch_norm(weight, bias_t, conv, *_statistics(b, bn),
                                         eps=as_float(bn.args[6]))
        b.fused.add(bn)
    # [top, bottom, left, right] added by a zero pad the convolution absorbs.
    extra = [0, 0, 0, 0]
    padded = _zero_pad_of_spatial_dims(b, x, 1 if cargs.one_d else 2)
    if padded is not None and not conv.transposed:
        pads = as_ints(x.args[1]) + [0, 0, 0, 0]
        extra = [pads[2], pads[3], pads[0], pads[1]] if not cargs.one_d else \
            [0, 0, pads[0], pads[1]]
        x = padded
    if cargs.one_d:
        weight = weight.unsqueeze(2)
    out = b.value(cargs.out_dims(shape_of(node)))
    bias_id = G.INVALID_VALUE_ID if bias_t is None else b.static_value(bias_t)
    kind, params = cargs.node(conv, weight.shape[2:], extra, cargs.read(b, x),
                              b.static_value(conv_filter(weight, conv)), bias_id, out)
    b.add_node(kind, params, owner=node)
    cargs.define(b, node, out)


def pool_padding(size: int, out: int, kernel: int, stride: int, pad: int,
                 dilation: int = 1) -> int:
    """Bottom/right padding giving XNNPACK's (floor) output size `out`: more
    than `pad` in ceil mode, whose last window may start in the padding."""
    needed = (out - 1) * stride + dilation * (kernel - 1) + 1 - size - pad
    return max(pad, needed)


def _pool(b: GraphBuilder, node: Node, kind: G.NodeKind, kernel: list[int],
          stride: list[int], padding: list[int], dilation: Sequence[int]) -> None:
    x = as_node(node.args[0])
    in_shape, out_shape = shape_of(x), shape_of(node)
    bottom = pool_padding(in_shape[2], out_shape[2], kernel[0], stride[0], padding[0], dilation[0])
    right = pool_padding(in_shape[3], out_shape[3], kernel[1], stride[1], padding[1], dilation[1])
    source = b.get(x, NHWC).id
    out = b.value(lay.physical_shape(out_shape, NHWC), like=source)  # qint8 max pooling too
    b.add_node(kind, G.Pooling2D(padding[0], right, bottom, padding[1], kernel[0], kernel[1],
                                 stride[0], stride[1], dilation[0], dilation[1], source, out),
               owner=node)
    b.define(node, out, NHWC)


def _is_identity_pool(kernel: list[int], stride: list[int], padding: list[int]) -> bool:
    return kernel == [1, 1] and stride == [1, 1] and padding == [0, 0]


def emit_max_pool(b: GraphBuilder, node: Node) -> None:
    kernel = pair(node.args[1], 1)
    stride = pair(arg(node, 2, "stride"), 0) if arg(node, 2, "stride") else kernel
    padding, dilation = pair(arg(node, 3, "padding"), 0), pair(arg(node, 4, "dilation"), 1)
    if _is_identity_pool(kernel, stride, padding):
        b.alias(node, as_node(node.args[0]))
        return
    _pool(b, node, G.NodeKind.MAX_POOLING_2D, kernel, stride, padding, dilation)


def emit_avg_pool(b: GraphBuilder, node: Node) -> None:
    kernel = pair(node.args[1], 1)
    stride = pair(arg(node, 2, "stride"), 0) if arg(node, 2, "stride") else kernel
    padding = pair(arg(node, 3, "padding"), 0)
    count_include_pad = bool(arg(node, 5, "count_include_pad", True))
    if _is_identity_pool(kernel, stride, padding):
        b.alias(node, as_node(node.args[0]))
        return
    if count_include_pad and any(padding):
        # XNNPACK leaves padding out of the average: pad with zeros first, so
        # they count, as PyTorch's default does.
        version = b.get(as_node(node.args[0]), NHWC)
        padded = b.value([d + 2 * p if i in (1, 2) else d for i, (d, p) in enumerate(
            zip(b.graph.values[version.id].dims, [0, padding[0], padding[1], 0]))])
        b.add_node(G.NodeKind.STATIC_CONSTANT_PAD, G.StaticConstantPad(
            [0, padding[0], padding[1], 0], [0, padding[0], padding[1], 0], 0.0,
            version.id, padded))
        out_shape = shape_of(node)
        out = b.value(lay.physical_shape(out_shape, NHWC))
        b.add_node(G.NodeKind.AVG_POOLING_2D, G.Pooling2D(
            0, 0, 0, 0, kernel[0], kernel[1], stride[0], stride[1], 1, 1, padded, out),
            owner=node)
        b.define(node, out, NHWC)
        return
    _pool(b, node, G.NodeKind.AVG_POOLING_2D, kernel, stride, padding, [1, 1])


def emit_adaptive_avg_pool(b: GraphBuilder, node: Node) -> None:
    """Output sizes dividing the input's: an average pooling with kernel =
    stride = input / output (support.py takes no others)."""
    x = as_node(node.args[0])
    in_shape, out_shape = shape_of(x), shape_of(node)
    kernel = [in_shape[2] // out_shape[2], in_shape[3] // out_shape[3]]
    if kernel == [1, 1]:
        b.alias(node, x)
        return
    if out_shape[2:] == [1, 1]:
        out = b.value(lay.physical_shape(out_shape, NHWC))
        b.add_node(G.NodeKind.GLOBAL_AVG_POOLING_2D,
                   G.Node1x1(b.get(x, NHWC).id, out, KEEP_DIMS), owner=node)
        b.define(node, out, NHWC)
        return
    _pool(b, node, G.NodeKind.AVG_POOLING_2D, kernel, kernel, [0, 0], [1, 1])


def emit_upsample_bilinear(b: GraphBuilder, node: Node) -> None:
    x = as_node(node.args[0])
    out_shape = shape_of(node)
    source = b.get(x, NHWC).id
    out = b.value(lay.physical_shape(out_shape, NHWC))
    flags = ALIGN_CORNERS if bool(node.args[2]) else 0
    b.add_node(G.NodeKind.STATIC_RESIZE_BILINEAR_2D,
               G.StaticResizeBilinear2D(out_shape[2], out_shape[3], source, out, flags),
               owner=node)
    b.define(node, out, NHWC)


def emit_upsample_nearest(b: GraphBuilder, node: Node) -> None:
    """Nearest upsampling by whole factors (XNNPACK has no operator for it)
    copies each pixel in place: a tiling, in whatever layout the input has."""
    x = as_node(node.args[0])
    in_shape, out_shape = shape_of(x), shape_of(node)
    tile(b, node, x, {2: out_shape[2] // in_shape[2], 3: out_shape[3] // in_shape[3]},
         outer=False)


def emit_batch_norm(b: GraphBuilder, node: Node) -> None:
    """Folded into its convolution when it could be; else x * scale + shift
    with per-channel constants, in the layout x has."""
    x = as_node(node.args[0])
    if node in b.fused:
        b.alias(node, x)
        return
    scale, shift = batch_norm_affine(*_statistics(b, node), eps=as_float(node.args[6]))
    rank = len(shape_of(x))
    per_channel = [-1] + [1] * (rank - 2)
    scaled_shape = shape_of(x)
    version = b.get(x)
    mid = b.value(lay.physical_shape(scaled_shape, version.layout))
    b.add_node(G.NodeKind.MULTIPLY, G.Node2x1(
        version.id, b.broadcast_operand(scale.to(torch.float32).reshape(per_channel),
                                        version.layout), mid))
    out = b.value(lay.physical_shape(scaled_shape, version.layout))
    b.add_node(G.NodeKind.ADD, G.Node2x1(
        mid, b.broadcast_operand(shift.to(torch.float32).reshape(per_channel), version.layout),
        out), owner=node)
    b.define(node, out, version.layout)


EMITTERS: dict[object, Emitter] = {
    aten.convolution.default: emit_convolution,
    aten.max_pool2d.default: emit_max_pool,
    aten.max_pool2d_with_indices.default: emit_max_pool,
    aten.avg_pool2d.default: emit_avg_pool,
    aten._adaptive_avg_pool2d.default: emit_adaptive_avg_pool,
    aten.upsample_bilinear2d.vec: emit_upsample_bilinear,
    aten.upsample_bilinear2d.default: emit_upsample_bilinear,
    aten.upsample_nearest2d.vec: emit_upsample_nearest,
    aten.upsample_nearest2d.default: emit_upsample_nearest,
    aten._upsample_nearest_exact2d.vec: emit_upsample_nearest,
    aten._upsample_nearest_exact2d.default: emit_upsample_nearest,
    BATCH_NORM: emit_batch_norm,
}
