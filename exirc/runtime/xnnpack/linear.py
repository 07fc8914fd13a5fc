"""Matrix nodes: fully connected, the three convolutions, batch matrix multiply.

XNNPACK keeps activations NHWC and filters in its own layouts; torch's
kernels want NCHW and `[O, I/groups, KH, KW]`. Filters that are constants
are brought into torch's layout once, here, at init; activations are viewed
NCHW by a permute (no copy: torch then runs its channels-last kernels) and
the result is viewed back. Filters that are values (computed at run time)
are permuted per call.

Layouts (what ExecuTorch's XNNPACK serializer writes):
    fully connected  filter [O, I]; [I, O] with XNN_FLAG_TRANSPOSE_WEIGHTS
    convolution      filter [G*Og, KH, KW, Ig]
    depthwise        filter [1, KH, KW, C*M] (C = groups, M = Og / Ig)
    deconvolution    filter [G*Og, KH, KW, Ig]
Padding is given per side and may be asymmetric; torch takes symmetric
padding only, so asymmetric padding is applied explicitly (zeros).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from exirc.runtime.xnnpack.context import Env, NodeContext, Op
from exirc.serialize.xnnpack import graph as G

FLAG_TRANSPOSE_WEIGHTS = 0x1  # fully connected: filter is [I, O]; BMM: input 2 is [.., N, K]

Weight = Callable[[Env], torch.Tensor]


def _operand(ctx: NodeContext, value_id: int, role: str,
             convert: Callable[[torch.Tensor], torch.Tensor]) -> Weight:
    """A filter or bias: converted once if a constant, else on every call."""
    constant = ctx.constant(value_id)
    if constant is not None:
        ctx.read(value_id, role)
        fixed = convert(constant)
        return lambda env: fixed
    slot = ctx.read(value_id, role)
    return lambda env: convert(env[slot])


def _bias(ctx: NodeContext, bias_id: int, channels: int) -> Weight | None:
    if bias_id == G.INVALID_VALUE_ID:
        return None
    dims = ctx.dims(bias_id)
    if dims != [channels]:
        raise ctx.fail(f"its bias has dims {dims}, expected [{channels}]")
    return _operand(ctx, bias_id, "bias", lambda t: t)


def build_fully_connected(ctx: NodeContext) -> Op:
    p = ctx.node.params
    assert isinstance(p, G.FullyConnected)
    ctx.check_flags(p.flags, FLAG_TRANSPOSE_WEIGHTS, "XNN_FLAG_TRANSPOSE_WEIGHTS")
    ids = [(p.input1_id, "input"), (p.filter_id, "filter"), (p.output_id, "output")]
    if p.bias_id != G.INVALID_VALUE_ID:
        ids.append((p.bias_id, "bias"))
    ctx.require_float(ids)
    filter_dims = ctx.dims(p.filter_id)
    if len(filter_dims) != 2:
        raise ctx.fail(f"its filter has dims {filter_dims}, expected 2 dims")
    transposed = bool(p.flags & FLAG_TRANSPOSE_WEIGHTS)
    out_channels, in_channels = filter_dims[::-1] if transposed else filter_dims
    input_dims = ctx.dims(p.input1_id)
    if not input_dims or input_dims[-1] != in_channels:
        raise ctx.fail(f"its input has dims {input_dims}, but its filter takes "
                       f"{in_channels} input channels")
    x = ctx.read(p.input1_id, "input")
    # F.linear(x, W) is x @ W.t(); W = filter.t() makes that a plain x @ filter.
    weight = _operand(ctx, p.filter_id, "filter", (lambda t: t.t()) if transposed else
                      (lambda t: t))
    bias = _bias(ctx, p.bias_id, out_channels)
    out = ctx.write(p.output_id)
    clamp = ctx.clamp_bounds()
    linear = F.linear
    if clamp is not None:
        low, high = clamp

        def run_clamped(env: Env) -> None:
            env[out] = linear(env[x], weight(env), bias(env) if bias else None).clamp_(low, high)
        return run_clamped

    def run(env: Env) -> None:
        env[out] = linear(env[x], weight(env), bias(env) if bias else None)
    return run


def _positive(ctx: NodeContext, **numbers: int) -> None:
    for name, number in numbers.items():
        if number <= 0:
            raise ctx.fail(f"its {name} is {number}; it must be at least 1")


def _padding(p: G.Conv | G.Pooling2D) -> tuple[int, int, int, int]:
    return p.padding_top, p.padding_right, p.padding_bottom, p.padding_left


def _expect_dims(ctx: NodeContext, value_id: int, role: str, expected: list[int | None]) -> None:
    dims = ctx.dims(value_id)
    if len(dims) != len(expected) or any(e is not None and d != e
                                         for d, e in zip(dims, expected)):
        shown = ", ".join("*" if e is None else str(e) for e in expected)
        raise ctx.fail(f"its {role} has dims {dims}, expected [{shown}]")


def build_convolution(ctx: NodeContext) -> Op:
    """Conv2D and DepthwiseConv2D: torch's conv2d on an NCHW view."""
    p = ctx.node.params
    assert isinstance(p, G.Conv)
    ctx.check_flags(p.flags)
    _positive(ctx, kernel_height=p.kernel_height, kernel_width=p.kernel_width,
              subsampling_height=p.subsampling_height, subsampling_width=p.subsampling_width,
              dilation_height=p.dilation_height, dilation_width=p.dilation_width,
              groups=p.groups, group_input_channels=p.group_input_channels,
              group_output_channels=p.group_output_channels)
    ids = [(p.input1_id, "input"), (p.filter_id, "filter"), (p.output_id, "output")]
    if p.bias_id != G.INVALID_VALUE_ID:
        ids.append((p.bias_id, "bias"))
    ctx.require_float(ids)
    kh, kw = p.kernel_height, p.kernel_width
    if ctx.kind == G.NodeKind.DEPTHWISE_CONV2D:
        # As ExecuTorch's runtime defines it: C = groups input channels,
        # M = Og / Ig outputs per channel, filter [1, KH, KW, C*M].
        multiplier = p.group_output_channels // p.group_input_channels
        if multiplier < 1:
            raise ctx.fail(f"its depth multiplier ({p.group_output_channels} / "
                           f"{p.group_input_channels}) is 0")
        channels_in, channels_out = p.groups, p.groups * multiplier
        _expect_dims(ctx, p.filter_id, "filter", [1, kh, kw, channels_out])

        def to_torch(f: torch.Tensor) -> torch.Tensor:
            return f.permute(3, 0, 1, 2).contiguous()
    else:
        channels_in = p.groups * p.group_input_channels
        channels_out = p.groups * p.group_output_channels
        _expect_dims(ctx, p.filter_id, "filter",
                     [channels_out, kh, kw, p.group_input_channels])

        def to_torch(f: torch.Tensor) -> torch.Tensor:
            return f.permute(0, 3, 1, 2).contiguous()
    _expect_dims(ctx, p.input1_id, "input", [None, None, None, channels_in])
    x = ctx.read(p.input1_id, "input")
    weight = _operand(ctx, p.filter_id, "filter", to_torch)
    bias = _bias(ctx, p.bias_id, channels_out)
    out = ctx.write(p.output_id)
    top, right, bottom, left = _padding(p)
    stride = (p.subsampling_height, p.subsampling_width)
    dilation = (p.dilation_height, p.dilation_width)
    groups = p.groups
    symmetric = top == bottom and left == right
    padding = (top, left) if symmetric else (0, 0)
    explicit = (left, right, top, bottom)
    clamp = ctx.clamp_bounds()
    conv2d = F.conv2d

    def run(env: Env) -> None:
        value = env[x].permute(0, 3, 1, 2)
        if not symmetric:
            value = F.pad(value, explicit)
        result = conv2d(value, weight(env), bias(env) if bias else None, stride, padding,
                        dilation, groups)
        if clamp is not None:
            result = result.clamp_(*clamp)
        env[out] = result.permute(0, 2, 3, 1)
    return run


