"""Quantized matrix nodes: fully connected and convolutions, with XNNPACK's arithmetic.

Integer products are computed exactly: the integer inputs and weights
(after subtracting zero points) are float64 tensors, whose products and sums
are exact integers at any size a delegate can have, so torch's float64
kernels give the int32 accumulator XNNPACK's kernels compute. What follows
is XNNPACK's float32 epilogue:

  - dynamic (qdint8 input, qcint8 / qbint4 weights, float32 output): as the
    FMA kernels XNNPACK runs on x86 (AVX2 / AVX-512 VNNI) compute it, bit for
    bit (see `_dynamic_fc`): per channel, fma(accumulator * row scale,
    channel scale, bias); per block, a float32 sum started at the packed
    weights' zero-point term with one fma per block of 32 or more inputs,
    then * row scale + bias; then the fused clamp;
  - weight-only (fp32 input, qcint8 / qcint4 weights, float32 output):
    (input . integers [+ bias]) * channel scale, then the fused clamp;
  - static (qint8 / quint8 input and output, qcint8 or qint8 weights, int32
    bias): requantized as `quant.requantize` does, saturated to the fused
    clamp's quantized bounds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy
import torch

from exirc.runtime.delegates.xnnpack import linear
from exirc.runtime.delegates.xnnpack.context import Env, NodeContext, Op
from exirc.runtime.delegates.xnnpack.quant import (
    F32,
    Dynamic,
    Static,
    Weights,
    output_bounds,
    requantize,
    static_params,
    weights,
)
from exirc.serialize.xnnpack import graph as G

# XNNPACK's x86 qd8 GEMMs with VNNI dot products (unsigned times signed bytes) read
# the int8 activations as unsigned: values and zero point + 128 (the float32
# zero-point term of a blockwise GEMM rounds differently with the offset).
UNSIGNED_OFFSET = 128.0


def _requant_scales(x: Static, w: Weights, out: Static) -> torch.Tensor:
    """float32(float32(input_scale * weight_scale) / output_scale), per channel, as XNNPACK
    computes it when it creates the operator."""
    device = w.integers.device
    if device.type == "meta":  # the shape check: the values do not matter
        return torch.ones(w.scale.shape, dtype=torch.float32, device=device)
    scales = w.scale.to(torch.float32).numpy().astype(F32)
    result = (F32(x.scale) * scales).astype(F32) / F32(out.scale)
    return torch.from_numpy(numpy.asarray(result, dtype=F32))


def _bias(ctx: NodeContext, bias_id: int, channels: int, quantized: bool) -> torch.Tensor | None:
    """A constant bias: exact int32 values for static graphs, float32 otherwise."""
    if bias_id == G.INVALID_VALUE_ID:
        return None
    if ctx.dims(bias_id) != [channels]:
        raise ctx.fail(f"its bias has dims {ctx.dims(bias_id)}, expected [{channels}]")
    if quantized:
        value = ctx.value(bias_id, "bias")
        if value.datatype not in (G.Datatype.QINT32, G.Datatype.QCINT32):
            raise ctx.unsupported("its bias is not int32")
        assert ctx.source is not None
        return weights(ctx, ctx.source, bias_id, "bias").integers.reshape(channels)
    ctx.require_float([(bias_id, "bias")])
    bias = ctx.constant(bias_id)
    if bias is None:
        raise ctx.unsupported("its bias is computed at run time")
    ctx.read(bias_id, "bias")
    return bias


def build_fully_connected(ctx: NodeContext) -> Op:
    p = ctx.node.params
    assert isinstance(p, G.FullyConnected)
    ctx.check_flags(p.flags, linear.FLAG_TRANSPOSE_WEIGHTS, "XNN_FLAG_TRANSPOSE_WEIGHTS")
    assert ctx.source is not None
    w = weights(ctx, ctx.source, p.filter_id, "filter")
    integers, scale = w.integers, w.scale
    if p.flags & linear.FLAG_TRANSPOSE_WEIGHTS:
        if w.group_size:
            raise ctx.unsupported("its blockwise filter is transposed")
        integers, scale = integers.t(), scale.reshape(-1, 1) if scale.dim() else scale
    if integers.dim() != 2:
        raise ctx.fail(f"its filter has dims {list(integers.shape)}, expected 2 dims")
    channels, inputs = integers.shape
    if scale.dim() and scale.shape[0] != channels and not w.group_size:
        raise ctx.unsupported("its filter is quantized along its input channels")
    x_value = ctx.value(p.input1_id, "input")
    if not x_value.dims or x_value.dims[-1] != inputs:
        raise ctx.fail(f"its input has dims {list(x_value.dims)}, but its filter takes "
                       f"{inputs} input channels")
    x = ctx.read(p.input1_id, "input")
    if x_value.datatype == G.Datatype.QDINT8:
        quant = x_value.quant
        if not isinstance(quant, G.PerTokenDynamicQuant) or quant.num_nonbatch_dims != 1:
            raise ctx.unsupported("its qdint8 input is not quantized per row")
        ctx.require_float([(p.output_id, "output")])
        bias = _bias(ctx, p.bias_id, channels, quantized=False)
        return _dynamic_fc(ctx, x, ctx.write(p.output_id), w, integers, scale, bias)
    if x_value.datatype == G.Datatype.FP32:
        return _float_input_fc(ctx, x, w, integers, scale)
    x_params = static_params(ctx, p.input1_id, "input")
    out_params = static_params(ctx, p.output_id, "output")
    if w.group_size:
        raise ctx.unsupported("its blockwise filter takes a static quantized input")
    bias = _bias(ctx, p.bias_id, channels, quantized=True)
    requant = _requant_scales(x_params, Weights(integers, scale.reshape(-1)), out_params)
    bounds = output_bounds(ctx, out_params)
    out = ctx.write(p.output_id)
    weight_t = integers.t().contiguous()
    zp = x_params.zero_point

    def run(env: Env) -> None:
        acc = torch.matmul(env[x].to(torch.float64) - zp, weight_t)
        if bias is not None:
            acc = acc + bias
        env[out] = requantize(acc, requant, out_params, bounds)
    return run


def fma_f32(product: torch.Tensor, addend: torch.Tensor) -> torch.Tensor:
    """float32 fused multiply-add: `product` (float64, the exact product of the two
    float32 factors) + `addend` (float32 values), rounded once to float32.

    The float64 sum can round, and rounding that again to float32 would be a
    double rounding; where the float64 sum falls exactly on a float32 midpoint
    but was inexact, the exact remainder (Knuth's two-sum) decides the side."""
    addend = addend.to(torch.float64)
    total = product + addend
    back = total - product
    error = (product - (total - back)) + (addend - back)
    rounded = total.to(torch.float32)
    if rounded.device.type == "meta":  # the shape check
        return rounded
    near = rounded.to(torch.float64)
    other = torch.nextafter(rounded, torch.where(near < total, torch.inf, -torch.inf)
                            .to(torch.float32))
    tie = (near != total) & ((near + other.to(torch.float64)) * 0.5 == total) & (error != 0)
    if bool(tie.any()):
        up = torch.where(error > 0, torch.maximum(rounded, other), torch.minimum(rounded, other))
        rounded = torch.where(tie, up, rounded)
    return rounded


def _float_input_fc(ctx: NodeContext, x: int, w: Weights, integers: torch.Tensor,
                    scale: torch.Tensor) -> Op:
    """fp32 input, qcint8 / qcint4 filter, fp32 output (XNNPACK's f32-qc8w / f32-qc4w
    GEMMs: weight-only quantized linear layers). The products are summed, then
    multiplied by each channel's scale; a bias is added before that multiply, as
    ExecuTorch 1.5.1's runtime does (so a float bias comes out scaled: exirc writes
    such layers without one)."""
    p = ctx.node.params
    assert isinstance(p, G.FullyConnected)
    if w.group_size:
        raise ctx.unsupported("its blockwise filter takes a float input (ExecuTorch's runtime "
                              "refuses the method)")
    ctx.require_float([(p.output_id, "output")])
    channels, inputs = integers.shape
    bias = _bias(ctx, p.bias_id, channels, quantized=False)
    weight_t = integers.t().contiguous()
    channel_scale = scale.reshape(-1).to(torch.float64)
    clamp = ctx.clamp_bounds()
    out = ctx.write(p.output_id)

    def run(env: Env) -> None:
        value = env[x]
        acc = torch.matmul(value.reshape(-1, inputs).to(torch.float64), weight_t)
        if bias is not None:
            acc = acc + bias.to(torch.float64)
        result = (acc * channel_scale).to(torch.float32)
        if clamp is not None:
            result = result.clamp_(*clamp)
        env[out] = result.reshape(*value.shape[:-1], channels)
    return run


def _dynamic_fc(ctx: NodeContext, x: int, out: int, w: Weights, integers: torch.Tensor,
                scale: torch.Tensor, bias: torch.Tensor | None) -> Op:
    """XNNPACK's qd8-f32-qc8w / qb4w GEMM, as its x86 FMA kernels compute it (the
    AVX-512 VNNI ones bit for bit against ExecuTorch 1.5.1's runtime; kernels
    without FMA, or with signed dot products, round the float32 epilogue
    differently, by an ulp or so of the output):

      - per channel (qcint8): the exact int32 accumulator sum((x - zp) * w), as float32,
        times the row scale (rounded), then fma(., channel scale, bias);
      - per block (qbint4): the packed weights carry ksum = -sum over blocks of
        sum(w) * block scale (float32, accumulated block by block) and the kernel
        starts from ksum * zero point, adds each block's exact integer
        sum(x * w) times its bf16 scale with one fma, multiplies by the row
        scale and adds the bias. The VNNI kernels read x and the zero point as
        unsigned (+ 128), which changes how the zero-point term rounds.
    """
    clamp = ctx.clamp_bounds()
    channels, inputs = integers.shape
    device = integers.device
    bias32 = (bias if bias is not None else torch.zeros(channels, device=device)
              ).to(torch.float32)
    if w.group_size:
        blocks = inputs // w.group_size
        # [blocks, group, channels]: each block's integers, for a batched product.
        blocked = integers.reshape(channels, blocks, w.group_size).permute(1, 2, 0).contiguous()
        block_scale = w.scale.t().to(torch.float64).contiguous()  # [blocks, channels], bf16
        ksum = torch.zeros(channels, dtype=torch.float32, device=device)
        for b, sums in enumerate(blocked.sum(1)):  # [channels] per block, exact
            ksum = (ksum.to(torch.float64) - (sums * block_scale[b])).to(torch.float32)

        def run_blocks(env: Env) -> None:
            q: Dynamic = env[x]
            a = q.values.reshape(-1, blocks, w.group_size).to(torch.float64).transpose(0, 1)
            sums = torch.matmul(a + UNSIGNED_OFFSET, blocked)  # [blocks, M, channels], exact
            zp = (q.zero_point.reshape(-1, 1) + UNSIGNED_OFFSET).to(torch.float32)
            acc = (ksum * zp).to(torch.float32)
            for b in range(blocks):
                acc = fma_f32(sums[b] * block_scale[b], acc)
            acc = acc * q.scale.reshape(-1, 1)
            acc = acc + bias32
            if clamp is not None:
                acc = acc.clamp_(*clamp)
            env[out] = acc.reshape(*q.values.shape[:-1], channels)
        return run_blocks

    weight_t = integers.t().contiguous()
    channel_scale = scale.reshape(-1).to(torch.float64)

    def run(env: Env) -> None:
        q: Dynamic = env[x]
        a = q.values.to(torch.float64) - q.zero_point.to(torch.float64)
        acc = torch.matmul(a.reshape(-1, inputs), weight_t).to(torch.float32)
        acc = acc * q.scale.reshape(-1, 1)
        acc = fma_f32(acc.to(torch.float64) * channel_scale, bias32)
        if clamp is not None:
            acc = acc.clamp_(*clamp)
        env[out] = acc.reshape(*q.values.shape[:-1], channels)
    return run


def build_convolution(ctx: NodeContext) -> Op:
    """Quantized Conv2D, DepthwiseConv2D and ConvTranspose2D (filters per output channel)."""
    p = ctx.node.params
    assert isinstance(p, G.Conv)
    ctx.check_flags(p.flags)
    geometry = linear.conv_geometry(ctx, p)
    if ctx.value(p.input1_id, "input").datatype == G.Datatype.QDINT8:
        return _dynamic_convolution(ctx, p, geometry)
    x_params = static_params(ctx, p.input1_id, "input")
    out_params = static_params(ctx, p.output_id, "output")
    assert ctx.source is not None
    w = weights(ctx, ctx.source, p.filter_id, "filter")
    if w.group_size:
        raise ctx.unsupported("its filter is blockwise quantized")
    channel_dim = 3 if ctx.kind == G.NodeKind.DEPTHWISE_CONV2D else 0  # the output channels
    if w.scale.dim() and w.scale.numel() != 1 and w.scale.shape[channel_dim] \
            != geometry.channels_out:
        raise ctx.unsupported("its filter is not quantized per output channel")
    requant = _requant_scales(x_params, Weights(w.integers, w.scale.reshape(-1)), out_params)
    weight = geometry.to_torch(w.integers)
    bias = _bias(ctx, p.bias_id, geometry.channels_out, quantized=True)
    bounds = output_bounds(ctx, out_params)
    x = ctx.read(p.input1_id, "input")
    out = ctx.write(p.output_id)
    zp = x_params.zero_point
    per_channel = requant.reshape(1, -1, 1, 1) if requant.numel() > 1 else requant

    def run(env: Env) -> None:
        value = env[x].permute(0, 3, 1, 2).to(torch.float64) - zp
        acc = geometry.convolve(value, weight, bias)
        env[out] = requantize(acc, per_channel, out_params, bounds).permute(0, 2, 3, 1)
    return run


def _dynamic_convolution(ctx: NodeContext, p: G.Conv, geometry: linear.ConvGeometry) -> Op:
    """qdint8 input (one scale per batch element), qcint8 filter, float32 output."""
    ctx.require_float([(p.output_id, "output")])
    assert ctx.source is not None
    w = weights(ctx, ctx.source, p.filter_id, "filter")
    if w.group_size or w.scale.numel() != geometry.channels_out:
        raise ctx.unsupported("its filter is not quantized per output channel")
    weight = geometry.to_torch(w.integers)
    channel_scale = w.scale.reshape(1, -1, 1, 1).to(torch.float32)
    bias = _bias(ctx, p.bias_id, geometry.channels_out, quantized=False)
    bias_nchw = None if bias is None else bias.reshape(1, -1, 1, 1)
    clamp = ctx.clamp_bounds()
    x = ctx.read(p.input1_id, "input")
    out = ctx.write(p.output_id)

    def run(env: Env) -> None:
        q: Dynamic = env[x]
        # Scales per batch element ([N, 1, 1, 1]), or per pixel ([N, H, W, 1]) where
        # a pointwise convolution runs as a matrix product.
        a = (q.values.to(torch.float64) - q.zero_point.to(torch.float64)).permute(0, 3, 1, 2)
        acc = geometry.convolve(a, weight, None).to(torch.float32)
        result = acc * q.scale.permute(0, 3, 1, 2) * channel_scale
        if bias_nchw is not None:
            result = result + bias_nchw
        if clamp is not None:
            result = result.clamp_(*clamp)
        env[out] = result.permute(0, 2, 3, 1)
    return run


BUILDERS: dict[G.NodeKind, Callable[[NodeContext], Op]] = {
    G.NodeKind.FULLY_CONNECTED: build_fully_connected,
    G.NodeKind.CONV2D: build_convolution,
    G.NodeKind.DEPTHWISE_CONV2D: build_convolution,
    G.NodeKind.CONV_TRANSPOSE2D: build_convolution,
}
