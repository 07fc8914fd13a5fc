"""XnnpackBackend: a partition -> the payload ExecuTorch's XnnpackBackend runs.

`build_blob` walks the partition's nodes in order and has each one's
emitter add XNNPACK values and nodes (`lower_*.py`); the builder keeps
each tensor in the layouts it exists in so far, converting only where an
operator needs another order. Quantized groups (`DQ -> op -> Q`) are
planned first and emitted whole (`lower_quant`). The delegate call passes
the partition's runtime inputs, then its outputs: they become external
values 0..n-1 and n..n+m-1, in that order, as ExecuTorch numbers them (its
runtime reads argument `external_id` for each external value).
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node
from torch.fx.node import map_arg

from exirc.backend.delegation.interface import DelegateSummary, PartitionGraph, PreprocessResult
from exirc.backend.xnnpack import (
    lower_elementwise,
    lower_linear,
    lower_nn,
    lower_norm,
    lower_quant,
    lower_shape,
    qdq,
)
from exirc.backend.xnnpack.args import created
from exirc.backend.xnnpack.builder import GraphBuilder
from exirc.backend.xnnpack.compact import compact
from exirc.backend.xnnpack.lower_elementwise import Emitter
from exirc.backend.xnnpack.lower_patterns import find_patterns
from exirc.backend.xnnpack.merge_projections import merge_projections
from exirc.backend.xnnpack.merge_rotary import merge_rotary
from exirc.backend.xnnpack.sizes import SizeMismatch, at_point, reconcile, size_points
from exirc.errors import InternalError
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.writer import serialize_blob

BACKEND_ID = "XnnpackBackend"
# Folded results this small are stored whatever they are computed from.
SMALL_FOLD_ELEMENTS = 64

EMITTERS: dict[object, Emitter] = {
    **lower_elementwise.EMITTERS,
    **lower_shape.EMITTERS,
    **lower_nn.EMITTERS,
    **lower_linear.EMITTERS,
    **lower_norm.EMITTERS,
    **lower_quant.EMITTERS,
    operator.getitem: lower_shape.emit_getitem,
}
"""Each Edge operator XnnpackSupport takes, and what emits it."""


class XnnpackBackend:
    """Backend -> payload: a partition of Backend-dialect nodes (float32,
    static or upper-bounded shapes, as XnnpackSupport chose them) becomes an XNNPACK graph,
    serialized with its weights in the program's named data."""

    backend_id = BACKEND_ID

    def preprocess(self, partition: PartitionGraph) -> PreprocessResult:
        blob, builder = build_blob(partition)
        summary = DelegateSummary(node_count=len(blob.graph.nodes),
                                  op_kinds=builder.op_kinds(),
                                  weight_bytes=builder.weight_bytes())
        return PreprocessResult(serialize_blob(blob), named_data=builder.named_data,
                                summary=summary)


def build_blob(partition: PartitionGraph) -> tuple[G.XnnpackBlob, GraphBuilder]:
    """The XNNPACK graph of `partition`, and the builder (its weights, its counts).

    A partition with dynamic dims is built at each of `sizes.size_points` and
    the graphs reconciled: upper-bound dims, a 0 where a reshape infers the
    dynamic one."""
    vals = [v for n in partition.graph_module.graph.nodes
            for v in _tensor_vals(n.meta.get("val"))]
    points = size_points(vals)
    if not points:
        blob, b = _build(partition)
        _fewer_nodes(blob.graph, b.named_data)
        return blob, b
    built = []
    for point in points:
        with at_point(point):
            built.append(_build(partition))
    try:
        graph = reconcile([blob.graph for blob, _ in built])
    except SizeMismatch as mismatch:
        raise InternalError(f"xnnpack: a partition with dynamic shapes cannot be built: "
                            f"{mismatch}; XnnpackSupport should not have taken it, please "
                            "report") from mismatch
    b = built[0][1]
    b.graph = graph
    _fewer_nodes(graph, b.named_data)
    return G.XnnpackBlob(graph), b