def build_deconvolution(ctx: NodeContext) -> Op:
    """ConvTranspose2D: torch's conv_transpose2d, then padding cropped per side.

    Output size (XNNPACK's): (in - 1) * stride + adjustment + dilation * (k - 1) + 1
    - pad_before - pad_after. Adjustment rows and columns (at the bottom and
    right) receive no filter taps: they hold the bias only.
    """
    p = ctx.node.params
    assert isinstance(p, G.Conv)
    ctx.check_flags(p.flags)
    _positive(ctx, kernel_height=p.kernel_height, kernel_width=p.kernel_width,
              subsampling_height=p.subsampling_height, subsampling_width=p.subsampling_width,
              dilation_height=p.dilation_height, dilation_width=p.dilation_width,
              groups=p.groups, group_input_channels=p.group_input_channels,
              group_output_channels=p.group_output_channels)
    if p.adjustment_height >= p.subsampling_height or p.adjustment_width >= p.subsampling_width:
        raise ctx.fail(f"its adjustment ({p.adjustment_height}, {p.adjustment_width}) must be "
                       f"below its stride ({p.subsampling_height}, {p.subsampling_width})")
    ids = [(p.input1_id, "input"), (p.filter_id, "filter"), (p.output_id, "output")]
    if p.bias_id != G.INVALID_VALUE_ID:
        ids.append((p.bias_id, "bias"))
    ctx.require_float(ids)
    groups, gin, gout = p.groups, p.group_input_channels, p.group_output_channels
    kh, kw = p.kernel_height, p.kernel_width
    _expect_dims(ctx, p.filter_id, "filter", [groups * gout, kh, kw, gin])
    _expect_dims(ctx, p.input1_id, "input", [None, None, None, groups * gin])

    def to_torch(f: torch.Tensor) -> torch.Tensor:
        # [G*Og, KH, KW, Ig] -> torch's [G*Ig, Og, KH, KW]
        f = f.permute(0, 3, 1, 2).reshape(groups, gout, gin, kh, kw).transpose(1, 2)
        return f.reshape(groups * gin, gout, kh, kw).contiguous()

    x = ctx.read(p.input1_id, "input")
    weight = _operand(ctx, p.filter_id, "filter", to_torch)
    bias = _bias(ctx, p.bias_id, groups * gout)
    out = ctx.write(p.output_id)
    top, right, bottom, left = _padding(p)
    stride = (p.subsampling_height, p.subsampling_width)
    dilation = (p.dilation_height, p.dilation_width)
    adjustment = (p.adjustment_height, p.adjustment_width)
    symmetric = top == bottom and left == right
    clamp = ctx.clamp_bounds()

    def run(env: Env) -> None:
        value = env[x].permute(0, 3, 1, 2)
        b = bias(env) if bias else None
        if symmetric:
            result = F.conv_transpose2d(value, weight(env), b, stride, (top, left), adjustment,
                                        groups, dilation)
        else:
            full = F.conv_transpose2d(value, weight(env), b, stride, 0, adjustment, groups,
                                      dilation)
            height, width = full.shape[2], full.shape[3]
            if top + bottom >= height or left + right >= width:
                raise ValueError(f"padding ({top}, {right}, {bottom}, {left}) leaves no "
                                 f"output of a {height}x{width} deconvolution")
            result = full[:, :, top:height - bottom, left:width - right]
        if clamp is not None:
            result = result.clamp(*clamp)
        env[out] = result.permute(0, 2, 3, 1)
    return run


