"""Quantize and dequantize kernels of ExecuTorch's quantized library, as its C++ computes them.

`quantized_decomposed::{quantize,dequantize}_per_{tensor,channel,token}` (per
token is per channel over all dims but the last), and what the other
quantized kernels share. `exirc.runtime.kernels.quantized` lists them with
their schemas. The arithmetic is that of ExecuTorch's kernels
(kernels/quantized/cpu) as built for x86, which round where torch's
reference ops do not:

  quantize    q = clamp(zp + nearbyint(float(x) * (1.0f / float(scale))))
              entirely in float32 (a double input is multiplied in double,
              then rounded to float); `nearbyint` rounds ties to even; the
              zero point, cast to int32, is added as a float32; the clamp is
              max(q, qmin) then min(q, qmax), so qmin > qmax gives qmax. A
              NaN, or a sum beyond int64, converts to INT64_MIN (x86's
              cvttss2si) and so clamps to qmin: +inf quantizes to qmin too.
  dequantize  float32(q - zp) * float32(scale), rounded to the output dtype
              (a double output gets the float32 product too); per tensor,
              q - zp is int32 arithmetic. ExecuTorch's loop for 1-d
              per-channel inputs converts q - zp to the output dtype first.

Scales and zero points given as tensors are float64 and int64 (per-channel
and per-token dequantization also take float32 and int32).

Inputs come from untrusted files: every check ExecuTorch makes is made here
too (where ExecuTorch aborts, this raises `ExecutionError`), plus the ones
that keep it from reading out of bounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NoReturn

import numpy
import torch

from exirc.runtime.errors import ExecutionError

F32 = numpy.float32

QUANT_RANGES = {
    torch.uint8: (0, 255), torch.int8: (-128, 127), torch.int16: (-(2 ** 15), 2 ** 15 - 1),
    torch.uint16: (0, 2 ** 16 - 1), torch.bits16: (0, 2 ** 16 - 1),
    torch.int32: (-(2 ** 31), 2 ** 31 - 1),
}
"""The integer dtypes ExecuTorch quantizes to and dequantizes from, with their ranges."""

FLOAT_INPUTS = (torch.float32, torch.float64, torch.float16)
FLOAT_OUTPUTS = (torch.float32, torch.float64, torch.float16)
PARAMETER_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "scale": (torch.float64,), "zero point": (torch.int64,)}
"""What ExecuTorch takes for tensors of scales and zero points."""
DEQUANTIZE_PARAMETERS: dict[str, tuple[torch.dtype, ...]] = {
    "scale": (torch.float64, torch.float32), "zero point": (torch.int64, torch.int32)}
"""Per-channel (and per-token) dequantization also takes float32 scales, int32 zero points."""


def fail(op: str, message: str) -> NoReturn:
    raise ExecutionError(f"quantized_decomposed::{op}: {message}")


def name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def fit(out: torch.Tensor, shape: Sequence[int], op: str) -> None:
    """Give `out` the result's shape, as ExecuTorch's resize_tensor does; planned
    memory cannot grow, so a result larger than the plan is an error."""
    if tuple(out.shape) == tuple(shape):
        return
    before = out.shape
    try:
        out.resize_(shape)
    except RuntimeError:
        out.resize_(before)  # torch has already set the new sizes
        fail(op, f"the result has shape {list(shape)}, but its out tensor only has room "
                 f"for {out.numel()} elements")


def int32(value: int) -> int:
    """`static_cast<int32_t>(value)`: the C++ wraps, and so does this."""
    return (int(value) + 2 ** 31) % 2 ** 32 - 2 ** 31


def float32(value: float) -> numpy.float32:
    with numpy.errstate(over="ignore"):
        return F32(float(value))


def inverse(scale: torch.Tensor) -> torch.Tensor:
    """`1.0f / static_cast<float>(scale)`, in float32 (a zero scale gives inf)."""
    narrow = scale.to(torch.float32)
    return torch.ones_like(narrow) / narrow


def zero_points_as_float(zero_points: torch.Tensor) -> torch.Tensor:
    """`static_cast<int32_t>(zp)` (which wraps), added to a float: float32."""
    return zero_points.to(torch.int64).to(torch.int32).to(torch.float32)


def check_dim(op: str, tensor: torch.Tensor, axis: int) -> int:
    """`axis` normalized, if it is a dimension of `tensor`."""
    if tensor.dim() == 0:
        fail(op, "a per-channel operand needs at least one dimension, not a scalar")
    if not -tensor.dim() <= axis < tensor.dim():
        fail(op, f"axis {axis} is not a dimension of a {tensor.dim()}-d input")
    return axis % tensor.dim()


def check_parameter(op: str, what: str, tensor: torch.Tensor, count: int,
                    dtypes: dict[str, tuple[torch.dtype, ...]] = PARAMETER_DTYPES) -> None:
    """A scale or zero point tensor: ExecuTorch's dtype, and one element per channel."""
    if tensor.dtype not in dtypes[what]:
        fail(op, f"the {what} tensor must be {' or '.join(map(name, dtypes[what]))}, not "
                 f"{name(tensor.dtype)}")
    if tensor.numel() != count:
        fail(op, f"the {what} tensor has {tensor.numel()} elements, but there are {count} "
                 "channels")


