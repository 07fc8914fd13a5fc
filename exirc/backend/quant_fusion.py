"""QuantFusion: "dequantize -> op -> quantize" patterns become fused quantized ops.

A pattern table, as the fusion pass has: each entry names where it anchors
and builds the replacement, or declines. The ops it makes are ExecuTorch's
quantized kernel library's (`exirc.backend.quantized_ops`), so a target lists
the patterns its runtime has kernels for:

- `symmetric`: a per-channel dequantize with all-zero zero points reads none
  (they cost 8 bytes a channel).
- `embedding`: an embedding of a dequantized table (weight-only quantization,
  or pt2e's per-channel embedding) looks up rows of the integer table and
  dequantizes only those: `embedding_byte` / `embedding_4bit` / `embedding_2bit`.
  4- and 2-bit tables are packed, two or four values a byte, as those kernels
  read them.
- `dequantized_weight`: any other read of a group-wise quantized weight (a
  linear's) dequantizes the whole table through the same kernel, looking up
  every row: ExecuTorch has no group-wise dequantize kernel, and this one is
  exact. A target whose backend runs such linears with their integer weights
  (XNNPACK) sets `refuse_dequantized_weights`: one left to this pattern would
  be dequantized on every call, slower than float, so it is refused with the
  reason instead (`TargetQuantizationError`).
- `add`: DQ(a) + DQ(b) -> Q becomes `quantized_decomposed::add` on the
  quantized tensors, for same-shape per-tensor uint8 operands (ExecuTorch's
  kernel takes uint8 only; int8 adds stay DQ -> add -> Q).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch.fx import Node

from exirc.backend.quantized_ops import EMBEDDING_OPS, is_quantize, pack_nibbles, quantized_add
from exirc.edge.constants import add_constant, constant_tensor
from exirc.errors import TargetQuantizationError, UsageError
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram

_aten = torch.ops.aten

# (quant_min, quant_max) -> bits of the embedding kernel that reads such a table
_BITS = {(-128, 127): 8, (-127, 127): 8, (0, 255): 8, (-8, 7): 4, (-2, 1): 2}

Rewrite = Callable[["ExportedProgram", Node], "Node | None"]


@dataclass(frozen=True)
class QuantPattern:
    name: str
    rewrite: Rewrite  # the replacement for the anchor node, inserted; or None: no match


def _dequantized_table(program: ExportedProgram, node: Any) -> tuple[Any, ...] | None:
    """(constant table node, its tensor, scales, zero points, quant_min, quant_max,
    bits) when `node` dequantizes a constant 2-D table per row or per group."""
    if not isinstance(node, Node) or node.op != "call_function":
        return None
    if is_quantize(node.target, "dequantize_per_channel_group"):
        table, scales, zero_points, quant_min, quant_max = node.args[:5]
    elif is_quantize(node.target, "dequantize_per_channel") and len(node.args) >= 7 \
            and node.args[3] == 0:
        table, scales, zero_points, _, quant_min, quant_max = node.args[:6]
    else:
        return None
    if node.kwargs.get("out_dtype") not in (None, torch.float32):
        return None
    if not isinstance(quant_min, int) or not isinstance(quant_max, int):
        return None
    bits = _BITS.get((quant_min, quant_max))
    value = constant_tensor(program, table) if isinstance(table, Node) else None
    if bits is None or value is None or value.dim() != 2 or \
            value.dtype not in (torch.int8, torch.uint8):
        return None
    scale_value = constant_tensor(program, scales) if isinstance(scales, Node) else None
    if scale_value is None or scale_value.dtype != torch.float32:
        return None
    if bits < 8 and value.shape[1] % (8 // bits):
        return None
    if value.numel() and (int(value.min()) < quant_min or int(value.max()) > quant_max):
        return None  # packing would wrap values outside the range around
    if zero_points is not None:
        # The embedding kernels read zero points in the scales' dtype (pt2e's are int64).
        zero_value = constant_tensor(program, zero_points) \
            if isinstance(zero_points, Node) else None
        if zero_value is None or zero_value.dtype != scale_value.dtype:
            return None
    return table, value, scales, zero_points, quant_min, quant_max, bits


def _table_argument(program: ExportedProgram, table: Node, value: torch.Tensor,
                    bits: int) -> Node:
    """The table as the embedding kernel reads it: packed below 8 bits."""
    if bits == 8:
        return table
    return add_constant(program, f"{table.name}_packed", pack_nibbles(value, bits),
                        described=f"{table.name}, packed {8 // bits} values a byte")


def _embedding_call(program: ExportedProgram, found: tuple[Any, ...], indices: Any,
                    anchor: Node) -> Node:
    table, value, scales, zero_points, quant_min, quant_max, bits = found
    argument = _table_argument(program, table, value, bits)
    graph = anchor.graph
    with graph.inserting_before(anchor):
        fused = graph.call_function(EMBEDDING_OPS[bits], (
            argument, scales, zero_points, quant_min, quant_max, indices))
    fused.meta.update(anchor.meta)
    return fused


def _embedding(program: ExportedProgram, node: Node) -> Node | None:
    if node.target != _aten.embedding.default or len(node.args) < 2:
        return None
    if any(a not in (-1, False) for a in node.args[2:]):
        return None  # padding_idx / scale_grad_by_freq / sparse: the kernels have none
    found = _dequantized_table(program, node.args[0])
    if found is None or (found[-1] == 8 and not _is_int64(node.args[1])):
        return None  # embedding_byte takes int64 indices only: dequantize the whole table
    return _embedding_call(program, found, node.args[1], node)


def _is_int64(node: Any) -> bool:
    value = node.meta.get("val") if isinstance(node, Node) else None
    return isinstance(value, torch.Tensor) and value.dtype == torch.int64


def _dequantized_weight(program: ExportedProgram, node: Node) -> Node | None:
    if not is_quantize(node.target, "dequantize_per_channel_group"):
        return None
    found = _dequantized_table(program, node)
    if found is None:
        return None
    bits = found[-1]
    return _embedding_call(program, found, _row_indices(program, found[1].shape[0], bits), node)


def _row_indices(program: ExportedProgram, count: int, bits: int) -> Node:
    """A constant arange(count), one per row count in the program (the layers of
    a transformer share a handful). ExecuTorch's 4- and 2-bit embedding kernels
    take int32 indices, half of int64's bytes; its embedding_byte takes int64
    only (and aborts on others)."""
    dtype = torch.int64 if bits == 8 else torch.int32
    graph = program.graph_module.graph
    name = f"_quantized_rows_{count}_{str(dtype).removeprefix('torch.')}"
    for node in graph.nodes:
        if node.op == "placeholder" and node.name == name:
            return node
        if node.op != "placeholder":
            break
    return add_constant(program, name, torch.arange(count, dtype=dtype),
                        described="row indices that dequantize a whole quantized weight")


def _per_tensor_args(node: Any) -> tuple[Any, ...] | None:
    """(input, scale, zero point, quant_min, quant_max) of a uint8 per-tensor DQ."""
    if not isinstance(node, Node) or node.target != _dequantize_per_tensor() or \
            node.args[5] != torch.uint8 or node.kwargs.get("out_dtype") not in (None,):
        return None
    return tuple(node.args[:5])


def _add(program: ExportedProgram, node: Node) -> Node | None:
    if node.target != _quantize_per_tensor() or node.args[5] != torch.uint8:
        return None
    added = node.args[0]
    if not isinstance(added, Node) or added.target != _aten.add.Tensor or \
            len(added.users) != 1 or added.kwargs or len(added.args) != 2:
        return None
    a, b = (_per_tensor_args(arg) for arg in added.args)
    if a is None or b is None or not _same_shape(added.args[0], added.args[1], node):
        return None
    with node.graph.inserting_before(node):
        fused = node.graph.call_function(quantized_add, (*a, *b, *node.args[1:5]))
    fused.meta.update(node.meta)
    return fused


def _same_shape(*nodes: Any) -> bool:
    shapes = {tuple(n.meta["val"].shape) for n in nodes
              if isinstance(n, Node) and isinstance(n.meta.get("val"), torch.Tensor)}
    return len(shapes) == 1 and all(isinstance(n, Node) for n in nodes)


def _quantize_per_tensor() -> Any:
    return torch.ops.quantized_decomposed.quantize_per_tensor.default


def _dequantize_per_tensor() -> Any:
    return torch.ops.quantized_decomposed.dequantize_per_tensor.default


def _symmetric(program: ExportedProgram, node: Node) -> Node | None:
    """A per-channel dequantize whose zero points are a constant of zeros (pt2e
    stores them, as int64, even for symmetric weights) reads none instead."""
    if not is_quantize(node.target, "dequantize_per_channel") or len(node.args) < 3 or \
            not isinstance(node.args[2], Node):
        return None
    zero_points = constant_tensor(program, node.args[2])
    if zero_points is None or bool(zero_points.any()):
        return None
    target = node.target
    assert callable(target)
    with node.graph.inserting_before(node):
        fused = node.graph.call_function(target, (*node.args[:2], None, *node.args[3:]),
                                         dict(node.kwargs))
    fused.meta.update(node.meta)
    return fused


PATTERNS: dict[str, QuantPattern] = {p.name: p for p in (
    QuantPattern("symmetric", _symmetric),
    QuantPattern("embedding", _embedding),
    QuantPattern("dequantized_weight", _dequantized_weight),
    QuantPattern("add", _add),
)}


@dataclass(frozen=True)
class QuantFusion(Pass):
    """Backend -> Backend: DQ -> op -> Q patterns become ExecuTorch's fused quantized ops.

    `patterns` names the table's entries to apply (all by default): those the
    target's runtime has kernels for. The integer tables they read stay
    constants; a dead_code_elimination after it drops what they replaced.
    """

    name: ClassVar[str] = "quant_fusion"
    patterns: tuple[str, ...] = tuple(PATTERNS)
    refuse_dequantized_weights: bool = False

    def run(self, program: ExportedProgram) -> PassResult:
        unknown = set(self.patterns) - set(PATTERNS)
        if unknown:
            raise UsageError(f"unknown quant_fusion pattern(s) {sorted(unknown)}",
                             hint=f"known: {', '.join(PATTERNS)}")
        if not _has_quantized_ops(program):
            return PassResult(program, False)
        graph = program.graph_module.graph
        if self.refuse_dequantized_weights:
            _refuse_dequantized_weights(program)
        changed = False
        for name in self.patterns:
            rewrite = PATTERNS[name].rewrite
            for node in list(graph.nodes):
                if node.op != "call_function" or not node.users:
                    continue
                fused = rewrite(program, node)
                if fused is not None:
                    node.replace_all_uses_with(fused)
                    changed = True
            if changed:
                graph.eliminate_dead_code()
        if changed:
            program.graph_module.recompile()
        return PassResult(program, changed)


def _refuse_dequantized_weights(program: ExportedProgram) -> None:
    """Raise if a group-wise quantized weight is read other than by embeddings."""
    for node in program.graph_module.graph.nodes:
        if node.op != "call_function" or \
                not is_quantize(node.target, "dequantize_per_channel_group"):
            continue
        readers = [u for u in node.users if u.target != _aten.embedding.default]
        if not readers:
            continue
        found = _dequantized_table(program, node)
        rows, columns = (int(d) for d in node.args[0].meta["val"].shape) \
            if isinstance(node.args[0], Node) and "val" in node.args[0].meta else (0, 0)
        bits = found[-1] if found is not None else 8
        group = node.args[6] if len(node.args) > 6 else columns
        if _reads_per_token(node):
            _refuse_dynamic(node, rows, columns, _as_group(group, columns))
        if isinstance(group, int) and group < columns:
            why = (f"its int{bits} weights are in groups of {group}, and ExecuTorch's XNNPACK "
                   "runs a float-input linear layer only with weights per output channel")
        elif any(u.target == _aten.embedding.default for u in node.users):
            why = "its weights are shared with an embedding, and XNNPACK reads them only alone"
        else:
            why = "XNNPACK did not take it (--explain-delegation says why)"
        raise TargetQuantizationError(
            f"the weight-only quantized linear layer reading {node.args[0]} [{rows}, {columns}] "
            f"cannot run in XNNPACK with its integer weights: {why}; it would be dequantized "
            "on portable kernels on every call",
            hint="use --quantize 8da4w or 8da8w (activations quantized inside XNNPACK), a "
                 "--group-size of at least the layer's input features, or --target portable")


def _as_group(group: object, columns: int) -> int:
    return group if isinstance(group, int) else columns


def _reads_per_token(weight: Node) -> bool:
    """Whether the program quantizes activations per token outside the delegates: an
    8da4w weight left out is then one of those layers (XNNPACK may have taken its
    transpose and matmul as float ops, so its reader does not say)."""
    return any(is_quantize(n.target, "choose_qparams_per_token_asymmetric")
               for n in weight.graph.nodes)


def _refuse_dynamic(node: Node, rows: int, columns: int, group: int) -> None:
    from exirc.backend.xnnpack.dynamic_linear import block_reason

    why = block_reason(columns, group) or "XNNPACK did not take it (--explain-delegation says why)"
    raise TargetQuantizationError(
        f"the 8da4w linear layer reading {node.args[0]} [{rows}, {columns}] cannot run in "
        f"XNNPACK: {why}; its activations would be quantized on ExecuTorch's quantized "
        "kernels outside the delegate, which a runtime built with XNNPACK alone lacks",
        hint="use a --group-size that is a multiple of 32 and divides the layer's input "
             "features (or at least them: one group a row), --quantize 8da8w, or "
             "--target portable")


def _has_quantized_ops(program: ExportedProgram) -> bool:
    return any(isinstance(n.target, torch._ops.OpOverload)
               and n.target.namespace == "quantized_decomposed"
               for n in program.graph_module.graph.nodes)
