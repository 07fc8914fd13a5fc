"""Dead-node elimination and value renumbering of a finished XNNGraph.

Emitters may make values nobody reads in the end (a reshape kept for a
node whose only user was fused, a layout copy an operator took another way
round); this drops the nodes whose outputs are not read, then the values,
weights and quantization scales no remaining node or external refers to,
and numbers the values 0..n-1 in order, as the format expects.
"""

from __future__ import annotations

import dataclasses

from exirc.serialize.xnnpack import graph as G

OUTPUT_FIELDS = ("output_id", "output_value_id", "output_index_id")


def _ids(params: G.NodeParams) -> dict[str, int]:
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)
            if f.name.endswith("_id")}


def node_outputs(params: G.NodeParams) -> set[int]:
    """The values a node writes."""
    return {v for k, v in _ids(params).items() if k in OUTPUT_FIELDS}


def _read(params: G.NodeParams) -> list[int]:
    return [v for k, v in _ids(params).items()
            if k not in OUTPUT_FIELDS and v != G.INVALID_VALUE_ID]


def node_inputs(params: G.NodeParams) -> set[int]:
    """The values a node reads."""
    return set(_read(params))


def producers(graph: G.XNNGraph) -> dict[int, G.Node]:
    """The node that writes each value (graph inputs and constants have none)."""
    return {value: node for node in graph.nodes for value in node_outputs(node.params)}


def read_counts(graph: G.XNNGraph) -> dict[int, int]:
    """How many times each value is read: once per node field naming it, and once
    more if it is a graph output (what a rewrite checks before taking it over)."""
    count: dict[int, int] = {}
    for node in graph.nodes:
        for value in _read(node.params):
            count[value] = count.get(value, 0) + 1
    for value in graph.output_ids:
        count[value] = count.get(value, 0) + 1
    return count


def compact(graph: G.XNNGraph, named_data: dict[str, bytes]) -> None:
    """Drop what nothing reads from `graph` (in place) and from `named_data`."""
    read = set(graph.output_ids)
    live: list[G.Node] = []
    for node in reversed(graph.nodes):
        if node_outputs(node.params) & read:
            live.append(node)
            read |= node_inputs(node.params)
    graph.nodes = live[::-1]
    inputs = set(graph.input_ids)  # kept even when unread: the delegate call passes them
    keep = [v for v in graph.values if v.id_out in read or v.id_out in inputs]
    renumber = {v.id_out: i for i, v in enumerate(keep)}
    renumber[G.INVALID_VALUE_ID] = G.INVALID_VALUE_ID
    data = [graph.constant_data[0]]
    data_index: dict[int, int] = {0: 0}

    def entry(old: int) -> int:
        if old not in data_index:
            data_index[old] = len(data)
            data.append(graph.constant_data[old])
        return data_index[old]

    for value in keep:
        value.id_out = renumber[value.id_out]
        if value.constant_buffer_idx:
            value.constant_buffer_idx = entry(value.constant_buffer_idx)
        quant = value.quant
        # Per-channel scales live in constant data too (one buffer, maybe shared
        # by a weight and its bias): a new quantization, as values share them.
        if isinstance(quant, (G.PerChannelQuant, G.PerChannelGroupQuant)) \
                and quant.scale_buffer_idx:
            value.quant = dataclasses.replace(quant, scale_buffer_idx=entry(quant.scale_buffer_idx))
    for node in graph.nodes:
        for name, vid in _ids(node.params).items():
            setattr(node.params, name, renumber[vid])
    graph.values = keep
    graph.input_ids = [renumber[i] for i in graph.input_ids]
    graph.output_ids = [renumber[i] for i in graph.output_ids]
    graph.constant_data = data
    used = {entry.named_key for entry in data if entry.is_named}
    for key in [k for k in named_data if k not in used]:
        del named_data[key]
