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

# The node tables live in nodes.py; graph.py is the one import for the model.
from exirc.serialize.xnnpack.nodes import (
    ELU,
    INVALID_VALUE_ID,
    PARAMS_OF_KIND,
    ArgMaxPooling2d,
    Concatenate,
    Conv,
    FullyConnected,
    LeakyReLU,
    Node,
    Node1x1,
    Node2x1,
    NodeKind,
    NodeParams,
    Pooling2D,
    ScaledDotProductAttention,
    StaticConstantPad,
    StaticReshape,
    StaticResizeBilinear2D,
    StaticSlice,
    StaticTranspose,
)

__all__ = [
    "ELU", "FLAG_EXTERNAL_INPUT", "FLAG_EXTERNAL_OUTPUT", "INVALID_VALUE_ID", "NAMED_DATA_OFFSET",
    "PARAMS_OF_KIND", "QUANT_TAGS", "ArgMaxPooling2d", "Concatenate", "ConstantDataOffset", "Conv",
    "Datatype", "FullyConnected", "LeakyReLU", "Node", "Node1x1", "Node2x1", "NodeKind",
    "NodeParams", "PerChannelGroupQuant", "PerChannelQuant", "PerTensorQuant",
    "PerTokenDynamicQuant", "Pooling2D", "Quantization", "ScaledDotProductAttention",
    "StaticConstantPad", "StaticReshape", "StaticResizeBilinear2D", "StaticSlice",
    "StaticTranspose", "TensorValue", "XNNGraph", "XnnpackBlob",
]

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
