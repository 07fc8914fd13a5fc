"""Hand-built XNNPACK graphs: one per node kind and per quantization kind.

Not a test module: the round-trip and hostile-blob tests build on these.
Every graph is sound (it passes `validate_graph`), uses float32-exact float
parameters (the wire stores float32), and keeps some constants in the
blob's constant region and some as named data, so both paths are covered.
"""

from __future__ import annotations

import struct

from exirc.serialize.xnnpack import graph as G

DT = G.Datatype
K = G.NodeKind
INVALID = G.INVALID_VALUE_ID


class GraphBuilder:
    """Values get dense ids in creation order; inputs, then outputs, get the
    external ids when `build()` runs."""

    def __init__(self) -> None:
        self.values: list[G.TensorValue] = []
        self.nodes: list[G.Node] = []
        self.constant_data = [G.ConstantDataOffset(0, 0)]
        self.region = bytearray()
        self.inputs: list[int] = []
        self.outputs: list[int] = []

    def tensor(self, dims: list[int], datatype: G.Datatype = DT.FP32,
               quant: G.Quantization | None = None, *, index: int = 0,
               dq_datatype: G.Datatype = DT.INVALID) -> int:
        self.values.append(G.TensorValue(datatype, list(dims), len(self.values), index,
                                         INVALID, 0, dq_datatype, quant))
        return len(self.values) - 1

    def input(self, dims: list[int], datatype: G.Datatype = DT.FP32,
              quant: G.Quantization | None = None, *,
              dq_datatype: G.Datatype = DT.INVALID) -> int:
        value_id = self.tensor(dims, datatype, quant, dq_datatype=dq_datatype)
        self.inputs.append(value_id)
        return value_id

    def output(self, dims: list[int], datatype: G.Datatype = DT.FP32,
               quant: G.Quantization | None = None) -> int:
        value_id = self.tensor(dims, datatype, quant)
        self.outputs.append(value_id)
        return value_id

    def data(self, nbytes: int, *, named: bool = False) -> int:
        """A constant_data entry of `nbytes` patterned bytes; its index."""
        payload = bytes((len(self.constant_data) * 7 + i) % 251 for i in range(nbytes))
        if named:
            entry = G.ConstantDataOffset(G.NAMED_DATA_OFFSET, nbytes,
                                         f"key-{len(self.constant_data)}")
        else:
            self.region.extend(bytes(-len(self.region) % 16))
            entry = G.ConstantDataOffset(len(self.region), nbytes)
            self.region.extend(payload)
        self.constant_data.append(entry)
        return len(self.constant_data) - 1

    def constant(self, dims: list[int], datatype: G.Datatype = DT.FP32,
                 quant: G.Quantization | None = None, *, named: bool = False,
                 bits: int = 32) -> int:
        count = 1
        for d in dims:
            count *= d
        return self.tensor(dims, datatype, quant, index=self.data((count * bits + 7) // 8,
                                                                  named=named))

    def node(self, kind: G.NodeKind, params: G.NodeParams,
             clamp: tuple[float, float] | None = None) -> None:
        self.nodes.append(G.Node(kind, params, len(self.nodes) + 1, clamp))

    def build(self) -> G.XnnpackBlob:
        for external_id, value_id in enumerate(self.inputs + self.outputs):
            value = self.values[value_id]
            value.external_id = external_id
            value.flags |= (G.FLAG_EXTERNAL_INPUT if value_id in self.inputs
                            else G.FLAG_EXTERNAL_OUTPUT)
        graph = G.XNNGraph("0", self.nodes, self.values, len(self.inputs) + len(self.outputs),
                           self.inputs, self.outputs, self.constant_data)
        return G.XnnpackBlob(graph, bytes(self.region))


def _unary(b: GraphBuilder, kind: G.NodeKind) -> None:
    dims = [1, 4, 4, 3] if kind == K.GLOBAL_AVG_POOLING_2D else [2, 3]
    out_dims = [1, 1, 1, 3] if kind == K.GLOBAL_AVG_POOLING_2D else dims
    out_type = DT.FP16 if kind == K.CONVERT else DT.FP32
    clamp = (-1.0, 6.0) if kind == K.CLAMP else None
    b.node(kind, G.Node1x1(b.input(dims), b.output(out_dims, out_type)), clamp)