def _fewer_nodes(graph: G.XNNGraph, named_data: dict[str, bytes]) -> None:
    """Compact the finished graph, then rewrites that save nodes (a decode step's
    cost is mostly per node) and change no value, then compact again if they
    left nodes or constants unread."""
    compact(graph, named_data)  # the readers they count are live nodes only
    if merge_rotary(graph) + merge_projections(graph, named_data):
        compact(graph, named_data)


def _tensor_vals(val: object) -> list[torch.Tensor]:
    vals = val if isinstance(val, (tuple, list)) else [val]
    return [v for v in vals if isinstance(v, torch.Tensor)]


def _build(partition: PartitionGraph) -> tuple[G.XnnpackBlob, GraphBuilder]:
    """The graph as emitted, dead nodes and all (`build_blob` compacts it)."""
    b = GraphBuilder(dict(partition.constants))
    inputs = partition.runtime_inputs
    for external_id, placeholder in enumerate(inputs):
        b.external_input(placeholder, external_id)
    lower_quant.quantize_inputs(b, inputs)
    # Size arithmetic (a view's sym_size argument) is XNNPACK's own at run time.
    calls = [n for n in partition.graph_module.graph.nodes if n.op == "call_function"
             and _tensor_vals(n.meta.get("val"))]
    whole = find_patterns(b, calls)
    # A pattern's root (a dynamically quantized linear layer) is no pt2e group.
    whole.update(lower_quant.find_quantized(b, [n for n in calls if n not in whole]))
    for handle, node in enumerate(calls, start=1):
        if b.is_defined(node) or node in b.absorbed:
            continue  # an earlier emitter did it (an unflattening view_copy of a linear)
        b.debug_handle = handle
        if node in whole:
            whole[node](b)
            continue
        if _fold(b, node):
            continue
        emitter = EMITTERS.get(node.target)
        if emitter is None:
            raise InternalError(f"xnnpack: no lowering for {node.target} (node {node.name}); "
                                "XnnpackSupport should not have taken it, please report")
        emitter(b, node)
    b.debug_handle = 0
    outputs = partition.outputs
    for position, result in enumerate(outputs):
        b.mark_output(result, len(inputs) + position)
    b.graph.num_externs = len(inputs) + len(outputs)
    return G.XnnpackBlob(b.graph), b


def _fold(b: GraphBuilder, node: Node) -> bool:
    """Compute at compile time a node whose tensor inputs are all constants, or
    a creation op (Edge folds most; what is left, e.g. over its size limit,
    is folded here).

    A result of more elements than the constants it is computed from (and
    than `SMALL_FOLD_ELEMENTS`) is not folded: a broadcast of a weight
    (`expand`, `repeat`) would be stored as a weight many times its size.
    Its emitter runs it in the delegate instead, and what is computed from
    it follows, not being constant; a bmm by a broadcast weight reads the
    weight itself (`lower_linear.emit_bmm`). Elements, not bytes: a
    dequantized weight is bigger than its int8 form but no broadcast, and
    is folded, as the quantized lowerings expect.
    """
    made = created(node)
    if made is not None:
        b.fold(node, made)
        return True
    if node.target == operator.getitem or not isinstance(node.target, torch._ops.OpOverload):
        return False
    inputs = node.all_input_nodes
    statics = [b.static(i) for i in inputs]
    if not inputs or any(t is None for t in statics):
        return False
    args, kwargs = map_arg((node.args, node.kwargs), lambda n: b.static(n))
    result = node.target(*args, **kwargs)
    if not isinstance(result, torch.Tensor):
        return False
    if result.numel() > max(sum(t.numel() for t in statics if t is not None),
                            SMALL_FOLD_ELEMENTS):
        return False
    # A quantize of a constant (an activation Edge folded, e.g. a position
    # embedding) is integers: its readers take them as qint8, as a quantize
    # computed here would be.
    params = qdq.tensor_params(node) if qdq.is_q(node) else None
    b.fold(node, result, params.xnnpack if params is not None else None)
    return True
