"""XnnpackSupport's rules for image operators: convolution, batch norm,
pooling and resizing. XNNPACK runs them on NHWC 4-d values; 1-d
convolutions go through it as height-1 2-d ones."""

from __future__ import annotations

import torch
from torch.fx import Node

from exirc.backend.xnnpack.args import arg, as_int, as_numbers, pair, shape
from exirc.backend.xnnpack.support_rules import (
    Facts,
    Reason,
    Rule,
    constraint,
    only_first_output_used,
    op_name,
)

aten = torch.ops.aten


def _rank4(node: Node) -> Reason:
    rank = len(shape(node.args[0]))
    if rank != 4:
        return constraint(f"{op_name(node)} of a rank-{rank} input; XNNPACK's 2-d image "
                          "operators take batched [N, C, H, W] tensors")
    return None


def convolution(node: Node, facts: Facts) -> Reason:
    weight, bias = node.args[1], node.args[2]
    if not facts.is_constant(weight):
        return constraint("convolution weight computed at run time; XNNPACK packs constant "
                          "filters only")
    if bias is not None and not facts.is_constant(bias):
        return constraint("convolution bias computed at run time; XNNPACK takes constant "
                          "biases only")
    return convolution_geometry(node)


def convolution_geometry(node: Node) -> Reason:
    """What XNNPACK's convolutions take of a convolution's shape and arguments
    (float or quantized alike)."""
    rank = len(shape(node.args[1]))
    if rank not in (3, 4):
        return constraint(f"{rank - 2}-d convolution; XNNPACK has 2-d ones (1-d go through them)")
    if bool(node.args[6]):
        stride, dilation, adjust = (pair(node.args[3], 1), pair(node.args[5], 1),
                                    pair(node.args[7], 0))
        if any(a >= s for a, s in zip(adjust, stride)):
            return constraint(f"transposed convolution output_padding {adjust} not below its "
                              f"stride {stride}; XNNPACK requires it")
        if any(d != 1 for d in dilation) and any(a for a in adjust):
            return constraint("dilated transposed convolution with output_padding")
    return None


def batch_norm(node: Node, facts: Facts) -> Reason:
    for param in node.args[1:5]:
        if param is not None and not facts.is_constant(param):
            return constraint("batch norm statistics or affine parameters computed at run "
                              "time; folded as constants only")
    if len(shape(node.args[0])) < 2:
        return constraint("batch norm of a rank-1 input")
    return only_first_output_used(node)


def _pool_window(node: Node, kernel: list[int], stride: list[int], padding: list[int]) -> Reason:
    if kernel == [1, 1]:
        if stride == [1, 1] and padding == [0, 0]:
            return None  # the identity, no node
        return constraint(f"{op_name(node)} with a 1x1 window and stride {stride}; XNNPACK "
                          "pools windows larger than 1x1")
    if any(s > k for s, k in zip(stride, kernel)):
        return constraint(f"{op_name(node)} stride {stride} larger than its window {kernel}; "
                          "XNNPACK requires stride <= window")
    return None


def max_pool(node: Node, facts: Facts) -> Reason:
    kernel = pair(node.args[1], 1)
    stride = pair(node.args[2], 1) if arg(node, 2, "stride") else kernel
    padding = pair(arg(node, 3, "padding"), 0)
    found = _rank4(node) or _pool_window(node, kernel, stride, padding)
    if found is None and node.target == aten.max_pool2d_with_indices.default:
        return only_first_output_used(node)
    return found


def avg_pool(node: Node, facts: Facts) -> Reason:
    kernel = pair(node.args[1], 1)
    stride = pair(node.args[2], 1) if arg(node, 2, "stride") else kernel
    padding = pair(arg(node, 3, "padding"), 0)
    found = _rank4(node) or _pool_window(node, kernel, stride, padding)
    if found is not None:
        return found
    if bool(arg(node, 4, "ceil_mode", False)):
        in_shape, out_shape = shape(node.args[0]), shape(node)
        floor = [(in_shape[2 + i] + 2 * padding[i] - kernel[i]) // stride[i] + 1 for i in (0, 1)]
        if floor != out_shape[2:]:
            return constraint("avg_pool2d ceil_mode with a partial last window; XNNPACK "
                              "averages whole windows only")
    divisor = arg(node, 6, "divisor_override")
    if divisor is not None and as_int(divisor) != kernel[0] * kernel[1]:
        return constraint(f"avg_pool2d divisor_override={divisor}; XNNPACK divides by the window")
    return None


def adaptive_avg_pool(node: Node, facts: Facts) -> Reason:
    found = _rank4(node)
    if found is not None:
        return found
    in_shape, out_shape = shape(node.args[0]), shape(node)
    if any(i % o for i, o in zip(in_shape[2:], out_shape[2:])):
        return constraint(f"adaptive average pooling {in_shape[2:]} -> {out_shape[2:]} with "
                          "windows of different sizes; taken when the output divides the input")
    return None


def _scales(node: Node) -> list[float] | None:
    if node.target in (aten.upsample_bilinear2d.vec, aten.upsample_nearest2d.vec,
                       aten._upsample_nearest_exact2d.vec):
        scales = node.args[-1]
        return None if scales is None else [float(s) for s in as_numbers(scales)]
    extra = node.args[3:] if node.target == aten.upsample_bilinear2d.default else node.args[2:]
    values = [s for s in extra if s is not None]
    return [float(s) for s in as_numbers(values)] if len(values) == 2 else None


def upsample_bilinear(node: Node, facts: Facts) -> Reason:
    found = _rank4(node)
    if found is not None:
        return found
    scales = _scales(node)
    align_corners = bool(node.args[2])
    in_shape, out_shape = shape(node.args[0]), shape(node)
    if scales is not None and not align_corners and any(
            i * s != o for i, s, o in zip(in_shape[2:], scales, out_shape[2:])):
        return constraint(f"bilinear resize by scale factors {scales} that do not give the "
                          f"output size {out_shape[2:]} exactly; XNNPACK resizes by sizes")
    return None


def upsample_nearest(node: Node, facts: Facts) -> Reason:
    found = _rank4(node)
    if found is not None:
        return found
    in_shape, out_shape = shape(node.args[0]), shape(node)
    if any(o % i for i, o in zip(in_shape[2:], out_shape[2:])):
        return constraint(f"nearest resize {in_shape[2:]} -> {out_shape[2:]} by a fractional "
                          "factor; taken for whole factors only")
    scales = _scales(node)
    if scales is not None and any(o != i * s for i, s, o in zip(in_shape[2:], scales,
                                                               out_shape[2:])):
        return constraint(f"nearest resize by scale factors {scales} that do not give the "
                          f"output size {out_shape[2:]} exactly")
    return None


NN_RULES: dict[object, Rule] = {
    aten.convolution.default: convolution,
    aten._native_batch_norm_legit_no_training.default: batch_norm,
    aten.max_pool2d.default: max_pool,
    aten.max_pool2d_with_indices.default: max_pool,
    aten.avg_pool2d.default: avg_pool,
    aten._adaptive_avg_pool2d.default: adaptive_avg_pool,
    aten.upsample_bilinear2d.vec: upsample_bilinear,
    aten.upsample_bilinear2d.default: upsample_bilinear,
    aten.upsample_nearest2d.vec: upsample_nearest,
    aten.upsample_nearest2d.default: upsample_nearest,
    aten._upsample_nearest_exact2d.vec: upsample_nearest,
    aten._upsample_nearest_exact2d.default: upsample_nearest,
}
