"""Dynamically quantized linear layers (8da4w / 8da8w) as XNNPACK's qd8 fully connected.

The pattern, as `exirc.quantize.dynamic` writes it and Edge decomposes it:

    s, zp = choose_qparams_per_token_asymmetric(x, int8)
    xq = dequantize_per_token(quantize_per_token(x, s, zp, -128, 127, int8), ...)
    w = dequantize_per_channel_group(w_int4, scales, None, -8, 7, int8, group)  # 8da4w
      | dequantize_per_channel(w_int8, scales, None, 0, -128, 127, int8)         # 8da8w
    y = addmm(bias, [view](xq), permute(w, [1, 0]))  |  mm([view](xq), permute(w))

becomes what ExecuTorch 1.5.1's XNNPACK backend writes for it:

  - a Convert of x (fp32) to a qdint8 value with per-token dynamic quantization
    (num_nonbatch_dims 1): XNNPACK quantizes each row at run time;
  - a FullyConnected reading it, with the filter [out, in] as qbint4 (per group
    of `group` input channels, scales bf16 in named data "scale_<sha256>",
    values + 8 packed two to a byte, low nibble first) or qcint8 (float32 scales
    per output channel), a float32 bias, and a float32 output.

The weights and their scales live in the delegate's data; nothing runs outside.

A weight-only linear layer (`exirc.quantize.weight_only`, per output channel)
is the same FullyConnected reading its float input directly, with a qcint8 or
qcint4 filter (XNNPACK's f32-qc8w / f32-qc4w GEMMs, which ExecuTorch 1.5.1's
runtime accepts though its own partitioner writes none) and no bias: that
runtime multiplies the bias by the channel scales, so the bias is an Add
after it. It equals the weight-only model within float rounding.
XNNPACK chooses each row's parameters as its own kernels do, which may differ
from `choose_qparams_per_token_asymmetric` in the last bit of a scale: the
results agree within a quantization step of the activations.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.fx import Node

from exirc.backend.quantized_ops import is_quantize
from exirc.backend.xnnpack.args import as_float, as_int, as_ints
from exirc.backend.xnnpack.patterns import Match

aten = torch.ops.aten
Constant = Callable[[Node], torch.Tensor | None]
INT4, INT8 = (-8, 7), (-128, 127)
# ExecuTorch 1.5.1's runtime (XNNPACK) refuses a blockwise filter whose blocks are not
# a multiple of 32 input channels (xnn_status_invalid_parameter when the method loads).
BLOCK_MULTIPLE = 32


@dataclass(frozen=True)
class DynamicLinear:
    """A matched layer: its float input, integer weight [out, in], float32 scales
    ([out, in / group] in blocks, else [out]), group size (0: per channel), bias.

    int4 weights in one group a row whose length is not a multiple of 32 are per
    channel (a qcint4 filter: XNNPACK's qd8-f32-qc4w GEMM) rather than blockwise."""

    x: Node
    integers: torch.Tensor
    scales: torch.Tensor
    bits: int
    group_size: int
    bias: torch.Tensor | None
    dynamic: bool = True  # False: a weight-only layer, its input read as float


def _call(node: object, name: str) -> Node | None:
    if isinstance(node, Node) and node.op == "call_function" and is_quantize(node.target, name):
        return node
    return None


def _only_users(node: Node, users: set[Node]) -> bool:
    return set(node.users) <= users


def _activation(value: object) -> tuple[Node, tuple[Node, ...]] | None:
    """The float input behind `[view](dequantize_per_token(quantize_per_token(x, ...)))`
    with its parameters chosen per token, and the nodes in between."""
    view = None
    if isinstance(value, Node) and value.target == aten.view_copy.default:
        view, value = value, value.args[0]
    dq = _call(value, "dequantize_per_token")
    # Under a dynamic length, a delegate measures the view's size from dq itself
    # (`cut.size_source`): a sym_size of dq is no other reader of its values.
    if dq is None or view is not None and any(
            user is not view and user.target is not aten.sym_size.int for user in dq.users):
        return None
    q = _call(dq.args[0], "quantize_per_token")
    if q is None or len(q.users) != 1 or tuple(dq.args[1:6]) != tuple(q.args[1:6]):
        return None
    scales, zero_points = q.args[1], q.args[2]
    if list(q.args[3:6]) != [-128, 127, torch.int8] or dq.args[6] != torch.float32:
        return None
    getters = []
    for index, getter in enumerate((scales, zero_points)):
        if not isinstance(getter, Node) or getter.target is not operator.getitem \
                or getter.args[1] != index or not _only_users(getter, {q, dq}):
            return None
        getters.append(getter)
    chosen = _call(getters[0].args[0], "choose_qparams_per_token_asymmetric")
    if chosen is None or getters[1].args[0] is not chosen or chosen.args[1] != torch.int8 \
            or not _only_users(chosen, set(getters)):
        return None
    x = chosen.args[0]
    if not isinstance(x, Node) or q.args[0] is not x:
        return None
    value = x.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
        return None
    return x, (chosen, *getters, q, dq, *((view,) if view is not None else ()))


def _weight(value: object, constant: Constant) -> tuple[tuple[Node, ...], torch.Tensor,
                                                       torch.Tensor, int, int] | None:
    """`permute(dequantize(w), [1, 0])` of a constant symmetric int4-per-group or
    int8-per-channel weight: (nodes, integers, scales, bits, group size)."""
    if not isinstance(value, Node) or value.target != aten.permute_copy.default \
            or len(value.users) != 1 or [p % 2 for p in as_ints(value.args[1])] != [1, 0]:
        return None
    dq = value.args[0]
    if not isinstance(dq, Node) or len(dq.users) != 1 or \
            dq.kwargs.get("out_dtype") not in (None, torch.float32):
        return None
    grouped = _call(dq, "dequantize_per_channel_group")
    channel = _call(dq, "dequantize_per_channel")
    if grouped is not None:
        table, scale_node, zeros, low, high, dtype, group = grouped.args[:7]
        bits = 4 if (low, high) == INT4 else 8
        if (low, high) not in (INT4, INT8) or grouped.args[7] != torch.float32:
            return None
    elif channel is not None:
        table, scale_node, zeros, axis, low, high, dtype = channel.args[:7]
        bits, group = 8, 0
        if (low, high) != INT8 or axis != 0:
            return None
    else:
        return None
    data = constant(table) if isinstance(table, Node) else None
    scales = constant(scale_node) if isinstance(scale_node, Node) else None
    if dtype != torch.int8 or data is None or scales is None or data.dtype != torch.int8 \
            or data.dim() != 2 or scales.dtype != torch.float32:
        return None
    if zeros is not None:
        zero_values = constant(zeros) if isinstance(zeros, Node) else None
        if zero_values is None or bool(zero_values.any()):
            return None  # XNNPACK's filters are symmetric
    if not bool(((scales > 0) & torch.isfinite(scales)).all()):
        return None
    rows, columns = data.shape
    if grouped is not None:
        if not isinstance(group, int) or group <= 0 or columns % group \
                or bits == 4 and columns % 2 or scales.numel() != rows * (columns // group):
            return None
        if int(data.min()) < as_int(low) or int(data.max()) > as_int(high):
            return None
        scales = scales.reshape(rows, columns // group)
    elif scales.numel() != rows:
        return None
    return (dq, value), data, scales, bits, as_int(group)


def block_reason(columns: int, group: int) -> str | None:
    """Why XNNPACK cannot take a dynamically quantized layer's int4 weights of
    `columns` input channels in groups of `group`; None if it can."""
    if columns % 2:
        return (f"its int4 weights have an odd number of input channels ({columns}), "
                "which XNNPACK's 4-bit filters (two values a byte) cannot hold")
    if group < columns and group % BLOCK_MULTIPLE:
        return (f"its int4 weights are in groups of {group}, and XNNPACK takes groups of "
                f"a multiple of {BLOCK_MULTIPLE} input channels")
    return None


def match_dynamic_linear(root: Node, constant: Constant) -> Match | None:
    found = dynamic_linear(root, constant)
    if found is None:
        return None
    linear, absorbed = found
    return Match(root, linear.x, absorbed)


def dynamic_linear(root: Node, constant: Constant
                   ) -> tuple[DynamicLinear, tuple[Node, ...]] | None:
    """`root` (addmm or mm) as a dynamically quantized linear layer, and the nodes it
    absorbs; None if it is not one."""
    if root.op != "call_function" or root.target not in (aten.addmm.default, aten.mm.default):
        return None
    if root.target == aten.addmm.default:
        if as_float(root.kwargs.get("alpha", 1)) != 1 or as_float(root.kwargs.get("beta", 1)) != 1:
            return None
        bias_node, x_arg, w_arg = root.args[:3]
    else:
        bias_node, (x_arg, w_arg) = None, root.args[:2]
    weight = _weight(w_arg, constant)
    if weight is None:
        return None
    weight_nodes, integers, scales, bits, group = weight
    activation = _activation(x_arg)
    if activation is None:
        return None
    x, activation_nodes = activation
    if bits == 8 and group:
        return None  # XNNPACK's qd8 filters: int8 per channel, int4 per channel or block
    if activation_nodes[-1].target == aten.view_copy.default and isinstance(x_arg, Node) \
            and list(x_arg.meta["val"].shape)[-1] != list(x.meta["val"].shape)[-1]:
        return None  # a view that is not only flattening the leading dims
    if list(x.meta["val"].shape)[-1] != integers.shape[1]:
        return None
    if group % BLOCK_MULTIPLE:
        if group != integers.shape[1]:
            return None  # refused by quant_fusion with the reason (`block_reason`)
        group, scales = 0, scales.reshape(-1)  # one block a row: a qcint4 filter
    bias = None
    if bias_node is not None:
        bias = constant(bias_node) if isinstance(bias_node, Node) else None
        if bias is None or bias.dtype != torch.float32 or bias.numel() != integers.shape[0]:
            return None
        bias = bias.reshape(-1)
    return (DynamicLinear(x, integers, scales, bits, group, bias),
            (*activation_nodes, *weight_nodes))


def _constant_bias(bias_node: object, constant: Constant, channels: int) -> torch.Tensor | None:
    bias = constant(bias_node) if isinstance(bias_node, Node) else None
    if bias is None or bias.dtype != torch.float32 or bias.numel() != channels:
        return None
    return bias.reshape(-1)


def weight_only_linear(root: Node, constant: Constant
                       ) -> tuple[DynamicLinear, tuple[Node, ...]] | None:
    """`root` (addmm or mm) as a weight-only quantized linear layer that XNNPACK runs
    with its integer weights (a float input, a per-channel int8 or int4 filter), and
    the nodes it absorbs; None if it is not one. Grouped weights are not: ExecuTorch
    1.5.1's runtime refuses a blockwise filter on a float input."""
    if root.op != "call_function" or root.target not in (aten.addmm.default, aten.mm.default):
        return None
    if root.target == aten.addmm.default:
        if as_float(root.kwargs.get("alpha", 1)) != 1 or as_float(root.kwargs.get("beta", 1)) != 1:
            return None
        bias_node, x, w_arg = root.args[:3]
    else:
        bias_node, (x, w_arg) = None, root.args[:2]
    weight = _weight(w_arg, constant)
    if weight is None or not is_quantize(weight[0][0].target, "dequantize_per_channel_group"):
        return None
    weight_nodes, integers, scales, bits, group = weight
    if group != integers.shape[1]:
        return None
    if not isinstance(x, Node) or isinstance(x.target, torch._ops.OpOverload) \
            and x.target.namespace == "quantized_decomposed":
        return None  # a statically quantized activation: pt2e's pattern, not this one
    value = x.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float32 \
            or value.shape[-1] != integers.shape[1]:
        return None
    bias = None
    if bias_node is not None:
        bias = _constant_bias(bias_node, constant, integers.shape[0])
        if bias is None:
            return None
    return (DynamicLinear(x, integers, scales.reshape(-1), bits, 0, bias, dynamic=False),
            weight_nodes)


def match_weight_only_linear(root: Node, constant: Constant) -> Match | None:
    found = weight_only_linear(root, constant)
    if found is None:
        return None
    linear, absorbed = found
    return Match(root, linear.x, absorbed)
