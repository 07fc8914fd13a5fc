"""Quantized values: their parameters, and Convert to and from them, as XNNPACK computes.

Two kinds of quantized activations occur in ExecuTorch's XNNPACK graphs:

  - static (qint8, quint8, per tensor): the value table holds the integers
    (an int8 or uint8 tensor); scale and zero point are fixed in the blob;
  - dynamic (qdint8, "per token"): quantized at run time, each row (all dims
    but the last `num_nonbatch_dims`) with its own scale and zero point; the
    value table holds a `Dynamic` (the integers and the per-row parameters).

Weights are constants: qcint8 / qcint4 per output channel, qbint4 per block
of input channels (bf16 scales), qint32 / qcint32 biases. `weights` turns
them into exact integer tensors and float32 scales.

The arithmetic is XNNPACK's, in float32 where XNNPACK uses float32:
quantizing multiplies by the reciprocal scale and rounds to nearest even;
dynamic parameters come from each row's range (including 0) as in
`xnn_f32_qd8_asymmetric_quantization_params`, the row then multiplied by
its multiplier 255 / range (not by 1 / scale: the two differ in the last
bit, which moves ties); requantizing multiplies the
exact integer accumulator, as float32, by `input_scale * weight_scale /
output_scale` and rounds to nearest even.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy
import torch

from exirc.runtime.delegates.xnnpack.constants import ConstantSource, datatype_name
from exirc.runtime.delegates.xnnpack.context import Env, NodeContext, Op
from exirc.serialize.xnnpack import graph as G

STATIC_TYPES = {G.Datatype.QINT8: torch.int8, G.Datatype.QUINT8: torch.uint8}
RANGES = {torch.int8: (-128, 127), torch.uint8: (0, 255)}
BLOCK_MULTIPLE = 32  # XNNPACK's blockwise filters: blocks of a multiple of 32 input channels
F32 = numpy.float32


def is_static_quantized(value: G.TensorValue) -> bool:
    return value.datatype in STATIC_TYPES and isinstance(value.quant, G.PerTensorQuant)


@dataclass(frozen=True)
class Dynamic:
    """A value quantized at run time: int8 `values`, and per row (trailing dims of 1)
    the float32 dequantization `scale` and the `zero_point` (as float32)."""

    values: torch.Tensor
    scale: torch.Tensor
    zero_point: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype


@dataclass(frozen=True)
class Static:
    """A static per-tensor quantization: scale (float32), zero point, storage type."""

    scale: float
    zero_point: int
    dtype: torch.dtype

    @property
    def range(self) -> tuple[int, int]:
        return RANGES[self.dtype]


def static_params(ctx: NodeContext, value_id: int, role: str) -> Static:
    value = ctx.value(value_id, role)
    quant = value.quant
    if value.datatype not in STATIC_TYPES or not isinstance(quant, G.PerTensorQuant):
        raise ctx.unsupported(f"its {role} (value {value_id}) is "
                              f"{datatype_name(value.datatype)}, where it takes per-tensor "
                              "qint8 or quint8")
    if not (quant.scale > 0 and numpy.isfinite(quant.scale)):
        raise ctx.fail(f"its {role} (value {value_id}) has scale {quant.scale}")
    dtype = STATIC_TYPES[value.datatype]
    low, high = RANGES[dtype]
    if not low <= quant.zero_point <= high:
        raise ctx.fail(f"its {role} (value {value_id}) has zero point {quant.zero_point}, "
                       f"outside {datatype_name(value.datatype)}")
    return Static(float(F32(quant.scale)), int(quant.zero_point), dtype)


def output_bounds(ctx: NodeContext, out: Static) -> tuple[int, int]:
    """The node's fused clamp as quantized bounds (xnn_qs8_quantize of output_min/max)."""
    low, high = out.range
    bounds = ctx.clamp_bounds()
    if bounds is None:
        return low, high

    def quantize(x: float) -> int:
        q = F32(x) / F32(out.scale) + F32(out.zero_point)
        return int(numpy.rint(numpy.clip(q, F32(low), F32(high))))
    return quantize(bounds[0]), quantize(bounds[1])


def requantize(acc: torch.Tensor, scale: torch.Tensor, out: Static,
               bounds: tuple[int, int]) -> torch.Tensor:
    """Exact integer accumulators (any float dtype) -> the output's integers."""
    low, high = bounds
    scaled = acc.to(torch.float32) * scale
    zp = out.zero_point
    return (torch.round(scaled.clamp(low - zp, high - zp)) + zp).to(out.dtype)


