"""The quantized convolution and linear layer of pt2e graphs (`Gemm`), as XNNPACK runs them.

`[view](DQ(x)) -> op(weight: [permute](DQ(w)), bias) -> [view] -> [clamp] -> Q`,
with op a convolution, addmm or mm and w a constant int8 tensor, is one
quantized XNNPACK node: qcint8 filter (qint8 for one scale), int32 bias, the
clamp as its output range. Recognized only where XNNPACK computes what
PyTorch does: symmetric weights scaled along the output channels (XNNPACK's
filters have no zero point), a bias that fits int32, and a requantization
scale below the 256 XNNPACK's operators accept.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.fx import Node

from exirc.backend.quantized_ops import is_quantize
from exirc.backend.xnnpack.args import arg, as_float, as_int, as_ints
from exirc.backend.xnnpack.qdq import (
    VIEW,
    Output,
    dq_params,
    is_weight_dq,
    output_of,
    quantized_input,
    tensor_params,
)

aten = torch.ops.aten
Constant = Callable[[Node], torch.Tensor | None]
GEMMS = (aten.convolution.default, aten.addmm.default, aten.mm.default)
# Largest input_scale * weight_scale / output_scale XNNPACK's quantized
# convolutions and fully connected operators accept (they refuse the operator).
MAX_REQUANT = 256.0


@dataclass(frozen=True)
class Weight:
    """A constant int8 weight: its integers and float32 scales (1-D along `axis`,
    or 0-d for one scale), zero points all 0."""

    integers: torch.Tensor
    scale: torch.Tensor
    axis: int | None

    @property
    def per_channel(self) -> bool:
        return self.axis is not None


def weight_of(dq: Node, constant: Constant) -> Weight | str:
    """The weight behind a dequantize of a constant, or why XNNPACK cannot take it."""
    data = constant(dq.args[0]) if isinstance(dq.args[0], Node) else None
    if data is None:
        return f"the weight {dq.args[0]} of {dq.name} is computed at run time"
    if data.dtype != torch.int8:
        return f"the weight of {dq.name} is {data.dtype}; XNNPACK's quantized weights are int8"
    if arg(dq, 6 if is_quantize(dq.target, "dequantize_per_channel") else 5, "dtype") \
            != torch.int8:
        return f"{dq.name} dequantizes a type other than int8"
    if dq.kwargs.get("out_dtype") not in (None, torch.float32):
        return f"{dq.name} dequantizes to {dq.kwargs['out_dtype']}, not float32"
    if is_quantize(dq.target, "dequantize_per_tensor"):
        p = tensor_params(dq)
        if p is None or p.zero_point != 0 or not 0 < p.scale < math.inf:
            return (f"{dq.name} has scale and zero point {p and (p.scale, p.zero_point)}; "
                    "XNNPACK's quantized weights have zero point 0 and a positive scale")
        return Weight(data, torch.tensor(p.scale, dtype=torch.float32), None)
    scales = constant(dq.args[1]) if isinstance(dq.args[1], Node) else None
    zero_points = dq.args[2]
    zeros = constant(zero_points) if isinstance(zero_points, Node) else None
    if scales is None or (zero_points is not None and zeros is None):
        return f"the scales or zero points of {dq.name} are computed at run time"
    axis = int(arg(dq, 3, "axis")) % data.dim()
    scale = scales.to(torch.float32).reshape(-1)
    if scale.numel() != data.shape[axis]:
        return f"{dq.name} has {scale.numel()} scales for {data.shape[axis]} channels"
    if zeros is not None and bool((zeros != 0).any()):
        return f"{dq.name} has nonzero zero points; XNNPACK's quantized weights are symmetric"
    if not bool(((scale > 0) & torch.isfinite(scale)).all()):
        return f"{dq.name} has scales that are not positive and finite"
    return Weight(data, scale, axis)


@dataclass(frozen=True)
class Gemm:
    """A convolution or matrix product with a quantized weight, as one quantized node:
    `[view](DQ(x)) -> op(weight: [permute](DQ(w)), bias) -> Output`."""

    node: Node
    dq: Node
    view: Node | None
    weight: Weight
    weight_nodes: tuple[Node, ...]
    bias: torch.Tensor | None
    output: Output

    @property
    def input_q(self) -> Node:
        q = self.dq.args[0]
        assert isinstance(q, Node)
        return q

    @property
    def members(self) -> tuple[Node, ...]:
        """The nodes that must go with the operator: all of the group but the
        activation's quantize (its integers may come from another delegate)."""
        view = (self.view,) if self.view is not None else ()
        return (self.dq, *view, *self.weight_nodes, *self.output.inner, self.output.q)


def gemm_weight(node: Node) -> tuple[Node, tuple[Node, ...]] | None:
    """The dequantize of a GEMM's weight and the nodes on its way (None: no dequantize)."""
    if node.op != "call_function" or node.target not in GEMMS:
        return None
    w = node.args[2] if node.target == aten.addmm.default else node.args[1]
    if is_weight_dq(w):
        assert isinstance(w, Node)
        return w, (w,)
    if isinstance(w, Node) and w.target == aten.permute_copy.default \
            and node.target != aten.convolution.default and is_weight_dq(w.args[0]):
        dq = w.args[0]
        assert isinstance(dq, Node)
        return dq, (dq, w)
    return None


