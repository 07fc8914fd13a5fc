"""The quantized ops of the Backend dialect: ExecuTorch's quantized kernel library.

Two kinds:

- The Q/DQ ops torch and torchao define (`quantized_decomposed::quantize_per_tensor`,
  ...) are Edge ops as pt2e's `convert_pt2e` writes them. Torch has no out
  forms for them; `OUT_FORMS` gives each the out-variant ExecuTorch's quantized
  library names (`quantize_per_tensor.out`, `.Tensor_out`, ...), which is what
  programs call.
- Fused ops that QuantFusion (`exirc.backend.quant_fusion`) makes from
  "dequantize -> op -> quantize" patterns: `embedding_byte` and its 2- and 4-bit
  kin (an embedding of a quantized table, the dequantize done per row looked
  up) and `add` (two quantized tensors added into a quantized result).

Each is a backend op (`exirc.backend.ops.BackendOp`): a plain Python callable
with its out schema, so registering them never clashes with ExecuTorch's own
`torch.library` definitions of the same names when both are imported. The
patterns are reference implementations in torch; the runtime's kernels
(`exirc.runtime.kernels.quantized`) are what programs run.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from exirc.backend.ops import BackendOp
from exirc.ir.quantize_ops import define_quantize_ops

NAMESPACE = "quantized_decomposed"


def _op(schema: str, pattern: Any) -> BackendOp:
    parsed = torch._C.parse_schema(schema)
    return BackendOp(parsed.name, pattern, parsed)


# -- out forms of the Q/DQ ops --------------------------------------------------

# functional overload (as `packet.overload`) -> the out schema ExecuTorch's
# quantized library registers for it; the arguments are the same, plus outs.
_OUT_SCHEMAS = {
    "quantize_per_tensor.default":
        "quantize_per_tensor.out(Tensor input, float scale, int zero_point, int quant_min, "
        "int quant_max, ScalarType dtype, *, Tensor(a!) out) -> Tensor(a!)",
    "quantize_per_tensor.tensor":
        "quantize_per_tensor.Tensor_out(Tensor input, Tensor scale, Tensor zero_point, "
        "int quant_min, int quant_max, ScalarType dtype, *, Tensor(a!) out) -> Tensor(a!)",
    "dequantize_per_tensor.default":
        "dequantize_per_tensor.out(Tensor input, float scale, int zero_point, int quant_min, "
        "int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None, Tensor(a!) out) "
        "-> Tensor(a!)",
    "dequantize_per_tensor.tensor":
        "dequantize_per_tensor.Tensor_out(Tensor input, Tensor scale, Tensor zero_point, "
        "int quant_min, int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None, "
        "Tensor(a!) out) -> Tensor(a!)",
    "quantize_per_channel.default":
        "quantize_per_channel.out(Tensor input, Tensor scales, Tensor zero_points, int axis, "
        "int quant_min, int quant_max, ScalarType dtype, *, Tensor(a!) out) -> Tensor(a!)",
    "dequantize_per_channel.default":
        "dequantize_per_channel.out(Tensor input, Tensor scales, Tensor? zero_points, "
        "int axis, int quant_min, int quant_max, ScalarType dtype, *, "
        "ScalarType? out_dtype=None, Tensor(a!) out) -> Tensor(a!)",
    "quantize_per_token.default":
        "quantize_per_token.out(Tensor input, Tensor scales, Tensor zero_points, "
        "int quant_min, int quant_max, ScalarType dtype, *, Tensor(a!) out) -> Tensor(a!)",
    "dequantize_per_token.default":
        "dequantize_per_token.out(Tensor input, Tensor scales, Tensor zero_points, "
        "int quant_min, int quant_max, ScalarType dtype, ScalarType output_dtype, *, "
        "Tensor(a!) out) -> Tensor(a!)",
    "choose_qparams.tensor":
        "choose_qparams.Tensor_out(Tensor input, int quant_min, int quant_max, float eps, "
        "ScalarType dtype, *, Tensor(a!) scale_out, Tensor(b!) zero_point_out) "
        "-> (Tensor(a!), Tensor(b!))",
    "choose_qparams_per_token_asymmetric.default":
        "choose_qparams_per_token_asymmetric.out(Tensor input, ScalarType dtype, *, "
        "Tensor(a!) scale_out, Tensor(b!) zero_point_out) -> (Tensor(a!), Tensor(b!))",
}


@functools.cache
def out_forms() -> dict[Any, BackendOp]:
    """Each Q/DQ OpOverload -> the backend op of its ExecuTorch out form."""
    ops = define_quantize_ops()
    forms: dict[Any, BackendOp] = {}
    for overload, schema in _OUT_SCHEMAS.items():
        packet_name, _, overload_name = overload.partition(".")
        packet = getattr(ops, packet_name, None)
        if packet is None or overload_name not in packet.overloads():
            continue  # torchao is not installed: its ops cannot be in a graph either
        functional = getattr(packet, overload_name)
        forms[functional] = _op(f"{NAMESPACE}::{schema}", functional)
    return forms


def out_form(target: Any) -> BackendOp | None:
    """The out form of a Q/DQ op, or None for any other call target."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != NAMESPACE:
        return None
    return out_forms().get(target)


