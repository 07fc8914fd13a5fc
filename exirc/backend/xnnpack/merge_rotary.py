"""Rotary embeddings of a layer's queries and keys, applied once to both.

A LLaMA layer rotates its queries and its keys alike: `x * cos +
rotate_half(x) * sin`, the same cos and sin, six XNNPACK nodes each (two
multiplies, the two halves sliced and concatenated swapped, an add). In a
decode step every node costs its call (about 0.1 us on ExecuTorch's runtime,
more than the arithmetic on a token's few heads), so the two are joined on
the heads axis, rotated once, and sliced apart: nine nodes for twelve. Every
element meets the same operands in the same operations, so each result is
the one it was, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from exirc.backend.xnnpack.compact import node_inputs, producers, read_counts
from exirc.serialize.xnnpack import graph as G

P = TypeVar("P")
_HEADS = 2  # [batch, sequence, heads, head_dim]: the axis queries and keys are joined on


@dataclass
class _Rotary:
    """One `x * cos + rotate_half(x) * sin` chain: its nodes and operands."""

    nodes: list[G.Node]
    x: int
    cos: int
    sin: int
    cos_first: bool   # MUL(cos, x) rather than MUL(x, cos)
    sin_first: bool
    output: int
    sequence: list[int]  # the slices' sizes on [batch, sequence]: 0 where dynamic


def merge_rotary(graph: G.XNNGraph) -> int:
    """XNNGraph -> XNNGraph (before `compact`): two rotary chains over
    [batch, sequence, heads, head_dim] tensors with the same cos, sin and
    shapes but for their heads become one chain over the two joined on the
    heads axis, then a slice back to each. Returns how many pairs were joined."""
    readers = read_counts(graph)
    producer = producers(graph)
    chains = [c for n in graph.nodes if n.kind == G.NodeKind.ADD
              for c in [_rotary(graph, n, producer, readers)] if c is not None]
    merged = 0
    used: set[int] = set()
    for i, first in enumerate(chains):
        for second in chains[i + 1:]:
            if id(first) in used or id(second) in used or not _pair(graph, first, second):
                continue
            if not _later_readers_only(graph, first, second):
                continue
            _join(graph, first, second, readers, producer)
            used |= {id(first), id(second)}
            merged += 1
    return merged


def _output(node: G.Node) -> int:
    return int(getattr(node.params, "output_id", G.INVALID_VALUE_ID))


def _params(node: G.Node | None, kind: G.NodeKind, form: type[P]) -> P | None:
    """`node`'s parameters if it is a `kind` node (whose parameters are `form`)."""
    if node is None or node.kind != kind or not isinstance(node.params, form):
        return None
    return node.params


def _rotary(graph: G.XNNGraph, add: G.Node, producer: dict[int, G.Node],
            readers: dict[int, int]) -> _Rotary | None:
    """The chain ending at `add`, if it is one whose inner values nothing else reads."""
    sum_ = _params(add, G.NodeKind.ADD, G.Node2x1)
    if sum_ is None or add.output_min_max is not None:
        return None
    first, second = producer.get(sum_.input1_id), producer.get(sum_.input2_id)
    if first is None or second is None:
        return None
    for by_cos, by_sin in ((first, second), (second, first)):
        chain = _halves(graph, by_cos, by_sin, producer)
        if chain is None:
            continue
        nodes = chain.nodes
        if all(readers.get(_output(n), 0) == 1 for n in nodes) and \
                all(n.output_min_max is None for n in nodes):
            chain.nodes, chain.output = [*nodes, add], sum_.output_id
            return chain
    return None