def _binary(b: GraphBuilder, kind: G.NodeKind) -> None:
    if kind == K.BATCH_MATRIX_MULTIPLY:
        x, y, out = b.input([2, 3, 4]), b.input([2, 4, 5]), [2, 3, 5]
    elif kind == K.PRELU:
        x, y, out = b.input([1, 2, 2, 3]), b.constant([3], named=True), [1, 2, 2, 3]
    else:  # broadcasting, as ExecuTorch writes it: ranks may differ
        x, y, out = b.input([2, 3, 4]), b.input([3, 1]), [2, 3, 4]
    b.node(kind, G.Node2x1(x, y, b.output(out), flags=0), (0.0, float("inf")))


def _conv(b: GraphBuilder, kind: G.NodeKind) -> None:
    x = b.input([1, 5, 5, 4])
    if kind == K.DEPTHWISE_CONV2D:
        w, groups, gin, gout, out = b.constant([1, 3, 3, 4]), 4, 1, 1, [1, 3, 3, 4]
    elif kind == K.CONV_TRANSPOSE2D:
        w, groups, gin, gout, out = b.constant([2, 3, 3, 4]), 1, 4, 2, [1, 7, 7, 2]
    else:
        w, groups, gin, gout, out = b.constant([2, 3, 3, 4], named=True), 1, 4, 2, [1, 5, 5, 2]
    pad = 0 if kind != K.CONV2D else 1
    bias = b.constant([gout * groups]) if kind != K.CONV_TRANSPOSE2D else INVALID
    b.node(kind, G.Conv(pad, pad, pad, pad, 3, 3, 1, 1, 1, 1, gin, gout, groups,
                        0, 0, x, w, bias, b.output(out)))


def _graph_for(kind: G.NodeKind) -> G.XnnpackBlob:
    b = GraphBuilder()
    params = G.PARAMS_OF_KIND[kind]
    if params is G.Node1x1:
        _unary(b, kind)
    elif params is G.Node2x1:
        _binary(b, kind)
    elif params is G.Conv:
        _conv(b, kind)
    elif kind == K.FULLY_CONNECTED:
        x = b.input([2, 8])
        b.node(kind, G.FullyConnected(x, b.constant([4, 8]), b.constant([4], named=True),
                                      b.output([2, 4])), (0.0, float("inf")))
        b.node(kind, G.FullyConnected(x, b.constant([3, 8]), INVALID, b.output([2, 3]), 1))
    elif params is G.Pooling2D:
        dilation = 1 if kind == K.MAX_POOLING_2D else 0  # ExecuTorch leaves avg's at 0
        b.node(kind, G.Pooling2D(0, 0, 0, 0, 2, 2, 2, 2, dilation, dilation,
                                 b.input([1, 4, 4, 3]), b.output([1, 2, 2, 3]), 0x40))
    elif kind == K.ARG_MAX_POOLING_2D:
        b.node(kind, G.ArgMaxPooling2d(0, 0, 0, 0, 2, 2, b.input([1, 4, 4, 3]),
                                       b.output([1, 2, 2, 3]), b.output([1, 2, 2, 3], DT.INT32)))
    elif kind == K.STATIC_TRANSPOSE:
        b.node(kind, G.StaticTranspose(4, [0, 2, 3, 1], b.input([1, 3, 4, 5]),
                                       b.output([1, 4, 5, 3])))
    elif kind == K.STATIC_RESIZE_BILINEAR_2D:
        b.node(kind, G.StaticResizeBilinear2D(8, 6, b.input([1, 4, 3, 2]),
                                              b.output([1, 8, 6, 2]), 0x8))
    elif kind == K.STATIC_CONSTANT_PAD:
        b.node(kind, G.StaticConstantPad([0, 1, 2], [0, 3, 0], -1.5, b.input([1, 2, 3]),
                                         b.output([1, 6, 5])))
    elif kind == K.STATIC_RESHAPE:
        b.node(kind, G.StaticReshape(2, [6, 4], b.input([2, 3, 4]), b.output([6, 4])))
    elif kind == K.STATIC_SLICE:
        b.node(kind, G.StaticSlice(3, [0, 1, 2], [2, 2, 2], b.input([2, 3, 4]),
                                   b.output([2, 2, 2])))
    elif kind == K.ELU:
        b.node(kind, G.ELU(1.25, b.input([5]), b.output([5])))
    elif kind == K.LEAKY_RELU:
        b.node(kind, G.LeakyReLU(0.0625, b.input([5]), b.output([5])))
    elif params is G.Concatenate:
        count = {K.CONCATENATE2: 2, K.CONCATENATE3: 3, K.CONCATENATE4: 4, K.CONCATENATE5: 5}
        ids = [b.input([2, i + 1]) for i in range(count[kind])]
        ids += [INVALID] * (5 - len(ids))
        out = b.output([2, sum(range(1, count[kind] + 1))])
        b.node(kind, G.Concatenate(1, ids[0], ids[1], ids[2], ids[3], out, 0, ids[4]))
    elif kind == K.SCALED_DOT_PRODUCT_ATTENTION:
        q, k, v = b.input([1, 2, 3, 4]), b.input([1, 2, 5, 4]), b.input([1, 2, 5, 4])
        scale = b.constant([4])
        b.node(kind, G.ScaledDotProductAttention(q, k, v, scale, b.input([3, 5]),
                                                 b.output([1, 2, 3, 4])))
        b.node(kind, G.ScaledDotProductAttention(q, k, v, scale, INVALID,
                                                 b.output([1, 2, 3, 4])))
    else:
        raise AssertionError(f"no graph for {kind.name}")
    return b.build()


