"""Quantized add, multiply, clamp, max and global average pooling, as XNNPACK computes.

Add (qs8 / qu8): XNNPACK turns the two rescale factors `a_scale /
output_scale` and `b_scale / output_scale` into integer multipliers with a
common shift (`xnn_init_qs8_add_minmax_scalar_params`), adds the rounding
term and the zero-point corrections into one bias, and computes, in int32,
`(bias + a * a_multiplier + b * b_multiplier) >> shift` (an arithmetic shift)
plus the output zero point, saturated to the fused clamp's quantized bounds.
We compute the same in int64 (the same values: nothing overflows int32).

Max pooling on integers is the float one on their values (exactly
representable), saturated to the fused clamp; input and output share their
quantization, as XNNPACK requires.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy
import torch

from exirc.runtime.delegates.xnnpack.context import Env, NodeContext, Op
from exirc.runtime.delegates.xnnpack.pooling import FLAG_KEEP_DIMS, max_pooling_geometry
from exirc.runtime.delegates.xnnpack.quant import F32, output_bounds, static_params
from exirc.serialize.xnnpack import graph as G


def _bits(x: numpy.float32) -> int:
    return int(struct.unpack("<I", struct.pack("<f", float(x)))[0])


def add_multipliers(a_scale: float, b_scale: float, out_scale: float
                    ) -> tuple[int, int, int] | None:
    """(a_multiplier, b_multiplier, shift), or None where XNNPACK refuses the scales."""
    a_out, b_out = F32(a_scale) / F32(out_scale), F32(b_scale) / F32(out_scale)
    largest = max(abs(a_out), abs(b_out))
    if not (2.0 ** -10 <= largest < 2.0 ** 8) or min(abs(a_out), abs(b_out)) < 2.0 ** -10:
        return None
    exponent = (_bits(F32(largest)) >> 23) - 127
    shift = 20 - exponent
    # abs(scale) * 2**shift, exactly (a power of two), rounded to nearest even.
    a_mult = int(numpy.rint(numpy.ldexp(abs(a_out), shift, dtype=F32)))
    b_mult = int(numpy.rint(numpy.ldexp(abs(b_out), shift, dtype=F32)))
    return (-a_mult if a_out < 0 else a_mult), (-b_mult if b_out < 0 else b_mult), shift


def build_quantized_add(ctx: NodeContext) -> Op:
    p = ctx.node.params
    assert isinstance(p, G.Node2x1)
    ctx.check_flags(p.flags)
    a_params = static_params(ctx, p.input1_id, "input 1")
    b_params = static_params(ctx, p.input2_id, "input 2")
    out_params = static_params(ctx, p.output_id, "output")
    if not a_params.dtype == b_params.dtype == out_params.dtype:
        raise ctx.fail("its inputs and output differ in integer type")
    multipliers = add_multipliers(a_params.scale, b_params.scale, out_params.scale)
    if multipliers is None:
        raise ctx.unsupported("its scales are too far apart for XNNPACK's quantized add")
    a_mult, b_mult, shift = multipliers
    bias = (1 << (shift - 1)) - a_mult * a_params.zero_point - b_mult * b_params.zero_point
    low, high = output_bounds(ctx, out_params)
    zp, dtype = out_params.zero_point, out_params.dtype
    a = ctx.read(p.input1_id, "input 1")
    b = ctx.read(p.input2_id, "input 2")
    out = ctx.write(p.output_id)

    def run(env: Env) -> None:
        acc = env[a].to(torch.int64) * a_mult + env[b].to(torch.int64) * b_mult + bias
        env[out] = ((acc >> shift).clamp_(low - zp, high - zp) + zp).to(dtype)
    return run


def build_quantized_max_pooling(ctx: NodeContext) -> Op:
    p = ctx.node.params
    assert isinstance(p, G.Pooling2D)
    in_params = static_params(ctx, p.input_id, "input")
    out_params = static_params(ctx, p.output_id, "output")
    if in_params != out_params:
        raise ctx.fail("its input and output are quantized differently")
    pool = max_pooling_geometry(ctx, p)
    low, high = output_bounds(ctx, out_params)
    x = ctx.read(p.input_id, "input")
    out = ctx.write(p.output_id)
    dtype = out_params.dtype

    def run(env: Env) -> None:
        result = pool(env[x].permute(0, 3, 1, 2).to(torch.float32))
        env[out] = result.clamp_(low, high).to(dtype).permute(0, 2, 3, 1)
    return run


def build_quantized_multiply(ctx: NodeContext) -> Op:
    """(a - a_zp) * (b - b_zp) in int32, times float32(a_scale * b_scale / out_scale),
    rounded to nearest even, plus the output zero point (qs8-vmul's fp32 path)."""
    p = ctx.node.params
    assert isinstance(p, G.Node2x1)
    ctx.check_flags(p.flags)
    a_params = static_params(ctx, p.input1_id, "input 1")
    b_params = static_params(ctx, p.input2_id, "input 2")
    out_params = static_params(ctx, p.output_id, "output")
    if not a_params.dtype == b_params.dtype == out_params.dtype:
        raise ctx.fail("its inputs and output differ in integer type")
    scale = float((F32(a_params.scale) * F32(b_params.scale)) / F32(out_params.scale))
    low, high = output_bounds(ctx, out_params)
    zp, dtype = out_params.zero_point, out_params.dtype
    za, zb = a_params.zero_point, b_params.zero_point
    a = ctx.read(p.input1_id, "input 1")
    b = ctx.read(p.input2_id, "input 2")
    out = ctx.write(p.output_id)

    def run(env: Env) -> None:
        acc = (env[a].to(torch.int32) - za) * (env[b].to(torch.int32) - zb)
        scaled = (acc.to(torch.float32) * scale).clamp_(low - zp, high - zp)
        env[out] = (torch.round(scaled) + zp).to(dtype)
    return run


def build_quantized_clamp(ctx: NodeContext) -> Op:
    """Clamp on integers. With one quantization for input and output, the bounds are
    output_min/max quantized; otherwise XNNPACK applies a table, computed in float32
    per input integer: dequantize, clamp, quantize (round to nearest even)."""
    p = ctx.node.params
    assert isinstance(p, G.Node1x1)
    ctx.check_flags(p.flags)
    in_params = static_params(ctx, p.input_id, "input")
    out_params = static_params(ctx, p.output_id, "output")
    x = ctx.read(p.input_id, "input")
    out = ctx.write(p.output_id)
    if in_params == out_params:
        low, high = output_bounds(ctx, out_params)

        def run(env: Env) -> None:
            env[out] = env[x].clamp(low, high)
        return run
    if in_params.dtype != out_params.dtype:
        raise ctx.unsupported("its input and output differ in integer type")
    bounds = ctx.clamp_bounds() or (float("-inf"), float("inf"))
    first, last = in_params.range
    q = numpy.arange(first, last + 1, dtype=F32)
    real = numpy.clip((q - F32(in_params.zero_point)) * F32(in_params.scale),
                      F32(bounds[0]), F32(bounds[1])).astype(F32)
    low, high = out_params.range
    quantized = numpy.clip(numpy.rint(real / F32(out_params.scale) + F32(out_params.zero_point)),
                           low, high)
    table = torch.from_numpy(quantized.astype(numpy.int64)).to(out_params.dtype)
    offset = -first

    def run_table(env: Env) -> None:
        env[out] = table.to(env[x].device)[env[x].to(torch.int64) + offset]
    return run_table




def build_quantized_global_average_pooling(ctx: NodeContext) -> Op:
    """The int sum over H and W, less n * the input zero point, times
    float32(float32(input_scale / output_scale) / n), rounded to nearest even."""
    p = ctx.node.params
    assert isinstance(p, G.Node1x1)
    ctx.check_flags(p.flags, FLAG_KEEP_DIMS, "XNN_FLAG_KEEP_DIMS")
    in_params = static_params(ctx, p.input_id, "input")
    out_params = static_params(ctx, p.output_id, "output")
    dims = ctx.dims(p.input_id)
    if len(dims) != 4:
        raise ctx.fail(f"its input has dims {dims}; it takes a 4-D NHWC tensor")
    keep = bool(p.flags & FLAG_KEEP_DIMS)
    low, high = output_bounds(ctx, out_params)
    x = ctx.read(p.input_id, "input")
    out = ctx.write(p.output_id)
    zi, zo, dtype = in_params.zero_point, out_params.zero_point, out_params.dtype
    ratio = F32(in_params.scale) / F32(out_params.scale)

    def run(env: Env) -> None:
        value = env[x]
        count = value.shape[1] * value.shape[2]
        acc = value.to(torch.int64).sum((1, 2), keepdim=keep) - count * zi
        scaled = acc.to(torch.float32) * float(F32(ratio / F32(count)))
        # XNNPACK adds the zero point before rounding: ties round to even on the
        # shifted value, which differs from rounding first when zo is odd.
        env[out] = torch.round((scaled + zo).clamp_(low, high)).to(dtype)
    return run


BUILDERS: dict[G.NodeKind, Callable[[NodeContext], Op]] = {
    G.NodeKind.ADD: build_quantized_add,
    G.NodeKind.MULTIPLY: build_quantized_multiply,
    G.NodeKind.CLAMP: build_quantized_clamp,
    G.NodeKind.MAX_POOLING_2D: build_quantized_max_pooling,
    G.NodeKind.GLOBAL_AVG_POOLING_2D: build_quantized_global_average_pooling,
}