# -- weights ----------------------------------------------------------------------


def _channel_scales(ctx: NodeContext, source: ConstantSource, value: G.TensorValue,
                    count: int) -> torch.Tensor:
    quant = value.quant
    assert isinstance(quant, (G.PerChannelQuant, G.PerChannelGroupQuant))
    what = f"the scales of value {value.id_out}"
    if quant.scale_buffer_idx:
        dtype = torch.bfloat16 if isinstance(quant, G.PerChannelGroupQuant) else torch.float32
        scales = source.floats(quant.scale_buffer_idx, count, dtype, what)
    elif isinstance(quant, G.PerChannelGroupQuant):
        raise ctx.unsupported(f"value {value.id_out} keeps its block scales inline (an old "
                              "format, rounded to bf16 by ExecuTorch's runtime)")
    else:
        if len(quant.scale) != count:
            raise ctx.fail(f"value {value.id_out} has {len(quant.scale)} scales for {count} "
                           "channels")
        scales = torch.tensor(quant.scale, dtype=torch.float32)
    if not bool(torch.isfinite(scales).all()):
        raise ctx.fail(f"value {value.id_out} has scales that are not finite")
    return scales.to(ctx.constant(value.id_out).device)  # type: ignore[union-attr]


def unpack_4bit(packed: torch.Tensor, columns: int) -> torch.Tensor:
    """[rows, ceil(columns / 2)] bytes, low nibble first -> [rows, columns] of 0..15."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], -1).reshape(packed.shape[0], -1)[:, :columns]


@dataclass(frozen=True)
class Weights:
    """A quantized constant as exact integers (float64) and float32 scales that
    broadcast against it: per channel along `channel_dim`, or per block [O, I/group]."""

    integers: torch.Tensor
    scale: torch.Tensor
    group_size: int = 0


def weights(ctx: NodeContext, source: ConstantSource, value_id: int, role: str) -> Weights:
    """A quantized filter or bias constant, decoded once."""
    value = ctx.value(value_id, role)
    raw = ctx.constant(value_id)
    if raw is None:
        raise ctx.unsupported(f"its {role} (value {value_id}) is quantized but not a constant")
    ctx.read(value_id, role)
    quant, dims = value.quant, list(value.dims)
    kind = value.datatype
    if kind in (G.Datatype.QCINT4, G.Datatype.QBINT4):
        if len(dims) != 2:
            raise ctx.fail(f"its 4-bit {role} has dims {dims}; it must be 2-D")
        integers = unpack_4bit(raw, dims[1]).to(torch.float64) - 8
    elif kind in (G.Datatype.QCINT8, G.Datatype.QINT8, G.Datatype.QCINT32, G.Datatype.QINT32):
        integers = raw.to(torch.float64)
    else:
        raise ctx.unsupported(f"its {role} (value {value_id}) is {datatype_name(kind)}")
    if isinstance(quant, G.PerTensorQuant):
        if kind not in (G.Datatype.QINT8, G.Datatype.QINT32):
            raise ctx.fail(f"its {role} is {datatype_name(kind)} with per-tensor quantization")
        return Weights(integers - quant.zero_point, torch.tensor(F32(quant.scale)))  # 0-d
    if isinstance(quant, G.PerChannelGroupQuant):
        if kind != G.Datatype.QBINT4 or quant.group_size <= 0 or dims[1] % quant.group_size:
            raise ctx.fail(f"its {role} has blocks of {quant.group_size} for dims {dims}")
        if quant.group_size % BLOCK_MULTIPLE:
            raise ctx.unsupported(f"its {role} has blocks of {quant.group_size} input channels, "
                                  f"not a multiple of {BLOCK_MULTIPLE} (ExecuTorch's runtime "
                                  "refuses the method)")
        blocks = dims[1] // quant.group_size
        scale = _channel_scales(ctx, source, value, dims[0] * blocks).reshape(dims[0], blocks)
        return Weights(integers, scale, quant.group_size)
    if isinstance(quant, G.PerChannelQuant) and kind in (G.Datatype.QCINT8, G.Datatype.QCINT4,
                                                         G.Datatype.QCINT32):
        dim = quant.channel_dim
        if not 0 <= dim < len(dims):
            raise ctx.fail(f"its {role} has channel dim {dim} for dims {dims}")
        shape = [1] * len(dims)
        shape[dim] = dims[dim]
        scale = _channel_scales(ctx, source, value, dims[dim]).reshape(shape)
        return Weights(integers, scale)
    raise ctx.unsupported(f"its {role} (value {value_id}) is {datatype_name(kind)} with "
                          f"{type(quant).__name__}")


# -- Convert ----------------------------------------------------------------------


def build_quantize(ctx: NodeContext, x: int, out: int, params: Static) -> Op:
    """float32 -> static qint8/quint8: round(x * (1 / scale)) + zero point, saturated."""
    inverse = float(F32(1.0) / F32(params.scale))
    low, high = params.range
    zp, dtype = params.zero_point, params.dtype

    def run(env: Env) -> None:
        scaled = (env[x] * inverse).clamp(low - zp, high - zp)
        env[out] = (torch.round(scaled) + zp).to(dtype)
    return run


def build_dequantize(ctx: NodeContext, x: int, out: int, params: Static) -> Op:
    """static qint8/quint8 -> float32: (q - zero point) * scale."""
    zp, scale = params.zero_point, params.scale

    def run(env: Env) -> None:
        env[out] = (env[x].to(torch.float32) - zp) * scale
    return run


def build_dynamic_quantize(ctx: NodeContext, x: int, out: int, nonbatch: int) -> Op:
    """float32 -> qdint8: each row (the last `nonbatch` dims) quantized with parameters
    from its own range."""
    dims = ctx.dims(ctx.node.params.input_id)  # type: ignore[union-attr]
    if not 1 <= nonbatch <= len(dims):
        raise ctx.fail(f"it quantizes per {nonbatch} trailing dims of a {len(dims)}-D value")
    reduced = tuple(range(-nonbatch, 0))

    def run(env: Env) -> None:
        value = env[x]
        low = torch.clamp(torch.amin(value, reduced, keepdim=True), max=0.0)
        high = torch.clamp(torch.amax(value, reduced, keepdim=True), min=0.0)
        same = low == high
        # Divisions of two tensors: `255.0 / tensor` is torch's reciprocal times 255,
        # rounded twice, which misses XNNPACK's float32 quotient in the last bit.
        one = torch.ones((), dtype=value.dtype, device=value.device)
        multiplier = torch.where(same, one, torch.div(one * 255.0, torch.where(same, one,
                                                                             high - low)))
        descaled_low, descaled_high = low * multiplier, high * multiplier
        from_low = -128.0 + descaled_low
        from_high = 127.0 + descaled_high
        zero_point = torch.where(from_low + from_high > 0, -128.0 - descaled_low,
                                 127.0 - descaled_high)
        zero_point = torch.round(zero_point.clamp(-128.0, 127.0))
        scale = torch.div(one, multiplier)  # what the matrix kernels dequantize with
        # The conversion multiplies by the multiplier itself (not 1 / scale, which
        # can differ in the last bit and move ties such as a clamped 0.5 * 255).
        scaled = (value * multiplier).clamp(-128.0 - zero_point, 127.0 - zero_point)
        values = (torch.round(scaled) + zero_point).to(torch.int8)
        env[out] = Dynamic(values, scale, zero_point)
    return run


def build_quantized_convert(ctx: NodeContext) -> Op:
    """Convert where the input or the output is quantized."""
    p = ctx.node.params
    assert isinstance(p, G.Node1x1)
    ctx.check_flags(p.flags)
    source = ctx.value(p.input_id, "input")
    target = ctx.value(p.output_id, "output")
    if target.datatype == G.Datatype.QDINT8 and source.datatype == G.Datatype.FP32:
        if not isinstance(target.quant, G.PerTokenDynamicQuant):
            raise ctx.fail("its qdint8 output has no per-token quantization")
        return build_dynamic_quantize(ctx, ctx.read(p.input_id, "input"),
                                      ctx.write(p.output_id), target.quant.num_nonbatch_dims)
    if source.datatype == G.Datatype.FP32 and target.datatype in STATIC_TYPES:
        params = static_params(ctx, p.output_id, "output")
        return build_quantize(ctx, ctx.read(p.input_id, "input"), ctx.write(p.output_id),
                              params)
    if source.datatype in STATIC_TYPES and target.datatype == G.Datatype.FP32:
        params = static_params(ctx, p.input_id, "input")
        return build_dequantize(ctx, ctx.read(p.input_id, "input"), ctx.write(p.output_id),
                                params)
    raise ctx.unsupported(f"it converts {datatype_name(source.datatype)} to "
                          f"{datatype_name(target.datatype)}")
