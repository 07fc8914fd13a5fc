"""`XnnpackBlob` -> the payload bytes ExecuTorch's XnnpackBackend loads.

The graph is validated first (`validate.py`): a payload that a runtime would
reject, or a number that does not fit its wire type, is a `FormatError`
here rather than a broken file later. The FlatBuffer is built bottom-up with
the flatc-generated builder functions, children before parents, and framed
by the header: header, padding, FlatBuffer, padding, constant region, at the
offsets `header.XnnpackHeader.for_sizes` gives (16-byte aligned).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import flatbuffers

from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.generated import (
    ArgMaxPoolingNode,
    AttentionNode,
    BinaryNode,
    ConcatNode,
    ConstantDataOffset,
    ConstantPadNode,
    ConvNode,
    ELUNode,
    FullyConnectedNode,
    LeakyReLUNode,
    OutputMinMax,
    PerChannelGroupQuant,
    PerChannelQuant,
    PerTensorQuant,
    PerTokenDynamicQuant,
    PoolingNode,
    ReshapeNode,
    ResizeBilinearNode,
    SliceNode,
    TransposeNode,
    UnaryNode,
    XNNGraph,
    XNNQuantizedTensorValue,
    XNNTensorValue,
    XNode,
    XValue,
)
from exirc.serialize.xnnpack.header import FILE_IDENTIFIER, XnnpackHeader
from exirc.serialize.xnnpack.layout import PARAM_LAYOUTS, camel
from exirc.serialize.xnnpack.validate import validate_graph

# The generated table module of each node parameter class.
_PARAM_TABLES: dict[type, ModuleType] = {
    G.Node1x1: UnaryNode, G.Node2x1: BinaryNode, G.FullyConnected: FullyConnectedNode,
    G.Conv: ConvNode, G.Pooling2D: PoolingNode, G.StaticTranspose: TransposeNode,
    G.StaticResizeBilinear2D: ResizeBilinearNode, G.StaticConstantPad: ConstantPadNode,
    G.Concatenate: ConcatNode, G.ELU: ELUNode, G.LeakyReLU: LeakyReLUNode,
    G.StaticReshape: ReshapeNode, G.StaticSlice: SliceNode,
    G.ScaledDotProductAttention: AttentionNode, G.ArgMaxPooling2d: ArgMaxPoolingNode,
}
_TENSOR, _QUANTIZED = 1, 2  # XValueUnion tags


def serialize_blob(blob: G.XnnpackBlob) -> bytes:
    """The payload bytes of `blob` (validated first; FormatError if unsound)."""
    validate_graph(blob)
    flatbuffer = _Builder().graph(blob.graph)
    region = bytes(blob.constant_region)
    header = XnnpackHeader.for_sizes(len(flatbuffer), len(region))
    return b"".join([
        header.to_bytes().ljust(header.flatbuffer_offset, b"\0"),
        flatbuffer.ljust(header.constant_data_offset - header.flatbuffer_offset, b"\0"),
        region,
    ])


class _Builder:
    """Builds the FlatBuffer of one XNNGraph; one method per schema table."""

    def __init__(self) -> None:
        self.b = flatbuffers.Builder(1024)

    def _table(self, table: ModuleType, *fields: tuple[Callable[[Any, Any], None], Any]) -> int:
        """One table of the generated module `table`, each (add, value) in
        order; values that are None are left out (built children come first)."""
        table.Start(self.b)
        for add, value in fields:
            if value is not None:
                add(self.b, value)
        return int(table.End(self.b))

    def _vector(self, start: Callable[[Any, int], Any], prepend: Callable[[Any], None],
                items: Sequence[Any]) -> int:
        start(self.b, len(items))
        for item in reversed(items):
            prepend(item)
        return int(self.b.EndVector())

    def _uints(self, start: Callable[[Any, int], Any], items: Sequence[int]) -> int:
        return self._vector(start, self.b.PrependUint32, items)

    def _offsets(self, start: Callable[[Any, int], Any], offsets: Sequence[int]) -> int:
        return self._vector(start, self.b.PrependUOffsetTRelative, offsets)

    def graph(self, graph: G.XNNGraph) -> bytes:
        nodes = [self.node(node) for node in graph.nodes]
        values = [self.value(value) for value in graph.values]
        constants = [self.constant(entry) for entry in graph.constant_data]
        version = self.b.CreateString(graph.version)
        root = self._table(
            XNNGraph,
            (XNNGraph.AddVersion, version),
            (XNNGraph.AddXnodes, self._offsets(XNNGraph.StartXnodesVector, nodes)),
            (XNNGraph.AddXvalues, self._offsets(XNNGraph.StartXvaluesVector, values)),
            (XNNGraph.AddNumExterns, graph.num_externs),
            (XNNGraph.AddInputIds, self._uints(XNNGraph.StartInputIdsVector, graph.input_ids)),
            (XNNGraph.AddOutputIds,
             self._uints(XNNGraph.StartOutputIdsVector, graph.output_ids)),
            (XNNGraph.AddConstantData,
             self._offsets(XNNGraph.StartConstantDataVector, constants)),
        )
        self.b.Finish(root, file_identifier=FILE_IDENTIFIER)
        return bytes(self.b.Output())

    def constant(self, entry: G.ConstantDataOffset) -> int:
        # Readers (ExecuTorch's runtime among them) tell a named constant by
        # the presence of named_key, not by its value: write it only when set.
        key = self.b.CreateString(entry.named_key) if entry.named_key else None
        return self._table(ConstantDataOffset,
                           (ConstantDataOffset.AddOffset, entry.offset),
                           (ConstantDataOffset.AddSize, entry.size),
                           (ConstantDataOffset.AddNamedKey, key))

    # -- nodes -----------------------------------------------------------

    def node(self, node: G.Node) -> int:
        params = self.params(node.params)
        clamp = None
        if node.output_min_max is not None:
            clamp = self._table(OutputMinMax,
                                (OutputMinMax.AddOutputMin, node.output_min_max[0]),
                                (OutputMinMax.AddOutputMax, node.output_min_max[1]))
        return self._table(XNode,
                           (XNode.AddXnodeUnionType, int(node.kind)),
                           (XNode.AddXnodeUnion, params),
                           (XNode.AddDebugHandle, node.debug_handle),
                           (XNode.AddOutputMinMax, clamp))

    def params(self, params: G.NodeParams) -> int:
        """Any parameter table, from its layout: field i is slot i."""
        table = _PARAM_TABLES[type(params)]
        layout = PARAM_LAYOUTS[type(params)]
        vectors = {name: self._uints(getattr(table, f"Start{camel(name)}Vector"),
                                     getattr(params, name))
                   for name, kind in layout if kind == "uints"}
        return self._table(table, *[
            (getattr(table, f"Add{camel(name)}"), vectors.get(name, getattr(params, name)))
            for name, _ in layout])

    # -- values ----------------------------------------------------------

    def value(self, value: G.TensorValue) -> int:
        tensor = self.tensor(value)
        if value.quant is None:
            tag, body = _TENSOR, tensor
        else:
            quant = self.quantization(value.quant)
            tag, body = _QUANTIZED, self._table(
                XNNQuantizedTensorValue,
                (XNNQuantizedTensorValue.AddTensorValue, tensor),
                (XNNQuantizedTensorValue.AddQuantParamsType, G.QUANT_TAGS[type(value.quant)]),
                (XNNQuantizedTensorValue.AddQuantParams, quant))
        return self._table(XValue, (XValue.AddXvalueUnionType, tag),
                           (XValue.AddXvalueUnion, body))

    def tensor(self, v: G.TensorValue) -> int:
        dims = self._uints(XNNTensorValue.StartDimsVector, v.dims)
        return self._table(
            XNNTensorValue,
            (XNNTensorValue.AddDatatype, int(v.datatype)),
            (XNNTensorValue.AddNumDims, len(v.dims)),
            (XNNTensorValue.AddDims, dims),
            (XNNTensorValue.AddConstantBufferIdx, v.constant_buffer_idx),
            (XNNTensorValue.AddExternalId, v.external_id),
            (XNNTensorValue.AddFlags, v.flags),
            (XNNTensorValue.AddIdOut, v.id_out),
            (XNNTensorValue.AddDqDatatype, int(v.dq_datatype)),
        )

    def _scales(self, start: Callable[[Any, int], Any], scales: Sequence[float]) -> int:
        return self._vector(start, self.b.PrependFloat32, scales)

    def quantization(self, q: G.Quantization) -> int:
        if isinstance(q, G.PerTensorQuant):
            return self._table(PerTensorQuant, (PerTensorQuant.AddScale, q.scale),
                               (PerTensorQuant.AddZeroPoint, q.zero_point))
        if isinstance(q, G.PerTokenDynamicQuant):
            return self._table(PerTokenDynamicQuant, (PerTokenDynamicQuant.AddNumNonbatchDims,
                                                      q.num_nonbatch_dims))
        if isinstance(q, G.PerChannelQuant):
            scale = self._scales(PerChannelQuant.StartScaleVector, q.scale)
            return self._table(PerChannelQuant, (PerChannelQuant.AddScale, scale),
                               (PerChannelQuant.AddChannelDim, q.channel_dim),
                               (PerChannelQuant.AddScaleBufferIdx, q.scale_buffer_idx),
                               (PerChannelQuant.AddNumScales, q.num_scales))
        scale = self._scales(PerChannelGroupQuant.StartScaleVector, q.scale)
        return self._table(PerChannelGroupQuant, (PerChannelGroupQuant.AddScale, scale),
                           (PerChannelGroupQuant.AddChannelDim, q.channel_dim),
                           (PerChannelGroupQuant.AddGroupSize, q.group_size),
                           (PerChannelGroupQuant.AddScaleBufferIdx, q.scale_buffer_idx),
                           (PerChannelGroupQuant.AddNumScales, q.num_scales))