def per_channel(values: torch.Tensor, dims: int, axis: int) -> torch.Tensor:
    """A vector of one value per channel, shaped to broadcast along `axis`."""
    shape = [1] * dims
    shape[axis] = -1
    return values.reshape(shape)


def as_integers(tensor: torch.Tensor) -> torch.Tensor:
    """A quantized tensor's values as int64 (bits16 read as unsigned, as the C++ does)."""
    if tensor.dtype == torch.bits16:
        tensor = tensor.view(torch.uint16)
    return tensor.to(torch.int64)


# ---------------------------------------------------------------------------
# quantize
# ---------------------------------------------------------------------------


def check_quantize(op: str, x: torch.Tensor, quant_min: int, quant_max: int,
                   dtype: torch.dtype, out: torch.Tensor) -> None:
    if x.dtype not in FLOAT_INPUTS:
        fail(op, f"the input must be float32, float64 or float16, not {name(x.dtype)}")
    if out.dtype != dtype:
        fail(op, f"the out tensor is {name(out.dtype)}, but dtype is {name(dtype)}")
    if dtype not in QUANT_RANGES:
        fail(op, f"cannot quantize to {name(dtype)}")
    low, high = QUANT_RANGES[dtype]
    if quant_min < low:
        fail(op, f"quant_min {quant_min} is below {name(dtype)}'s minimum {low}")
    if quant_max > high:
        fail(op, f"quant_max {quant_max} is above {name(dtype)}'s maximum {high}")


def quantize(x: torch.Tensor, inverse_scale: torch.Tensor, zero_point: torch.Tensor,
             quant_min: int, quant_max: int, dtype: torch.dtype) -> torch.Tensor:
    """ExecuTorch's `quantize_val` on every element. `inverse_scale` and `zero_point`
    are float32 (already `1.0f / float(scale)` and `float(int32(zp))`), broadcastable."""
    if x.dtype == torch.float64:
        scaled = (x * inverse_scale.double()).float()
    else:
        scaled = x.float() * inverse_scale
    total = (torch.round(scaled) + zero_point).double()
    # cvttss2si turns NaN and values beyond int64 into INT64_MIN, which clamps to qmin.
    invalid = total.isnan() | (total >= 2.0 ** 63) | (total < -(2.0 ** 63))
    clamped = torch.where(invalid, torch.tensor(float(quant_min), dtype=torch.float64), total)
    clamped = clamped.clamp_min(float(quant_min)).clamp_max(float(quant_max))
    if dtype == torch.bits16:
        return clamped.to(torch.uint16).view(torch.bits16)
    return clamped.to(torch.int64).to(dtype)


def _quantize_into(op: str, x: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                   axis: int | None, quant_min: int, quant_max: int, dtype: torch.dtype,
                   out: torch.Tensor) -> torch.Tensor:
    check_quantize(op, x, quant_min, quant_max, dtype, out)
    inverse_scale = inverse(scales.reshape(-1))
    zero_point = zero_points_as_float(zero_points.reshape(-1))
    if axis is None:  # one scale: the result has the input's shape, even a scalar's
        inverse_scale, zero_point = inverse_scale.reshape(()), zero_point.reshape(())
    else:
        inverse_scale = per_channel(inverse_scale, x.dim(), axis)
        zero_point = per_channel(zero_point, x.dim(), axis)
    result = quantize(x, inverse_scale, zero_point, quant_min, quant_max, dtype)
    fit(out, x.shape, op)
    out.copy_(result)
    return out


def quantize_per_tensor_out(input: torch.Tensor, scale: float, zero_point: int, quant_min: int,
                            quant_max: int, dtype: torch.dtype, *,
                            out: torch.Tensor) -> torch.Tensor:
    scales = torch.tensor([float(scale)], dtype=torch.float64)
    return _quantize_into("quantize_per_tensor.out", input, scales, torch.tensor([zero_point]),
                          None, quant_min, quant_max, dtype, out)


