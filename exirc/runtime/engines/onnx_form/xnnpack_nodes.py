"""Each XNNPACK node kind as ONNX nodes, with the semantics the torch path gives it.

An emitter takes the builder and one (clamp-fused, checked) float32 node and
appends the ONNX nodes computing it. Where XNNPACK and ONNX agree by
definition the mapping is one node: numpy broadcasting for binary ops,
softmax over the last dim, erf GELU, `x * relu6(x + 3) / 6` hardswish,
padded elements never picked by max pooling and never counted by average
pooling (count_include_pad=0). Filters are brought from XNNPACK's layouts
into ONNX's (the same as torch's, see `linear.py`) once, here. Anything an
emitter cannot express exactly raises `NotMapped`, e.g. a filter computed at
run time, or a pooling padding as wide as its window (which ONNX refuses).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy

from exirc.runtime.delegates.xnnpack.linear import FLAG_TRANSPOSE_WEIGHTS
from exirc.runtime.delegates.xnnpack.pooling import FLAG_ALIGN_CORNERS, FLAG_KEEP_DIMS
from exirc.runtime.delegates.xnnpack.shapes import CONCAT_INPUTS
from exirc.runtime.engines.onnx_form.builder import NotMapped, OnnxBuilder, clamp_bounds, value_name
from exirc.serialize.xnnpack import graph as G

Emitter = Callable[[OnnxBuilder, G.Node], None]

UNARY = {
    G.NodeKind.ABS: "Abs", G.NodeKind.CEILING: "Ceil", G.NodeKind.FLOOR: "Floor",
    G.NodeKind.NEGATE: "Neg", G.NodeKind.SQUARE_ROOT: "Sqrt", G.NodeKind.LOG: "Log",
    G.NodeKind.EXP: "Exp", G.NodeKind.SIN: "Sin", G.NodeKind.COS: "Cos",
    G.NodeKind.TANH: "Tanh", G.NodeKind.SIGMOID: "Sigmoid", G.NodeKind.GELU: "Gelu",
    G.NodeKind.HARDSWISH: "HardSwish", G.NodeKind.COPY: "Identity",
    G.NodeKind.CONVERT: "Identity",  # float32 to float32 only (checked by the caller)
}

BINARY = {
    G.NodeKind.ADD: "Add", G.NodeKind.SUBTRACT: "Sub", G.NodeKind.MULTIPLY: "Mul",
    G.NodeKind.DIV: "Div", G.NodeKind.MINIMUM: "Min", G.NodeKind.MAXIMUM: "Max",
}

INT64_MAX = 2**63 - 1


def _unary(b: OnnxBuilder, node: G.Node) -> None:
    p = node.params
    assert isinstance(p, G.Node1x1)
    b.node(UNARY[node.kind], [b.read(p.input_id)], [value_name(p.output_id)])


def _square(b: OnnxBuilder, node: G.Node) -> None:
    p = node.params
    assert isinstance(p, G.Node1x1)
    x = b.read(p.input_id)
    b.node("Mul", [x, x], [value_name(p.output_id)])


def _rsqrt(b: OnnxBuilder, node: G.Node) -> None:
    p = node.params
    assert isinstance(p, G.Node1x1)
    b.node("Reciprocal", [b.node("Sqrt", [b.read(p.input_id)])], [value_name(p.output_id)])


def _clamp(b: OnnxBuilder, node: G.Node) -> None:
    p = node.params
    assert isinstance(p, G.Node1x1)
    b.clamp(b.read(p.input_id), clamp_bounds(node), value_name(p.output_id))


def _softmax(b: OnnxBuilder, node: G.Node) -> None:
    p = node.params
    assert isinstance(p, G.Node1x1)
    b.node("Softmax", [b.read(p.input_id)], [value_name(p.output_id)], axis=-1)


def _elu(b: OnnxBuilder, node: G.Node) -> None:
    p = node.params
    assert isinstance(p, G.ELU)
    b.node("Elu", [b.read(p.input_id)], [value_name(p.output_id)], alpha=float(p.alpha))


def _leaky_relu(b: OnnxBuilder, node: G.Node) -> None:
    p = node.params
    assert isinstance(p, G.LeakyReLU)
    b.node("LeakyRelu", [b.read(p.input_id)], [value_name(p.output_id)],
          alpha=float(p.negative_slope))


def _prelu(b: OnnxBuilder, node: G.Node) -> None:
    # The slope ([C] or [1], checked at compile) broadcasts along the last dim, as
    # ONNX's unidirectional broadcasting does.
    p = node.params
    assert isinstance(p, G.Node2x1)
    b.node("PRelu", [b.read(p.input1_id), b.read(p.input2_id)], [value_name(p.output_id)])


def _binary(b: OnnxBuilder, node: G.Node) -> None:
    p = node.params
    assert isinstance(p, G.Node2x1)
    bounds = clamp_bounds(node)
    target = value_name(p.output_id)
    result = b.node(BINARY[node.kind], [b.read(p.input1_id), b.read(p.input2_id)],
                   None if bounds else [target])
    if bounds:
        b.clamp(result, bounds, target)


def _fully_connected(b: OnnxBuilder, node: G.Node) -> None:
    """x @ W (+ bias): W is [I, O] for ONNX's MatMul, whatever layout the blob has."""
    p = node.params
    assert isinstance(p, G.FullyConnected)
    weight = b.require_constant(p.filter_id, "filter")
    if not p.flags & FLAG_TRANSPOSE_WEIGHTS:
        weight = weight.T  # [O, I] -> [I, O]
    bounds = clamp_bounds(node)
    target = value_name(p.output_id)
    direct = None if bounds else [target]
    product = b.node("MatMul", [b.read(p.input1_id),
                               b.array("weight", numpy.ascontiguousarray(weight))],
                    direct if p.bias_id == G.INVALID_VALUE_ID else None)
    if p.bias_id != G.INVALID_VALUE_ID:
        b.require_constant(p.bias_id, "bias")
        product = b.node("Add", [product, b.read(p.bias_id)], direct)
    if bounds:
        b.clamp(product, bounds, target)


