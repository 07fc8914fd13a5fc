"""XNNPACK payload bytes -> `XnnpackBlob`, trusting nothing.

A payload arrives inside a program file that may be hostile, and a runtime
hands its ids, shapes and offsets straight to XNNPACK. So the header is
checked against the payload size (`header.py`), every FlatBuffer offset is
checked by `CheckedBuffer` before it is followed, enums and union tags are
checked while decoding, and the whole graph's cross-references are checked
by `validate.py` before the blob is returned. Anything wrong is a
`FormatError` naming the field, e.g. `graph.xnodes[3].xnode_union_type`.

Slot numbers are field positions in `schema/xnnpack.fbs` (deprecated fields
keep theirs). Also read: payloads without the header (a bare FlatBuffer,
identifier `XN00`), whose constants sit in the legacy `constant_buffer`
inside the FlatBuffer; they become a constant region, so callers see one
representation.
"""

from __future__ import annotations

import enum
from typing import Any, TypeVar

from exirc.errors import FormatError
from exirc.serialize.checked_buffer import I32, U8, U32, U64, CheckedBuffer, TableView
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.header import (
    ALIGNMENT,
    FILE_IDENTIFIERS,
    XnnpackHeader,
    align_up,
)
from exirc.serialize.xnnpack.layout import F32, I16, PARAM_LAYOUTS
from exirc.serialize.xnnpack.validate import validate_graph

E = TypeVar("E", bound=enum.IntEnum)

ROOT = "graph"


def deserialize_blob(data: bytes | memoryview) -> G.XnnpackBlob:
    """Read and validate one XNNPACK delegate payload.

    The constant region is a view into `data` (no copy), except for legacy
    payloads, whose in-FlatBuffer constants are gathered into new bytes.
    """
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    header = XnnpackHeader.parse(view)
    if header is None:  # a bare FlatBuffer: no header, no constant region
        flatbuffer, region = view, view[len(view):]
    else:
        fb_start, const_start = header.flatbuffer_offset, header.constant_data_offset
        flatbuffer = view[fb_start:fb_start + header.flatbuffer_size]
        region = view[const_start:const_start + header.constant_data_size]
    identifier = bytes(flatbuffer[4:8])
    if identifier not in FILE_IDENTIFIERS:
        raise FormatError(
            f"FlatBuffer identifier is {identifier!r}, expected one of "
            f"{', '.join(map(repr, FILE_IDENTIFIERS))}", field=f"{ROOT}(identifier)")
    buf = CheckedBuffer(flatbuffer)
    root = buf.table_at(buf.follow(0, ROOT), ROOT)
    graph = decode_graph(root)
    blob = G.XnnpackBlob(graph, region)
    if header is None:  # constants, if any, are in the legacy constant_buffer
        legacy = [x.byte_vector(0, "storage") for x in root.tables(6, "constant_buffer")]
        if legacy:
            blob = _adopt_legacy_constants(blob, legacy)
    validate_graph(blob)
    return blob


def _adopt_legacy_constants(blob: G.XnnpackBlob, buffers: list[bytes]) -> G.XnnpackBlob:
    """Payloads without a header keep constant i in `constant_buffer[i]` (0
    unused), as ExecuTorch's runtime reads them: gather them into a constant
    region and point `constant_data` at them."""
    region = bytearray(blob.constant_region)
    entries = [G.ConstantDataOffset(0, 0)]
    for storage in buffers[1:]:
        region.extend(bytes(align_up(len(region), ALIGNMENT) - len(region)))
        entries.append(G.ConstantDataOffset(len(region), len(storage)))
        region.extend(storage)
    blob.graph.constant_data = entries
    return G.XnnpackBlob(blob.graph, bytes(region))


def _enum(kind: type[E], raw: int, t: TableView, name: str) -> E:
    try:
        return kind(raw)
    except ValueError:
        raise FormatError(f"{raw} is not a valid {kind.__name__}",
                          field=f"{t.path}.{name}") from None


def _required(table: TableView | None, path: str, what: str) -> TableView:
    if table is None:
        raise FormatError(f"{what} is missing", field=path)
    return table


def decode_graph(t: TableView) -> G.XNNGraph:
    return G.XNNGraph(
        version=t.string(0, "version") or "",
        nodes=[node(x) for x in t.tables(1, "xnodes")],
        values=[value(x) for x in t.tables(2, "xvalues")],
        num_externs=t.scalar(3, U32, 0, "num_externs"),
        input_ids=t.scalars(4, "I", "input_ids"),
        output_ids=t.scalars(5, "I", "output_ids"),
        # slot 6: constant_buffer (legacy, see deserialize_blob); 7: mem_buffer_sizes (unused)
        constant_data=[G.ConstantDataOffset(x.scalar(0, U64, 0, "offset"),
                                            x.scalar(1, U64, 0, "size"),
                                            x.string(2, "named_key") or "")
                       for x in t.tables(8, "constant_data")],
    )


# --- nodes -----------------------------------------------------------------

