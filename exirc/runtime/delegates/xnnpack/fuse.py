"""Fusing Clamp nodes into the node before them, as XNNPACK's subgraph optimizer does.

XNNPACK rewrites `producer -> value -> Clamp -> output` into `producer ->
output` with the clamp as the producer's fused output range, whenever the
producer takes an output range (convolutions, fully connected, add, ...)
and the clamp is the only reader of a value that is not an external output.
For float graphs the result is the same either way. For quantized graphs it
is not: the fused producer requantizes straight to the clamp's output
quantization, skipping the intermediate one; so we rewrite the graph the
same way before compiling it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from exirc.runtime.delegates.xnnpack.context import CLAMPED_KINDS
from exirc.serialize.xnnpack import graph as G

FUSES_CLAMP = CLAMPED_KINDS - {G.NodeKind.CLAMP}


def _output_field(params: G.NodeParams) -> str | None:
    names = [f.name for f in dataclasses.fields(params)]
    return "output_id" if "output_id" in names else None


def reads(node: G.Node) -> list[int]:
    """The value ids `node` reads (its `*_id` fields but the outputs; unused ones left out)."""
    return [getattr(node.params, f.name) for f in dataclasses.fields(node.params)
            if f.name.endswith("_id") and not f.name.startswith("output")
            and getattr(node.params, f.name) != G.INVALID_VALUE_ID]


def fuse_clamps(graph: G.XNNGraph) -> list[tuple[int, G.Node]]:
    """The graph's nodes, each with its index in the blob, with each fusable Clamp
    folded into its producer (which keeps its index)."""
    readers: Counter[int] = Counter(v for node in graph.nodes for v in reads(node))
    externals = set(graph.output_ids)
    producer: dict[int, int] = {}
    nodes = list(graph.nodes)
    dropped: set[int] = set()
    for i, node in enumerate(nodes):
        if node.kind == G.NodeKind.CLAMP and isinstance(node.params, G.Node1x1):
            value = node.params.input_id
            j = producer.get(value)
            if (j is not None and j not in dropped and nodes[j].kind in FUSES_CLAMP
                    and readers[value] == 1 and value not in externals
                    and node.params.flags == 0):
                nodes[j] = _fused(nodes[j], node)
                dropped.add(i)
                producer[node.params.output_id] = j
                continue
        field = _output_field(node.params)
        if field is not None:
            producer[getattr(node.params, field)] = i
    return [(i, node) for i, node in enumerate(nodes) if i not in dropped]


def _fused(producer: G.Node, clamp: G.Node) -> G.Node:
    assert isinstance(clamp.params, G.Node1x1)
    inf = float("inf")
    low1, high1 = producer.output_min_max or (-inf, inf)
    low2, high2 = clamp.output_min_max or (-inf, inf)
    original: Any = producer.params  # every fusing kind has an output_id
    params = dataclasses.replace(original, output_id=clamp.params.output_id)
    return dataclasses.replace(producer, params=params,
                               output_min_max=(max(low1, low2), min(high1, high2)))