def _onnx_filter(kind: G.NodeKind, p: G.Conv, f: numpy.ndarray) -> numpy.ndarray:
    """XNNPACK's filter in ONNX's layout (the same as torch's, see `linear.ConvGeometry`)."""
    if kind == G.NodeKind.DEPTHWISE_CONV2D:  # [1, KH, KW, C*M] -> [C*M, 1, KH, KW]
        return numpy.ascontiguousarray(f.transpose(3, 0, 1, 2))
    if kind == G.NodeKind.CONV2D:  # [O, KH, KW, I/G] -> [O, I/G, KH, KW]
        return numpy.ascontiguousarray(f.transpose(0, 3, 1, 2))
    # Deconvolution: [G*Og, KH, KW, Ig] -> [G*Ig, Og, KH, KW]
    g, gin, gout = p.groups, p.group_input_channels, p.group_output_channels
    kh, kw = p.kernel_height, p.kernel_width
    f = f.transpose(0, 3, 1, 2).reshape(g, gout, gin, kh, kw).transpose(0, 2, 1, 3, 4)
    return numpy.ascontiguousarray(f.reshape(g * gin, gout, kh, kw))


def _convolution(b: OnnxBuilder, node: G.Node) -> None:
    """Conv, depthwise conv and ConvTranspose, on an NCHW view of the NHWC input."""
    p = node.params
    assert isinstance(p, G.Conv)
    weight = _onnx_filter(node.kind, p, b.require_constant(p.filter_id, "filter"))
    inputs = [b.to_nchw(b.read(p.input1_id)), b.array("filter", weight)]
    if p.bias_id != G.INVALID_VALUE_ID:
        b.require_constant(p.bias_id, "bias")
        inputs.append(b.read(p.bias_id))
    attributes: dict[str, Any] = {
        "pads": [p.padding_top, p.padding_left, p.padding_bottom, p.padding_right],
        "strides": [p.subsampling_height, p.subsampling_width],
        "dilations": [p.dilation_height, p.dilation_width],
        "kernel_shape": [p.kernel_height, p.kernel_width],
        "group": p.groups,
    }
    if node.kind == G.NodeKind.CONV_TRANSPOSE2D:
        result = b.node("ConvTranspose", inputs, output_padding=[p.adjustment_height,
                                                                p.adjustment_width],
                       **attributes)
    else:
        result = b.node("Conv", inputs, **attributes)
    _finish_nchw(b, node, result, p.output_id)


