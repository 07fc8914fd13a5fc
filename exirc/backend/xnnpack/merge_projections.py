"""Two quantized projections of one input that are joined anyway: one node.

After `merge_rotary`, a layer's query and key projections (fully connected
nodes reading the same per-token quantized input) meet only in a
concatenate on their last axis. One fully connected node whose filter holds
both filters' rows (and their scales) computes that concatenation: each
output column is its own row's dot product with the same quantized input,
summed and scaled as before, so every value is the one it was. Two nodes
fewer a layer.
"""

from __future__ import annotations

import dataclasses
import hashlib

from exirc.backend.xnnpack.compact import producers, read_counts
from exirc.serialize.xnnpack import graph as G

_ROWS = (G.PerChannelGroupQuant, G.PerChannelQuant)  # per output row scales, in a buffer


def merge_projections(graph: G.XNNGraph, named_data: dict[str, bytes]) -> int:
    """XNNGraph -> XNNGraph (before `compact`, which drops the filters it no
    longer reads): CONCATENATE2(FC(x, A), FC(x, B)) on the last axis, both
    filters quantized per output row alike (int4 per group, int8 per
    channel), no bias, no clamp, each result read by the concatenate only,
    becomes FC(x, [A; B]). Returns how many were merged."""
    producer = producers(graph)
    readers = read_counts(graph)
    merged = 0
    for cat in [n for n in graph.nodes if n.kind == G.NodeKind.CONCATENATE2]:
        params = cat.params
        if not isinstance(params, G.Concatenate) or params.input3_id != G.INVALID_VALUE_ID:
            continue
        first, second = producer.get(params.input1_id), producer.get(params.input2_id)
        if first is None or second is None or \
                params.axis != len(graph.values[params.output_id].dims) - 1 or \
                any(readers.get(v, 0) != 1 for v in (params.input1_id, params.input2_id)):
            continue
        filter_id = _joined_filter(graph, named_data, first, second)
        if filter_id is None:
            continue
        fc = first.params
        assert isinstance(fc, G.FullyConnected)
        node = G.Node(G.NodeKind.FULLY_CONNECTED, G.FullyConnected(
            fc.input1_id, filter_id, G.INVALID_VALUE_ID, params.output_id, fc.flags),
            first.debug_handle)
        graph.nodes = [node if n is cat else n for n in graph.nodes
                       if n is not first and n is not second]
        merged += 1
    return merged


def _joined_filter(graph: G.XNNGraph, named_data: dict[str, bytes], first: G.Node,
                   second: G.Node) -> int | None:
    """The value of both nodes' filters' rows, one after the other, if they can join
    (no flags: a transposed filter's rows are its inputs, not its outputs)."""
    a, b = first.params, second.params
    if not (isinstance(a, G.FullyConnected) and isinstance(b, G.FullyConnected)) or \
            first.kind != second.kind or first.output_min_max or second.output_min_max or \
            a.input1_id != b.input1_id or a.flags or b.flags or \
            a.bias_id != G.INVALID_VALUE_ID or b.bias_id != G.INVALID_VALUE_ID:
        return None
    fa, fb = graph.values[a.filter_id], graph.values[b.filter_id]
    qa, qb = fa.quant, fb.quant
    kind_a, kind_b = (fa.datatype, fa.dims[1:], fa.dq_datatype), (fb.datatype, fb.dims[1:],
                                                                   fb.dq_datatype)
    if not isinstance(qa, _ROWS) or type(qa) is not type(qb) or kind_a != kind_b:
        return None
    assert isinstance(qb, _ROWS)
    if qa.channel_dim != 0 or qb.channel_dim != 0 or not qa.scale_buffer_idx or \
            not qb.scale_buffer_idx or getattr(qa, "group_size", 0) != getattr(qb, "group_size", 0):
        return None
    pieces = [_named(graph, named_data, i) for i in (fa.constant_buffer_idx,
                                                     fb.constant_buffer_idx,
                                                     qa.scale_buffer_idx, qb.scale_buffer_idx)]
    if any(p is None for p in pieces) or fa.dims[0] * len(pieces[1] or b"") != \
            fb.dims[0] * len(pieces[0] or b""):  # rows of one size: a row-major [rows, ...]
        return None
    rows, scales = (pieces[0] or b"") + (pieces[1] or b""), (pieces[2] or b"") + (pieces[3] or b"")
    quant = dataclasses.replace(qa, scale_buffer_idx=_entry(graph, named_data, scales, "scale_"),
                                num_scales=qa.num_scales + qb.num_scales)
    graph.values.append(G.TensorValue(
        fa.datatype, [fa.dims[0] + fb.dims[0], *fa.dims[1:]], len(graph.values),
        constant_buffer_idx=_entry(graph, named_data, rows, ""), dq_datatype=fa.dq_datatype,
        quant=quant))
    return len(graph.values) - 1


def _named(graph: G.XNNGraph, named_data: dict[str, bytes], index: int) -> bytes | None:
    entry = graph.constant_data[index] if 0 < index < len(graph.constant_data) else None
    if entry is None or not entry.is_named:
        return None
    return named_data.get(entry.named_key)


def _entry(graph: G.XNNGraph, named_data: dict[str, bytes], raw: bytes, prefix: str) -> int:
    key = prefix + hashlib.sha256(raw).hexdigest()
    named_data[key] = raw
    graph.constant_data.append(G.ConstantDataOffset(G.NAMED_DATA_OFFSET, len(raw), key))
    return len(graph.constant_data) - 1