def _halves(graph: G.XNNGraph, by_cos: G.Node, by_sin: G.Node, producer: dict[int, G.Node]
            ) -> _Rotary | None:
    cos_mul = _params(by_cos, G.NodeKind.MULTIPLY, G.Node2x1)
    sin_mul = _params(by_sin, G.NodeKind.MULTIPLY, G.Node2x1)
    if cos_mul is None or sin_mul is None:
        return None
    swapped = producer.get(sin_mul.input1_id)
    sin_first = _params(swapped, G.NodeKind.CONCATENATE2, G.Concatenate) is None
    if sin_first:
        swapped = producer.get(sin_mul.input2_id)
    cat = _params(swapped, G.NodeKind.CONCATENATE2, G.Concatenate)
    if swapped is None or cat is None or cat.input3_id != G.INVALID_VALUE_ID or cat.axis != 3:
        return None
    sin = sin_mul.input1_id if sin_first else sin_mul.input2_id
    high_node, low_node = producer.get(cat.input1_id), producer.get(cat.input2_id)
    high = _params(high_node, G.NodeKind.STATIC_SLICE, G.StaticSlice)
    low = _params(low_node, G.NodeKind.STATIC_SLICE, G.StaticSlice)
    if high is None or low is None or high_node is None or low_node is None:
        return None
    x = low.input_id
    dims = graph.values[x].dims
    if high.input_id != x or len(dims) != 4 or dims[3] % 2:
        return None
    half = dims[3] // 2
    if low.offsets != [0, 0, 0, 0] or high.offsets != [0, 0, 0, half] or \
            low.sizes[2:] != [dims[2], half] or high.sizes != low.sizes:
        return None
    ops = (cos_mul.input1_id, cos_mul.input2_id)
    if x not in ops or ops[0] == ops[1]:
        return None
    cos_first = ops[1] == x
    cos = ops[0] if cos_first else ops[1]
    return _Rotary([by_cos, low_node, high_node, swapped, by_sin], x, cos, sin, cos_first,
                   sin_first, G.INVALID_VALUE_ID, list(low.sizes[:2]))


def _pair(graph: G.XNNGraph, a: _Rotary, b: _Rotary) -> bool:
    va, vb = graph.values[a.x], graph.values[b.x]
    same_but_heads = [d for i, d in enumerate(va.dims) if i != _HEADS] == \
        [d for i, d in enumerate(vb.dims) if i != _HEADS]
    # cos and sin must be the same for every head (size 1 on that axis), or
    # joining the heads would pair them with other heads' tables.
    per_head = any(len(graph.values[t].dims) != 4 or graph.values[t].dims[_HEADS] != 1
                   for t in (a.cos, a.sin))
    return (a.cos, a.sin, a.cos_first, a.sin_first) == (b.cos, b.sin, b.cos_first, b.sin_first) \
        and not per_head and va.datatype == vb.datatype == G.Datatype.FP32 and same_but_heads \
        and a.sequence == b.sequence and a.x != b.x


def _later_readers_only(graph: G.XNNGraph, first: _Rotary, second: _Rotary) -> bool:
    """The joined chain stands where `second` ends: nothing may read `first`'s
    result before that (both inputs are made before their own chains begin)."""
    where = {id(n): i for i, n in enumerate(graph.nodes)}
    end = where[id(second.nodes[-1])]
    for node in graph.nodes[where[id(first.nodes[-1])] + 1:end]:
        if first.output in node_inputs(node.params):
            return False
    return True


