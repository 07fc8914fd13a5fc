"""The XNNPACK delegate's graph, as Python data (the payload ExecuTorch's
`XnnpackBackend` reads).

A delegate blob is a small header, a FlatBuffer (file identifier `XN01`)
holding an `XNNGraph`, and a region of constant data. The graph is a list of
values (tensors, identified by `id_out`) and a list of nodes (XNNPACK
operators) that read and write values by id. External values are the
delegate's inputs and outputs; constant values (weights) point into
`constant_data`, whose entries locate bytes either in the blob's constant
region (`offset`) or in the program's named data (`named_key`).

Field names and their order follow the format's tables; `NodeKind` numbers
are the format's union tags. Shapes and weights are in XNNPACK's layouts:
NHWC activations for convolution and pooling, `[O, H, W, I/groups]` conv
filters, `[1, H, W, O]` depthwise filters, `[O, I]` fully connected filters.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

# A value id meaning "no value" (XNN_INVALID_VALUE_ID): e.g. a missing bias.
INVALID_VALUE_ID = 0xFFFFFFFF
# ConstantDataOffset.offset of constants stored as named data.
NAMED_DATA_OFFSET = 0xFFFFFFFFFFFFFFFF

# XNNTensorValue.flags bits.
FLAG_EXTERNAL_INPUT = 0x1
FLAG_EXTERNAL_OUTPUT = 0x2



class Datatype(enum.IntEnum):
    """Schema: enum XNNDatatype (the element type of a value)."""

    INVALID = 0
    FP32 = 1
    FP16 = 2
    QINT8 = 3
    QUINT8 = 4
    QINT32 = 5
    QCINT8 = 6
    QCINT32 = 7
    QCINT4 = 8
    QDINT8 = 9
    QBINT4 = 10
    QPINT8 = 11
    INT32 = 12
    PFP32 = 13
    BF16 = 14


@dataclass
class PerTensorQuant:
    scale: float
    zero_point: int


@dataclass
class PerChannelQuant:
    scale: list[float]
    channel_dim: int
    scale_buffer_idx: int = 0
    num_scales: int = 0


@dataclass
class PerTokenDynamicQuant:
    num_nonbatch_dims: int


@dataclass
class PerChannelGroupQuant:
    scale: list[float]
    channel_dim: int
    group_size: int
    scale_buffer_idx: int = 0
    num_scales: int = 0


Quantization = PerChannelQuant | PerTensorQuant | PerTokenDynamicQuant | PerChannelGroupQuant
# Schema: union XNNQuantParams, tags from 1.
QUANT_TAGS: dict[type, int] = {PerChannelQuant: 1, PerTensorQuant: 2,
                               PerTokenDynamicQuant: 3, PerChannelGroupQuant: 4}


@dataclass
class TensorValue:
    """Schema: table XNNTensorValue, or XNNQuantizedTensorValue when `quant` is set."""

    datatype: Datatype
    dims: list[int]
    id_out: int
    constant_buffer_idx: int = 0      # 0: not a constant
    external_id: int = INVALID_VALUE_ID
    flags: int = 0
    dq_datatype: Datatype = Datatype.INVALID
    quant: Quantization | None = None

    @property
    def num_dims(self) -> int:
        return len(self.dims)


# --- node parameter tables -------------------------------------------------

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


@dataclass
class ConstantDataOffset:
    """Schema: table ConstantDataOffset. Exactly one of `offset` (into the
    blob's constant region) and `named_key` (program named data) is used."""

    offset: int
    size: int
    named_key: str = ""

    @property
    def is_named(self) -> bool:
        return bool(self.named_key)


@dataclass
class XNNGraph:
    """Schema: table XNNGraph (root). `constant_data[0]` is reserved (non-constant)."""

    version: str = "0"
    nodes: list[Node] = field(default_factory=list)
    values: list[TensorValue] = field(default_factory=list)
    num_externs: int = 0
    input_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    constant_data: list[ConstantDataOffset] = field(
        default_factory=lambda: [ConstantDataOffset(0, 0)])


@dataclass
class XnnpackBlob:
    """A whole delegate payload: the graph and the blob's own constant region."""

    graph: XNNGraph
    constant_region: bytes | memoryview = b""
