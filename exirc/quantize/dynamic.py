"""Dynamically quantized linear layers: `--quantize 8da4w` and `8da8w`.

Each linear layer (and `addmm`/`mm` with a constant weight) gets

  - its input quantized to int8 at run time, per token (each row of the last
    dim with its own scale and zero point, from the row's range):
    `choose_qparams_per_token_asymmetric -> quantize_per_token ->
    dequantize_per_token`, the ops ExecuTorch's quantized kernel library has;
  - its weight stored as integers: int4 with symmetric scales per group of
    `group_size` input channels (8da4w; `dequantize_per_channel_group`), or
    int8 with one symmetric scale per output channel (8da8w;
    `dequantize_per_channel`).

This is what torchao's `Int8DynamicActivationIntxWeightConfig` computes, and
what ExecuTorch's XNNPACK backend runs as dynamically quantized fully
connected nodes (qdint8 input, qbint4 / qcint8 filter). XNNPACK keeps block
scales in bf16, so 8da4w rounds its scales to bf16 here: the quantized model,
the portable program and the XNNPACK payload then compute with the same
weights.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import GraphModule, Node

from exirc.ir.content import content_digest
from exirc.quantize.graph_weights import (
    drop_unused_attributes,
    first_node,
    weight_reads,
)
from exirc.quantize.weight_only import RANGES, QuantizedWeight

_aten = torch.ops.aten

DEFAULT_GROUP_SIZE = 32  # 8da4w: torchao's Int8DynamicActivationIntxWeightConfig default
MATMULS = (_aten.linear.default, _aten.addmm.default, _aten.mm.default)


def quantize_symmetric(weight: torch.Tensor, bits: int, group_size: int,
                       bf16_scales: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, columns] float -> (int8 values, float32 scales [rows, columns/group]).

    The largest magnitude of a group maps to half the integer range (7.5 for int4,
    127.5 for int8), as torchao's symmetric mapping (`choose_qparams_affine`) does:
    a step finer than mapping it to quant_max, at the cost of clamping a positive
    extreme by half a step. With `bf16_scales` the scales are rounded to bf16 first
    and the values quantized with those."""
    rows, columns = weight.shape
    quant_min, quant_max = RANGES[bits]
    groups = weight.detach().to(torch.float32).reshape(rows, columns // group_size, group_size)
    half_range = (quant_max - quant_min) / 2
    scales = (groups.abs().amax(dim=-1) / half_range).clamp(min=torch.finfo(torch.float32).eps)
    if bf16_scales:
        scales = scales.to(torch.bfloat16).to(torch.float32)
    values = torch.round(groups / scales.unsqueeze(-1)).clamp(quant_min, quant_max)
    return values.reshape(rows, columns).to(torch.int8), scales


def group_size_for(columns: int, group_size: int | None) -> int:
    """8da4w's group: `group_size` (default 32) when it divides the row, else the row."""
    wanted = DEFAULT_GROUP_SIZE if group_size is None else group_size
    if wanted >= columns or columns % wanted:
        return columns
    return wanted


def quantize_dynamic(model: GraphModule, bits: int, group_size: int | None = None
                     ) -> list[QuantizedWeight]:
    """Rewrite `model` (an exported graph module) in place; return the weights quantized."""
    from exirc.ir.quantize_ops import define_quantize_ops

    q = define_quantize_ops()
    quant_min, quant_max = RANGES[bits]
    graph = model.graph
    done: dict[tuple[str, bool], tuple[Node, QuantizedWeight]] = {}
    for use in weight_reads(model, lambda n: n.target in MATMULS):
        node, index, weight_node, transposed, key = \
            use.node, use.index, use.weight, use.transposed, use.key
        if key not in done:
            rows = use.rows(model)
            size = group_size_for(rows.shape[1], group_size) if bits == 4 else rows.shape[1]
            values, scales = quantize_symmetric(rows, bits, size, bf16_scales=bits == 4)
            stem = str(weight_node.target).replace(".", "_") + ("_t" if transposed else "")
            while hasattr(model, f"{stem}_int{bits}") or hasattr(model, f"{stem}_scales"):
                stem += "_linear"  # a tied embedding's table, quantized already
            model.register_buffer(f"{stem}_int{bits}", values)
            model.register_buffer(f"{stem}_scales", scales if bits == 4 else scales.reshape(-1))
            with graph.inserting_before(first_node(graph)):
                stored = graph.get_attr(f"{stem}_int{bits}")
                scale_node = graph.get_attr(f"{stem}_scales")
            with graph.inserting_before(node):
                if bits == 4:
                    read = graph.call_function(q.dequantize_per_channel_group.default, (
                        stored, scale_node, None, quant_min, quant_max, torch.int8, size,
                        torch.float32))
                else:
                    read = graph.call_function(q.dequantize_per_channel.default, (
                        stored, scale_node, None, 0, quant_min, quant_max, torch.int8))
                if transposed:
                    read = graph.call_function(_aten.t.default, (read,))
            done[key] = (read, QuantizedWeight(str(weight_node.target), use.stored_shape(model),
                                               size, digest=content_digest(values, scales)))
        read, entry = done[key]
        entry.users.append(node.name)
        node.update_arg(index, read)
        activation_index = 1 if node.target == _aten.addmm.default else 0
        activation = node.args[activation_index]
        if isinstance(activation, Node):
            node.update_arg(activation_index, _per_token(graph, q, activation, node))
    graph.eliminate_dead_code()
    model.delete_all_unused_submodules()
    drop_unused_attributes(model)
    model.recompile()
    return [entry for _, entry in done.values()]


def _per_token(graph: torch.fx.Graph, ops: Any, x: Node, before: Node) -> Node:
    """x quantized to int8 per token and back, as the layer reads it."""
    with graph.inserting_before(before):
        chosen = graph.call_function(ops.choose_qparams_per_token_asymmetric.default,
                                     (x, torch.int8))
        scales = graph.call_function(operator.getitem, (chosen, 0))
        zero_points = graph.call_function(operator.getitem, (chosen, 1))
        quantized = graph.call_function(ops.quantize_per_token.default,
                                        (x, scales, zero_points, -128, 127, torch.int8))
        return graph.call_function(ops.dequantize_per_token.default,
                                   (quantized, scales, zero_points, -128, 127, torch.int8,
                                    torch.float32))
