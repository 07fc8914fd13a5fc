"""ExecuTorch's quantized kernel library: its 19 operators, by schema.

`exirc.runtime.kernels.registry` registers `QUANTIZED_KERNELS` in its default registry,
so programs ExecuTorch quantized (Q/DQ around float ops, quantized embeddings,
`quantized_decomposed::add` after its QuantFusionPass) run here, and so can
the ones exirc's compiler emits with these ops. The schemas are those of
ExecuTorch's `kernels/quantized/quantized.yaml`; the arithmetic is that of its
C++ kernels (see `quantized_affine` for quantize, dequantize and their
rounding, and `quantized_embedding` for the embeddings and the mixed-precision
matmuls). This module adds choosing parameters at run time, the quantized
add, and the table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from exirc.runtime.kernels import quantized_affine as affine
from exirc.runtime.kernels import quantized_embedding as embedding
from exirc.runtime.kernels.quantized_affine import F32, fail, fit, float32, int32, name

SMALL_SCALE = F32(6.1e-5)
"""Scales below this are raised to it (and the range widened to match)."""

TOKEN_RANGE = (-128, 127)
"""`choose_qparams_per_token_asymmetric` always chooses for int8, whatever its dtype."""

ADD_RANGE = (0, 255)
"""The quantized add takes only ranges within uint8's."""


# ---------------------------------------------------------------------------
# choose_qparams
# ---------------------------------------------------------------------------


