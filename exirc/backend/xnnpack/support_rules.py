"""The operator rules of XnnpackSupport: for each Edge operator XNNPACK can
run, the arguments it cannot take ("constraint" rejections).

A rule sees a node whose dtypes and shapes already passed (float32, static)
and returns None or ("constraint", reason). The limits are XNNPACK's, as
ExecuTorch 1.5.1's runtime defines its operators (e.g. pooling windows
must be larger than 1x1 and no smaller than their stride, transposed
convolution adjustments smaller than the stride).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.fx import Node

from exirc.backend.xnnpack.args import arg, as_float, as_ints, shape

aten = torch.ops.aten
Reason = tuple[str, str] | None
MAX_EXPAND_ELEMENTS = 1 << 20  # the ones constant an expand multiplies by
POWERS = (1.0, -1.0, 2.0, 3.0, 4.0, 0.5, -0.5)


@dataclass(frozen=True)
class Facts:
    """What rules may ask about the program: the tensor of a constant input."""

    constant: Callable[[Node], torch.Tensor | None]

    def is_constant(self, x: object) -> bool:
        return isinstance(x, Node) and self.constant(x) is not None


Rule = Callable[[Node, Facts], Reason]


def op_name(node: Node) -> str:
    """`aten.add.Tensor`, `quantized_decomposed.choose_qparams.tensor`: an op by its
    own namespace."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target.__name__}"
    return getattr(target, "__name__", str(target))


def constraint(reason: str) -> Reason:
    return "constraint", reason


def anything(node: Node, facts: Facts) -> Reason:
    return None


def only_first_output_used(node: Node) -> Reason:
    for user in node.users:
        if user.target != operator.getitem or user.args[1] != 0:
            return constraint(f"{user.name} uses an output of {op_name(node)} other than "
                              "the first; XNNPACK computes only the first")
    return None


# --- elementwise -------------------------------------------------------------

def elu(node: Node, facts: Facts) -> Reason:
    if as_float(arg(node, 2, "scale", 1)) != 1 or as_float(arg(node, 3, "input_scale", 1)) != 1:
        return constraint("elu with scale or input_scale other than 1; XNNPACK's elu "
                          "has alpha only")
    return None


def add_sub(node: Node, facts: Facts) -> Reason:
    alpha = node.kwargs.get("alpha", 1)
    if alpha != 1 and not facts.is_constant(node.args[1]):
        return constraint(f"alpha={alpha} scales an operand computed at run time")
    return None


def power(node: Node, facts: Facts) -> Reason:
    exponent = node.args[1]
    if not isinstance(exponent, (int, float)) or float(exponent) not in POWERS:
        return constraint(f"pow with exponent {exponent}; taken for exponents 1, 2, 3, 4, "
                          "-1, 0.5 and -0.5 (XNNPACK's square, square root and reciprocal "
                          "square root, and products of them)")
    return None


def to_copy(node: Node, facts: Facts) -> Reason:
    memory_format = node.kwargs.get("memory_format")
    if memory_format not in (None, torch.preserve_format, torch.contiguous_format):
        return constraint(f"_to_copy to {memory_format}; only copies keeping the layout are taken")
    return None


def expand(node: Node, facts: Facts) -> Reason:
    source, out = shape(node.args[0]), shape(node)
    padded = [1] * (len(out) - len(source)) + source
    ones = math.prod(o for p, o in zip(padded, out) if p == 1)
    if ones > MAX_EXPAND_ELEMENTS:
        return constraint(f"expand by {ones} elements; XNNPACK has no broadcast operator and "
                          f"expands by multiplying with ones (up to {MAX_EXPAND_ELEMENTS})")
    return None


# --- data movement -------------------------------------------------------------

def slice_step(node: Node, facts: Facts) -> Reason:
    step = arg(node, 4, "step", 1)
    if step != 1:
        return constraint(f"slice with step {step}; XNNPACK's static slice takes step 1 only")
    return None


