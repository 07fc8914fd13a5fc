"""What the reader refuses, and how it says so: one case per check.

Each case breaks one thing in a sound graph, writes it with the unchecked
writer and asserts the FormatError's field path and message. The checked
writer refuses the same graphs before writing anything.
"""

from __future__ import annotations

import copy
import struct
from collections.abc import Callable

import pytest

from exirc.errors import FormatError
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.generated import XNNTensorValue
from exirc.serialize.xnnpack.reader import deserialize_blob
from exirc.serialize.xnnpack.writer import _Builder, serialize_blob
from tests.serialize.xnnpack.graphs import GRAPHS_BY_KIND, quantized_graph, raw_payload

K = G.NodeKind
INVALID = G.INVALID_VALUE_ID


def _broken(kind: G.NodeKind, breaks: Callable[[G.XnnpackBlob], object]) -> G.XnnpackBlob:
    blob = copy.deepcopy(GRAPHS_BY_KIND[kind])
    breaks(blob)
    return blob


def _set(obj: object, **fields: object) -> None:
    for name, value in fields.items():
        setattr(obj, name, value)


def _value(blob: G.XnnpackBlob, i: int) -> G.TensorValue:
    return blob.graph.values[i]


def _params(blob: G.XnnpackBlob, i: int = 0) -> G.NodeParams:
    return blob.graph.nodes[i].params


CASES: list[tuple[str, G.NodeKind, Callable[[G.XnnpackBlob], object], str, str]] = [
    ("duplicate id", K.ADD, lambda b: _set(_value(b, 1), id_out=0),
     "graph.xvalues[1].id_out", "already the id of another value"),
    ("id beyond the values", K.ADD, lambda b: _set(_value(b, 2), id_out=7),
     "graph.xvalues[2].id_out", "not below the number of values"),
    ("undefined input", K.SIGMOID, lambda b: _set(_params(b), input_id=5),
     "graph.xnodes[0].xnode_union.input_id", "id 5 is not a value"),
    ("undefined output", K.SIGMOID, lambda b: _set(_params(b), output_id=INVALID),
     "graph.xnodes[0].xnode_union.output_id", "is not a value"),
    ("absent filter", K.FULLY_CONNECTED, lambda b: _set(_params(b), filter_id=INVALID),
     "graph.xnodes[0].xnode_union.filter_id", "is not a value"),
    ("absent third input of a 3-way concat", K.CONCATENATE3,
     lambda b: _set(_params(b), input3_id=INVALID),
     "graph.xnodes[0].xnode_union.input3_id", "is not a value"),
    ("key and offset", K.FULLY_CONNECTED,
     lambda b: _set(b.graph.constant_data[2], offset=0),
     "graph.constant_data[2].offset", "has both a named key and an offset"),
    ("named offset without key", K.FULLY_CONNECTED,
     lambda b: _set(b.graph.constant_data[2], named_key=""),
     "graph.constant_data[2].named_key", "the named key is empty"),
    ("constant past the region", K.FULLY_CONNECTED,
     lambda b: _set(b.graph.constant_data[1], offset=200),
     "graph.constant_data[1].size", "runs past the"),
    ("constant index out of range", K.FULLY_CONNECTED,
     lambda b: _set(_value(b, 1), constant_buffer_idx=9),
     "graph.xvalues[1].constant_buffer_idx", "not an index of constant_data"),
    ("constant too small", K.FULLY_CONNECTED,
     lambda b: _set(_value(b, 1), dims=[5, 8]),
     "graph.xvalues[1].constant_buffer_idx", "holds 128 bytes, but the value needs 160"),
    ("rank above XNNPACK's", K.RECIPROCAL_SQUARE_ROOT,
     lambda b: _set(_value(b, 0), dims=[1] * 7), "graph.xvalues[0].dims", "rank 7"),
    ("huge tensor", K.RECIPROCAL_SQUARE_ROOT,
     lambda b: _set(_value(b, 0), dims=[0xFFFFFFFF, 0xFFFFFFFF]),
     "graph.xvalues[0].dims", "elements is above the limit"),
    ("invalid datatype", K.TANH, lambda b: _set(_value(b, 0), datatype=0),
     "graph.xvalues[0].datatype", "invalid datatype"),
    ("unknown flag bits", K.TANH, lambda b: _set(_value(b, 1), flags=0x6),
     "graph.xvalues[1].flags", "bits other than"),
    ("input not flagged", K.TANH, lambda b: _set(_value(b, 0), flags=0),
     "graph.input_ids[0]", "a value without flag 0x1"),
    ("flagged but not listed", K.TANH, lambda b: _set(b.graph, output_ids=[]),
     "graph.xvalues[1].flags", "flagged 0x2 but value 1 is not in output_ids"),
    ("external id too large", K.TANH, lambda b: _set(_value(b, 1), external_id=2),
     "graph.xvalues[1].external_id", "not below num_externs"),
    ("external id shared", K.TANH, lambda b: _set(_value(b, 1), external_id=0),
     "graph.xvalues[1].external_id", "also value 0's"),
    ("perm not a permutation", K.STATIC_TRANSPOSE,
     lambda b: _set(_params(b), perm=[0, 1, 1, 3]),
     "graph.xnodes[0].xnode_union.perm", "not a permutation"),
    ("perm shorter than num_dims", K.STATIC_TRANSPOSE,
     lambda b: _set(_params(b), perm=[0, 1, 2]),
     "graph.xnodes[0].xnode_union.perm", "3 entries for num_dims 4"),
    ("slice rank", K.STATIC_SLICE,
     lambda b: _set(_params(b), num_dims=2, offsets=[0, 0], sizes=[1, 1]),
     "graph.xnodes[0].xnode_union.num_dims", "not the input's rank"),
    ("paddings rank", K.STATIC_CONSTANT_PAD, lambda b: _set(_params(b), post_paddings=[0]),
     "graph.xnodes[0].xnode_union.post_paddings", "1 entries for the input's rank 3"),
    ("concat axis", K.CONCATENATE2, lambda b: _set(_params(b), axis=2),
     "graph.xnodes[0].xnode_union.axis", "not below the output's rank"),
    ("params of another kind", K.ADD, lambda b: _set(b.graph.nodes[0], kind=K.SOFTMAX),
     "graph.xnodes[0].xnode_union", "SOFTMAX node takes Node1x1 parameters, not Node2x1"),
    ("float beyond float32", K.ELU, lambda b: _set(_params(b), alpha=1e39),
     "graph.xnodes[0].xnode_union.alpha", "does not fit a float32"),
    ("too many externs", K.TANH, lambda b: _set(b.graph, num_externs=5000),
     "graph.num_externs", "above the limit of 4096"),
]