def is_quantize(target: Any, *names: str) -> bool:
    """Whether `target` is the Q/DQ op `quantized_decomposed::<name>` (any overload)."""
    return isinstance(target, torch._ops.OpOverload) and target.namespace == NAMESPACE \
        and target._schema.name.split("::")[1] in names


# -- fused ops --------------------------------------------------------------------


def dequantize_rows(weight: torch.Tensor, scales: torch.Tensor,
                    zero_points: torch.Tensor | None) -> torch.Tensor:
    """(weight - zero point) * scale with per-row (1-D) or per-group (2-D) scales,
    in the scales' dtype: the dequantize every embedding_* op does."""
    rows, columns = weight.shape
    groups = 1 if scales.dim() == 1 else scales.shape[1]
    values = weight.to(torch.float32).reshape(rows, groups, columns // groups)
    shift = torch.zeros(()) if zero_points is None else \
        zero_points.to(torch.float32).reshape(rows, groups, 1)
    result = (values - shift) * scales.to(torch.float32).reshape(rows, groups, 1)
    return result.reshape(rows, columns).to(scales.dtype)


def _shifts(bits: int) -> torch.Tensor:
    """Where each value of a byte sits: ExecuTorch's 4-bit tables put the first
    value in the high nibble, its 2-bit tables the first value in the low bits."""
    if bits == 4:
        return torch.tensor([4, 0], dtype=torch.int32)
    return torch.arange(0, 8, bits, dtype=torch.int32)


def unpack_nibbles(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 rows of 8/bits values each -> int8 values in [-2^(bits-1), 2^(bits-1)),
    in ExecuTorch's order (`_shifts`)."""
    per_byte = 8 // bits
    mask = (1 << bits) - 1
    shifts = _shifts(bits)
    values = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & mask
    offset = 1 << (bits - 1)
    return (values.reshape(packed.shape[0], packed.shape[1] * per_byte) - offset).to(torch.int8)


def pack_nibbles(values: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of `unpack_nibbles`: int values in [-2^(bits-1), 2^(bits-1)) -> uint8."""
    per_byte = 8 // bits
    offset = 1 << (bits - 1)
    shifted = (values.to(torch.int32) + offset).reshape(values.shape[0], -1, per_byte)
    shifts = _shifts(bits)
    return (shifted << shifts).sum(-1).to(torch.uint8)


def _embedding(bits: int) -> Any:
    def embedding(weight: torch.Tensor, weight_scales: torch.Tensor,
                  weight_zero_points: torch.Tensor | None, weight_quant_min: int,
                  weight_quant_max: int, indices: torch.Tensor) -> torch.Tensor:
        table = weight if bits == 8 else unpack_nibbles(weight, bits)
        return torch.nn.functional.embedding(
            indices, dequantize_rows(table, weight_scales, weight_zero_points))
    embedding.__name__ = f"embedding_{'byte' if bits == 8 else f'{bits}bit'}"
    return embedding


_EMBEDDING_ARGUMENTS = ("Tensor weight, Tensor weight_scales, Tensor? weight_zero_points, "
                        "int weight_quant_min, int weight_quant_max, Tensor indices, *, "
                        "Tensor(a!) out) -> Tensor(a!)")

embedding_byte = _op(f"{NAMESPACE}::embedding_byte.out({_EMBEDDING_ARGUMENTS}", _embedding(8))
embedding_4bit = _op(f"{NAMESPACE}::embedding_4bit.out({_EMBEDDING_ARGUMENTS}", _embedding(4))
embedding_2bit = _op(f"{NAMESPACE}::embedding_2bit.out({_EMBEDDING_ARGUMENTS}", _embedding(2))

EMBEDDING_OPS = {8: embedding_byte, 4: embedding_4bit, 2: embedding_2bit}


def _quantized_add(a: torch.Tensor, a_scale: float, a_zero_point: int, a_quant_min: int,
                   a_quant_max: int, b: torch.Tensor, b_scale: float, b_zero_point: int,
                   b_quant_min: int, b_quant_max: int, out_scale: float, out_zero_point: int,
                   out_quant_min: int, out_quant_max: int) -> torch.Tensor:
    ops = define_quantize_ops()
    total = ops.dequantize_per_tensor(a, a_scale, a_zero_point, a_quant_min, a_quant_max,
                                      a.dtype) + \
        ops.dequantize_per_tensor(b, b_scale, b_zero_point, b_quant_min, b_quant_max, b.dtype)
    return ops.quantize_per_tensor(total, out_scale, out_zero_point, out_quant_min,
                                   out_quant_max, a.dtype)


quantized_add = _op(
    f"{NAMESPACE}::add.out(Tensor a, float a_scale, int a_zero_point, int a_quant_min, "
    "int a_quant_max, Tensor b, float b_scale, int b_zero_point, int b_quant_min, "
    "int b_quant_max, float out_scale, int out_zero_point, int out_quant_min, "
    "int out_quant_max, *, Tensor(a!) out) -> Tensor(a!)", _quantized_add)
