"""XnnpackBlob -> bytes -> XnnpackBlob is the identity, for every node kind and
every quantization kind, and the bytes have the layout readers expect."""

from __future__ import annotations

import struct

import pytest

from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.generated import Buffer
from exirc.serialize.xnnpack.generated import XNNGraph as FbGraph
from exirc.serialize.xnnpack.header import HEADER_LENGTH, HEADER_MAGIC, XnnpackHeader
from exirc.serialize.xnnpack.reader import deserialize_blob
from exirc.serialize.xnnpack.writer import _Builder, serialize_blob
from tests.serialize.xnnpack.graphs import GRAPHS_BY_KIND, GraphBuilder, quantized_graph

K = G.NodeKind


@pytest.mark.parametrize("kind", list(G.NodeKind), ids=lambda kind: kind.name)
def test_every_node_kind_round_trips(kind: G.NodeKind) -> None:
    blob = GRAPHS_BY_KIND[kind]
    assert {node.kind for node in blob.graph.nodes} == {kind}
    assert deserialize_blob(serialize_blob(blob)) == blob


def test_every_quantization_kind_round_trips() -> None:
    blob = quantized_graph()
    assert {type(v.quant) for v in blob.graph.values if v.quant} == set(G.QUANT_TAGS)
    assert any(v.dq_datatype != G.Datatype.INVALID for v in blob.graph.values)
    assert deserialize_blob(serialize_blob(blob)) == blob


def test_an_empty_graph_round_trips() -> None:
    blob = G.XnnpackBlob(G.XNNGraph())
    assert deserialize_blob(serialize_blob(blob)) == blob


def test_the_payload_layout() -> None:
    blob = GRAPHS_BY_KIND[K.CONV2D]
    data = serialize_blob(blob)
    assert data == serialize_blob(blob), "writing is deterministic"
    assert data[:4] == bytes(4) and data[4:8] == HEADER_MAGIC
    header = XnnpackHeader.parse(data)
    assert header is not None and header.length == HEADER_LENGTH
    assert header.flatbuffer_offset == 32 and header.constant_data_offset % 16 == 0
    fb = data[header.flatbuffer_offset:header.flatbuffer_offset + header.flatbuffer_size]
    assert fb[4:8] == b"XN01"
    assert data[HEADER_LENGTH:header.flatbuffer_offset] == bytes(2)
    region = data[header.constant_data_offset:]
    assert region == blob.constant_region and len(region) == header.constant_data_size
    for entry in blob.graph.constant_data:
        if not entry.is_named:
            assert entry.offset % 16 == 0


def test_named_key_is_present_only_for_named_constants() -> None:
    """ExecuTorch's runtime treats a present named_key (even empty) as named."""
    blob = GRAPHS_BY_KIND[K.CONV2D]  # one named filter, one bias in the region
    data = serialize_blob(blob)
    header = XnnpackHeader.parse(data)
    assert header is not None
    root = FbGraph.XNNGraph.GetRootAs(data, header.flatbuffer_offset)
    keys = [root.ConstantData(i).NamedKey() for i in range(root.ConstantDataLength())]
    assert keys == [None if not e.is_named else e.named_key.encode()
                    for e in blob.graph.constant_data]
    assert None in keys and any(keys)


def test_the_constant_region_is_a_view_of_the_input() -> None:
    data = bytearray(serialize_blob(GRAPHS_BY_KIND[K.FULLY_CONNECTED]))
    blob = deserialize_blob(memoryview(data))
    assert isinstance(blob.constant_region, memoryview)
    assert blob.constant_region.obj is data


def test_the_legacy_identifier_is_read() -> None:
    data = bytearray(serialize_blob(GRAPHS_BY_KIND[K.ADD]))
    assert data[36:40] == b"XN01"
    data[36:40] = b"XN00"
    assert deserialize_blob(bytes(data)) == GRAPHS_BY_KIND[K.ADD]


def _legacy_payload(graph: G.XNNGraph, buffers: list[bytes]) -> bytes:
    """A bare FlatBuffer (no header, identifier XN00) whose constants are in
    the deprecated constant_buffer (slot 6) and without constant_data."""
    w = _Builder()
    b = w.b
    nodes = [w.node(node) for node in graph.nodes]
    values = [w.value(value) for value in graph.values]
    storages = []
    for data in buffers:
        vector = b.CreateByteVector(data)
        Buffer.Start(b)
        Buffer.AddStorage(b, vector)
        storages.append(Buffer.End(b))
    constant_buffer = w._offsets(lambda builder, n: builder.StartVector(4, n, 4), storages)
    version = b.CreateString(graph.version)
    xnodes = w._offsets(FbGraph.StartXnodesVector, nodes)
    xvalues = w._offsets(FbGraph.StartXvaluesVector, values)
    inputs = w._uints(FbGraph.StartInputIdsVector, graph.input_ids)
    outputs = w._uints(FbGraph.StartOutputIdsVector, graph.output_ids)
    FbGraph.Start(b)
    FbGraph.AddVersion(b, version)
    FbGraph.AddXnodes(b, xnodes)
    FbGraph.AddXvalues(b, xvalues)
    FbGraph.AddNumExterns(b, graph.num_externs)
    FbGraph.AddInputIds(b, inputs)
    FbGraph.AddOutputIds(b, outputs)
    b.PrependUOffsetTRelativeSlot(6, constant_buffer, 0)
    b.Finish(FbGraph.End(b), file_identifier=b"XN00")
    return bytes(b.Output())


def test_a_bare_legacy_flatbuffer_with_in_flatbuffer_constants_is_read() -> None:
    b = GraphBuilder()
    x = b.input([2, 3])
    w = b.tensor([4, 3], index=1)
    bias = b.tensor([4], index=2)
    b.node(K.FULLY_CONNECTED, G.FullyConnected(x, w, bias, b.output([2, 4])))
    expected = b.build()
    weights = struct.pack("<12f", *range(12))
    biases = struct.pack("<4f", 1, 2, 3, 4)
    blob = deserialize_blob(_legacy_payload(expected.graph, [b"", weights, biases]))
    constants = blob.graph.constant_data
    assert len(constants) == 3 and not any(entry.is_named for entry in constants)
    region = bytes(blob.constant_region)
    assert region[constants[1].offset:][:constants[1].size] == weights
    assert region[constants[2].offset:][:constants[2].size] == biases
    blob.graph.constant_data = expected.graph.constant_data
    assert blob.graph == expected.graph
