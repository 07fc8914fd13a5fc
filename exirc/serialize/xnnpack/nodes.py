"""The XNNPACK graph's nodes, as Python data: one parameter table per
operator shape, and `NodeKind`, the format's union tags.

Split from `graph.py` (which re-exports every name here) so that adding an
operator touches only this file. The fields of each parameter table are in
the format's slot order: the reader and writer map field i to slot i.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# A value id meaning "no value" (XNN_INVALID_VALUE_ID): e.g. a missing bias.
INVALID_VALUE_ID = 0xFFFFFFFF


@dataclass
class Node1x1:
    input_id: int
    output_id: int
    flags: int = 0


@dataclass
class Node2x1:
    input1_id: int
    input2_id: int
    output_id: int
    flags: int = 0


@dataclass
class FullyConnected:
    input1_id: int
    filter_id: int
    bias_id: int
    output_id: int
    flags: int = 0


@dataclass
class Conv:
    """Schema: table _XNNNodeConv (conv, depthwise conv, transposed conv)."""

    padding_top: int
    padding_right: int
    padding_bottom: int
    padding_left: int
    kernel_height: int
    kernel_width: int
    subsampling_height: int
    subsampling_width: int
    dilation_height: int
    dilation_width: int
    group_input_channels: int
    group_output_channels: int
    groups: int
    adjustment_height: int
    adjustment_width: int
    input1_id: int
    filter_id: int
    bias_id: int
    output_id: int
    flags: int = 0


@dataclass
class Pooling2D:
    padding_top: int
    padding_right: int
    padding_bottom: int
    padding_left: int
    pooling_height: int
    pooling_width: int
    stride_height: int
    stride_width: int
    dilation_height: int
    dilation_width: int
    input_id: int
    output_id: int
    flags: int = 0


@dataclass
class StaticTranspose:
    num_dims: int
    perm: list[int]
    input_id: int
    output_id: int
    flags: int = 0


@dataclass
class StaticResizeBilinear2D:
    new_height: int
    new_width: int
    input_id: int
    output_id: int
    flags: int = 0


@dataclass
class StaticConstantPad:
    pre_paddings: list[int]
    post_paddings: list[int]
    padding_value: float
    input_id: int
    output_id: int
    flags: int = 0


@dataclass
class Concatenate:
    """Schema: table _XNNCat (2 to 5 inputs; unused ones are INVALID_VALUE_ID)."""

    axis: int
    input1_id: int
    input2_id: int
    input3_id: int
    input4_id: int
    output_id: int
    flags: int = 0
    input5_id: int = INVALID_VALUE_ID


@dataclass
class ELU:
    alpha: float
    input_id: int
    output_id: int
    flags: int = 0


@dataclass
class LeakyReLU:
    negative_slope: float
    input_id: int
    output_id: int
    flags: int = 0


@dataclass
class StaticReshape:
    num_dims: int
    new_shape: list[int]
    input_id: int
    output_id: int
    flags: int = 0


@dataclass
class StaticSlice:
    num_dims: int
    offsets: list[int]
    sizes: list[int]
    input_id: int
    output_id: int
    flags: int = 0


@dataclass
class ScaledDotProductAttention:
    query_id: int
    key_id: int
    value_id: int
    scale_id: int
    mask_id: int
    output_id: int
    flags: int = 0


@dataclass
class ArgMaxPooling2d:
    padding_top: int
    padding_right: int
    padding_bottom: int
    padding_left: int
    pooling_height: int
    pooling_width: int
    input_id: int
    output_value_id: int
    output_index_id: int
    flags: int = 0


NodeParams = (Node1x1 | Node2x1 | FullyConnected | Conv | Pooling2D | StaticTranspose
              | StaticResizeBilinear2D | StaticConstantPad | Concatenate | ELU | LeakyReLU
              | StaticReshape | StaticSlice | ScaledDotProductAttention | ArgMaxPooling2d)


class NodeKind(enum.IntEnum):
    """Schema: union XNodeUnion; the numbers are the union's type tags."""

    ADD = 1
    FULLY_CONNECTED = 2
    SOFTMAX = 3
    SIGMOID = 4
    STATIC_TRANSPOSE = 5
    CLAMP = 6
    CONV2D = 7
    DIV = 8
    STATIC_RESIZE_BILINEAR_2D = 9
    STATIC_CONSTANT_PAD = 10
    AVG_POOLING_2D = 11
    MINIMUM = 12
    DEPTHWISE_CONV2D = 13
    MAX_POOLING_2D = 14
    MULTIPLY = 15
    SUBTRACT = 16
    FLOOR = 17
    CONVERT = 18
    GLOBAL_AVG_POOLING_2D = 19
    STATIC_RESHAPE = 20
    ARG_MAX_POOLING_2D = 21
    SQUARE_ROOT = 22
    CEILING = 23
    HARDSWISH = 24
    LEAKY_RELU = 25
    MAXIMUM = 26
    NEGATE = 27
    SQUARE = 28
    ELU = 29
    ABS = 30
    PRELU = 31
    CONCATENATE2 = 32
    CONCATENATE3 = 33
    CONCATENATE4 = 34
    STATIC_SLICE = 35
    SCALED_DOT_PRODUCT_ATTENTION = 36
    BATCH_MATRIX_MULTIPLY = 37
    CONCATENATE5 = 38
    CONV_TRANSPOSE2D = 39
    RECIPROCAL_SQUARE_ROOT = 40
    LOG = 41
    GELU = 42
    TANH = 43
    EXP = 44
    SIN = 45
    COPY = 46
    COS = 47