def _extremes(op: str, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's minimum and maximum as ExecuTorch's vec_minf/vec_maxf find them:
    a NaN after the first element is skipped; a NaN first makes the row's scale
    NaN, on which ExecuTorch aborts."""
    first = rows[:, :1]
    if bool(first.isnan().any()):
        fail(op, "the input's first element (of a row) is NaN, so its scale would be NaN")
    rows = torch.where(rows.isnan(), first, rows)
    return rows.amin(dim=1), rows.amax(dim=1)


def _parameters(op: str, low: torch.Tensor, high: torch.Tensor, quant_min: int,
                quant_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ExecuTorch's asymmetric (scale, zero point) for each float32 range [low, high].

    The range is widened to hold 0; scale = range / (qmax - qmin) in double (0.1
    where float32 cannot invert it), raised to SMALL_SCALE if below; the zero
    point comes from whichever end has the smaller error, rounded to nearest
    even as a float32, clamped to [qmin, qmax].
    """
    qmin, qmax = int32(quant_min), int32(quant_max)
    zero = torch.zeros((), dtype=torch.float32)
    low = torch.where(low > 0, zero, low)
    high = torch.where(high < 0, zero, high)
    span = int32(qmax - qmin)  # int32 arithmetic in the C++, which wraps
    scale = (high.double() - low.double()) / span  # a tensor: x / 0 is inf or NaN
    narrow = scale.float()
    scale = torch.where((narrow == 0) | torch.isinf(1.0 / narrow), 0.1, scale)
    if not bool((scale > 0).all()):
        fail(op, f"the scale for quant range [{quant_min}, {quant_max}] is not positive")
    small = scale < float(SMALL_SCALE)
    if bool(small.any()):
        span32 = F32(span)
        amplifier = torch.tensor(SMALL_SCALE) / scale.float()
        widened_low = torch.where(low == 0, low, torch.where(
            high == 0, torch.tensor(-SMALL_SCALE * span32), low * amplifier))
        widened_high = torch.where(low == 0, torch.tensor(SMALL_SCALE * span32), torch.where(
            high == 0, high, high * amplifier))
        low = torch.where(small, widened_low, low)
        high = torch.where(small, widened_high, high)
        scale = torch.where(small, float(SMALL_SCALE), scale)
    low_q, high_q = low.double() / scale, high.double() / scale
    initial = torch.where(abs(qmin) - low_q.abs() < abs(qmax) - high_q.abs(),
                          qmin - low_q, qmax - high_q)
    rounded = torch.round(initial.float()).double()
    # Converting to int32: NaN and out-of-range values become INT32_MIN (x86).
    rounded = torch.where(rounded.isnan() | (rounded.abs() >= 2.0 ** 31), -(2.0 ** 31), rounded)
    zero_point = torch.where(initial < qmin, float(qmin),
                             torch.where(initial > qmax, float(qmax), rounded))
    return scale, zero_point.to(torch.int64)


def _check_parameter_outs(op: str, x: torch.Tensor, scale_out: torch.Tensor,
                          zero_point_out: torch.Tensor) -> None:
    if x.dtype != torch.float32:
        fail(op, f"the input must be float32, not {name(x.dtype)}")
    if scale_out.dtype != torch.float64:
        fail(op, f"scale_out must be float64, not {name(scale_out.dtype)}")
    if zero_point_out.dtype != torch.int64:
        fail(op, f"zero_point_out must be int64, not {name(zero_point_out.dtype)}")


def choose_qparams_tensor_out(input: torch.Tensor, quant_min: int, quant_max: int, eps: float,
                              dtype: torch.dtype, *, scale_out: torch.Tensor,
                              zero_point_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One (scale, zero point) for the whole input; `eps` and `dtype` are unused, as
    in ExecuTorch."""
    op = "choose_qparams.Tensor_out"
    if quant_min >= quant_max:
        fail(op, f"quant_min {quant_min} must be less than quant_max {quant_max}")
    _check_parameter_outs(op, input, scale_out, zero_point_out)
    for what, out in (("scale_out", scale_out), ("zero_point_out", zero_point_out)):
        if out.numel() == 0:  # a dynamic out the interpreter emptied before the call
            fit(out, [1], op)
        if out.numel() != 1:
            fail(op, f"{what} must have one element, not {out.numel()}")
    if input.numel() == 0:
        fail(op, "the input is empty: it has no range to choose parameters for")
    low, high = _extremes(op, input.reshape(1, -1))
    scale, zero_point = _parameters(op, low, high, quant_min, quant_max)
    scale_out.copy_(scale.reshape(scale_out.shape))
    zero_point_out.copy_(zero_point.reshape(zero_point_out.shape))
    return scale_out, zero_point_out


def choose_qparams_per_token_asymmetric_out(
        input: torch.Tensor, dtype: torch.dtype, *, scale_out: torch.Tensor,
        zero_point_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One (scale, zero point) per token (all dims but the last), for int8."""
    op = "choose_qparams_per_token_asymmetric.out"
    _check_parameter_outs(op, input, scale_out, zero_point_out)
    rows = affine.tokens(op, input)
    shape = [*input.shape[:-1], 1]
    fit(scale_out, shape, op)
    fit(zero_point_out, shape, op)
    if rows.shape[0] == 0:
        return scale_out, zero_point_out
    if rows.shape[1] == 0:
        fail(op, "the tokens are empty (the last dimension is 0): no range to choose from")
    low, high = _extremes(op, rows)
    scale, zero_point = _parameters(op, low, high, *TOKEN_RANGE)
    scale_out.copy_(scale.reshape(shape))
    zero_point_out.copy_(zero_point.reshape(shape))
    return scale_out, zero_point_out


# ---------------------------------------------------------------------------
# add
# ---------------------------------------------------------------------------


def add_out(a: torch.Tensor, a_scale: float, a_zero_point: int, a_quant_min: int,
            a_quant_max: int, b: torch.Tensor, b_scale: float, b_zero_point: int,
            b_quant_min: int, b_quant_max: int, out_scale: float, out_zero_point: int,
            out_quant_min: int, out_quant_max: int, *, out: torch.Tensor) -> torch.Tensor:
    """Dequantize both (in double, rounded to float32), add in float32, quantize."""
    op = "add.out"
    if a.shape != b.shape:
        fail(op, f"a and b must have the same shape, not {list(a.shape)} and {list(b.shape)}")
    if not a.dtype == b.dtype == out.dtype:
        fail(op, f"a, b and out must have one dtype, not {name(a.dtype)}, {name(b.dtype)} "
                 f"and {name(out.dtype)}")
    if a.dtype not in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        fail(op, f"cannot add {name(a.dtype)} tensors")
    for what, low, high in (("a", a_quant_min, a_quant_max), ("b", b_quant_min, b_quant_max),
                            ("out", out_quant_min, out_quant_max)):
        if not ADD_RANGE[0] <= low <= high <= ADD_RANGE[1]:
            fail(op, f"the quant range of {what}, [{low}, {high}], must be ordered and within "
                     f"[{ADD_RANGE[0]}, {ADD_RANGE[1]}]")

    def real(q: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
        difference = q.to(torch.int64) - int32(zero_point)
        return (difference.double() * float(float32(scale))).float()

    total = real(a, a_scale, a_zero_point) + real(b, b_scale, b_zero_point)
    inverse_scale = affine.inverse(torch.tensor([float(out_scale)], dtype=torch.float64))
    zero_point = affine.zero_points_as_float(torch.tensor([out_zero_point]))
    result = affine.quantize(total, inverse_scale, zero_point, out_quant_min, out_quant_max,
                             torch.int64).to(a.dtype)
    fit(out, a.shape, op)
    out.copy_(result)
    return out


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------

_Q = "quantized_decomposed::"
_ARGS = {  # argument lists shared by several schemas
    "tensor": "Tensor input, float scale, int zero_point, int quant_min, int quant_max, "
              "ScalarType dtype",
    "tensor_args": "Tensor input, Tensor scale, Tensor zero_point, int quant_min, "
                   "int quant_max, ScalarType dtype",
    "embedding": "Tensor weight, Tensor weight_scales, Tensor? weight_zero_points, "
                 "int weight_quant_min, int weight_quant_max, Tensor indices",
}
_OUT = "Tensor(a!) out) -> Tensor(a!)"
_TWO_OUTS = ("Tensor(a!) scale_out, Tensor(b!) zero_point_out) -> "
             "(Tensor(a!), Tensor(b!))")

QUANTIZED_KERNELS: dict[str, Callable[..., Any]] = {
    f"{_Q}add.out(Tensor a, float a_scale, int a_zero_point, int a_quant_min, "
    "int a_quant_max, Tensor b, float b_scale, int b_zero_point, int b_quant_min, "
    "int b_quant_max, float out_scale, int out_zero_point, int out_quant_min, "
    f"int out_quant_max, *, {_OUT}": add_out,
    f"{_Q}choose_qparams.Tensor_out(Tensor input, int quant_min, int quant_max, float eps, "
    f"ScalarType dtype, *, {_TWO_OUTS}": choose_qparams_tensor_out,
    f"{_Q}choose_qparams_per_token_asymmetric.out(Tensor input, ScalarType dtype, *, "
    f"{_TWO_OUTS}": choose_qparams_per_token_asymmetric_out,
    f"{_Q}quantize_per_tensor.out({_ARGS['tensor']}, *, {_OUT}":
        affine.quantize_per_tensor_out,
    f"{_Q}quantize_per_tensor.Tensor_out({_ARGS['tensor_args']}, *, {_OUT}":
        affine.quantize_per_tensor_tensor_out,
    f"{_Q}dequantize_per_tensor.out({_ARGS['tensor']}, *, ScalarType? out_dtype=None, {_OUT}":
        affine.dequantize_per_tensor_out,
    f"{_Q}dequantize_per_tensor.Tensor_out({_ARGS['tensor_args']}, *, "
    f"ScalarType? out_dtype=None, {_OUT}": affine.dequantize_per_tensor_tensor_out,
    f"{_Q}quantize_per_channel.out(Tensor input, Tensor scales, Tensor zero_points, int axis, "
    f"int quant_min, int quant_max, ScalarType dtype, *, {_OUT}":
        affine.quantize_per_channel_out,
    f"{_Q}dequantize_per_channel.out(Tensor input, Tensor scales, Tensor? zero_points, "
    "int axis, int quant_min, int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None, "
    f"{_OUT}": affine.dequantize_per_channel_out,
    f"{_Q}quantize_per_token.out(Tensor input, Tensor scales, Tensor zero_points, "
    f"int quant_min, int quant_max, ScalarType dtype, *, {_OUT}":
        affine.quantize_per_token_out,
    f"{_Q}dequantize_per_token.out(Tensor input, Tensor scales, Tensor zero_points, "
    "int quant_min, int quant_max, ScalarType dtype, ScalarType output_dtype, *, "
    f"{_OUT}": affine.dequantize_per_token_out,
    f"{_Q}embedding_byte.out({_ARGS['embedding']}, *, {_OUT}": embedding.embedding_byte_out,
    f"{_Q}embedding_byte.dtype_out({_ARGS['embedding']}, *, ScalarType? dtype=None, {_OUT}":
        embedding.embedding_byte_dtype_out,
    f"{_Q}embedding_2bit.out({_ARGS['embedding']}, *, {_OUT}": embedding.embedding_2bit_out,
    f"{_Q}embedding_2bit.dtype_out({_ARGS['embedding']}, ScalarType? dtype=None, *, {_OUT}":
        embedding.embedding_2bit_dtype_out,
    f"{_Q}embedding_4bit.out({_ARGS['embedding']}, *, {_OUT}": embedding.embedding_4bit_out,
    f"{_Q}embedding_4bit.dtype_out({_ARGS['embedding']}, ScalarType? dtype=None, *, {_OUT}":
        embedding.embedding_4bit_dtype_out,
    f"{_Q}mixed_mm.out(Tensor input, Tensor weight, Tensor weight_scales, "
    f"Tensor? weight_zero_points, *, {_OUT}": embedding.mixed_mm_out,
    f"{_Q}mixed_linear.out(Tensor input, Tensor weight, Tensor weight_scales, "
    f"Tensor? weight_zero_points, ScalarType? dtype=None, *, {_OUT}":
        embedding.mixed_linear_out,
}
"""Schema (as ExecuTorch's quantized.yaml writes it) -> kernel, for
`exirc.runtime.kernels.registry` to register. Kernels take the schema's arguments in
order, the keyword-only ones (outs, out_dtype) by name."""
