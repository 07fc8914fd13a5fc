"""ExecuTorch's own XNNPACK payloads: we read them, write them back, and its
runtime runs what we wrote.

ExecuTorch is the oracle twice: its XnnpackPartitioner makes the payloads we
must read, and its runtime (with the XNNPACK backend) must run the payloads
we write, giving the same outputs as the programs it wrote itself. The
facts other parts of exirc rely on (how a conv model's layout changes
appear, what a fused relu looks like) are asserted here, so a new
ExecuTorch that changes them fails loudly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest
import torch

from exirc.serialize import deserialize, serialize
from exirc.serialize import program as P
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.header import FILE_IDENTIFIER, HEADER_LENGTH, XnnpackHeader
from exirc.serialize.xnnpack.reader import deserialize_blob
from exirc.serialize.xnnpack.writer import serialize_blob
from tests.oracle import requires_executorch, run_with_executorch
from tests.serialize.xnnpack.conftest import MODELS, RealProgram

pytestmark = [requires_executorch, pytest.mark.oracle]
K = G.NodeKind


@pytest.mark.parametrize("name", MODELS)
def test_reads_and_rewrites_executorch_payloads(real_programs: dict[str, RealProgram],
                                                name: str) -> None:
    real = real_programs[name]
    assert real.blobs, "the partitioner delegated nothing"
    for data in real.blobs:
        header = XnnpackHeader.parse(data)
        assert header is not None and header.length == HEADER_LENGTH
        assert header.flatbuffer_offset % 16 == 0 and header.constant_data_offset % 16 == 0
        assert data[header.flatbuffer_offset + 4:header.flatbuffer_offset + 8] == FILE_IDENTIFIER
        blob = deserialize_blob(data)
        assert blob.graph.nodes and blob.graph.values
        assert deserialize_blob(serialize_blob(blob)) == blob


@pytest.mark.parametrize("name", MODELS)
def test_named_constants_are_the_programs_named_data(real_programs: dict[str, RealProgram],
                                                     name: str) -> None:
    """ExecuTorch 1.5.1 keeps every constant in the program's named data, keyed
    by the sha256 of its bytes ("scale_" + sha256 for per-channel scales)."""
    real = real_programs[name]
    named = {n.key: real.program.segments[n.segment_index].data
             for n in real.program.named_data}
    for data in real.blobs:
        blob = deserialize_blob(data)
        assert len(blob.constant_region) == 0
        assert blob.graph.constant_data[0] == G.ConstantDataOffset(0, 0, "")
        for entry in blob.graph.constant_data[1:]:
            assert entry.offset == G.NAMED_DATA_OFFSET and entry.named_key in named
            stored = bytes(named[entry.named_key])
            assert len(stored) >= entry.size
            digest = hashlib.sha256(stored[:entry.size]).hexdigest()
            assert entry.named_key in (digest, "scale_" + digest)


def _kinds(real: RealProgram) -> list[G.NodeKind]:
    return [node.kind for node in deserialize_blob(real.blobs[0]).graph.nodes]


def test_what_executorch_writes_for_a_conv_model(real_programs: dict[str, RealProgram]) -> None:
    """NCHW -> NHWC and back are explicit transposes around the NHWC ops; batch
    norm is folded into the conv, relu fused as output_min_max; max pooling
    keeps its dims (flag 0x40, XNN_FLAG_KEEP_DIMS)."""
    graph = deserialize_blob(real_programs["conv_bn_relu_maxpool"].blobs[0]).graph
    assert [n.kind for n in graph.nodes] == [K.STATIC_TRANSPOSE, K.CONV2D, K.MAX_POOLING_2D,
                                             K.STATIC_TRANSPOSE]
    to_nhwc, conv, pool, to_nchw = (n.params for n in graph.nodes)
    assert isinstance(to_nhwc, G.StaticTranspose) and to_nhwc.perm == [0, 2, 3, 1]
    assert isinstance(to_nchw, G.StaticTranspose) and to_nchw.perm == [0, 3, 1, 2]
    assert graph.nodes[0].debug_handle == graph.nodes[3].debug_handle == 0xFFFF
    assert isinstance(conv, G.Conv) and conv.flags == 0 and conv.groups == 1
    assert graph.nodes[1].output_min_max == (0.0, float("inf"))
    assert isinstance(pool, G.Pooling2D) and pool.flags == 0x40
    values = {v.id_out: v for v in graph.values}
    assert values[to_nhwc.input_id].dims == [1, 3, 8, 8]       # NCHW input
    assert values[to_nhwc.output_id].dims == [1, 8, 8, 3]      # NHWC
    assert values[conv.filter_id].dims == [8, 3, 3, 3]         # [O, H, W, I]
    assert values[to_nchw.output_id].flags == G.FLAG_EXTERNAL_OUTPUT
    assert graph.input_ids == [0] and values[0].flags == G.FLAG_EXTERNAL_INPUT


def test_what_executorch_writes_for_a_linear_model(
        real_programs: dict[str, RealProgram]) -> None:
    graph = deserialize_blob(real_programs["linear_relu"].blobs[0]).graph
    assert [n.kind for n in graph.nodes] == [K.FULLY_CONNECTED]
    fc = graph.nodes[0].params
    assert isinstance(fc, G.FullyConnected) and fc.flags == 0
    assert graph.nodes[0].output_min_max == (0.0, float("inf"))
    values = {v.id_out: v for v in graph.values}
    assert values[fc.filter_id].dims == [4, 8]                 # [O, I], not transposed
    assert [values[i].external_id for i in graph.input_ids + graph.output_ids] == [0, 1]
    assert graph.num_externs == 2


def test_other_executorch_facts(real_programs: dict[str, RealProgram]) -> None:
    assert _kinds(real_programs["depthwise_conv"]) == [K.STATIC_TRANSPOSE, K.DEPTHWISE_CONV2D,
                                                       K.STATIC_TRANSPOSE]
    assert _kinds(real_programs["cat_permute_softmax"]) == [K.CONCATENATE2, K.STATIC_TRANSPOSE,
                                                            K.SOFTMAX]
    assert _kinds(real_programs["broadcast_add_mul"]) == [K.MULTIPLY, K.ADD]
    cat = deserialize_blob(real_programs["cat_permute_softmax"].blobs[0]).graph.nodes[0].params
    assert isinstance(cat, G.Concatenate)
    assert (cat.input3_id, cat.input4_id, cat.input5_id) == (G.INVALID_VALUE_ID,) * 3
    quantized = deserialize_blob(real_programs["quantized_conv_linear"].blobs[0]).graph
    quant_kinds = {type(v.quant) for v in quantized.values if v.quant is not None}
    assert quant_kinds == {G.PerTensorQuant, G.PerChannelQuant}
    dynamic = deserialize_blob(real_programs["dynamic_quantized_linear"].blobs[0]).graph
    assert any(isinstance(v.quant, G.PerTokenDynamicQuant) and v.datatype == G.Datatype.QDINT8
               for v in dynamic.values)


# --------------------------------------------------------------------------
# ExecuTorch's runtime runs what we write.
# --------------------------------------------------------------------------

def _with_blobs(program: P.Program, rewrite: Callable[[bytes], bytes]) -> bytes:
    for plan in program.execution_plan:
        for delegate in plan.delegates:
            ref = delegate.processed
            if ref.location == P.DataLocation.SEGMENT:
                segment = program.segments[ref.index]
                segment.data = rewrite(bytes(segment.data))
            else:
                inline = program.backend_delegate_data[ref.index]
                inline.data = rewrite(bytes(inline.data))
    return bytes(serialize(program))


def _constants_into_region(program: P.Program) -> Callable[[bytes], bytes]:
    """Move a payload's named constants into its own constant region (the
    layout of files from before named data)."""
    named = {n.key: bytes(program.segments[n.segment_index].data) for n in program.named_data}

    def rewrite(data: bytes) -> bytes:
        blob = deserialize_blob(data)
        region = bytearray(blob.constant_region)
        for i, entry in enumerate(blob.graph.constant_data):
            if entry.is_named:
                region.extend(bytes(-len(region) % 16))
                blob.graph.constant_data[i] = G.ConstantDataOffset(len(region), entry.size)
                region.extend(named[entry.named_key][:entry.size])
        return serialize_blob(G.XnnpackBlob(blob.graph, bytes(region)))

    return rewrite


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("constants", ["named", "in_region"])
def test_executorch_runs_the_payloads_we_write(real_programs: dict[str, RealProgram], name: str,
                                               constants: str) -> None:
    real = real_programs[name]
    expected = run_with_executorch(real.pte, real.inputs)
    program = deserialize(real.pte)  # a fresh copy: the rewrite changes it
    rewrite = (_constants_into_region(program) if constants == "in_region"
               else lambda data: serialize_blob(deserialize_blob(data)))
    ours = _with_blobs(program, rewrite)
    got = run_with_executorch(ours, real.inputs)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)

