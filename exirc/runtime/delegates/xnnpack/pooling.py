"""Pooling and resizing nodes, on NHWC activations viewed NCHW for torch.

XNNPACK's semantics, where they differ from torch's defaults:
  - padding is per side; max pooling never picks a padding element (as if
    it were -inf), and average pooling divides by the number of input
    elements in the window, padding excluded (torch's count_include_pad=False);
  - global average pooling keeps the H and W dims (as 1) only with
    XNN_FLAG_KEEP_DIMS, else returns [N, C];
  - argmax pooling uses non-overlapping windows (stride = window) and
    returns, per output, the max and its index in the window counted
    column-major (`x * pooling_height + y`); the first element of the window
    that is not padding is the initial candidate (index 0) and only a strictly
    greater element replaces it;
  - bilinear resize uses half-pixel centres unless XNN_FLAG_ALIGN_CORNERS.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from exirc.runtime.delegates.xnnpack.context import Env, NodeContext, Op
from exirc.serialize.xnnpack import graph as G

FLAG_KEEP_DIMS = 0x40
FLAG_ALIGN_CORNERS = 0x8


def _positive(ctx: NodeContext, **numbers: int) -> None:
    for name, number in numbers.items():
        if number <= 0:
            raise ctx.fail(f"its {name} is {number}; it must be at least 1")


def _nhwc_input(ctx: NodeContext, value_id: int) -> int:
    dims = ctx.dims(value_id)
    if len(dims) != 4:
        raise ctx.fail(f"its input has dims {dims}; it takes a 4-D NHWC tensor")
    return ctx.read(value_id, "input")


def max_pooling_geometry(ctx: NodeContext, p: G.Pooling2D
                         ) -> Callable[[torch.Tensor], torch.Tensor]:
    """Check a max pooling's parameters; the pooling itself, on NCHW values."""
    ctx.check_flags(p.flags, FLAG_KEEP_DIMS, "XNN_FLAG_KEEP_DIMS")
    _positive(ctx, pooling_height=p.pooling_height, pooling_width=p.pooling_width,
              stride_height=p.stride_height, stride_width=p.stride_width,
              dilation_height=p.dilation_height, dilation_width=p.dilation_width)
    dims = ctx.dims(p.input_id)
    if len(dims) != 4:
        raise ctx.fail(f"its input has dims {dims}; it takes a 4-D NHWC tensor")
    kernel = (p.pooling_height, p.pooling_width)
    stride = (p.stride_height, p.stride_width)
    dilation = (p.dilation_height, p.dilation_width)
    top, right, bottom, left = p.padding_top, p.padding_right, p.padding_bottom, p.padding_left
    # torch pads symmetrically, at most half the window; anything else is padded by hand.
    effective = ((kernel[0] - 1) * dilation[0] + 1, (kernel[1] - 1) * dilation[1] + 1)
    native = top == bottom and left == right and 2 * top <= effective[0] \
        and 2 * left <= effective[1]
    padding = (top, left) if native else (0, 0)
    explicit = (left, right, top, bottom)

    def pool(value: torch.Tensor) -> torch.Tensor:
        if not native:
            value = F.pad(value, explicit, value=float("-inf"))
        return F.max_pool2d(value, kernel, stride, padding, dilation)
    return pool


def build_max_pooling(ctx: NodeContext) -> Op:
    p = ctx.node.params
    assert isinstance(p, G.Pooling2D)
    ctx.require_float([(p.input_id, "input"), (p.output_id, "output")])
    pool = max_pooling_geometry(ctx, p)
    x = ctx.read(p.input_id, "input")
    out = ctx.write(p.output_id)
    clamp = ctx.clamp_bounds()

    def run(env: Env) -> None:
        result = pool(env[x].permute(0, 3, 1, 2))
        if clamp is not None:
            result = result.clamp(*clamp)
        env[out] = result.permute(0, 2, 3, 1)
    return run


def build_average_pooling(ctx: NodeContext) -> Op:
    p = ctx.node.params
    assert isinstance(p, G.Pooling2D)
    ctx.check_flags(p.flags, FLAG_KEEP_DIMS, "XNN_FLAG_KEEP_DIMS")
    _positive(ctx, pooling_height=p.pooling_height, pooling_width=p.pooling_width,
              stride_height=p.stride_height, stride_width=p.stride_width)
    ctx.require_float([(p.input_id, "input"), (p.output_id, "output")])
    x = _nhwc_input(ctx, p.input_id)
    out = ctx.write(p.output_id)
    kernel = (p.pooling_height, p.pooling_width)
    stride = (p.stride_height, p.stride_width)
    top, right, bottom, left = p.padding_top, p.padding_right, p.padding_bottom, p.padding_left
    native = top == bottom and left == right and 2 * top <= kernel[0] and 2 * left <= kernel[1]
    explicit = (left, right, top, bottom)
    clamp = ctx.clamp_bounds()

    def run(env: Env) -> None:
        value = env[x].permute(0, 3, 1, 2)
        if native:
            result = F.avg_pool2d(value, kernel, stride, (top, left), count_include_pad=False)
        else:
            # Sum of the real elements in each window over how many there are.
            total = F.avg_pool2d(F.pad(value, explicit), kernel, stride, divisor_override=1)
            ones = torch.ones((1, 1, value.shape[2], value.shape[3]), dtype=value.dtype,
                              device=value.device)
            count = F.avg_pool2d(F.pad(ones, explicit), kernel, stride, divisor_override=1)
            result = total / count
        if clamp is not None:
            result = result.clamp(*clamp)
        env[out] = result.permute(0, 2, 3, 1)
    return run


