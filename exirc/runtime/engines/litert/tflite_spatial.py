"""TFLite forms of ONNX convolution and pooling (see `onnx_to_tflite`).

ONNX lays these out NCHW, TFLite NHWC: each reads its input through a pending
transpose (free after exirc's own NHWC-to-NCHW Transpose) and leaves its
output as an NHWC tensor read back as NCHW. ONNX pads explicitly, TFLite by
SAME or VALID: a padding that is not SAME's for this input is a PAD (of zeros,
or of -inf before a max pool) and VALID. Average pooling is taken only where
TFLite's divisor is ONNX's: no padding, or SAME padding with the padded
elements not counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy

from exirc.runtime.engines.litert.tflite_builder import Value, compose
from exirc.runtime.engines.onnx_form.builder import NotMapped

if TYPE_CHECKING:
    from exirc.runtime.engines.litert.onnx_to_tflite import Converter

NCHW_TO_NHWC = (0, 2, 3, 1)
NHWC_TO_NCHW = (0, 3, 1, 2)


def _padding(c: Converter, source: int, pads: list[int], kernel: tuple[int, int],
             strides: tuple[int, int], dilations: tuple[int, int],
             pad_value: float | None) -> tuple[int, int]:
    """The input to read and the TFLite padding (SAME or VALID) that pad as ONNX
    `pads` do, with a PAD operator (of `pad_value`) when neither does alone (a
    NotMapped if `pad_value` is None: no explicit pad gives the node's answer)."""
    S = c.b.S
    n, h, w, ch = c.b.shapes[source]
    if not any(pads):
        return source, S.Padding.VALID
    same = []
    for size, k, s, d in zip((h, w), kernel, strides, dilations):
        out = -(-size // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        same.append((total // 2, total - total // 2))
    top, left, bottom, right = pads
    if [(top, bottom), (left, right)] == same:
        return source, S.Padding.SAME
    if pad_value is None:
        raise NotMapped(f"padding {pads} is not TFLite's SAME here")
    padded = c.b.tensor((n, h + top + bottom, w + left + right, ch))
    amounts = c.b.constant(numpy.array([[0, 0], [top, bottom], [left, right], [0, 0]],
                                       numpy.int32))
    if pad_value == 0.0:
        c.b.op("PAD", [source, amounts], [padded], "PadOptions")
    else:
        fill = c.b.scalar(pad_value)
        c.b.op("PADV2", [source, amounts, fill], [padded], "PadV2Options")
    return padded, S.Padding.VALID


def _nhwc_input(c: Converter, name: str) -> int:
    """An NCHW ONNX input as an NHWC tensor (free when it is a pending NCHW view)."""
    source = c.value(name)
    return c.b.materialize(Value(source.tensor, compose(NCHW_TO_NHWC, source.perm)))


def _conv(c: Converter, node: Any) -> None:
    attributes = c.attributes(node)
    weight = c.constant(node, 1).astype(numpy.float32)
    if weight.ndim != 4 or len(c.shape(node.input[0])) != 4:
        raise NotMapped(f"Conv {node.output[0]}: only 2-d convolutions")
    out_channels, per_group, kh, kw = weight.shape
    in_channels = c.shape(node.input[0])[1]
    group = attributes.get("group", 1)
    bias = c.constant(node, 2).astype(numpy.float32) if len(node.input) > 2 and node.input[2] \
        else numpy.zeros(out_channels, numpy.float32)
    strides = tuple(attributes.get("strides", (1, 1)))
    dilations = tuple(attributes.get("dilations", (1, 1)))
    source, padding = _padding(c, _nhwc_input(c, node.input[0]), list(attributes.get(
        "pads", (0, 0, 0, 0))), (kh, kw), strides, dilations, 0.0)
    n, oc, oh, ow = c.shape(node.output[0])
    out = c.b.tensor((n, oh, ow, oc))
    fields = dict(padding=padding, strideH=strides[0], strideW=strides[1],
                  dilationHFactor=dilations[0], dilationWFactor=dilations[1])
    if group == 1:
        filters = c.b.constant(weight.transpose(0, 2, 3, 1))  # OIHW -> OHWI
        c.b.op("CONV_2D", [source, filters, c.b.constant(bias)], [out], "Conv2DOptions",
               **fields)
    elif group == in_channels and per_group == 1:
        filters = c.b.constant(weight.reshape(out_channels, kh, kw).transpose(1, 2, 0)[None])
        c.b.op("DEPTHWISE_CONV_2D", [source, filters, c.b.constant(bias)], [out],
               "DepthwiseConv2DOptions", depthMultiplier=out_channels // in_channels, **fields)
    else:
        raise NotMapped(f"Conv {node.output[0]}: {group} groups")
    c.set(node.output[0], Value(out, NHWC_TO_NCHW))


def _pool(c: Converter, node: Any) -> None:
    """MaxPool, and AveragePool where TFLite divides as ONNX does (module docstring)."""
    attributes = c.attributes(node)
    if attributes.get("ceil_mode", 0) or any(d != 1 for d in attributes.get("dilations", [1])) \
            or len(node.output) > 1 or len(c.shape(node.input[0])) != 4:
        raise NotMapped(f"{node.op_type} {node.output[0]}: ceil mode, dilation, indices or "
                        "not 2-d")
    kh, kw = attributes["kernel_shape"]
    strides = tuple(attributes.get("strides", (1, 1)))
    pads = list(attributes.get("pads", (0, 0, 0, 0)))
    average = node.op_type == "AveragePool"
    source, padding = _padding(c, _nhwc_input(c, node.input[0]), pads, (kh, kw), strides,
                               (1, 1), None if average else -math.inf)
    if average and any(pads) and attributes.get("count_include_pad", 0):
        raise NotMapped(f"AveragePool {node.output[0]}: padded elements counted")
    n, ch, oh, ow = c.shape(node.output[0])
    out = c.b.tensor((n, oh, ow, ch))
    c.b.op("AVERAGE_POOL_2D" if average else "MAX_POOL_2D", [source], [out], "Pool2DOptions",
           padding=padding, strideH=strides[0], strideW=strides[1], filterHeight=kh,
           filterWidth=kw)
    c.set(node.output[0], Value(out, NHWC_TO_NCHW))


SPATIAL: dict[str, Callable[[Converter, Any], None]] = {
    "Conv": _conv, "MaxPool": _pool, "AveragePool": _pool}
