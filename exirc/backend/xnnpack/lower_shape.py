"""Emitters of data-movement operators: permute, reshape, slice, cat, pad,
softmax and mean.

These take an axis or a shape in PyTorch's logical dims; each is remapped
to the physical axes of the layout its input already has, so a permute is
free (a relabelling of the same bytes), a reshape keeps a non-PyTorch
layout when the dims it merges lie together, and cat, slice, pad, softmax
and mean work on NHWC values without converting them back. The data
movers make their results like their inputs (datatype and quantization), so
they move qint8 tensors as well (`lower_quant`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.fx import Node

from exirc.backend.xnnpack import layout as lay
from exirc.backend.xnnpack.args import arg, as_float, as_int, as_ints, as_node
from exirc.backend.xnnpack.builder import GraphBuilder, Version, shape_of
from exirc.backend.xnnpack.layout import Layout
from exirc.backend.xnnpack.lower_elementwise import Emitter, choose_layout, number
from exirc.serialize.xnnpack import graph as G

aten = torch.ops.aten
CAT_KINDS = {2: G.NodeKind.CONCATENATE2, 3: G.NodeKind.CONCATENATE3,
             4: G.NodeKind.CONCATENATE4, 5: G.NodeKind.CONCATENATE5}
KEEP_DIMS = 0x40  # XNN_FLAG_KEEP_DIMS: reductions keep the reduced axes as 1s


def _source(node: Node) -> Node:
    return as_node(node.args[0])


def emit_permute(b: GraphBuilder, node: Node) -> None:
    """No node: every copy of the input is a copy of the result, relabelled."""
    source, perm = _source(node), as_ints(node.args[1])
    perm = [p % len(perm) for p in perm]
    static = b.static(source)
    if static is not None:
        b.fold(node, static.permute(perm))
        return
    for version in b.versions(source):
        b.define(node, version.id, lay.after_permute(version.layout, perm))


def emit_reshape(b: GraphBuilder, node: Node) -> None:
    """view_copy, squeeze_copy, unsqueeze_copy: a reshape of the bytes, in the
    input's layout when the merged dims lie together there."""
    source = _source(node)
    in_shape, out_shape = shape_of(source), shape_of(node)
    for version in b.versions(source):
        layout = lay.reshape_layout(in_shape, out_shape, version.layout)
        if layout is not None:
            b.define(node, b.reshape(version.id, lay.physical_shape(out_shape, layout)), layout)
            return
    vid = b.get_contiguous(source)
    b.define(node, b.reshape(vid, out_shape), lay.identity(len(out_shape)))


def _slice(b: GraphBuilder, version: Version, in_shape: Sequence[int], dim: int,
           start: int, size: int) -> int:
    offsets = [start if d == dim else 0 for d in version.layout]
    sizes = [size if d == dim else int(in_shape[d]) for d in version.layout]
    out = b.value(sizes, like=version.id)
    b.add_node(G.NodeKind.STATIC_SLICE,
               G.StaticSlice(len(sizes), offsets, sizes, version.id, out))
    return out


def _start(node: Node, dim_size: int) -> int:
    given = arg(node, 2, "start")
    start = 0 if given is None else as_int(given)
    if start < 0:
        start += dim_size
    return min(max(start, 0), dim_size)


def emit_slice(b: GraphBuilder, node: Node) -> None:
    source = _source(node)
    in_shape, out_shape = shape_of(source), shape_of(node)
    dim = as_int(arg(node, 1, "dim", 0)) % len(in_shape)
    version = b.get(source)
    if in_shape == out_shape:
        b.alias(node, source)
        return
    out = _slice(b, version, in_shape, dim, _start(node, in_shape[dim]), out_shape[dim])
    b.define(node, out, version.layout)


def emit_select(b: GraphBuilder, node: Node) -> None:
    """select(x, dim, i): a slice of size 1, then a reshape dropping the dim."""
    source = _source(node)
    in_shape = shape_of(source)
    dim, index = as_int(node.args[1]) % len(in_shape), as_int(node.args[2])
    version = b.get(source)
    sliced = _slice(b, version, in_shape, dim, index % in_shape[dim], 1)
    layout = tuple(d - (d > dim) for d in version.layout if d != dim)
    b.define(node, b.reshape(sliced, lay.physical_shape(shape_of(node), layout)), layout)