def weight_consumer(node: Node) -> Node | None:
    """The GEMM whose weight comes through `node` (a dequantize, or its permute)."""
    for user in node.users:
        found = gemm_weight(user)
        if found is not None and node in found[1]:
            return user
        if user.target == aten.permute_copy.default and len(user.users) == 1:
            return weight_consumer(user)
    return None


def match_gemm(node: Node, constant: Constant) -> Gemm | str | None:
    """`node` as a quantized GEMM group; a reason if it has a quantized weight but
    cannot run quantized; None if its weight is not quantized at all."""
    found = gemm_weight(node)
    if found is None:
        return None
    dq, weight_nodes = found
    weight = weight_of(dq, constant)
    if isinstance(weight, str):
        return weight
    for w in weight_nodes:
        if len(w.users) != 1:
            return f"its quantized weight {w.name} is read elsewhere too"
    weight = _weight_layout(node, weight, weight_nodes)
    if isinstance(weight, str):
        return weight
    conv = node.target == aten.convolution.default
    x = node.args[0] if node.target != aten.addmm.default else node.args[1]
    view = None
    if not conv and isinstance(x, Node) and x.target == VIEW and len(x.users) == 1:
        view, x = x, x.args[0]
    q = quantized_input(x)
    if isinstance(q, str):
        return f"its activation is not quantized ({q})"
    bias = _bias(node, constant)
    if isinstance(bias, str):
        return bias
    output = output_of(node, views=not conv)
    if isinstance(output, str):
        return output
    assert isinstance(x, Node)
    gemm = Gemm(node, x, view, weight, weight_nodes, bias, output)
    return _numbers_problem(gemm) or gemm


def _weight_layout(node: Node, weight: Weight, nodes: tuple[Node, ...]) -> Weight | str:
    """The weight as XNNPACK's filter is laid out ([out, in] for a matrix product),
    or why it cannot be: per-channel scales must run along the output channels,
    as XNNPACK's are."""
    if node.target == aten.convolution.default:
        if not weight.per_channel:
            return weight
        transposed, groups = bool(node.args[6]), as_int(node.args[8])
        if transposed and (groups != 1 or weight.axis != 1):
            return ("transposed convolution weights are taken quantized per output channel "
                    "(axis 1) and ungrouped only")
        if not transposed and weight.axis != 0:
            return f"its weight is quantized along axis {weight.axis}, not the output channels"
        return weight
    perm = [p % 2 for p in as_ints(nodes[1].args[1])] if len(nodes) == 2 else []
    if weight.integers.dim() != 2 or perm not in ([], [1, 0]):
        return "its weight is not a [out, in] or [in, out] matrix"
    if not perm:
        # Stored [in, out] and read as it is (a GPT-2 Conv1D's addmm): its
        # transpose is the [out, in] filter, the scales' axis turning with it.
        axis = None if weight.axis is None else 1 - weight.axis
        weight = Weight(weight.integers.t(), weight.scale, axis)
    if weight.per_channel and weight.axis != 0:
        return "its weight is not quantized per output channel"
    return weight


def _bias(node: Node, constant: Constant) -> torch.Tensor | None | str:
    """A GEMM's bias as one float per output channel (None: no bias)."""
    if node.target == aten.mm.default:
        return None
    if node.target == aten.addmm.default:
        if as_float(node.kwargs.get("alpha", 1)) != 1 or as_float(node.kwargs.get("beta", 1)) != 1:
            return "addmm with alpha or beta; taken quantized without them only"
        source = node.args[0]
    else:
        source = node.args[2]
    if source is None:
        return None
    tensor = constant(source) if isinstance(source, Node) else None
    if tensor is None or tensor.dtype != torch.float32:
        return f"its bias {source} is not a float32 constant"
    channels = int(node.meta["val"].shape[1 if node.target == aten.convolution.default else -1])
    if tensor.numel() != channels or (tensor.dim() == 2 and tensor.shape[0] != 1):
        return f"its bias {list(tensor.shape)} is not one value per output channel"
    return tensor.reshape(channels)


def bias_scales(gemm: Gemm) -> torch.Tensor:
    """The int32 bias's scales, input scale * weight scale in float32 (as PyTorch and
    ExecuTorch compute them)."""
    return gemm.weight.scale * torch.tensor(dq_params(gemm.dq).scale, dtype=torch.float32)


def quantized_bias(gemm: Gemm) -> torch.Tensor | None:
    """The bias as the int32 accumulator adds it: round(bias * (1 / scale))."""
    if gemm.bias is None:
        return None
    scale = bias_scales(gemm)
    channels = gemm.bias.numel()
    values = torch.round(gemm.bias * (1.0 / scale.expand(channels)))
    return values.to(torch.int64)


def _numbers_problem(gemm: Gemm) -> str | None:
    bias = quantized_bias(gemm)
    if bias is not None and bool(((bias < -(2 ** 31)) | (bias >= 2 ** 31)).any()):
        return "its bias does not fit int32 at scale input_scale * weight_scale"
    requant = bias_scales(gemm) / gemm.output.params.scale
    if bool((requant >= MAX_REQUANT).any()):
        return (f"input_scale * weight_scale / output_scale reaches {float(requant.max()):g}; "
                f"XNNPACK's quantized operators take less than {MAX_REQUANT:g}")
    return None