def build_global_average_pooling(ctx: NodeContext) -> Op:
    p = ctx.node.params
    assert isinstance(p, G.Node1x1)
    ctx.check_flags(p.flags, FLAG_KEEP_DIMS, "XNN_FLAG_KEEP_DIMS")
    ctx.require_float([(p.input_id, "input"), (p.output_id, "output")])
    x = _nhwc_input(ctx, p.input_id)
    out = ctx.write(p.output_id)
    keep = bool(p.flags & FLAG_KEEP_DIMS)
    clamp = ctx.clamp_bounds()

    def run(env: Env) -> None:
        result = torch.mean(env[x], (1, 2), keepdim=keep)
        env[out] = result if clamp is None else result.clamp_(*clamp)
    return run


def build_argmax_pooling(ctx: NodeContext) -> Op:
    p = ctx.node.params
    assert isinstance(p, G.ArgMaxPooling2d)
    ctx.check_flags(p.flags)
    _positive(ctx, pooling_height=p.pooling_height, pooling_width=p.pooling_width)
    ctx.require_float([(p.input_id, "input"), (p.output_value_id, "output")])
    index_value = ctx.value(p.output_index_id, "index output")
    if index_value.datatype != G.Datatype.INT32 or index_value.quant is not None:
        raise ctx.unsupported("its index output is not int32")
    x = _nhwc_input(ctx, p.input_id)
    out = ctx.write(p.output_value_id)
    index_out = ctx.write(p.output_index_id, "index output")
    ph, pw = p.pooling_height, p.pooling_width
    top, right, bottom, left = p.padding_top, p.padding_right, p.padding_bottom, p.padding_left
    explicit = (0, 0, left, right, top, bottom)  # NHWC: pad W then H
    # Window position (row-major y, x) -> XNNPACK's index, x * ph + y.
    column_major = torch.tensor([x_ * ph + y for y in range(ph) for x_ in range(pw)],
                                dtype=torch.int32)

    padded = bool(left or right or top or bottom)

    def windows_of(t: torch.Tensor, oh: int, ow: int) -> torch.Tensor:
        """[N, H, W, C] -> [N, OH, OW, C, ph*pw]: each window's elements, row-major."""
        n, c = t.shape[0], t.shape[3]
        return t[:, :oh * ph, :ow * pw].reshape(n, oh, ph, ow, pw, c) \
            .permute(0, 1, 3, 5, 2, 4).reshape(n, oh, ow, c, ph * pw)

    def run(env: Env) -> None:
        value = env[x]
        n, height, width, c = value.shape
        if padded:
            value = F.pad(value, explicit, value=float("-inf"))
        oh, ow = (height + top + bottom) // ph, (width + left + right) // pw
        windows = windows_of(value, oh, ow)
        if padded:
            # The first element of each window that is not padding.
            real = F.pad(torch.ones((1, height, width, 1), dtype=torch.uint8,
                                    device=value.device), explicit)
            start = windows_of(real, oh, ow).argmax(-1, keepdim=True)
            first = windows.gather(-1, start.expand(n, oh, ow, c, 1)).squeeze(-1)
        else:
            first = windows[..., 0]
        best, position = windows.max(-1)
        improved = best > first
        env[out] = torch.where(improved, best, first)
        env[index_out] = torch.where(improved, column_major.to(position.device)[position],
                                     torch.zeros((), dtype=torch.int32, device=value.device))
    return run


def build_resize_bilinear(ctx: NodeContext) -> Op:
    p = ctx.node.params
    assert isinstance(p, G.StaticResizeBilinear2D)
    ctx.check_flags(p.flags, FLAG_ALIGN_CORNERS, "XNN_FLAG_ALIGN_CORNERS")
    _positive(ctx, new_height=p.new_height, new_width=p.new_width)
    ctx.require_float([(p.input_id, "input"), (p.output_id, "output")])
    x = _nhwc_input(ctx, p.input_id)
    out = ctx.write(p.output_id)
    size = (p.new_height, p.new_width)
    align = bool(p.flags & FLAG_ALIGN_CORNERS)

    def run(env: Env) -> None:
        result = F.interpolate(env[x].permute(0, 3, 1, 2), size=size, mode="bilinear",
                               align_corners=align)
        env[out] = result.permute(0, 2, 3, 1)
    return run


BUILDERS: dict[G.NodeKind, Callable[[NodeContext], Op]] = {
    G.NodeKind.MAX_POOLING_2D: build_max_pooling,
    G.NodeKind.AVG_POOLING_2D: build_average_pooling,
    G.NodeKind.GLOBAL_AVG_POOLING_2D: build_global_average_pooling,
    G.NodeKind.ARG_MAX_POOLING_2D: build_argmax_pooling,
    G.NodeKind.STATIC_RESIZE_BILINEAR_2D: build_resize_bilinear,
}
