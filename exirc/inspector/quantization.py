"""Which tensors of a program are quantized, and how, as plain JSON-able data.

Quantization lives in two places in a program file:

- The arguments of calls to ExecuTorch's quantized kernels
  (`quantized_decomposed::*`, schemas in ExecuTorch's
  `kernels/quantized/quantized.yaml`). The tensor a quantize call writes, or
  a dequantize, embedding or mixed matmul call reads, is quantized with the
  scale(s), zero point(s), range and dtype that the call names. A scale is a
  double in the instruction, or a tensor: a constant (the file holds its
  values) or one computed at run time (dynamic quantization: only which
  value holds it is known).
- XNNPACK payloads: each quantized value of the graph carries its own
  parameters (`quantization_xnnpack.py`).

A tensor that several calls name with the same parameters (a quantize and
the dequantize reading its result) is one entry, with every call in `uses`.

Files are untrusted, and a malformed call is a fact to show, not a failure:
an argument that is missing or of the wrong kind is unknown (`null` in JSON,
`?` in text); nothing here raises on one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exirc.inspector.delegates import Payload, program_payloads
from exirc.inspector.listing import value_type
from exirc.inspector.quantization_params import (
    CONSTANT,
    EXTERNAL,
    LITERAL,
    NONE,
    RUN_TIME,
    UNKNOWN,
    Params,
    QuantizedTensor,
    Use,
    decode,
    params_text,
    scheme_text,
)
from exirc.inspector.quantization_xnnpack import payload_tensors
from exirc.serialize import program as P

NAMESPACE = "quantized_decomposed::"


@dataclass(frozen=True)
class _Operand:
    """Where one quantized tensor and its parameters sit among a call's
    arguments: positions in the schema (`tensor` None: the call's result)."""

    arg: str
    tensor: int | None
    scale: int
    zero_point: int
    quant_min: int | None = None
    quant_max: int | None = None
    dtype: int | None = None
    axis: int | None = None


@dataclass(frozen=True)
class _Kernel:
    """How a kernel quantizes: `tensor` (one scale), `channel` (along its axis
    argument), `token` (per row), `rows` (a weight's rows, or groups of each
    row when the scales are 2-D) or `mm_rows` (mixed_mm: always per row).
    `bits` < 8: the weight packs 8 / bits values a byte."""

    kind: str
    operands: tuple[_Operand, ...]
    bits: int = 8


def _rows(bits: int) -> _Kernel:
    return _Kernel("rows", (_Operand("weight", 0, 1, 2, 3, 4),), bits)


# By operator name; overloads (.out, .Tensor_out, .dtype_out) differ only
# after these arguments.
KERNELS: dict[str, _Kernel] = {
    "quantize_per_tensor": _Kernel("tensor", (_Operand("output", None, 1, 2, 3, 4, 5),)),
    "dequantize_per_tensor": _Kernel("tensor", (_Operand("input", 0, 1, 2, 3, 4, 5),)),
    "quantize_per_channel": _Kernel("channel", (_Operand("output", None, 1, 2, 4, 5, 6, 3),)),
    "dequantize_per_channel": _Kernel("channel", (_Operand("input", 0, 1, 2, 4, 5, 6, 3),)),
    "quantize_per_token": _Kernel("token", (_Operand("output", None, 1, 2, 3, 4, 5),)),
    "dequantize_per_token": _Kernel("token", (_Operand("input", 0, 1, 2, 3, 4, 5),)),
    "embedding_byte": _rows(8),
    "embedding_4bit": _rows(4),
    "embedding_2bit": _rows(2),
    "mixed_linear": _Kernel("rows", (_Operand("weight", 1, 2, 3),)),
    "mixed_mm": _Kernel("mm_rows", (_Operand("weight", 1, 2, 3),)),
    "add": _Kernel("tensor", (_Operand("a", 0, 1, 2, 3, 4), _Operand("b", 5, 6, 7, 8, 9),
                              _Operand("out", None, 10, 11, 12, 13))),
}

# The range a kernel without quant_min/max arguments (mixed_*) works in.
_DTYPE_RANGES = {"i8": (-128, 127), "u8": (0, 255)}


def quantized_tensors(program: P.Program,
                      payloads: Sequence[Payload] | None = None) -> list[QuantizedTensor]:
    """Every quantized tensor, by method: the kernel calls' (by value index),
    then each delegate's. `payloads` are the program's, if already read."""
    by_plan: dict[int, list[Payload]] = {}
    for payload in program_payloads(program) if payloads is None else payloads:
        by_plan.setdefault(payload.plan, []).append(payload)
    named = _named_data(program)
    found: list[QuantizedTensor] = []
    per_blob: dict[int, list[QuantizedTensor]] = {}  # a payload many delegates share: once
    for i, plan in enumerate(program.execution_plan):
        found.extend(kernel_tensors(program, plan))
        for payload in by_plan.get(i, [])[:len(plan.delegates)]:
            if payload.blob is None:
                continue
            tensors = per_blob.get(id(payload.blob))
            if tensors is None:
                tensors = per_blob[id(payload.blob)] = payload_tensors(payload, named)
                found.extend(tensors)
            else:
                found.extend(dataclasses.replace(t, method=payload.method, delegate=payload.index)
                             for t in tensors)
    return found


def quantization_facts(program: P.Program,
                       payloads: Sequence[Payload] | None = None) -> dict[str, Any]:
    """The `quantization` entry of `exirc inspect --json`."""
    tensors = quantized_tensors(program, payloads)
    return {"count": len(tensors), "tensors": [t.to_json() for t in tensors]}


def call_notes(program: P.Program, plan: P.ExecutionPlan) -> dict[tuple[int, int], str]:
    """(chain, index) -> what a quantized call's tensor arguments hold, for
    the listing: `per-channel axis 0: 4 scales 0.00144..0.00151, zp=0 (all 4)`.
    Literal scales are in the call's text already: those calls get no note."""
    notes: dict[tuple[int, int], list[str]] = {}
    for tensor in kernel_tensors(program, plan):
        if tensor.scale.source == LITERAL and tensor.zero_point.source == LITERAL:
            continue
        facts = tensor.to_json()
        text = (f"{scheme_text(facts)}: {params_text('scale', 'scales', facts['scale'])}, "
                f"{params_text('zp', 'zps', facts['zero_point'])}")
        for use in tensor.uses:
            found = notes.setdefault((use.chain, use.index), [])
            if text not in found:
                found.append(text)
    return {where: "; ".join(texts) for where, texts in notes.items()}


def _named_data(program: P.Program) -> dict[str, bytes | memoryview]:
    found: dict[str, bytes | memoryview] = {}
    for named in program.named_data:
        if 0 <= named.segment_index < len(program.segments):
            found.setdefault(named.key, program.segments[named.segment_index].data)
    return found


def kernel_tensors(program: P.Program, plan: P.ExecutionPlan) -> list[QuantizedTensor]:
    found: dict[str, QuantizedTensor] = {}
    known = _Known(frozenset(plan.inputs))
    for c, chain in enumerate(plan.chains):
        for i, instr in enumerate(chain.instructions):
            if not isinstance(instr, P.KernelCall):
                continue
            if not 0 <= instr.op_index < len(plan.operators):
                continue
            op = plan.operators[instr.op_index]
            kernel = KERNELS.get(op.name[len(NAMESPACE):]) \
                if op.name.startswith(NAMESPACE) else None
            if kernel is None:
                continue
            args = _Args(program, plan, list(instr.args[:-1]),
                         instr.args[-1] if instr.args else None, known)
            for operand in kernel.operands:
                tensor = args.describe(kernel, operand)
                key = json.dumps(tensor.to_json(), sort_keys=True)  # uses are still empty
                tensor = found.setdefault(key, tensor)
                tensor.uses.append(Use(operand.arg, operand.tensor is None,
                                       op.qualified_name, c, i))
    return sorted(found.values(), key=lambda t: -1 if t.value is None else t.value)


@dataclass
class _Known:
    """What the calls of one plan share: its inputs, and the scales and zero
    points read from each tensor value (a file can name one large constant in
    every call: it is read once)."""

    inputs: frozenset[int]
    params: dict[int, Params] = field(default_factory=dict)


@dataclass
class _Args:
    """One call's arguments: `schema` are value indices in schema order
    (keyword-only ones included); `result` is the returned value."""

    program: P.Program
    plan: P.ExecutionPlan
    schema: list[int]
    result: int | None
    known: _Known

    def index(self, position: int | None) -> int | None:
        if position is None or position >= len(self.schema):
            return None
        return self.schema[position]

    def value(self, index: int | None) -> P.EValue | None:
        if index is None or not 0 <= index < len(self.plan.values):
            return None
        return self.plan.values[index]

    def integer(self, position: int | None) -> int | None:
        value = self.value(self.index(position))
        return value.int_val if isinstance(value, P.Int) else None

    def tensor(self, position: int | None) -> P.Tensor | None:
        value = self.value(self.index(position))
        return value if isinstance(value, P.Tensor) else None

    def params(self, position: int) -> Params:
        index = self.index(position)
        value = self.value(index)
        if isinstance(value, P.Double):
            return Params.literal(value.double_val)
        if isinstance(value, P.Int):
            return Params.literal(value.int_val)
        if isinstance(value, P.Null):
            return Params(NONE, value=index)
        if isinstance(value, P.Tensor):
            assert index is not None
            if index not in self.known.params:
                self.known.params[index] = tensor_params(self.program, value, index)
            return self.known.params[index]
        return Params(UNKNOWN, value=index)

    def describe(self, kernel: _Kernel, operand: _Operand) -> QuantizedTensor:
        index = self.result if operand.tensor is None else self.index(operand.tensor)
        value = self.value(index)
        tensor = value if isinstance(value, P.Tensor) else None
        low, high = self.integer(operand.quant_min), self.integer(operand.quant_max)
        scale = self.params(operand.scale)
        scheme, axis, group = self._scheme(kernel, operand, tensor)
        dtype = _dtype(kernel, self.integer(operand.dtype), tensor, low)
        if operand.quant_min is None and dtype in _DTYPE_RANGES:
            low, high = _DTYPE_RANGES[dtype]
        return QuantizedTensor(
            method=self.plan.name, value=index,
            type="?" if value is None else value_type(value), dtype=dtype, scheme=scheme,
            scale=scale, zero_point=self.params(operand.zero_point),
            dynamic=scale.source == RUN_TIME, axis=axis, group_size=group, quant_min=low,
            quant_max=high, origin=_origin(self.known.inputs, index, tensor))

    def _scheme(self, kernel: _Kernel, operand: _Operand, weight: P.Tensor | None
                ) -> tuple[str | None, int | None, int | None]:
        """(scheme, axis, group size)."""
        if kernel.kind == "tensor":
            return "per_tensor", None, None
        if kernel.kind == "token":
            return "per_token", None, None
        if kernel.kind == "channel":
            return "per_channel", self.integer(operand.axis), None
        if kernel.kind == "mm_rows":
            return "per_channel", 0, None
        scales = self.tensor(operand.scale)
        if scales is None:
            return None, None, None
        sizes = scales.sizes
        if len(sizes) <= 1 or (len(sizes) == 2 and sizes[1] == 1):
            return "per_channel", 0, None
        if len(sizes) != 2:
            return None, None, None
        # Each row of the weight has sizes[1] groups of scales; the packed
        # sub-byte weights hold 8 / bits columns a byte.
        columns = weight.sizes[1] * (8 // kernel.bits) \
            if weight is not None and len(weight.sizes) == 2 else None
        groups = sizes[1]
        fits = columns is not None and groups > 0 and columns % groups == 0
        return "per_group", 0, columns // groups if fits and columns is not None else None


def tensor_params(program: P.Program, tensor: P.Tensor, index: int) -> Params:
    """A scale or zero point held in a tensor: a constant's values are read."""
    where: dict[str, Any] = {"value": index, "shape": list(tensor.sizes)}
    count = tensor.numel
    info = tensor.extra_tensor_info
    if info is not None and info.location == P.TensorDataLocation.EXTERNAL:
        return Params(EXTERNAL, count=count, **where)
    # Planned memory, even with an initial value, may be rewritten as it runs.
    if not tensor.data_buffer_idx or tensor.allocation_info is not None:
        return Params(RUN_TIME, count=count, **where)
    if not 0 < tensor.data_buffer_idx < program.constant_count():
        return Params(CONSTANT, count=count, **where)
    data = program.constant_data(tensor.data_buffer_idx)
    return Params.of_array(CONSTANT, decode(data, tensor.scalar_type, count), count, **where)


def _dtype(kernel: _Kernel, dtype: int | None, tensor: P.Tensor | None,
           quant_min: int | None) -> str | None:
    """The integer type: the call's dtype argument, else the tensor's own;
    packed sub-byte weights are `i4`/`u4`, `i2`/`u2` by their range."""
    if kernel.bits < 8:
        return f"{'u' if quant_min is not None and quant_min >= 0 else 'i'}{kernel.bits}"
    if dtype is not None:
        try:
            return P.ScalarType(dtype).short_name
        except (ValueError, KeyError):
            return None
    return tensor.scalar_type.short_name if tensor is not None else None


def _origin(inputs: frozenset[int], index: int | None, tensor: P.Tensor | None) -> str | None:
    if tensor is None or index is None:
        return None
    if tensor.data_buffer_idx and tensor.allocation_info is None:
        return "constant"
    return "input" if index in inputs else "computed"


def scheme_counts(tensors: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many tensors use each scheme (`dynamic per_token`), most first."""
    counts: dict[str, int] = {}
    for t in tensors:
        name = ("dynamic " if t.get("dynamic") else "") + str(t.get("scheme") or "unknown")
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
