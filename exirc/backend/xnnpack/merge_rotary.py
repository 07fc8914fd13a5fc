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

from exirc.serialize.xnnpack import graph as G

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


def merge_rotary(graph: G.XNNGraph) -> int:
    """XNNGraph -> XNNGraph (before `compact`): two rotary chains over
    [batch, sequence, heads, head_dim] tensors with the same cos, sin and
    shapes but for their heads become one chain over the two joined on the
    heads axis, then a slice back to each. Returns how many pairs were joined."""
    readers = _readers(graph)
    producer = {_output(n): n for n in graph.nodes}
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


def _readers(graph: G.XNNGraph) -> dict[int, int]:
    count: dict[int, int] = {}
    for node in graph.nodes:
        for name, value in vars(node.params).items():
            if name.endswith("_id") and name != "output_id" and value != G.INVALID_VALUE_ID:
                count[value] = count.get(value, 0) + 1
    for value in graph.output_ids:
        count[value] = count.get(value, 0) + 1
    return count


def _rotary(graph: G.XNNGraph, add: G.Node, producer: dict[int, G.Node],
            readers: dict[int, int]) -> _Rotary | None:
    """The chain ending at `add`, if it is one whose inner values nothing else reads."""
    if add.output_min_max is not None:
        return None
    first, second = (producer.get(v) for v in (add.params.input1_id, add.params.input2_id))
    if first is None or second is None:
        return None
    for by_cos, by_sin in ((first, second), (second, first)):
        chain = _halves(graph, by_cos, by_sin, producer)
        if chain is None:
            continue
        nodes, x, cos, sin, cos_first, sin_first = chain
        inner = [_output(n) for n in nodes]
        if all(readers.get(v, 0) == 1 for v in inner) and \
                all(n.output_min_max is None for n in nodes):
            return _Rotary([*nodes, add], x, cos, sin, cos_first, sin_first, _output(add))
    return None


def _halves(graph: G.XNNGraph, by_cos: G.Node, by_sin: G.Node, producer: dict[int, G.Node]
            ) -> tuple[list[G.Node], int, int, int, bool, bool] | None:
    if by_cos.kind != G.NodeKind.MULTIPLY or by_sin.kind != G.NodeKind.MULTIPLY:
        return None
    swapped = producer.get(by_sin.params.input1_id)
    sin_first = swapped is None or swapped.kind != G.NodeKind.CONCATENATE2
    if sin_first:
        swapped = producer.get(by_sin.params.input2_id)
    if swapped is None or swapped.kind != G.NodeKind.CONCATENATE2:
        return None
    sin = by_sin.params.input1_id if sin_first else by_sin.params.input2_id
    cat = swapped.params
    if cat.input3_id != G.INVALID_VALUE_ID or cat.axis != 3:
        return None
    high, low = producer.get(cat.input1_id), producer.get(cat.input2_id)
    if high is None or low is None or {high.kind, low.kind} != {G.NodeKind.STATIC_SLICE}:
        return None
    x = low.params.input_id
    dims = graph.values[x].dims
    if high.params.input_id != x or len(dims) != 4 or dims[3] % 2:
        return None
    half = dims[3] // 2
    if low.params.offsets != [0, 0, 0, 0] or high.params.offsets != [0, 0, 0, half] or \
            low.params.sizes[2:] != [dims[2], half] or high.params.sizes != low.params.sizes:
        return None
    ops = (by_cos.params.input1_id, by_cos.params.input2_id)
    if x not in ops or ops[0] == ops[1]:
        return None
    cos_first = ops[1] == x
    cos = ops[0] if cos_first else ops[1]
    return [by_cos, low, high, swapped, by_sin], x, cos, sin, cos_first, sin_first


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
        and a.nodes[1].params.sizes[:2] == b.nodes[1].params.sizes[:2] and a.x != b.x


def _later_readers_only(graph: G.XNNGraph, first: _Rotary, second: _Rotary) -> bool:
    """The joined chain stands where `second` ends: nothing may read `first`'s
    result before that (both inputs are made before their own chains begin)."""
    where = {id(n): i for i, n in enumerate(graph.nodes)}
    end = where[id(second.nodes[-1])]
    for node in graph.nodes[where[id(first.nodes[-1])] + 1:end]:
        if first.output in _inputs(node):
            return False
    return True


def _inputs(node: G.Node) -> set[int]:
    return {v for k, v in vars(node.params).items()
            if k.endswith("_id") and k != "output_id" and v != G.INVALID_VALUE_ID}


def _join(graph: G.XNNGraph, a: _Rotary, b: _Rotary, readers: dict[int, int],
          producer: dict[int, G.Node]) -> None:
    xa, xb = graph.values[a.x], graph.values[b.x]
    heads_a, heads_b = xa.dims[_HEADS], xb.dims[_HEADS]
    dims = [*xa.dims[:_HEADS], heads_a + heads_b, *xa.dims[_HEADS + 1:]]
    half = dims[3] // 2
    sequence = a.nodes[1].params.sizes[:2]  # 0 where the length is dynamic

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
            flat[0][0].params.new_shape[:2] == flat[1][0].params.new_shape[:2]:
        # Both split a [batch, sequence, heads * head_dim] result into heads: join
        # those instead, and split once (one reshape for two).
        (reshape_a, row_a), (reshape_b, row_b) = flat[0], flat[1]
        rows = value([*graph.values[row_a].dims[:2], dims[2] * dims[3]])
        shape = [*reshape_a.params.new_shape[:2], dims[2], dims[3]]
        join = [G.Node(G.NodeKind.CONCATENATE2, G.Concatenate(
                    2, row_a, row_b, G.INVALID_VALUE_ID, G.INVALID_VALUE_ID, rows), debug),
                G.Node(G.NodeKind.STATIC_RESHAPE, G.StaticReshape(4, shape, rows, joined), debug)]
        gone_too = [reshape_a, reshape_b]
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
          ) -> tuple[G.Node, int] | None:
    """(the reshape, its input) when `x` is a [batch, sequence, heads * head_dim]
    value split into heads that only its rotary chain reads (its multiply and
    two slices)."""
    reshape = producer.get(x)
    if reshape is None or reshape.kind != G.NodeKind.STATIC_RESHAPE or readers.get(x) != 3:
        return None
    row = reshape.params.input_id
    dims, shape = graph.values[row].dims, graph.values[x].dims
    if len(dims) != 3 or dims[:2] != shape[:2] or dims[2] != shape[2] * shape[3] \
            or graph.values[row].datatype != G.Datatype.FP32:
        return None
    return reshape, row