# Mistakes only a Python graph can make: a float32 cannot hold 1e39, and the
# wire stores no parameter type beside the union tag.
WRITER_ONLY = {case[1]: case[2] for case in CASES
               if case[0] in ("float beyond float32", "params of another kind")}


@pytest.mark.parametrize(("kind", "breaks", "field", "message"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_each_broken_graph_is_refused(kind: G.NodeKind, breaks: Callable[[G.XnnpackBlob], object],
                                      field: str, message: str) -> None:
    blob = _broken(kind, breaks)
    with pytest.raises(FormatError) as refused_on_write:
        serialize_blob(blob)
    assert refused_on_write.value.field == field
    assert message in str(refused_on_write.value)
    if kind in WRITER_ONLY and breaks is WRITER_ONLY[kind]:
        return  # the wire cannot even express it
    with pytest.raises(FormatError) as refused_on_read:
        deserialize_blob(raw_payload(blob))
    assert refused_on_read.value.field == field
    assert message in str(refused_on_read.value)


def test_unused_concat_inputs_may_hold_anything() -> None:
    blob = copy.deepcopy(GRAPHS_BY_KIND[K.CONCATENATE2])
    _set(_params(blob), input3_id=12345, input4_id=0, input5_id=INVALID)
    assert deserialize_blob(serialize_blob(blob)) == blob


@pytest.mark.parametrize(("tag", "kind_name"), [(0, "node"), (48, "node"), (255, "node")])
def test_an_unknown_node_tag_is_named(tag: int, kind_name: str) -> None:
    blob = copy.deepcopy(GRAPHS_BY_KIND[K.ABS])
    blob.graph.nodes[0].kind = tag  # type: ignore[assignment]
    with pytest.raises(FormatError, match=f"unknown {kind_name} kind: union tag {tag}") as err:
        deserialize_blob(raw_payload(blob))
    assert err.value.field == "graph.xnodes[0].xnode_union_type"


def test_an_unknown_datatype_is_named() -> None:
    blob = copy.deepcopy(GRAPHS_BY_KIND[K.ABS])
    blob.graph.values[0].datatype = 99  # type: ignore[assignment]
    with pytest.raises(FormatError, match="99 is not a valid Datatype") as err:
        deserialize_blob(raw_payload(blob))
    assert err.value.field == "graph.xvalues[0].xvalue_union.datatype"


def test_num_dims_must_match_dims() -> None:
    class WrongRank(_Builder):
        def tensor(self, v: G.TensorValue) -> int:
            dims = self._uints(XNNTensorValue.StartDimsVector, v.dims)
            return self._table(XNNTensorValue, (XNNTensorValue.AddDatatype, int(v.datatype)),
                               (XNNTensorValue.AddNumDims, len(v.dims) + 1),
                               (XNNTensorValue.AddDims, dims),
                               (XNNTensorValue.AddIdOut, v.id_out))

    data = WrongRank().graph(GRAPHS_BY_KIND[K.ABS].graph)
    with pytest.raises(FormatError, match="num_dims is 3 but dims has 2 entries") as err:
        deserialize_blob(data)
    assert err.value.field == "graph.xvalues[0].xvalue_union.num_dims"


def test_scales_must_cover_every_block() -> None:
    blob = quantized_graph()
    quantized = [v for v in blob.graph.values if isinstance(v.quant, G.PerChannelGroupQuant)]
    assert quantized and isinstance(quantized[0].quant, G.PerChannelGroupQuant)
    quantized[0].quant.num_scales = 4
    with pytest.raises(FormatError, match="4 scales for 8 blocks"):
        serialize_blob(blob)


def test_a_run_time_quantized_value_must_be_an_input() -> None:
    blob = quantized_graph()
    internal = next(v for v in blob.graph.values if not v.flags)
    internal.dq_datatype = G.Datatype.QINT8
    with pytest.raises(FormatError, match="only a non-constant, unquantized external input"):
        serialize_blob(blob)


# --------------------------------------------------------------------------
# The header.
# --------------------------------------------------------------------------

def _patched(offset: int, fmt: str, value: int) -> bytes:
    data = bytearray(serialize_blob(GRAPHS_BY_KIND[K.FULLY_CONNECTED]))
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


@pytest.mark.parametrize(("data", "field", "message"), [
    (b"", "header", "too short"),
    (bytes(4) + b"XH00" + bytes(10), "header", "ends inside the header"),
    (bytes(4) + b"ABCD" + bytes(40), "header.magic", "neither the header magic"),
    (_patched(0, "<I", 7), "header", "not zeros"),
    (_patched(8, "<H", 29), "header.length", "not between 30"),
    (_patched(8, "<H", 33), "header.length", "not between 30"),
    (_patched(14, "<I", 0), "header.flatbuffer_size", "too small"),
    (_patched(10, "<I", 0xFFFFFFF0), "header.flatbuffer_size", "runs past"),
    (_patched(18, "<I", 40), "header.constant_data_offset", "inside the flatbuffer"),
    (_patched(22, "<Q", 2**64 - 1), "header.constant_data_size", "runs past"),
], ids=["empty", "truncated", "magic", "zeros", "short length", "long length", "empty fb",
        "fb past end", "constants in fb", "constants past end"])
def test_a_broken_header_is_refused(data: bytes, field: str, message: str) -> None:
    with pytest.raises(FormatError, match=message) as err:
        deserialize_blob(data)
    assert err.value.field == field


def test_a_wrong_identifier_is_refused() -> None:
    data = bytearray(serialize_blob(GRAPHS_BY_KIND[K.ADD]))
    data[36:40] = b"ET12"
    with pytest.raises(FormatError, match="FlatBuffer identifier is b'ET12'"):
        deserialize_blob(bytes(data))