def build_batch_matrix_multiply(ctx: NodeContext) -> Op:
    """[.., M, K] @ [.., K, N] (input 2 [.., N, K] with XNN_FLAG_TRANSPOSE_B), batch
    dims broadcast."""
    p = ctx.node.params
    assert isinstance(p, G.Node2x1)
    ctx.check_flags(p.flags, FLAG_TRANSPOSE_WEIGHTS, "XNN_FLAG_TRANSPOSE_B")
    ctx.require_float([(p.input1_id, "input 1"), (p.input2_id, "input 2"),
                     (p.output_id, "output")])
    for value_id, role in ((p.input1_id, "input 1"), (p.input2_id, "input 2")):
        if len(ctx.dims(value_id)) < 2:
            raise ctx.fail(f"its {role} has dims {ctx.dims(value_id)}; it needs at least 2")
    a = ctx.read(p.input1_id, "input 1")
    b = ctx.read(p.input2_id, "input 2")
    out = ctx.write(p.output_id)
    matmul = torch.matmul
    if p.flags & FLAG_TRANSPOSE_WEIGHTS:
        def run_transposed(env: Env) -> None:
            env[out] = matmul(env[a], env[b].transpose(-1, -2))
        return run_transposed

    def run(env: Env) -> None:
        env[out] = matmul(env[a], env[b])
    return run


BUILDERS: dict[G.NodeKind, Callable[[NodeContext], Op]] = {
    G.NodeKind.FULLY_CONNECTED: build_fully_connected,
    G.NodeKind.CONV2D: build_convolution,
    G.NodeKind.DEPTHWISE_CONV2D: build_convolution,
    G.NodeKind.CONV_TRANSPOSE2D: build_deconvolution,
    G.NodeKind.BATCH_MATRIX_MULTIPLY: build_batch_matrix_multiply,
}
