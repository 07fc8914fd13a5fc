"""Mutations of an XNNPACK delegate's graph: its values, nodes and constants.

The payload is read into exirc's model of the format, one field is bent, and
it is written back well-formed, so the mutant gets past the payload's
FlatBuffer checks and tests what the backend does with a graph that lies:
a node reading a value that is not there, a filter of the wrong size, a
stride of zero, a constant past the end of its region.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Callable
from unittest import mock

from exirc.errors import ExircError
from exirc.serialize import program as P
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack import writer
from exirc.serialize.xnnpack.reader import deserialize_blob
from tools.mutants import picks
from tools.mutants.context import Context, model_kind

_EDGE_UINT = [0, 1, 2, 3, 4, 7, 255, 65535, 2**31 - 1, 2**31, 2**32 - 1]
_EDGE_FLOATS = [float("nan"), float("inf"), -float("inf"), 0.0, -1.0, 1e38, 1e-45]

Bend = Callable[[G.XNNGraph, random.Random], "str | None"]


def _with_graph(ctx: Context, bend: Bend) -> str | None:
    """Apply `bend` to the graph of a random XNNPACK delegate, written back."""
    found = []
    for plan in ctx.program.execution_plan:
        for delegate in plan.delegates:
            if delegate.id == "XnnpackBackend":
                found.append(delegate.processed)
    reference = picks.choice(ctx.rng, found)
    if reference is None:
        return None
    inline = reference.location == P.DataLocation.INLINE
    store = ctx.program.backend_delegate_data if inline else ctx.program.segments
    if not 0 <= reference.index < len(store):
        return None
    holder = store[reference.index]
    try:
        blob = deserialize_blob(holder.data)
    except ExircError:
        return None
    what = bend(blob.graph, ctx.rng)
    if what is None:
        return None
    holder.data = _unchecked(G.XnnpackBlob(blob.graph, bytes(blob.constant_region)))
    return what


def _unchecked(blob: G.XnnpackBlob) -> bytes:
    """The payload's bytes without the writer's own soundness check: a hostile
    file was not written by our writer."""
    with mock.patch.object(writer, "validate_graph", lambda _: None):
        return writer.serialize_blob(blob)


def _edge(rng: random.Random, graph: G.XNNGraph) -> int:
    count = len(graph.values)
    return rng.choice(_EDGE_UINT + [count, count - 1, G.INVALID_VALUE_ID])


@model_kind("xnn_value")
def xnn_value(ctx: Context) -> str | None:
    """A tensor value's dims, datatype, id, flags or constant index."""
    def bend(graph: G.XNNGraph, rng: random.Random) -> str | None:
        value = picks.choice(rng, graph.values)
        if value is None:
            return None
        field = rng.choice(["dims", "dims", "datatype", "id_out", "flags", "constant",
                            "external_id"])
        old = copy.copy(getattr(value, {"constant": "constant_buffer_idx"}.get(field, field)))
        if field == "dims" and value.dims and rng.random() < 0.7:
            value.dims[rng.randrange(len(value.dims))] = rng.choice(_EDGE_UINT)
        elif field == "dims":
            value.dims = value.dims[:-1] if value.dims and rng.random() < 0.5 \
                else value.dims + [rng.choice([1, 2, 0])]
        elif field == "datatype":
            value.datatype = rng.choice(list(G.Datatype))
        elif field == "id_out":
            value.id_out = _edge(rng, graph)
        elif field == "flags":
            value.flags = rng.choice([0, 1, 2, 3, 0xFF])
        elif field == "constant":
            value.constant_buffer_idx = rng.choice([0, 1, len(graph.constant_data),
                                                    2**32 - 1])
        else:
            value.external_id = _edge(rng, graph)
        new = getattr(value, {"constant": "constant_buffer_idx"}.get(field, field))
        return f"xnn value {value.id_out}: {field} {old} -> {new}"
    return _with_graph(ctx, bend)


@model_kind("xnn_node")
def xnn_node(ctx: Context) -> str | None:
    """A node's parameter (an id, a size, a stride, a permutation) or its kind."""
    def bend(graph: G.XNNGraph, rng: random.Random) -> str | None:
        position = rng.randrange(len(graph.nodes)) if graph.nodes else None
        if position is None:
            return None
        node = graph.nodes[position]
        if rng.random() < 0.15:
            alike = [k for k, cls in G.PARAMS_OF_KIND.items()
                     if cls is type(node.params) and k != node.kind]
            if alike:
                old_kind, node.kind = node.kind, rng.choice(alike)
                return f"xnn node {position}: kind {old_kind.name} -> {node.kind.name}"
        fields = dataclasses.fields(node.params)
        field = rng.choice(fields)
        old = getattr(node.params, field.name)
        if isinstance(old, list):
            new_list = list(old)
            if new_list and rng.random() < 0.6:
                new_list[rng.randrange(len(new_list))] = rng.choice(_EDGE_UINT)
            elif new_list and rng.random() < 0.5:
                new_list.pop()
            else:
                new_list.append(rng.choice([0, 1, 5]))
            setattr(node.params, field.name, new_list)
        elif isinstance(old, float):
            setattr(node.params, field.name, rng.choice(_EDGE_FLOATS))
        elif field.name.endswith("_id"):
            setattr(node.params, field.name, _edge(rng, graph))
        else:
            setattr(node.params, field.name, rng.choice(_EDGE_UINT))
        return (f"xnn node {position} ({node.kind.name}): {field.name} {old} -> "
                f"{getattr(node.params, field.name)}")
    return _with_graph(ctx, bend)


@model_kind("xnn_graph")
def xnn_graph(ctx: Context) -> str | None:
    """The graph's inputs, outputs, node order or constant locations."""
    def bend(graph: G.XNNGraph, rng: random.Random) -> str | None:
        action = rng.choice(["inputs", "outputs", "nodes", "constant", "externs"])
        if action in ("inputs", "outputs"):
            ids = graph.input_ids if action == "inputs" else graph.output_ids
            old = list(ids)
            if ids and rng.random() < 0.6:
                ids[rng.randrange(len(ids))] = _edge(rng, graph)
            elif ids and rng.random() < 0.5:
                ids.pop()
            else:
                ids.append(_edge(rng, graph))
            return f"xnn {action} {old} -> {ids}"
        if action == "nodes" and graph.nodes:
            i = rng.randrange(len(graph.nodes))
            how = rng.choice(["duplicate", "drop", "swap"])
            if how == "duplicate":
                graph.nodes.insert(i, graph.nodes[rng.randrange(len(graph.nodes))])
            elif how == "drop":
                graph.nodes.pop(i)
            else:
                j = rng.randrange(len(graph.nodes))
                graph.nodes[i], graph.nodes[j] = graph.nodes[j], graph.nodes[i]
            return f"xnn node {i}: {how}"
        if action == "constant" and len(graph.constant_data) > 1:
            i = rng.randrange(1, len(graph.constant_data))
            entry = graph.constant_data[i]
            was = (entry.offset, entry.size)
            if rng.random() < 0.5:
                entry.offset = rng.choice([0, 16, (entry.offset + 4) % 2**64, 2**32, 2**63])
            else:
                entry.size = rng.choice([0, 1, entry.size // 2, entry.size * 2, 2**40])
            return f"xnn constant {i}: (offset, size) {was} -> {(entry.offset, entry.size)}"
        old_count = graph.num_externs
        graph.num_externs = rng.choice([0, 1, old_count + 1, 2**31])
        return f"xnn num_externs {old_count} -> {graph.num_externs}"
    return _with_graph(ctx, bend)
