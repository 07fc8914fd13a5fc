"""Quantized partitions: which groups run on integers, and the nodes they become.

`find_quantized` looks at a partition before anything is emitted (as
`lower_patterns.find_patterns` does) and plans each `DQ -> op -> [clamp] -> Q`
group it can run exactly on qint8:

  - convolutions and linear layers with quantized weights (`lower_qgemm`);
  - add and multiply, where XNNPACK's rescaling takes the scales (it refuses
    ratios outside its fixed-point range), with a following relu or relu6 as
    their output range;
  - relu, hardtanh and clamp on their own: a Clamp node, mapping input to
    output integers as dequantize, clamp, quantize would;
  - mean over the spatial dims and adaptive average pooling to 1x1: global
    average pooling;
  - data movement (view, squeeze, unsqueeze, permute, slice, select, cat, clone,
    zero padding) and max pooling, when input and output share their
    quantization (XNNPACK requires it): the float emitters, on the integers.

A planned group reads its quantizes' integers and defines the result's
quantize; the dequantizes and clamps inside it make no node. Everything else
runs in float32: a quantize whose producer did not define it is a Convert
fp32 -> qint8, and a dequantize a Convert qint8 -> fp32 (made for every one,
dropped by `compact` when nothing reads it). Converts compute what PyTorch's
quantize and dequantize compute, so the float parts are exact too.

One case needs care: XNNPACK's runtime fuses a Clamp into the node before it
when that node takes an output range, and then requantizes once, straight
to the clamp's quantization, where PyTorch rounds twice (once at each Q).
Where the two quantizations differ, the results differ (by up to
output_scale / input_scale steps), so such a clamp is emitted as Convert,
float Clamp, Convert, which XNNPACK does not fuse.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.fx import Node

from exirc.backend.xnnpack import layout as lay
from exirc.backend.xnnpack import qdq, qdq_gemm
from exirc.backend.xnnpack.args import arg, as_float, as_int
from exirc.backend.xnnpack.builder import CLAMPABLE, GraphBuilder, Version, shape_of
from exirc.backend.xnnpack.lower_elementwise import choose_layout, demands
from exirc.backend.xnnpack.lower_qgemm import emit_gemm, quantized_value
from exirc.backend.xnnpack.lower_shape import KEEP_DIMS, pooling_view
from exirc.errors import InternalError
from exirc.serialize.xnnpack import graph as G

aten = torch.ops.aten
Plan = Callable[[GraphBuilder], None]

MOVES = frozenset({
    aten.view_copy.default, aten.squeeze_copy.dim, aten.squeeze_copy.dims,
    aten.squeeze_copy.default, aten.unsqueeze_copy.default, aten.permute_copy.default,
    aten.slice_copy.Tensor, aten.select_copy.int, aten.cat.default, aten.clone.default,
    aten.alias_copy.default, aten.constant_pad_nd.default, aten.max_pool2d.default,
    aten.max_pool2d_with_indices.default})
BINARY: dict[object, G.NodeKind] = {aten.add.Tensor: G.NodeKind.ADD,
                                    aten.mul.Tensor: G.NodeKind.MULTIPLY}
POOLS = (aten.mean.dim, aten._adaptive_avg_pool2d.default)


@dataclass(frozen=True)
class Group:
    """An operator on dequantized inputs whose result goes to one quantize."""

    node: Node
    inputs: tuple[Node, ...]     # the dequantizes, in argument order
    output: qdq.Output

    @property
    def sources(self) -> list[Node]:
        """The quantizes whose integers the inputs are."""
        return [q for dq in self.inputs for q in [dq.args[0]] if isinstance(q, Node)]


# --- planning --------------------------------------------------------------------


def find_quantized(b: GraphBuilder, nodes: list[Node]) -> dict[Node, Plan]:
    """For each group of `nodes` that runs quantized: its operator -> what emits it.
    Nodes it makes no node for go to `b.absorbed`, or become aliases."""
    inside = set(nodes)
    found: dict[Node, Plan] = {}
    for node in nodes:
        if node in b.absorbed or b.is_defined(node):
            continue
        gemm = qdq_gemm.match_gemm(node, b.static)
        if isinstance(gemm, str) or (gemm is not None and not set(gemm.members) <= inside):
            raise InternalError(f"xnnpack: {node.name} has a quantized weight but cannot run "
                                f"quantized ({gemm}); XnnpackSupport took it, please report")
        if gemm is not None:
            b.absorbed.update(gemm.members)
            b.absorbed.discard(gemm.output.q)
            found[node] = lambda builder, g=gemm: emit_gemm(builder, g)  # type: ignore[misc]
            continue
        group = _group(b, node, inside)
        if group is None:
            continue
        if node.target in MOVES:
            # The float emitters move the integers: the dequantizes are their
            # quantizes, and the result's quantize is what they define.
            for dq, q in zip(group.inputs, group.sources):
                b.alias(dq, q)
            b.alias(group.output.q, group.output.inner[-1] if group.output.inner else node)
            continue
        b.absorbed.update([*group.inputs, *group.output.inner])
        found[node] = lambda builder, g=group: _emit(builder, g)  # type: ignore[misc]
    return found


def _group(b: GraphBuilder, node: Node, inside: set[Node]) -> Group | None:
    """`node` as a group that runs quantized here, else None (it runs in float)."""
    target = node.target
    if target not in MOVES and target not in BINARY and target not in POOLS \
            and target not in qdq.CLAMPS:
        return None
    operands = list(node.args[0]) if target == aten.cat.default else (  # type: ignore[arg-type]
        list(node.args[:2]) if target in BINARY else [node.args[0]])
    inputs = []
    for x in operands:
        q = qdq.quantized_input(x)
        if isinstance(q, str) or x not in inside or b.is_static(q) \
                or (q not in inside and q.op != "placeholder"):
            return None
        assert isinstance(x, Node)
        inputs.append(x)
    output = qdq.output_of(node, clamp=target in BINARY or target in POOLS)
    if isinstance(output, str) or output.q not in inside or any(n not in inside
                                                                 for n in output.inner):
        return None
    group = Group(node, tuple(inputs), output)
    return group if _exact(group) else None


def _exact(group: Group) -> bool:
    """Whether XNNPACK's quantized operator computes what the group computes."""
    node, out = group.node, group.output.params
    scales = [qdq.dq_params(dq).scale for dq in group.inputs]
    if node.target in MOVES:
        if any(qdq.dq_params(dq) != out for dq in group.inputs):
            return False  # XNNPACK moves integers between values quantized alike only
        if node.target == aten.constant_pad_nd.default:
            return (arg(node, 2, "value", 0.0) or 0.0) == 0.0  # pads with the zero point
        return True
    if node.target == aten.add.Tensor:
        return as_float(node.kwargs.get("alpha", 1)) == 1.0 \
            and add_rescalable(scales[0], scales[1], out.scale)
    if node.target == aten.mul.Tensor:
        ratio = qdq.f32(qdq.f32(scales[0] * scales[1]) / out.scale)
        return 2.0 ** -16 <= ratio < 2.0 ** 8
    if node.target in POOLS:
        if node.target == aten._adaptive_avg_pool2d.default and shape_of(node)[2:] != [1, 1]:
            return False
        if node.target == aten.mean.dim and node.kwargs.get("dtype") is not None:
            return False
        return 2.0 ** -8 <= qdq.f32(scales[0] / out.scale) < 2.0 ** 8
    return True  # a clamp