_UNARY = (NodeKind.SOFTMAX, NodeKind.SIGMOID, NodeKind.CLAMP, NodeKind.FLOOR,
          NodeKind.CONVERT, NodeKind.GLOBAL_AVG_POOLING_2D, NodeKind.SQUARE_ROOT,
          NodeKind.CEILING, NodeKind.HARDSWISH, NodeKind.NEGATE, NodeKind.SQUARE,
          NodeKind.ABS, NodeKind.RECIPROCAL_SQUARE_ROOT, NodeKind.LOG, NodeKind.GELU,
          NodeKind.TANH, NodeKind.EXP, NodeKind.SIN, NodeKind.COPY, NodeKind.COS)
_BINARY = (NodeKind.ADD, NodeKind.DIV, NodeKind.MINIMUM, NodeKind.MULTIPLY,
           NodeKind.SUBTRACT, NodeKind.MAXIMUM, NodeKind.PRELU,
           NodeKind.BATCH_MATRIX_MULTIPLY)

PARAMS_OF_KIND: dict[NodeKind, type] = {
    **{kind: Node1x1 for kind in _UNARY},
    **{kind: Node2x1 for kind in _BINARY},
    NodeKind.FULLY_CONNECTED: FullyConnected,
    NodeKind.STATIC_TRANSPOSE: StaticTranspose,
    NodeKind.CONV2D: Conv,
    NodeKind.DEPTHWISE_CONV2D: Conv,
    NodeKind.CONV_TRANSPOSE2D: Conv,
    NodeKind.STATIC_RESIZE_BILINEAR_2D: StaticResizeBilinear2D,
    NodeKind.STATIC_CONSTANT_PAD: StaticConstantPad,
    NodeKind.AVG_POOLING_2D: Pooling2D,
    NodeKind.MAX_POOLING_2D: Pooling2D,
    NodeKind.STATIC_RESHAPE: StaticReshape,
    NodeKind.ARG_MAX_POOLING_2D: ArgMaxPooling2d,
    NodeKind.LEAKY_RELU: LeakyReLU,
    NodeKind.ELU: ELU,
    NodeKind.CONCATENATE2: Concatenate,
    NodeKind.CONCATENATE3: Concatenate,
    NodeKind.CONCATENATE4: Concatenate,
    NodeKind.CONCATENATE5: Concatenate,
    NodeKind.STATIC_SLICE: StaticSlice,
    NodeKind.SCALED_DOT_PRODUCT_ATTENTION: ScaledDotProductAttention,
}
"""The parameter table each node kind is stored as."""


@dataclass
class Node:
    """Schema: table XNode. `output_min_max` clamps the output (fused activation)."""

    kind: NodeKind
    params: NodeParams
    debug_handle: int = 0
    output_min_max: tuple[float, float] | None = None