GRAPHS_BY_KIND = {kind: _graph_for(kind) for kind in G.NodeKind}


def _scale_bytes(values: list[float], fmt: str = "f") -> int:
    return len(struct.pack(f"<{len(values)}{fmt}", *values))


def quantized_graph() -> G.XnnpackBlob:
    """Every quantization kind, in the shapes ExecuTorch writes them."""
    b = GraphBuilder()
    per_tensor = G.PerTensorQuant(0.125, -3)
    # A statically quantized conv: qint8 activations, per-channel qcint8 filter
    # (inline scales) and qcint32 bias (scales in a named constant, as ET does).
    x = b.input([1, 4, 4, 2], DT.QINT8, per_tensor)
    w = b.constant([3, 1, 1, 2], DT.QCINT8, G.PerChannelQuant([0.5, 0.25, 2.0], 0), bits=8)
    scales = b.data(_scale_bytes([0.5, 0.25, 2.0]), named=True)
    bias = b.constant([3], DT.QCINT32,
                      G.PerChannelQuant([], 0, scale_buffer_idx=scales, num_scales=3))
    conv_out = b.tensor([1, 4, 4, 3], DT.QINT8, G.PerTensorQuant(0.0625, 7))
    b.node(K.CONV2D, G.Conv(0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 3, 1, 0, 0, x, w, bias, conv_out),
           (-128.0, 127.0))
    b.node(K.CONVERT, G.Node1x1(conv_out, b.output([1, 4, 4, 3])))
    # A dynamically quantized linear with 4-bit blockwise weights.
    act = b.input([2, 32])
    dq = b.tensor([2, 32], DT.QDINT8, G.PerTokenDynamicQuant(1))
    b.node(K.CONVERT, G.Node1x1(act, dq))
    group_scales = b.data(2 * 4 * 2)  # bf16 scales, 4 rows x 2 groups, in the region
    w4 = b.constant([4, 32], DT.QBINT4, G.PerChannelGroupQuant(
        [], 0, 16, scale_buffer_idx=group_scales, num_scales=8), bits=4)
    b.node(K.FULLY_CONNECTED, G.FullyConnected(dq, w4, INVALID, b.output([2, 4])))
    # An input quantized at run time (the older form of dynamic quantization).
    dq_input = b.input([2, 8], dq_datatype=DT.QINT8)
    b.node(K.FULLY_CONNECTED, G.FullyConnected(
        dq_input, b.constant([3, 8], DT.QCINT8, G.PerChannelQuant([1.0, 0.5, 0.25], 0), bits=8),
        INVALID, b.output([2, 3])))
    return b.build()


def raw_payload(blob: G.XnnpackBlob, *, headed: bool = True) -> bytes:
    """The payload bytes of `blob` WITHOUT validation, so tests can make
    payloads the checked writer refuses (bad ids, huge dims, unknown tags)."""
    from exirc.serialize.xnnpack.header import XnnpackHeader
    from exirc.serialize.xnnpack.writer import _Builder

    flatbuffer = _Builder().graph(blob.graph)
    if not headed:
        return flatbuffer
    region = bytes(blob.constant_region)
    header = XnnpackHeader.for_sizes(len(flatbuffer), len(region))
    return (header.to_bytes().ljust(header.flatbuffer_offset, b"\0")
            + flatbuffer.ljust(header.constant_data_offset - header.flatbuffer_offset, b"\0")
            + region)