def pad(node: Node, facts: Facts) -> Reason:
    pads = as_ints(node.args[1])
    if any(p < 0 for p in pads):
        return constraint(f"negative padding {pads} (cropping); XNNPACK pads only")
    return None


def softmax(node: Node, facts: Facts) -> Reason:
    if bool(arg(node, 2, "half_to_float", False)):
        return constraint("softmax with half_to_float; XNNPACK computes in float32")
    return None


def reduction(node: Node, facts: Facts) -> Reason:
    if node.kwargs.get("dtype") is not None:
        return constraint(f"{op_name(node)} with dtype={node.kwargs['dtype']}; "
                          "XNNPACK keeps float32")
    return None


def group_norm(node: Node, facts: Facts) -> Reason:
    for param in node.args[1:3]:
        if param is not None and not facts.is_constant(param):
            return constraint("group norm weight or bias computed at run time; "
                              "taken as constants only")
    return only_first_output_used(node)


def repeat(node: Node, facts: Facts) -> Reason:
    repeats = as_ints(node.args[1])
    rank = len(repeats) + sum(r > 1 for r in repeats)
    if rank > 6:
        return constraint(f"repeat {repeats} needs rank {rank} to tile; XNNPACK takes at most 6")
    return None


def layer_norm(node: Node, facts: Facts) -> Reason:
    for param in node.args[2:4]:
        if param is not None and not facts.is_constant(param):
            return constraint("layer norm weight or bias computed at run time; "
                              "taken as constants only")
    return only_first_output_used(node)


# --- matrix products -----------------------------------------------------------

def addmm(node: Node, facts: Facts) -> Reason:
    if as_float(node.kwargs.get("alpha", 1)) != 1 and not facts.is_constant(node.args[2]):
        return constraint("addmm alpha scales a weight computed at run time")
    if as_float(node.kwargs.get("beta", 1)) != 1 and not facts.is_constant(node.args[0]):
        return constraint("addmm beta scales a bias computed at run time")
    return None


RULES: dict[object, Rule] = {
    **{op: anything for op in (
        aten.sigmoid.default, aten.tanh.default, aten.gelu.default, aten.abs.default,
        aten.neg.default,
        aten.sqrt.default, aten.rsqrt.default, aten.floor.default, aten.ceil.default,
        aten.exp.default, aten.log.default, aten.sin.default, aten.cos.default,
        aten.hardswish.default, aten.relu.default, aten.hardtanh.default, aten.clamp.default,
        aten.leaky_relu.default, aten.reciprocal.default, aten.clone.default,
        aten.alias_copy.default, aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor,
        aten.div.Scalar, aten.minimum.default, aten.maximum.default, aten.add.Scalar,
        aten.sub.Scalar, aten.permute_copy.default, aten.view_copy.default,
        aten.squeeze_copy.dim, aten.squeeze_copy.dims, aten.squeeze_copy.default,
        aten.unsqueeze_copy.default, aten.select_copy.int, aten.cat.default,
        aten.mm.default, aten.bmm.default, aten.split_with_sizes_copy.default,
        aten.split_copy.Tensor, aten.unbind_copy.int, aten.clamp.Tensor)},
    aten.elu.default: elu,
    aten.add.Tensor: add_sub,
    aten.sub.Tensor: add_sub,
    aten.pow.Tensor_Scalar: power,
    aten._to_copy.default: to_copy,
    aten.expand_copy.default: expand,
    aten.slice_copy.Tensor: slice_step,
    aten.constant_pad_nd.default: pad,
    aten._softmax.default: softmax,
    aten.mean.dim: reduction,
    aten.sum.dim_IntList: reduction,
    aten.native_layer_norm.default: layer_norm,
    aten.native_group_norm.default: group_norm,
    aten.repeat.default: repeat,
    aten.addmm.default: addmm,
}
"""Edge operator -> its rule (the image operators' rules are support_nn.NN_RULES)."""