def emit_cat(b: GraphBuilder, node: Node) -> None:
    out_shape = shape_of(node)
    rank = len(out_shape)
    dim = as_int(arg(node, 1, "dim", 0)) % rank
    tensors = [as_node(t) for t in node.args[0]]  # type: ignore[union-attr]
    # Empty pieces add nothing (PyTorch even allows 1-d empty ones of any rank).
    tensors = [t for t in tensors if math.prod(shape_of(t)) != 0]
    if len(tensors) == 1:
        b.alias(node, tensors[0])
        return
    layout = choose_layout(b, tensors, rank, node)
    ids = [b.get(t, layout).id for t in tensors]
    axis = lay.axis_of(layout, dim)
    sizes = [shape_of(t)[dim] for t in tensors]
    # XNNPACK concatenates 2 to 5 values at once: longer lists go in steps,
    # each step's result the first input of the next.
    while True:
        take = len(ids) if len(ids) <= 5 else 5
        step_ids, step_size = ids[:take], sum(sizes[:take])
        dims = lay.physical_shape(out_shape, layout)
        dims[axis] = step_size
        out = b.value(dims, like=step_ids[0])
        slots = step_ids + [G.INVALID_VALUE_ID] * (5 - take)
        b.add_node(CAT_KINDS[take], G.Concatenate(axis, slots[0], slots[1], slots[2], slots[3],
                                                  out, input5_id=slots[4]), owner=node)
        ids, sizes = [out, *ids[take:]], [step_size, *sizes[take:]]
        if len(ids) == 1:
            break
    b.define(node, out, layout)