def _scalar_parameters(op: str, scale: torch.Tensor,
                       zero_point: torch.Tensor) -> tuple[float, int]:
    check_parameter(op, "scale", scale, 1)
    check_parameter(op, "zero point", zero_point, 1)
    return float(scale.reshape(-1)[0]), int(zero_point.reshape(-1)[0])


def quantize_per_tensor_tensor_out(input: torch.Tensor, scale: torch.Tensor,
                                   zero_point: torch.Tensor, quant_min: int, quant_max: int,
                                   dtype: torch.dtype, *, out: torch.Tensor) -> torch.Tensor:
    op = "quantize_per_tensor.Tensor_out"
    _scalar_parameters(op, scale, zero_point)
    return _quantize_into(op, input, scale, zero_point, None, quant_min, quant_max, dtype, out)


def _quantize_channels(op: str, x: torch.Tensor, scales: torch.Tensor,
                       zero_points: torch.Tensor, axis: int, quant_min: int, quant_max: int,
                       dtype: torch.dtype, out: torch.Tensor) -> torch.Tensor:
    axis = check_dim(op, x, axis)
    check_parameter(op, "scale", scales, x.shape[axis])
    check_parameter(op, "zero point", zero_points, x.shape[axis])
    return _quantize_into(op, x, scales, zero_points, axis, quant_min, quant_max, dtype, out)


def quantize_per_channel_out(input: torch.Tensor, scales: torch.Tensor,
                             zero_points: torch.Tensor, axis: int, quant_min: int,
                             quant_max: int, dtype: torch.dtype, *,
                             out: torch.Tensor) -> torch.Tensor:
    return _quantize_channels("quantize_per_channel.out", input, scales, zero_points, axis,
                              quant_min, quant_max, dtype, out)


def tokens(op: str, x: torch.Tensor) -> torch.Tensor:
    """`x` as (tokens, last dim): ExecuTorch's per-token ops are per-channel ops on it."""
    if x.dim() == 0:
        fail(op, "the input must have at least one dimension (its last one is the token)")
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def quantize_per_token_out(input: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                           quant_min: int, quant_max: int, dtype: torch.dtype, *,
                           out: torch.Tensor) -> torch.Tensor:
    op = "quantize_per_token.out"
    shape = input.shape
    result = torch.empty(0, dtype=out.dtype)
    _quantize_channels(op, tokens(op, input), scales, zero_points, 0, quant_min, quant_max,
                       dtype, result)
    fit(out, shape, op)
    out.copy_(result.reshape(shape))
    return out


# ---------------------------------------------------------------------------
# dequantize
# ---------------------------------------------------------------------------


def check_dequantize(op: str, q: torch.Tensor, quant_min: int, quant_max: int,
                     dtype: torch.dtype, out_dtype: torch.dtype | None,
                     out: torch.Tensor) -> None:
    if q.dtype not in QUANT_RANGES:
        fail(op, f"cannot dequantize a {name(q.dtype)} tensor")
    if q.dtype != dtype:
        fail(op, f"the input is {name(q.dtype)}, but dtype is {name(dtype)}")
    if out_dtype is not None and out.dtype != out_dtype:
        fail(op, f"the out tensor is {name(out.dtype)}, but out_dtype is {name(out_dtype)}")
    if quant_min > quant_max:
        fail(op, f"quant_min {quant_min} is greater than quant_max {quant_max}")
    if out.dtype not in FLOAT_OUTPUTS:
        fail(op, f"cannot dequantize to {name(out.dtype)} (float32, float64 or float16 only)")


def dequantize(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
               dtype: torch.dtype, wrap32: bool = False, cast_first: bool = False) -> torch.Tensor:
    """float32(q - zp) * float32 `scale`, rounded to `dtype`; `wrap32` when the C++
    subtracts in int32 (per tensor), which wraps. `cast_first`: ExecuTorch's 1-d
    per-channel loop instead converts q - zp to `dtype` first and multiplies in
    C++'s promoted type (double for a double output, float32 otherwise)."""
    difference = as_integers(q) - zero_point
    if wrap32:
        difference = difference.to(torch.int32)
    if cast_first:
        wide = torch.float64 if dtype == torch.float64 else torch.float32
        return (difference.to(dtype).to(wide) * scale.to(wide)).to(dtype)
    return (difference.float() * scale).to(dtype)


