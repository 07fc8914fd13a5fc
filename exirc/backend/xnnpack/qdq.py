"""The quantize/dequantize patterns of pt2e graphs, as XNNPACK runs them.

`convert_pt2e` leaves a quantized model as float operators between
`dequantize_per_tensor` (DQ) and `quantize_per_tensor` (Q) nodes, with int8
weights behind `dequantize_per_channel` (or per tensor). XNNPACK runs the
same computation on the integers: a group `DQ(q) -> op -> [activation] -> Q`
becomes one quantized node reading q's integers and writing Q's, so a Q/DQ
pair costs nothing between two quantized nodes. This module and `qdq_gemm`
(convolutions and linear layers) only recognize the patterns; support
(`support_quant`) and the emitters (`lower_quant`, `lower_qgemm`) share
them, so what one takes the other can build.

Only what XNNPACK computes exactly as PyTorch does is recognized: int8
activations over the full [-128, 127] range (XNNPACK saturates there),
weights with zero points of 0 (XNNPACK's quantized filters are symmetric),
literal per-tensor parameters (those of a Q and the DQ reading it equal).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass

import numpy
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines the Q/DQ ops)
from torch.fx import Node

from exirc.backend.quantized_ops import is_quantize
from exirc.backend.xnnpack.args import arg, as_float
from exirc.serialize.xnnpack import graph as G

aten = torch.ops.aten
Q_TENSOR = torch.ops.quantized_decomposed.quantize_per_tensor.default
DQ_TENSOR = torch.ops.quantized_decomposed.dequantize_per_tensor.default
DQ_CHANNEL = torch.ops.quantized_decomposed.dequantize_per_channel.default
Constant = Callable[[Node], torch.Tensor | None]
VIEW = aten.view_copy.default
CLAMPS = (aten.relu.default, aten.hardtanh.default, aten.clamp.default)
INT8 = (-128, 127)


def is_q(node: object) -> bool:
    return isinstance(node, Node) and node.op == "call_function" \
        and is_quantize(node.target, "quantize_per_tensor")


def is_dq(node: object) -> bool:
    return isinstance(node, Node) and node.op == "call_function" \
        and is_quantize(node.target, "dequantize_per_tensor")


def is_weight_dq(node: object) -> bool:
    """A dequantize a weight may come through (per channel, or per tensor)."""
    return isinstance(node, Node) and node.op == "call_function" \
        and is_quantize(node.target, "dequantize_per_tensor", "dequantize_per_channel")


def f32(x: float) -> float:
    return float(numpy.float32(x))


@dataclass(frozen=True)
class QParams:
    """A per-tensor quantization (scale as float32: what every kernel computes with)."""

    scale: float
    zero_point: int
    quant_min: int
    quant_max: int
    dtype: torch.dtype

    @property
    def xnnpack(self) -> G.PerTensorQuant:
        return G.PerTensorQuant(self.scale, self.zero_point)


def tensor_params(node: Node) -> QParams | None:
    """The parameters of a per-tensor Q or DQ given as numbers (None: as tensors)."""
    scale, zero_point = arg(node, 1, "scale"), arg(node, 2, "zero_point")
    if isinstance(scale, Node) or isinstance(zero_point, Node) \
            or not isinstance(scale, (int, float)) or not isinstance(zero_point, int):
        return None
    return QParams(f32(scale), int(zero_point), int(arg(node, 3, "quant_min")),
                   int(arg(node, 4, "quant_max")), arg(node, 5, "dtype"))


def activation_problem(node: Node) -> str | None:
    """Why XNNPACK cannot hold the tensor of this per-tensor Q or DQ as qint8, if it cannot.
    (A quantize's range matters, XNNPACK saturating to int8's; a dequantize's does not.)"""
    p = tensor_params(node)
    name = node.name
    if p is None:
        return f"{name} takes its scale or zero point as tensors; XNNPACK needs them as numbers"
    if p.dtype != torch.int8:
        return f"{name} quantizes to {p.dtype}; XNNPACK takes int8 activations here"
    if (p.quant_min, p.quant_max) != INT8 and is_q(node):
        return (f"{name} clamps to [{p.quant_min}, {p.quant_max}]; XNNPACK saturates qint8 to "
                "[-128, 127] only")
    if not INT8[0] <= p.zero_point <= INT8[1]:
        return f"{name} has zero point {p.zero_point}, outside int8"
    if not (0 < p.scale < math.inf):
        return f"{name} has scale {p.scale}; XNNPACK needs a positive finite float32 scale"
    out_dtype = node.kwargs.get("out_dtype")
    if out_dtype not in (None, torch.float32):
        return f"{name} dequantizes to {out_dtype}; XNNPACK dequantizes to float32"
    return None


# --- groups ----------------------------------------------------------------------


@dataclass(frozen=True)
class Output:
    """What follows a quantized operator up to its quantize: view_copy nodes (a
    linear on [B, T, I]), the first output of a multi-output op, and at most one
    clamp that becomes the operator's output range."""

    q: Node
    params: QParams
    bounds: tuple[float, float] | None
    inner: tuple[Node, ...]


def clamp_bounds(node: Node) -> tuple[float, float]:
    """(min, max) of relu, hardtanh or clamp (absent bounds unbounded)."""
    if node.target == aten.relu.default:
        return 0.0, math.inf
    if node.target == aten.hardtanh.default:
        return as_float(arg(node, 1, "min_val", -1.0)), as_float(arg(node, 2, "max_val", 1.0))
    low, high = arg(node, 1, "min"), arg(node, 2, "max")
    return (-math.inf if low is None else as_float(low),
            math.inf if high is None else as_float(high))


def output_of(node: Node, *, views: bool = False, clamp: bool = True) -> Output | str:
    """`node`'s result up to the quantize that takes it, or why it is not quantized."""
    current, inner, bounds = node, [], None
    while True:
        users = list(current.users)
        if len(users) != 1:
            return (f"{current.name} has {len(users)} users; a quantized operator's result "
                    "goes to one quantize")
        user = users[0]
        if is_q(user):
            break
        moves = (user.target == operator.getitem and user.args[1] == 0 and current is node) \
            or (views and user.target == VIEW)
        if moves:
            pass
        elif clamp and bounds is None and user.target in CLAMPS:
            bounds = clamp_bounds(user)
        else:
            return f"its result goes to {user.name}, not to a quantize"
        inner.append(user)
        current = user
    problem = activation_problem(user)
    if problem is not None:
        return problem
    params = tensor_params(user)
    assert params is not None
    return Output(user, params, bounds, tuple(inner))


def quantized_input(x: object) -> Node | str:
    """The node holding the integers `x` (a dequantize read only here) dequantizes:
    a quantize, or in a partition an int8 input (another delegate's quantize)."""
    if not is_dq(x):
        return f"its input {x} is not dequantized"
    assert isinstance(x, Node)
    if len(x.users) != 1:
        return f"{x.name} has {len(x.users)} users"
    problem = activation_problem(x)
    if problem is not None:
        return problem
    q = x.args[0]
    if is_q(q):
        assert isinstance(q, Node)
        if tensor_params(q) != tensor_params(x):
            return f"{x.name} dequantizes {q.name} with other parameters"
        return q
    if isinstance(q, Node) and q.op == "placeholder" and is_int8(q):
        return q
    return f"{x.name} dequantizes {q}, not a quantize"


def is_int8(node: Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dtype == torch.int8


def dq_params(dq: Node) -> QParams:
    params = tensor_params(dq)
    assert params is not None
    return params