def _join(graph: G.XNNGraph, a: _Rotary, b: _Rotary, readers: dict[int, int],
          producer: dict[int, G.Node]) -> None:
    xa, xb = graph.values[a.x], graph.values[b.x]
    heads_a, heads_b = xa.dims[_HEADS], xb.dims[_HEADS]
    dims = [*xa.dims[:_HEADS], heads_a + heads_b, *xa.dims[_HEADS + 1:]]
    half = dims[3] // 2
    sequence = a.sequence

    def value(shape: list[int]) -> int:
        graph.values.append(G.TensorValue(G.Datatype.FP32, list(shape), len(graph.values)))
        return len(graph.values) - 1

    def two(kind: G.NodeKind, x: int, y: int, out: int) -> G.Node:
        return G.Node(kind, G.Node2x1(x, y, out), debug)

    def piece(source: int, offsets: list[int], sizes: list[int], out: int) -> G.Node:
        return G.Node(G.NodeKind.STATIC_SLICE,
                      G.StaticSlice(4, offsets, sizes, source, out), debug)

    debug = b.nodes[-1].debug_handle
    joined, by_cos, low, high, swapped, by_sin, rotated = (
        value(dims), value(dims), value([*dims[:3], half]), value([*dims[:3], half]),
        value(dims), value(dims), value(dims))
    flat = [_flat(graph, a.x, readers, producer), _flat(graph, b.x, readers, producer)]
    if flat[0] is not None and flat[1] is not None and \
            flat[0][0].new_shape[:2] == flat[1][0].new_shape[:2] and \
            graph.values[flat[0][1]].dims[:-1] == graph.values[flat[1][1]].dims[:-1]:
        # Both split a [..., heads * head_dim] result into heads: join those on
        # their last axis instead (row-major, the same elements in the same
        # places), and split once (one reshape for two).
        (reshape_a, row_a, node_a), (_, row_b, node_b) = flat[0], flat[1]
        leading = graph.values[row_a].dims[:-1]
        rows = value([*leading, dims[2] * dims[3]])
        shape = [*reshape_a.new_shape[:2], dims[2], dims[3]]
        join = [G.Node(G.NodeKind.CONCATENATE2, G.Concatenate(
                    len(leading), row_a, row_b, G.INVALID_VALUE_ID, G.INVALID_VALUE_ID, rows),
                    debug),
                G.Node(G.NodeKind.STATIC_RESHAPE, G.StaticReshape(4, shape, rows, joined), debug)]
        gone_too = [node_a, node_b]
    else:
        join = [G.Node(G.NodeKind.CONCATENATE2, G.Concatenate(
            _HEADS, a.x, b.x, G.INVALID_VALUE_ID, G.INVALID_VALUE_ID, joined), debug)]
        gone_too = []
    nodes = [
        *join,
        two(G.NodeKind.MULTIPLY, *((a.cos, joined) if a.cos_first else (joined, a.cos)), by_cos),
        piece(joined, [0, 0, 0, 0], [*sequence, dims[2], half], low),
        piece(joined, [0, 0, 0, half], [*sequence, dims[2], half], high),
        G.Node(G.NodeKind.CONCATENATE2, G.Concatenate(
            3, high, low, G.INVALID_VALUE_ID, G.INVALID_VALUE_ID, swapped), debug),
        two(G.NodeKind.MULTIPLY, *((a.sin, swapped) if a.sin_first else (swapped, a.sin)),
            by_sin),
        two(G.NodeKind.ADD, by_cos, by_sin, rotated),
        piece(rotated, [0, 0, 0, 0], [*sequence, heads_a, dims[3]], a.output),
        piece(rotated, [0, 0, heads_a, 0], [*sequence, heads_b, dims[3]], b.output),
    ]
    gone = {id(n) for n in [*a.nodes, *b.nodes, *gone_too]}
    end = graph.nodes.index(b.nodes[-1])
    graph.nodes = [n for n in graph.nodes[:end] if id(n) not in gone] + nodes + \
        [n for n in graph.nodes[end + 1:] if id(n) not in gone]


def _flat(graph: G.XNNGraph, x: int, readers: dict[int, int], producer: dict[int, G.Node]
          ) -> tuple[G.StaticReshape, int, G.Node] | None:
    """(the reshape, its input, its node) when `x` is a [..., heads * head_dim]
    value split into [batch, sequence, heads, head_dim] that only its rotary
    chain reads (its multiply and two slices)."""
    node = producer.get(x)
    reshape = _params(node, G.NodeKind.STATIC_RESHAPE, G.StaticReshape)
    if node is None or reshape is None or readers.get(x) != 3:
        return None
    row = reshape.input_id
    dims, shape = graph.values[row].dims, graph.values[x].dims
    if not dims or dims[-1] != shape[2] * shape[3] or \
            graph.values[row].datatype != G.Datatype.FP32:
        return None
    return reshape, row, node