def add_rescalable(a_scale: float, b_scale: float, out_scale: float) -> bool:
    """XNNPACK's quantized add turns a_scale / out_scale and b_scale / out_scale into
    fixed-point multipliers; it refuses ratios outside [2^-10, 2^8)."""
    ratios = [qdq.f32(a_scale / out_scale), qdq.f32(b_scale / out_scale)]
    return 2.0 ** -10 <= max(ratios) < 2.0 ** 8 and min(ratios) >= 2.0 ** -10


# --- emitting ----------------------------------------------------------------------


def _emit(b: GraphBuilder, group: Group) -> None:
    if group.node.target in BINARY:
        _binary(b, group)
    elif group.node.target in POOLS:
        _global_average(b, group)
    else:
        _clamp(b, group)


def _binary(b: GraphBuilder, group: Group) -> None:
    out_q, sources = group.output.q, group.sources
    rank = len(shape_of(out_q))
    layout = choose_layout(b, sources, rank, out_q)
    first, second = (b.broadcast_operand(q, layout) for q in sources)
    out = quantized_value(b, lay.physical_shape(shape_of(out_q), layout), group.output.params)
    b.add_node(BINARY[group.node.target], G.Node2x1(first, second, out), owner=out_q,
               min_max=group.output.bounds)
    b.define(out_q, out, layout)