def dequantize_per_tensor_out(input: torch.Tensor, scale: float, zero_point: int,
                              quant_min: int, quant_max: int, dtype: torch.dtype, *,
                              out_dtype: torch.dtype | None = None,
                              out: torch.Tensor) -> torch.Tensor:
    return _dequantize_tensor("dequantize_per_tensor.out", input, scale, zero_point,
                              quant_min, quant_max, dtype, out_dtype, out)


def dequantize_per_tensor_tensor_out(input: torch.Tensor, scale: torch.Tensor,
                                     zero_point: torch.Tensor, quant_min: int, quant_max: int,
                                     dtype: torch.dtype, *, out_dtype: torch.dtype | None = None,
                                     out: torch.Tensor) -> torch.Tensor:
    op = "dequantize_per_tensor.Tensor_out"
    value, zero = _scalar_parameters(op, scale, zero_point)
    return _dequantize_tensor(op, input, value, zero, quant_min, quant_max, dtype, out_dtype,
                              out)


def _dequantize_tensor(op: str, q: torch.Tensor, scale: float, zero_point: int, quant_min: int,
                       quant_max: int, dtype: torch.dtype, out_dtype: torch.dtype | None,
                       out: torch.Tensor) -> torch.Tensor:
    check_dequantize(op, q, quant_min, quant_max, dtype, out_dtype, out)
    result = dequantize(q, torch.tensor(float32(scale)), torch.tensor(int32(zero_point)),
                        out.dtype, wrap32=True)
    fit(out, q.shape, op)
    out.copy_(result)
    return out


def _dequantize_channels(op: str, q: torch.Tensor, scales: torch.Tensor,
                         zero_points: torch.Tensor | None, axis: int, quant_min: int,
                         quant_max: int, dtype: torch.dtype, out_dtype: torch.dtype | None,
                         out: torch.Tensor) -> torch.Tensor:
    axis = check_dim(op, q, axis)
    count = q.shape[axis]
    check_parameter(op, "scale", scales, count, DEQUANTIZE_PARAMETERS)
    if zero_points is not None:
        check_parameter(op, "zero point", zero_points, count, DEQUANTIZE_PARAMETERS)
    check_dequantize(op, q, quant_min, quant_max, dtype, out_dtype, out)
    if q.dtype == torch.int8 and out_dtype in (None, torch.float32):
        _check_int8_path(op, q, zero_points, quant_min, quant_max, out)
    scale = per_channel(scales.reshape(-1).float(), q.dim(), axis)
    zero = (torch.zeros((), dtype=torch.int64) if zero_points is None
            else per_channel(zero_points.reshape(-1), q.dim(), axis))
    result = dequantize(q, scale, zero, out.dtype, cast_first=q.dim() == 1)
    fit(out, q.shape, op)
    out.copy_(result)
    return out


def _check_int8_path(op: str, q: torch.Tensor, zero_points: torch.Tensor | None,
                     quant_min: int, quant_max: int, out: torch.Tensor) -> None:
    """ExecuTorch's int8 -> float32 path: it writes float32 whatever the out tensor
    is, and insists (once there are elements) that each zero point is in range."""
    if out.dtype != torch.float32:
        fail(op, f"an int8 input without out_dtype dequantizes to float32, but the out "
                 f"tensor is {name(out.dtype)}")
    if q.numel() == 0:
        return
    zeros = [0] if zero_points is None else zero_points.reshape(-1).tolist()
    outside = [z for z in zeros if not quant_min <= z <= quant_max]
    if outside:
        fail(op, f"zero point {outside[0]} is outside [quant_min, quant_max] = "
                 f"[{quant_min}, {quant_max}]")


def dequantize_per_channel_out(input: torch.Tensor, scales: torch.Tensor,
                               zero_points: torch.Tensor | None, axis: int, quant_min: int,
                               quant_max: int, dtype: torch.dtype, *,
                               out_dtype: torch.dtype | None = None,
                               out: torch.Tensor) -> torch.Tensor:
    return _dequantize_channels("dequantize_per_channel.out", input, scales, zero_points, axis,
                                quant_min, quant_max, dtype, out_dtype, out)


def dequantize_per_token_out(input: torch.Tensor, scales: torch.Tensor,
                             zero_points: torch.Tensor, quant_min: int, quant_max: int,
                             dtype: torch.dtype, output_dtype: torch.dtype, *,
                             out: torch.Tensor) -> torch.Tensor:
    op = "dequantize_per_token.out"
    shape = input.shape
    result = torch.empty(0, dtype=out.dtype)
    _dequantize_channels(op, tokens(op, input), scales, zero_points, 0, quant_min, quant_max,
                         dtype, output_dtype, result)
    fit(out, shape, op)
    out.copy_(result.reshape(shape))
    return out