def emit_pad(b: GraphBuilder, node: Node) -> None:
    source = _source(node)
    pads = as_ints(node.args[1])
    value = as_float(arg(node, 2, "value", 0.0) or 0.0)
    rank = len(shape_of(source))
    before, after = [0] * rank, [0] * rank
    for i in range(len(pads) // 2):
        before[rank - 1 - i], after[rank - 1 - i] = pads[2 * i], pads[2 * i + 1]
    version = b.get(source)
    out = b.value(lay.physical_shape(shape_of(node), version.layout), like=version.id)
    b.add_node(G.NodeKind.STATIC_CONSTANT_PAD,
               G.StaticConstantPad([before[d] for d in version.layout],
                                   [after[d] for d in version.layout], value, version.id, out),
               owner=node)
    b.define(node, out, version.layout)


def emit_softmax(b: GraphBuilder, node: Node) -> None:
    """XNNPACK's softmax runs over the last physical axis: use a copy that
    has the softmax dim there, or move the dim last (keeping the others)."""
    source = _source(node)
    rank = len(shape_of(source))
    dim = as_int(node.args[1]) % rank
    version = next((v for v in b.versions(source) if v.layout[-1] == dim), None)
    if version is None:
        first = b.get(source).layout
        version = b.get(source, tuple(d for d in first if d != dim) + (dim,))
    out = b.value(lay.physical_shape(shape_of(node), version.layout))
    b.add_node(G.NodeKind.SOFTMAX, G.Node1x1(version.id, out), owner=node)
    b.define(node, out, version.layout)


def _reduced_dims(node: Node, rank: int) -> list[int]:
    dims = arg(node, 1, "dim")
    if not dims:
        return list(range(rank))
    return sorted({d % rank for d in as_ints(dims)})


def _contiguous_run(layout: Layout, dims: list[int]) -> int | None:
    """The first physical axis of `dims` if they lie side by side in `layout`."""
    axes = sorted(lay.axis_of(layout, d) for d in dims)
    return axes[0] if axes == list(range(axes[0], axes[0] + len(axes))) else None


def pooling_view(b: GraphBuilder, source: Node, dims: list[int]) -> tuple[Version, list[int]]:
    """A copy of `source` whose `dims` lie side by side in memory (converted
    if none does), and its bytes seen as [outer, reduced, 1, inner]: the NHWC
    shape global average pooling reduces over H*W ("reduced")."""
    version = next((v for v in b.versions(source) if _contiguous_run(v.layout, dims) is not None),
                   None)
    if version is None:
        first = b.get(source).layout
        version = b.get(source, tuple(d for d in first if d not in dims) + tuple(dims))
    start = _contiguous_run(version.layout, dims)
    assert start is not None
    physical = lay.physical_shape(shape_of(source), version.layout)
    if len(physical) == 4 and start == 1 and len(dims) == 2:
        return version, physical  # already [N, H, W, C]: no reshape
    return version, [math.prod(physical[:start]), math.prod(physical[start:start + len(dims)]),
                     1, math.prod(physical[start + len(dims):])]


def global_average(b: GraphBuilder, vid: int, view: list[int], owner: Node | None = None) -> int:
    """Global average pooling of value `vid` seen as `view`: [outer, 1, 1, inner]."""
    pooled = b.value([view[0], 1, 1, view[3]])
    b.add_node(G.NodeKind.GLOBAL_AVG_POOLING_2D, G.Node1x1(b.reshape(vid, view), pooled, KEEP_DIMS),
               owner=owner)
    return pooled


def _mean(b: GraphBuilder, node: Node) -> tuple[int, Layout]:
    """mean over dims as XNNPACK's global average pooling: the reduced dims,
    wherever they lie together in memory, become its H*W and what comes after
    them its channels; so mean over H,W of an NHWC value needs no conversion,
    and a mean over the last dim works too. Returns the pooled value (not yet
    reshaped) and the result's layout."""
    source = _source(node)
    dims = _reduced_dims(node, len(shape_of(source)))
    keepdim = bool(arg(node, 2, "keepdim", False))
    version, view = pooling_view(b, source, dims)
    pooled = global_average(b, version.id, view, owner=node)
    if keepdim:
        return pooled, version.layout
    return pooled, tuple(d - sum(r < d for r in dims) for d in version.layout if d not in dims)


def emit_mean(b: GraphBuilder, node: Node) -> None:
    pooled, layout = _mean(b, node)
    b.define(node, b.reshape(pooled, lay.physical_shape(shape_of(node), layout)), layout)


def emit_sum(b: GraphBuilder, node: Node) -> None:
    """sum = mean * count (one more node; XNNPACK's sum is not in the format)."""
    in_shape = shape_of(_source(node))
    count = math.prod(in_shape[d] for d in _reduced_dims(node, len(in_shape)))
    pooled, layout = _mean(b, node)
    scaled = b.value(b.graph.values[pooled].dims)
    b.add_node(G.NodeKind.MULTIPLY,
               G.Node2x1(pooled, b.static_value(number(count)), scaled), owner=node)
    b.define(node, b.reshape(scaled, lay.physical_shape(shape_of(node), layout)), layout)


SPLITS = (aten.split_with_sizes_copy.default, aten.split_copy.Tensor, aten.unbind_copy.int)


def emit_split(b: GraphBuilder, node: Node) -> None:
    """Nothing yet: each getitem of a split is the slice it takes."""


def emit_getitem(b: GraphBuilder, node: Node) -> None:
    """Piece i of a split (a slice) or of an unbind (a select); else output 0
    of batch norm, max pooling or layer norm, which their emitters define as
    the node itself."""
    source, index = _source(node), as_int(node.args[1])
    if source.target not in SPLITS:
        b.alias(node, source)
        return
    whole = _source(source)
    in_shape = shape_of(whole)
    dim = as_int(arg(source, 1 if source.target == aten.unbind_copy.int else 2, "dim", 0))
    dim %= len(in_shape)
    version = b.get(whole)
    if source.target == aten.unbind_copy.int:
        sliced = _slice(b, version, in_shape, dim, index, 1)
        layout = tuple(d - (d > dim) for d in version.layout if d != dim)
        b.define(node, b.reshape(sliced, lay.physical_shape(shape_of(node), layout)), layout)
        return
    sizes = [int(piece.shape[dim]) for piece in source.meta["val"]]
    b.define(node, _slice(b, version, in_shape, dim, sum(sizes[:index]), sizes[index]),
             version.layout)


EMITTERS: dict[object, Emitter] = {
    aten.permute_copy.default: emit_permute,
    aten.view_copy.default: emit_reshape,
    aten.squeeze_copy.dim: emit_reshape,
    aten.squeeze_copy.dims: emit_reshape,
    aten.squeeze_copy.default: emit_reshape,
    aten.unsqueeze_copy.default: emit_reshape,
    aten.slice_copy.Tensor: emit_slice,
    aten.select_copy.int: emit_select,
    aten.cat.default: emit_cat,
    aten.constant_pad_nd.default: emit_pad,
    aten._softmax.default: emit_softmax,
    aten.mean.dim: emit_mean,
    aten.sum.dim_IntList: emit_sum,
    **{op: emit_split for op in SPLITS},
}
