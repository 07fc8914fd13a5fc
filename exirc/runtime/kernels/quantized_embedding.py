"""Weight-only quantized kernels of ExecuTorch's quantized library: embeddings and
mixed-precision matmuls, as its C++ computes them.

Embeddings (`embedding_byte`, `embedding_2bit`, `embedding_4bit`) look rows of
a quantized weight up and dequantize them: out = (float(w) - float(zp)) *
float(scale), in float32, rounded to the output dtype. Scales are per row
(1-d) or per group of columns (2-d, [rows, groups]); zero points are
optional. Sub-byte weights are packed in uint8 and stored offset by their
range's minimum (w + 2, w + 8):

  2-bit  four values a byte, the first in the lowest two bits;
  4-bit  two values a byte, the first in the HIGH nibble.

`.out` takes the parameters in the out tensor's dtype; `.dtype_out` names
the output dtype (float32 or float16) and reads the parameters in their own.
Indices are int64 (8-bit) or int64 and int32 (2- and 4-bit), as ExecuTorch
takes them. ExecuTorch reads parameters of another dtype than it expects as
if they were (garbage), and does not bounds-check 2- and 4-bit indices; both
are errors here.

`mixed_mm` (x @ (w * scale per row of w)) and `mixed_linear` (x @ (w * scale
per row and group of columns).T) multiply a float input by an int8 weight
term by term in the input's dtype and sum sequentially, as ExecuTorch's
portable loops do; they take no zero points (ExecuTorch has none yet).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from exirc.runtime.kernels.quantized_affine import fail, fit, name

FLOATS = (torch.float32, torch.float16)


def _check_embedding(op: str, bits: int, weight: torch.Tensor, scales: torch.Tensor,
                     zero_points: torch.Tensor | None, quant_min: int, quant_max: int,
                     indices: torch.Tensor, dtype: torch.dtype | None, out: torch.Tensor,
                     parameters_as_out: bool) -> int:
    """ExecuTorch's checks (and the ones it lacks); the number of groups per row."""
    allowed = (torch.uint8, torch.int8) if bits == 8 else (torch.uint8,)
    if weight.dtype not in allowed:
        fail(op, f"the weight must be {' or '.join(map(name, allowed))}, not "
                 f"{name(weight.dtype)}")
    if weight.dim() != 2:
        fail(op, f"the weight must be 2-d, not {weight.dim()}-d")
    if scales.dim() not in (1, 2):
        fail(op, f"the scales must be 1-d (per row) or 2-d (per group), not {scales.dim()}-d")
    if scales.shape[0] != weight.shape[0]:
        fail(op, f"there are {scales.shape[0]} rows of scales for {weight.shape[0]} rows of "
                 "weight")
    width = weight.shape[1] * (8 // bits)
    groups = scales.shape[1] if scales.dim() == 2 else 1
    if groups == 0 or width % groups:
        fail(op, f"{groups} groups do not divide the {width} columns")
    if out.dtype not in FLOATS:
        fail(op, f"the out tensor must be float32 or float16, not {name(out.dtype)}")
    if scales.dtype not in FLOATS:
        fail(op, f"the scales must be float32 or float16, not {name(scales.dtype)}")
    if parameters_as_out and scales.dtype != out.dtype:
        fail(op, f"the scales are {name(scales.dtype)}, but this overload reads them as the "
                 f"out tensor's {name(out.dtype)}")
    if zero_points is not None:
        if zero_points.shape != scales.shape:
            fail(op, f"the zero points have shape {list(zero_points.shape)}, the scales "
                     f"{list(scales.shape)}")
        if zero_points.dtype != out.dtype or zero_points.dtype != scales.dtype:
            fail(op, f"the zero points are {name(zero_points.dtype)}; they must have the "
                     f"scales' dtype ({name(scales.dtype)}) and the out tensor's "
                     f"({name(out.dtype)})")
    index_dtypes = (torch.int64,) if bits == 8 else (torch.int64, torch.int32)
    if indices.dtype not in index_dtypes:
        fail(op, f"the indices must be {' or '.join(map(name, index_dtypes))}, not "
                 f"{name(indices.dtype)}")
    if quant_min > quant_max:
        fail(op, f"weight_quant_min {quant_min} is greater than weight_quant_max {quant_max}")
    if dtype is not None and out.dtype != dtype:
        fail(op, f"the out tensor is {name(out.dtype)}, but dtype is {name(dtype)}")
    if indices.numel() and not 0 <= int(indices.min()) <= int(indices.max()) < weight.shape[0]:
        bad = indices[(indices < 0) | (indices >= weight.shape[0])].reshape(-1)[0]
        fail(op, f"index {int(bad)} is out of range for {weight.shape[0]} rows")
    return groups


def unpack(rows: torch.Tensor, bits: int) -> torch.Tensor:
    """Packed rows (uint8) as their signed values: the stored value minus 2 or 8."""
    if bits == 8:
        return rows.to(torch.int32)
    wide = rows.to(torch.int32)
    shifts = (4, 0) if bits == 4 else (0, 2, 4, 6)  # 4-bit: the high nibble comes first
    parts = [(wide >> shift) & ((1 << bits) - 1) for shift in shifts]
    values = torch.stack(parts, dim=-1).reshape(rows.shape[0], rows.shape[1] * len(parts))
    return values - (1 << (bits - 1))


def _embedding(op: str, bits: int, weight: torch.Tensor, scales: torch.Tensor,
               zero_points: torch.Tensor | None, quant_min: int, quant_max: int,
               indices: torch.Tensor, dtype: torch.dtype | None, out: torch.Tensor,
               parameters_as_out: bool) -> torch.Tensor:
    groups = _check_embedding(op, bits, weight, scales, zero_points, quant_min, quant_max,
                              indices, dtype, out, parameters_as_out)
    rows = indices.reshape(-1).to(torch.int64)
    values = unpack(weight[rows], bits)
    width = values.shape[1]
    group = width // groups

    def expand(parameters: torch.Tensor) -> torch.Tensor:
        per_row = parameters.reshape(weight.shape[0], groups)[rows].float()
        return per_row.repeat_interleave(group, dim=1)

    centred = values.float()
    if zero_points is not None:
        centred = centred - expand(zero_points)
    result = (centred * expand(scales)).to(out.dtype)
    fit(out, [*indices.shape, width], op)
    out.copy_(result.reshape(out.shape))
    return out


def _embedding_kernel(bits: int, takes_dtype: bool) -> Callable[..., torch.Tensor]:
    """The kernel of `embedding_<bits>.out` (the scales' dtype out) or `.dtype_out`."""
    op_name = f"embedding_{'byte' if bits == 8 else f'{bits}bit'}." + \
        ("dtype_out" if takes_dtype else "out")

    def kernel(weight: torch.Tensor, weight_scales: torch.Tensor,
               weight_zero_points: torch.Tensor | None, weight_quant_min: int,
               weight_quant_max: int, indices: torch.Tensor,
               dtype: torch.dtype | None = None, *, out: torch.Tensor) -> torch.Tensor:
        return _embedding(op_name, bits, weight, weight_scales, weight_zero_points,
                          weight_quant_min, weight_quant_max, indices,
                          dtype if takes_dtype else None, out, not takes_dtype)
    return kernel


embedding_byte_out = _embedding_kernel(8, takes_dtype=False)
embedding_byte_dtype_out = _embedding_kernel(8, takes_dtype=True)
embedding_2bit_out = _embedding_kernel(2, takes_dtype=False)
embedding_2bit_dtype_out = _embedding_kernel(2, takes_dtype=True)
embedding_4bit_out = _embedding_kernel(4, takes_dtype=False)
embedding_4bit_dtype_out = _embedding_kernel(4, takes_dtype=True)


# ---------------------------------------------------------------------------
# mixed-precision matmuls
# ---------------------------------------------------------------------------


def _check_mixed(op: str, x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                 zero_points: torch.Tensor | None, scale_ranks: tuple[int, ...]) -> None:
    if x.dim() != 2 or weight.dim() != 2:
        fail(op, f"the input and weight must be 2-d, not {x.dim()}-d and {weight.dim()}-d")
    if scales.dim() not in scale_ranks:
        fail(op, f"the scales must be {' or '.join(map(str, scale_ranks))}-d, not "
                 f"{scales.dim()}-d")
    if scales.shape[0] != weight.shape[0]:
        fail(op, f"there are {scales.shape[0]} scales for {weight.shape[0]} weight rows")
    if x.dtype != scales.dtype:
        fail(op, f"the input is {name(x.dtype)}, the scales {name(scales.dtype)}")
    if weight.dtype != torch.int8:
        fail(op, f"the weight must be int8, not {name(weight.dtype)}")
    if x.dtype not in FLOATS:
        fail(op, f"the input must be float32 or float16, not {name(x.dtype)}")
    if zero_points is not None:
        fail(op, "zero points are not supported (ExecuTorch has none yet)")


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a * b in C++'s type (float16 only if both are: c10::Half rounds each result)."""
    wide = torch.promote_types(a.dtype, b.dtype)
    return a.to(wide) * b.to(wide)


def _accumulate(total: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
    """`total += term`: the sum in the wider type, stored back in total's; except
    that c10::Half's `+=` takes a Half, so a float32 term is rounded first."""
    if total.dtype == torch.float16:
        return total + term.to(torch.float16)
    wide = torch.promote_types(total.dtype, term.dtype)
    return (total.to(wide) + term.to(wide)).to(total.dtype)


def mixed_mm_out(input: torch.Tensor, weight: torch.Tensor, weight_scales: torch.Tensor,
                 weight_zero_points: torch.Tensor | None, *, out: torch.Tensor) -> torch.Tensor:
    """out[i, j] = sum over k, in order, of x[i, k] * w[k, j] * s[k]."""
    op = "mixed_mm.out"
    _check_mixed(op, input, weight, weight_scales, weight_zero_points, (1,))
    if input.shape[1] != weight.shape[0]:
        fail(op, f"cannot multiply a {list(input.shape)} input by a {list(weight.shape)} "
                 "weight")
    if out.dtype != input.dtype:
        fail(op, f"the out tensor is {name(out.dtype)}, the input {name(input.dtype)}")
    rows = weight.to(input.dtype)
    total = torch.zeros(input.shape[0], weight.shape[1], dtype=input.dtype)
    for k in range(input.shape[1]):
        term = _product(_product(input[:, k:k + 1], rows[k:k + 1]), weight_scales[k:k + 1])
        total = _accumulate(total, term)
    fit(out, total.shape, op)
    out.copy_(total)
    return out


def mixed_linear_out(input: torch.Tensor, weight: torch.Tensor, weight_scales: torch.Tensor,
                     weight_zero_points: torch.Tensor | None, dtype: torch.dtype | None = None,
                     *, out: torch.Tensor) -> torch.Tensor:
    """out[i, j] = sum over groups of (sum over the group's k of x[i, k] * w[j, k]) times
    the group's scale, each sum in order, in the output dtype."""
    op = "mixed_linear.out"
    _check_mixed(op, input, weight, weight_scales, weight_zero_points, (1, 2))
    if input.shape[1] != weight.shape[1]:
        fail(op, f"the input has {input.shape[1]} columns, the weight {weight.shape[1]}")
    if dtype is not None and (dtype != out.dtype or dtype not in FLOATS):
        fail(op, f"dtype {name(dtype)} must be float32 or float16 and the out tensor's "
                 f"({name(out.dtype)})")
    if out.dtype not in (*FLOATS, torch.float64):
        fail(op, f"cannot compute in {name(out.dtype)}")
    rows, columns = input.shape
    outputs = weight.shape[0]
    groups = weight_scales.shape[1] if weight_scales.dim() == 2 else 1
    if columns == 0 or groups == 0:
        fail(op, "the input has no columns or the scales no groups (ExecuTorch divides by 0)")
    group = (columns + groups - 1) // groups
    per_row = (columns + group - 1) // group
    # ExecuTorch indexes the scales as [outputs, per_row] whatever their real shape.
    scales = weight_scales.reshape(-1)
    weight_t = weight.to(input.dtype).t()
    total = torch.zeros(rows, outputs, dtype=out.dtype)
    for start in range(0, columns, group):
        partial = torch.zeros(rows, outputs, dtype=out.dtype)
        for k in range(start, min(start + group, columns)):
            partial = _accumulate(partial, _product(input[:, k:k + 1], weight_t[k:k + 1]))
        scale = scales[torch.arange(outputs) * per_row + start // group]
        total = _accumulate(total, _product(partial, scale.reshape(1, -1)))
    fit(out, total.shape, op)
    out.copy_(total)
    return out
