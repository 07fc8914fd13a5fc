"""Emitters of the operators `patterns` finds decomposed: hardswish and PReLU,
one XNNPACK node each instead of three to five."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.fx import Node

from exirc.backend.xnnpack import layout as lay
from exirc.backend.xnnpack.builder import GraphBuilder, shape_of
from exirc.backend.xnnpack.lower_elementwise import unary
from exirc.backend.xnnpack.patterns import Match, match_hardswish, match_prelu
from exirc.serialize.xnnpack import graph as G

aten = torch.ops.aten


def emit_hardswish(b: GraphBuilder, match: Match) -> None:
    unary(b, G.NodeKind.HARDSWISH, match.root, match.x)


def emit_prelu(b: GraphBuilder, match: Match) -> None:
    """XNNPACK's PReLU takes one slope per element of the last physical axis:
    use a copy of x whose last axis is the slope's dim (NHWC for a
    convolution's output), and spread a single slope over that axis."""
    assert match.weight is not None
    weight = b.static(match.weight)
    assert weight is not None
    shape = shape_of(match.x)
    rank = len(shape)
    full = weight.to(torch.float32).reshape([1] * (rank - weight.dim()) + list(weight.shape))
    dims = [d for d in range(rank) if full.shape[d] != 1]
    if dims:
        dim = dims[0]
        version = next((v for v in b.versions(match.x) if v.layout[-1] == dim), None)
        if version is None:
            first = b.get(match.x).layout
            version = b.get(match.x, tuple(d for d in first if d != dim) + (dim,))
        slope = full.reshape(-1)
    else:
        version = b.get(match.x)
        slope = full.reshape(1).expand(shape[version.layout[-1]]).contiguous()
    out = b.value(lay.physical_shape(shape_of(match.root), version.layout))
    b.add_node(G.NodeKind.PRELU, G.Node2x1(version.id, b.static_value(slope), out),
               owner=match.root)
    b.define(match.root, out, version.layout)


FINDERS: tuple[tuple[Callable[[Node, Callable[[Node], torch.Tensor | None]], Match | None],
                     Callable[[GraphBuilder, Match], None]], ...] = (
    (match_hardswish, emit_hardswish),
    (match_prelu, emit_prelu),
)


def find_patterns(b: GraphBuilder, nodes: list[Node]) -> dict[Node, Callable[[GraphBuilder], None]]:
    """For each pattern in `nodes`: its root -> what emits it; the nodes it
    absorbs go to `b.absorbed`, and are not emitted."""
    inside = set(nodes)
    found: dict[Node, Callable[[GraphBuilder], None]] = {}
    for node in nodes:
        for finder, emit in FINDERS:
            match = finder(node, b.static)
            if match is None or not set(match.absorbed) <= inside:
                continue
            b.absorbed.update(match.absorbed)
            found[node] = lambda builder, m=match, e=emit: e(builder, m)  # type: ignore[misc]
            break
    return found