def _clamp(b: GraphBuilder, group: Group) -> None:
    out_q, params = group.output.q, group.output.params
    version = b.get(group.sources[0])
    dims = b.graph.values[version.id].dims
    bounds = qdq.clamp_bounds(group.node)
    producer = b.producer.get(version.id)
    if qdq.dq_params(group.inputs[0]) == params or producer is None \
            or producer.kind not in CLAMPABLE:
        out = quantized_value(b, dims, params)
        b.add_node(G.NodeKind.CLAMP, G.Node1x1(version.id, out), owner=out_q, min_max=bounds)
    else:
        # Not a quantized Clamp: XNNPACK would fuse it into its producer (see above).
        real = b.value(dims)
        b.add_node(G.NodeKind.CONVERT, G.Node1x1(version.id, real))
        clamped = b.unary_op(G.NodeKind.CLAMP, real)
        b.producer[clamped].output_min_max = bounds
        out = quantized_value(b, dims, params)
        b.add_node(G.NodeKind.CONVERT, G.Node1x1(clamped, out), owner=out_q)
    b.define(out_q, out, version.layout)


def _reduced_dims(group: Group) -> list[int]:
    rank = len(shape_of(group.inputs[0]))
    if group.node.target == aten._adaptive_avg_pool2d.default:
        return [rank - 2, rank - 1]
    dims = arg(group.node, 1, "dim")
    return sorted({as_int(d) % rank for d in dims}) if dims else list(range(rank))


def _global_average(b: GraphBuilder, group: Group) -> None:
    """XNNPACK's global average pooling averages the middle of [outer, reduced, 1, inner]:
    the reduced dims wherever they lie together in memory (NHWC's H, W, say)."""
    out_q, source = group.output.q, group.sources[0]
    dims = _reduced_dims(group)
    version, view = pooling_view(b, source, dims)
    pooled = quantized_value(b, [view[0], 1, 1, view[3]], group.output.params)
    b.add_node(G.NodeKind.GLOBAL_AVG_POOLING_2D,
               G.Node1x1(b.reshape(version.id, view), pooled, KEEP_DIMS), owner=out_q,
               min_max=group.output.bounds)
    keep = len(shape_of(out_q)) == len(shape_of(source))
    layout = version.layout if keep else \
        tuple(d - sum(r < d for r in dims) for d in version.layout if d not in dims)
    b.define(out_q, b.reshape(pooled, lay.physical_shape(shape_of(out_q), layout)), layout)


def emit_quantize(b: GraphBuilder, node: Node) -> None:
    """A quantize no quantized operator defined: Convert fp32 -> qint8, in the layout
    of its input's copy that its readers want (ExecuTorch converts before it
    transposes, so a transpose moves a quarter of the bytes)."""
    source = node.args[0]
    assert isinstance(source, Node)
    version = _preferred(b.versions(source), demands(node))
    if version is None:
        version = b.get(source)
    params = qdq.tensor_params(node)
    assert params is not None
    out = quantized_value(b, b.graph.values[version.id].dims, params)
    b.add_node(G.NodeKind.CONVERT, G.Node1x1(version.id, out), owner=node)
    b.define(node, out, version.layout)


def emit_dequantize(b: GraphBuilder, node: Node) -> None:
    """Convert qint8 -> fp32 for the float readers of a dequantize (a float operator,
    or the partition's output), from a copy of the integers in the layout they want."""
    q = node.args[0]
    assert isinstance(q, Node)
    wanted = demands(node)
    version = b.get(q, wanted[0] if wanted else None)
    out = b.value(b.graph.values[version.id].dims)
    b.add_node(G.NodeKind.CONVERT, G.Node1x1(version.id, out), owner=node)
    b.define(node, out, version.layout)


def emit_weight_dequantize(b: GraphBuilder, node: Node) -> None:
    raise InternalError(f"xnnpack: the quantized weight {node.name} is not read by a "
                        "quantized convolution or linear layer; XnnpackSupport took it, "
                        "please report")


def _preferred(versions: Sequence[Version], wanted: list[lay.Layout]) -> Version | None:
    """Of existing copies, one in a layout asked for most, else the first."""
    if not versions:
        return None
    return max(versions, key=lambda v: sum(w == v.layout for w in wanted))


EMITTERS: dict[object, Callable[[GraphBuilder, Node], None]] = {
    qdq.Q_TENSOR: emit_quantize, qdq.DQ_TENSOR: emit_dequantize,
            qdq.DQ_CHANNEL: emit_weight_dequantize}


def quantize_inputs(b: GraphBuilder, inputs: list[Node]) -> None:
    """Make each int8 input of the partition (a quantize's integers another delegate
    computed) a qint8 value, quantized as the dequantizes reading it say."""
    for placeholder in inputs:
        readers = [u for u in placeholder.users if qdq.is_dq(u)]
        if not qdq.is_int8(placeholder) or not readers:
            continue
        value = b.graph.values[b.versions(placeholder)[0].id]
        value.datatype, value.quant = G.Datatype.QINT8, qdq.dq_params(readers[0]).xnnpack
