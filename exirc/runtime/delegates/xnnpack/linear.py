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
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from exirc.runtime.delegates.xnnpack.context import Env, NodeContext, Op
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


@dataclass(frozen=True)
class ConvGeometry:
    """What a convolution's parameters mean, checked: channel counts, the filter's
    layout change, and the convolution itself (on NCHW values).

    A deconvolution's output is (in - 1) * stride + adjustment + dilation * (k - 1)
    + 1 - pad_before - pad_after; its adjustment rows and columns (bottom, right)
    receive no filter taps, only the bias.
    """

    kind: G.NodeKind
    channels_in: int
    channels_out: int
    kernel: tuple[int, int]
    padding: tuple[int, int, int, int]  # top, right, bottom, left
    stride: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    group_channels: tuple[int, int]  # in, out
    adjustment: tuple[int, int]

    def to_torch(self, f: torch.Tensor) -> torch.Tensor:
        """XNNPACK's filter -> torch's layout, contiguous."""
        if self.kind == G.NodeKind.DEPTHWISE_CONV2D:  # [1, KH, KW, C*M] -> [C*M, 1, KH, KW]
            return f.permute(3, 0, 1, 2).contiguous()
        if self.kind == G.NodeKind.CONV2D:  # [O, KH, KW, I/G] -> [O, I/G, KH, KW]
            return f.permute(0, 3, 1, 2).contiguous()
        # Deconvolution: [G*Og, KH, KW, Ig] -> [G*Ig, Og, KH, KW]
        (kh, kw), g, (gin, gout) = self.kernel, self.groups, self.group_channels
        f = f.permute(0, 3, 1, 2).reshape(g, gout, gin, kh, kw).transpose(1, 2)
        return f.reshape(g * gin, gout, kh, kw).contiguous()

    def convolve(self, value: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
        top, right, bottom, left = self.padding
        symmetric = top == bottom and left == right
        if self.kind != G.NodeKind.CONV_TRANSPOSE2D:
            if symmetric:
                return F.conv2d(value, weight, bias, self.stride, (top, left), self.dilation,
                                self.groups)
            value = F.pad(value, (left, right, top, bottom))
            return F.conv2d(value, weight, bias, self.stride, 0, self.dilation, self.groups)
        if symmetric:
            return F.conv_transpose2d(value, weight, bias, self.stride, (top, left),
                                      self.adjustment, self.groups, self.dilation)
        full = F.conv_transpose2d(value, weight, bias, self.stride, 0, self.adjustment,
                                  self.groups, self.dilation)
        height, width = full.shape[2], full.shape[3]
        if top + bottom >= height or left + right >= width:
            raise ValueError(f"padding ({top}, {right}, {bottom}, {left}) leaves no output "
                             f"of a {height}x{width} deconvolution")
        return full[:, :, top:height - bottom, left:width - right]


def conv_geometry(ctx: NodeContext, p: G.Conv) -> ConvGeometry:
    """Check a convolution's parameters against its input and filter dims."""
    _positive(ctx, kernel_height=p.kernel_height, kernel_width=p.kernel_width,
              subsampling_height=p.subsampling_height, subsampling_width=p.subsampling_width,
              dilation_height=p.dilation_height, dilation_width=p.dilation_width,
              groups=p.groups, group_input_channels=p.group_input_channels,
              group_output_channels=p.group_output_channels)
    kh, kw = p.kernel_height, p.kernel_width
    groups, gin, gout = p.groups, p.group_input_channels, p.group_output_channels
    if ctx.kind == G.NodeKind.DEPTHWISE_CONV2D:
        # As ExecuTorch's runtime defines it: C = groups input channels,
        # M = Og / Ig outputs per channel, filter [1, KH, KW, C*M].
        multiplier = gout // gin
        if multiplier < 1:
            raise ctx.fail(f"its depth multiplier ({gout} / {gin}) is 0")
        channels_in, channels_out = groups, groups * multiplier
        _expect_dims(ctx, p.filter_id, "filter", [1, kh, kw, channels_out])
    else:
        channels_in, channels_out = groups * gin, groups * gout
        _expect_dims(ctx, p.filter_id, "filter", [channels_out, kh, kw, gin])
    if ctx.kind == G.NodeKind.CONV_TRANSPOSE2D and (
            p.adjustment_height >= p.subsampling_height
            or p.adjustment_width >= p.subsampling_width):
        raise ctx.fail(f"its adjustment ({p.adjustment_height}, {p.adjustment_width}) must be "
                       f"below its stride ({p.subsampling_height}, {p.subsampling_width})")
    _expect_dims(ctx, p.input1_id, "input", [None, None, None, channels_in])
    adjustment = ((p.adjustment_height, p.adjustment_width)
                  if ctx.kind == G.NodeKind.CONV_TRANSPOSE2D else (0, 0))
    return ConvGeometry(ctx.kind, channels_in, channels_out, (kh, kw), _padding(p),
                        (p.subsampling_height, p.subsampling_width),
                        (p.dilation_height, p.dilation_width), groups, (gin, gout), adjustment)


def build_convolution(ctx: NodeContext) -> Op:
    """Conv2D, DepthwiseConv2D and ConvTranspose2D: torch's kernels on an NCHW view."""
    p = ctx.node.params
    assert isinstance(p, G.Conv)
    ctx.check_flags(p.flags)
    ids = [(p.input1_id, "input"), (p.filter_id, "filter"), (p.output_id, "output")]
    if p.bias_id != G.INVALID_VALUE_ID:
        ids.append((p.bias_id, "bias"))
    ctx.require_float(ids)
    geometry = conv_geometry(ctx, p)
    x = ctx.read(p.input1_id, "input")
    weight = _operand(ctx, p.filter_id, "filter", geometry.to_torch)
    bias = _bias(ctx, p.bias_id, geometry.channels_out)
    out = ctx.write(p.output_id)
    clamp = ctx.clamp_bounds()
    convolve = geometry.convolve

    def run(env: Env) -> None:
        result = convolve(env[x].permute(0, 3, 1, 2), weight(env), bias(env) if bias else None)
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
    G.NodeKind.CONV_TRANSPOSE2D: build_convolution,
    G.NodeKind.BATCH_MATRIX_MULTIPLY: build_batch_matrix_multiply,
}