def _finish_nchw(b: OnnxBuilder, node: G.Node, result: str, output_id: int) -> None:
    """Clamp an NCHW result (where ORT fuses it into its producer), then back to NHWC."""
    bounds = clamp_bounds(node)
    if bounds:
        result = b.clamp(result, bounds, b.fresh("clamped"))
    b.to_nhwc(result, value_name(output_id))


def _pooling(b: OnnxBuilder, node: G.Node) -> None:
    p = node.params
    assert isinstance(p, G.Pooling2D)
    # XNN_FLAG_KEEP_DIMS (ExecuTorch sets it) changes nothing on a 2-D pooling.
    if max(p.padding_top, p.padding_bottom) >= p.pooling_height or \
            max(p.padding_left, p.padding_right) >= p.pooling_width:
        raise NotMapped("its padding is as wide as its window")
    attributes: dict[str, Any] = {
        "pads": [p.padding_top, p.padding_left, p.padding_bottom, p.padding_right],
        "strides": [p.stride_height, p.stride_width],
        "kernel_shape": [p.pooling_height, p.pooling_width],
    }
    x = b.to_nchw(b.read(p.input_id))
    if node.kind == G.NodeKind.MAX_POOLING_2D:
        result = b.node("MaxPool", [x], dilations=[p.dilation_height, p.dilation_width],
                       **attributes)
    else:  # XNNPACK's average pooling has no dilation; the torch path ignores it too
        result = b.node("AveragePool", [x], count_include_pad=0, **attributes)
    _finish_nchw(b, node, result, p.output_id)


def _resize_bilinear(b: OnnxBuilder, node: G.Node) -> None:
    """As the torch path resizes (F.interpolate, bilinear, to the node's size):
    Resize in torch's own coordinate mapping (what torch.onnx exports it as);
    weights computed in another order move results in the last bits."""
    p = node.params
    assert isinstance(p, G.StaticResizeBilinear2D)
    dims = b.shapes.get(p.input_id)
    if dims is None or len(dims) != 4:
        raise NotMapped(f"its input's dims {dims} are not NHWC")
    mode = "align_corners" if p.flags & FLAG_ALIGN_CORNERS else "pytorch_half_pixel"
    sizes = b.ints("sizes", [dims[0], dims[3], p.new_height, p.new_width])
    result = b.node("Resize", [b.to_nchw(b.read(p.input_id)), "", "", sizes], mode="linear",
                   coordinate_transformation_mode=mode)
    _finish_nchw(b, node, result, p.output_id)


def _global_average_pooling(b: OnnxBuilder, node: G.Node) -> None:
    p = node.params
    assert isinstance(p, G.Node1x1)
    keep = 1 if p.flags & FLAG_KEEP_DIMS else 0
    bounds = clamp_bounds(node)
    target = value_name(p.output_id)
    dims = b.shapes.get(p.input_id)
    if dims is not None and len(dims) == 4 and dims[3] == 1:
        # One channel: a mean over the last dim lowered to XNNPACK (an RMSNorm's).
        # onnxruntime reduces [N, H, W, 1] over H, W on its slow general path
        # (~35 us against ~6 for [16, 768]); as [N, H * W] over its last axis, on
        # its fast one. The sum's order changes with the path: results move in
        # the last bits.
        flat = b.node("Reshape", [b.read(p.input_id), b.ints("shape", [dims[0], -1])])
        mean = b.node("ReduceMean", [flat, b.ints("axes", [1])], keepdims=1)
        result = b.node("Reshape", [mean, b.ints("shape", [dims[0], 1, 1, 1] if keep else
                                                 [dims[0], 1])], None if bounds else [target])
    else:
        result = b.node("ReduceMean", [b.read(p.input_id), b.ints("axes", [1, 2])],
                       None if bounds else [target], keepdims=keep)
    if bounds:
        b.clamp(result, bounds, target)


def _transpose(b: OnnxBuilder, node: G.Node) -> None:
    p = node.params
    assert isinstance(p, G.StaticTranspose)
    b.node("Transpose", [b.read(p.input_id)], [value_name(p.output_id)], perm=list(p.perm))


