"""Weight-only quantization: linear and embedding weights stored as int8 or int4.

Language models spend their bytes and memory bandwidth on weights, and
quantizing only the weights keeps activations in float, so accuracy barely
moves. Each weight of an embedding, linear, or `addmm`/`mm` with a constant
weight (transformers' GPT-2 `Conv1D`) becomes an integer table with
symmetric scales per group of `group_size` values along the reduction axis
(per output channel when the group spans the whole row), and the graph reads
it through `quantized_decomposed::dequantize_per_channel_group`. QuantFusion
(`exirc.backend.quant_fusion`) later turns those into ExecuTorch's
`embedding_byte` / `embedding_4bit` kernels, packing int4 two to a byte.

A weight shared by several ops (tied embeddings and LM heads) is quantized
once and stored once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.fx import GraphModule, Node

from exirc.ir.content import content_digest
from exirc.quantize.graph_weights import (
    drop_unused_attributes,
    first_node,
    weight_reads,
)

_aten = torch.ops.aten

# bits -> (quant_min, quant_max) as ExecuTorch's embedding kernels take them
RANGES = {8: (-128, 127), 4: (-8, 7)}
DEFAULT_GROUP_SIZE = {8: None, 4: 128}  # None: one scale per output channel


@dataclass
class QuantizedWeight:
    """One weight as stored: which ops read it, its shape, and its group size."""

    name: str
    shape: tuple[int, ...]
    group_size: int
    users: list[str] = field(default_factory=list)
    # What is stored (values and scales), by content: the same weight quantized
    # in two methods (prefill and decode of one model) is one weight, stored once.
    digest: str = ""


def quantize_rows(weight: torch.Tensor, bits: int, group_size: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """A 2-D float weight -> (int8 values, float32 scales [rows, columns/group]),
    symmetric, so the zero point is 0 and dequantizing is one multiply."""
    rows, columns = weight.shape
    quant_min, quant_max = RANGES[bits]
    groups = weight.detach().to(torch.float32).reshape(rows, columns // group_size, group_size)
    # The largest magnitude maps to quant_max; a group of zeros keeps a tiny scale.
    scales = (groups.abs().amax(dim=-1) / quant_max).clamp(min=torch.finfo(torch.float32).tiny)
    values = torch.round(groups / scales.unsqueeze(-1)).clamp(quant_min, quant_max)
    return values.reshape(rows, columns).to(torch.int8), scales


def group_size_for(columns: int, bits: int, group_size: int | None) -> int:
    """The group size used for rows of `columns` values: `group_size` (default by
    bits) when it divides them, else the whole row (one scale per channel)."""
    wanted = DEFAULT_GROUP_SIZE[bits] if group_size is None else group_size
    if wanted is None or wanted >= columns or columns % wanted:
        return columns
    return wanted


def quantize_weights(model: GraphModule, bits: int, group_size: int | None = None,
                     embeddings_only: bool = False) -> list[QuantizedWeight]:
    """Rewrite `model` (an exported graph module) in place; return what was quantized.

    `embeddings_only` leaves matmul weights alone (static int8 quantizes those)."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines the dequantize op)

    dequantize = torch.ops.quantized_decomposed.dequantize_per_channel_group.default
    quant_min, quant_max = RANGES[bits]
    done: dict[tuple[str, bool], tuple[tuple[Node, Node, int], QuantizedWeight]] = {}
    graph = model.graph
    reads = weight_reads(model, lambda n: not embeddings_only
                         or n.target == _aten.embedding.default)
    for use in reads:
        node, index, weight_node, transposed, key = \
            use.node, use.index, use.weight, use.transposed, use.key
        if key not in done:
            rows = use.rows(model)
            size = group_size_for(rows.shape[1], bits, group_size)
            values, scales = quantize_rows(rows, bits, size)
            stem = str(weight_node.target).replace(".", "_")
            suffix = "_t" if transposed else ""
            model.register_buffer(f"{stem}{suffix}_int{bits}", values)
            model.register_buffer(f"{stem}{suffix}_scales", scales)
            with graph.inserting_before(first_node(graph)):
                stored = graph.get_attr(f"{stem}{suffix}_int{bits}")
                scale_node = graph.get_attr(f"{stem}{suffix}_scales")
            entry = QuantizedWeight(str(weight_node.target), use.stored_shape(model), size,
                                    digest=content_digest(values, scales))
            done[key] = ((stored, scale_node, size), entry)
        (stored, scale_node, size), entry = done[key]
        # One dequantize per reader (the table stored once): a backend can then take
        # a linear's with it while a tied embedding reads its own.
        with graph.inserting_before(node):
            read: Node = graph.call_function(dequantize, (
                stored, scale_node, None, quant_min, quant_max, torch.int8, size,
                torch.float32))
            if transposed:
                read = graph.call_function(_aten.t.default, (read,))
        entry.users.append(node.name)
        node.update_arg(index, read)
    graph.eliminate_dead_code()
    model.delete_all_unused_submodules()
    drop_unused_attributes(model)
    model.recompile()
    return [entry for _, entry in done.values()]