def node(t: TableView) -> G.Node:
    tag = t.scalar(0, U8, 0, "xnode_union_type")
    try:
        kind = G.NodeKind(tag)
    except ValueError:
        raise FormatError(f"unknown node kind: union tag {tag} (known: 1..{len(G.NodeKind)})",
                          field=f"{t.path}.xnode_union_type") from None
    params = _required(t.table(1, "xnode_union"), f"{t.path}.xnode_union",
                       f"the parameters of the {kind.name} node")
    clamp = t.table(3, "output_min_max")
    return G.Node(
        kind=kind,
        params=node_params(G.PARAMS_OF_KIND[kind], params),
        debug_handle=t.scalar(2, U32, 0, "debug_handle"),
        output_min_max=None if clamp is None else (
            float(clamp.scalar(0, F32, 0.0, "output_min")),
            float(clamp.scalar(1, F32, 0.0, "output_max"))),
    )


def node_params(cls: type, t: TableView) -> Any:
    """One parameter table: field i of the dataclass is slot i."""
    kwargs: dict[str, Any] = {}
    for slot, (name, kind) in enumerate(PARAM_LAYOUTS[cls]):
        if kind == "uints":
            kwargs[name] = t.scalars(slot, "I", name)
        elif kind == "float":
            kwargs[name] = float(t.scalar(slot, F32, 0.0, name))
        else:
            kwargs[name] = t.scalar(slot, U32, 0, name)
    return cls(**kwargs)


# --- values ----------------------------------------------------------------

_TENSOR, _QUANTIZED = 1, 2  # XValueUnion tags


def value(t: TableView) -> G.TensorValue:
    tag = t.scalar(0, U8, 0, "xvalue_union_type")
    if tag not in (_TENSOR, _QUANTIZED):
        raise FormatError(f"unknown value kind: union tag {tag} (known: 1..2)",
                          field=f"{t.path}.xvalue_union_type")
    body = _required(t.table(1, "xvalue_union"), f"{t.path}.xvalue_union", "the value")
    if tag == _TENSOR:
        return tensor_value(body, None)
    tensor = _required(body.table(0, "tensor_value"), f"{body.path}.tensor_value",
                       "the tensor of a quantized value")
    return tensor_value(tensor, quantization(body))


def tensor_value(t: TableView, quant: G.Quantization | None) -> G.TensorValue:
    dims = t.scalars(2, "I", "dims")
    num_dims = t.scalar(1, U32, 0, "num_dims")
    if num_dims != len(dims):
        raise FormatError(f"num_dims is {num_dims} but dims has {len(dims)} entries",
                          field=f"{t.path}.num_dims")
    return G.TensorValue(
        datatype=_enum(G.Datatype, t.scalar(0, I16, 0, "datatype"), t, "datatype"),
        dims=dims,
        id_out=t.scalar(6, U32, 0, "id_out"),
        constant_buffer_idx=t.scalar(3, U32, 0, "constant_buffer_idx"),
        external_id=t.scalar(4, U32, 0, "external_id"),
        flags=t.scalar(5, U32, 0, "flags"),
        dq_datatype=_enum(G.Datatype, t.scalar(7, I16, 0, "dq_datatype"), t, "dq_datatype"),
        quant=quant,
    )


def quantization(t: TableView) -> G.Quantization:
    """The quant_params union of an XNNQuantizedTensorValue (slots 1 and 2)."""
    tag = t.scalar(1, U8, 0, "quant_params_type")
    path = f"{t.path}.quant_params"
    if not 1 <= tag <= 4:
        raise FormatError(f"unknown quantization kind: union tag {tag} (known: 1..4)",
                          field=f"{path}_type")
    q = _required(t.table(2, "quant_params"), path, "the quantization parameters")
    if tag == G.QUANT_TAGS[G.PerChannelQuant]:
        return G.PerChannelQuant(
            scale=[float(s) for s in q.scalars(0, "f", "scale")],
            channel_dim=q.scalar(1, I32, 0, "channel_dim"),
            scale_buffer_idx=q.scalar(2, U32, 0, "scale_buffer_idx"),
            num_scales=q.scalar(3, U32, 0, "num_scales"))
    if tag == G.QUANT_TAGS[G.PerTensorQuant]:
        return G.PerTensorQuant(scale=float(q.scalar(0, F32, 0.0, "scale")),
                                zero_point=q.scalar(1, I32, 0, "zero_point"))
    if tag == G.QUANT_TAGS[G.PerTokenDynamicQuant]:
        return G.PerTokenDynamicQuant(q.scalar(0, I32, 0, "num_nonbatch_dims"))
    return G.PerChannelGroupQuant(
        scale=[float(s) for s in q.scalars(0, "f", "scale")],
        channel_dim=q.scalar(1, I32, 0, "channel_dim"),
        group_size=q.scalar(2, I32, 0, "group_size"),
        # slot 3: scale_bf16 (deprecated)
        scale_buffer_idx=q.scalar(4, U32, 0, "scale_buffer_idx"),
        num_scales=q.scalar(5, U32, 0, "num_scales"))