def _reshape(b: OnnxBuilder, node: G.Node) -> None:
    # ExecuTorch writes the one inferred dim as 0; ONNX's Reshape infers -1 (and
    # would read 0 as "copy this dim").
    p = node.params
    assert isinstance(p, G.StaticReshape)
    shape = [-1 if d == 0 else d for d in p.new_shape]
    b.node("Reshape", [b.read(p.input_id), b.ints("shape", shape)], [value_name(p.output_id)])


def _slice(b: OnnxBuilder, node: G.Node) -> None:
    p = node.params
    assert isinstance(p, G.StaticSlice)
    ends = [INT64_MAX if size == 0 else offset + size for offset, size in zip(p.offsets,
                                                                               p.sizes)]
    b.node("Slice", [b.read(p.input_id), b.ints("starts", list(p.offsets)),
                    b.ints("ends", ends), b.ints("axes", list(range(p.num_dims)))],
          [value_name(p.output_id)])


def _constant_pad(b: OnnxBuilder, node: G.Node) -> None:
    p = node.params
    assert isinstance(p, G.StaticConstantPad)
    pads = b.ints("pads", [*p.pre_paddings, *p.post_paddings])
    b.node("Pad", [b.read(p.input_id), pads, b.floats("fill", [p.padding_value])],
          [value_name(p.output_id)], mode="constant")


def _concatenate(b: OnnxBuilder, node: G.Node) -> None:
    p = node.params
    assert isinstance(p, G.Concatenate)
    ids = [p.input1_id, p.input2_id, p.input3_id, p.input4_id, p.input5_id]
    used = ids[:CONCAT_INPUTS[node.kind]]
    b.node("Concat", [b.read(value_id) for value_id in used], [value_name(p.output_id)],
          axis=p.axis)


def _batch_matrix_multiply(b: OnnxBuilder, node: G.Node) -> None:
    p = node.params
    assert isinstance(p, G.Node2x1)
    second = b.read(p.input2_id)
    if p.flags & FLAG_TRANSPOSE_WEIGHTS:  # input 2 is [.., N, K]: swap its last two dims
        rank = b.rank(p.input2_id)
        if rank < 2:
            raise NotMapped(f"XNN_FLAG_TRANSPOSE_B of a rank-{rank} input")
        second = b.node("Transpose", [second],
                       perm=[*range(rank - 2), rank - 1, rank - 2])
    b.node("MatMul", [b.read(p.input1_id), second], [value_name(p.output_id)])


EMITTERS: dict[G.NodeKind, Emitter] = {
    **{kind: _unary for kind in UNARY},
    **{kind: _binary for kind in BINARY},
    G.NodeKind.SQUARE: _square,
    G.NodeKind.RECIPROCAL_SQUARE_ROOT: _rsqrt,
    G.NodeKind.CLAMP: _clamp,
    G.NodeKind.SOFTMAX: _softmax,
    G.NodeKind.ELU: _elu,
    G.NodeKind.LEAKY_RELU: _leaky_relu,
    G.NodeKind.PRELU: _prelu,
    G.NodeKind.FULLY_CONNECTED: _fully_connected,
    G.NodeKind.CONV2D: _convolution,
    G.NodeKind.DEPTHWISE_CONV2D: _convolution,
    G.NodeKind.CONV_TRANSPOSE2D: _convolution,
    G.NodeKind.MAX_POOLING_2D: _pooling,
    G.NodeKind.AVG_POOLING_2D: _pooling,
    G.NodeKind.GLOBAL_AVG_POOLING_2D: _global_average_pooling,
    G.NodeKind.STATIC_RESIZE_BILINEAR_2D: _resize_bilinear,
    G.NodeKind.STATIC_TRANSPOSE: _transpose,
    G.NodeKind.STATIC_RESHAPE: _reshape,
    G.NodeKind.STATIC_SLICE: _slice,
    G.NodeKind.STATIC_CONSTANT_PAD: _constant_pad,
    **{kind: _concatenate for kind in CONCAT_INPUTS},
    G.NodeKind.BATCH_MATRIX_MULTIPLY: _batch_matrix_multiply,
}
"""The node kinds the ONNX form takes (float32 only); any other keeps the delegate on torch."""
