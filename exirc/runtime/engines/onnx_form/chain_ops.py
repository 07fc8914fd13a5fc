"""The ATen kernels a fused chain (`onnx_chain`) can express as ONNX nodes.

Between a program's XNNPACK delegates sit a few portable kernels that XNNPACK
has no node for: attention's "safe softmax" guard (eq, logical_not, any,
where), a BERT mask's cast, index and bitwise and, the embedding lookups that
feed the first delegate. Each costs 1-5 us as a torch call, more than the
work it does. Each translator here appends the ONNX nodes computing exactly
what the kernel computes, for the argument kinds it can prove that of, and
raises `NotMapped` for anything else (the chain then runs kernel by kernel).

Exactness, kernel by kernel:
- embedding: Gather along axis 0. ONNX Gather wraps negative indices where
  torch raises, so the chain also outputs its least index (`Fusion.floors`):
  a negative one makes the run fall back to the kernels, which raise. An
  index past the end makes onnxruntime fail, with the same fallback.
- comparisons (`onnx_chain_arith`) with a scalar: compared in the tensor's own
  dtype, as torch does when the scalar is of the tensor's kind (a float with a
  float tensor, an int with an integer one); other mixes are refused (torch
  would promote).
- any/all over non-empty dims of a bool tensor: ReduceMax/ReduceMin of the bools
  themselves (opset 18+; over an empty dim they would differ, so it is refused).
- where, logical_not, logical/bitwise and/or on bool: Where, Not, And, Or;
  bitwise_not: Not of bools, BitwiseNot of integers.
- _to_copy from bool or an integer dtype: Cast (ONNX and torch agree there:
  non-zero is true, integers to float round to nearest); from float32/64 to a
  signed integer: Cast, which truncates toward zero as torch does where the
  result fits. Where it does not (NaN, infinities, overflow: undefined in
  C++, so torch and onnxruntime may differ) the element is what torch gives
  on this machine, probed once, if that is one value for all of them (x86:
  the minimum, for int32 and int64); else a guard into the least index sends
  such a run kernel by kernel. To bool: x != 0 (NaN is true, -0.0 false, as
  in torch). Other float sources are refused.
- flip: Slice with step -1 over each flipped dim (a bidirectional LSTM's
  reverse direction reads its sequence flipped); elements move, none change.
- index.Tensor with integer index tensors for the leading dims: GatherND
  over the indices broadcast and stacked, at load when constant (negative
  ones wrapped, all checked in range: an out-of-range constant is refused, as
  the kernel raises), else by nodes; one index after whole dims (x[:, :, i]):
  Gather along that dim. GatherND and Gather wrap a negative index and fail
  on one out of range, as the kernel does (the run then goes kernel by kernel).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import numpy
import torch

from exirc.runtime.core.arenas import numpy_dtype
from exirc.runtime.engines.onnx_form.builder import NotMapped

INTEGER_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


class Emitter(Protocol):
    """What a translator needs from the chain being built (`onnx_chain._Builder`)."""

    def name(self, value: int) -> str: ...
    def tensor(self, value: int) -> torch.Tensor: ...
    def scalar(self, value: int) -> Any: ...
    def constant(self, value: int) -> torch.Tensor: ...
    def items(self, value: int) -> list[int | None] | None: ...
    def array(self, stem: str, array: numpy.ndarray) -> str: ...
    def node(self, op_type: str, inputs: list[str], outputs: list[str] | None = None,
             **attributes: Any) -> str: ...
    def floor(self, indices: str) -> None: ...


Translator = Callable[[Emitter, list[int]], None]


def same_shape(e: Emitter, out: int, expected: torch.Size | tuple[int, ...]) -> None:
    if tuple(e.tensor(out).shape) != tuple(expected):
        raise NotMapped(f"its output is {tuple(e.tensor(out).shape)}, not {tuple(expected)}")


def broadcast(*tensors: torch.Tensor) -> tuple[int, ...]:
    try:
        return tuple(torch.broadcast_shapes(*(t.shape for t in tensors)))
    except RuntimeError:
        raise NotMapped("its operands do not broadcast") from None


def _bool(e: Emitter, *values: int) -> None:
    for value in values:
        if e.tensor(value).dtype != torch.bool:
            raise NotMapped(f"value {value} is {e.tensor(value).dtype}, not bool")


def embedding(e: Emitter, args: list[int]) -> None:
    weight, indices, out = e.tensor(args[0]), e.tensor(args[1]), args[-1]
    if indices.dtype not in (torch.int32, torch.int64) or weight.dim() != 2 \
            or indices.numel() == 0 or e.tensor(out).dtype != weight.dtype:
        raise NotMapped("not a 2-d table looked up by int32/int64 indices")
    same_shape(e, out, (*indices.shape, weight.shape[1]))
    e.node("Gather", [e.name(args[0]), e.name(args[1])], [e.name(out)], axis=0)
    e.floor(e.name(args[1]))


_EXACT_INTEGERS = {torch.float32: 2 ** 24, torch.float64: 2 ** 53}  # every int up to these


def scalar_of_kind(e: Emitter, tensor: torch.Tensor, scalar: Any) -> numpy.ndarray:
    dtype = tensor.dtype
    if dtype == torch.bool and isinstance(scalar, bool):
        return numpy.asarray(scalar, dtype=numpy.bool_)
    if dtype in INTEGER_DTYPES and isinstance(scalar, int) and not isinstance(scalar, bool):
        info = torch.iinfo(dtype)
        if info.min <= scalar <= info.max:
            return numpy.asarray(scalar, dtype=numpy_dtype(dtype))
    if dtype in (torch.float32, torch.float64) and isinstance(scalar, float):
        return numpy.asarray(scalar, dtype=numpy_dtype(dtype))
    if dtype in (torch.float32, torch.float64) and isinstance(scalar, int) and \
            not isinstance(scalar, bool) and abs(scalar) <= _EXACT_INTEGERS[dtype]:
        # exactly a float of the tensor's dtype (x * 2): no rounding for either to differ in
        return numpy.asarray(scalar, dtype=numpy_dtype(dtype))
    raise NotMapped(f"a {type(scalar).__name__} scalar with a {dtype} tensor is promoted")


def logical_not(e: Emitter, args: list[int]) -> None:
    _bool(e, args[0], args[-1])
    same_shape(e, args[-1], e.tensor(args[0]).shape)
    e.node("Not", [e.name(args[0])], [e.name(args[-1])])


def bitwise_not(e: Emitter, args: list[int]) -> None:
    """~x: Not of bools (DeBERTa's inverted mask), BitwiseNot of integers."""
    source, out = e.tensor(args[0]), e.tensor(args[-1])
    if out.dtype != source.dtype or source.dtype not in (torch.bool, *INTEGER_DTYPES):
        raise NotMapped(f"~ of {source.dtype} into {out.dtype}")
    same_shape(e, args[-1], source.shape)
    e.node("Not" if source.dtype == torch.bool else "BitwiseNot", [e.name(args[0])],
           [e.name(args[-1])])


def _binary_bool(op_type: str) -> Translator:
    def translate(e: Emitter, args: list[int]) -> None:
        _bool(e, args[0], args[1], args[-1])
        same_shape(e, args[-1], broadcast(e.tensor(args[0]), e.tensor(args[1])))
        e.node(op_type, [e.name(args[0]), e.name(args[1])], [e.name(args[-1])])
    return translate


def _reduce_bool(op_type: str, dims_at: int | None) -> Translator:
    """any/all: over `args[dims_at]` (an int or an int list; None for all dims)."""

    def translate(e: Emitter, args: list[int]) -> None:
        source, out = e.tensor(args[0]), args[-1]
        _bool(e, args[0], out)
        rank = source.dim()
        dims = e.scalar(args[dims_at]) if dims_at is not None else None
        keep = bool(e.scalar(args[dims_at + 1])) if dims_at is not None else False
        if dims is None:
            dims = list(range(rank))
        elif isinstance(dims, int) and not isinstance(dims, bool):
            dims = [dims]
        if not isinstance(dims, list) or not all(isinstance(d, int) and -rank <= d < rank
                                                 for d in dims) or rank == 0:
            raise NotMapped(f"dims {dims!r} of a rank-{rank} tensor")
        axes = sorted({d % rank for d in dims})
        if any(source.shape[d] == 0 for d in axes):
            raise NotMapped("it reduces an empty dim")
        expected = [1 if d in axes else size for d, size in enumerate(source.shape)]
        if not keep:
            expected = [size for d, size in enumerate(expected) if d not in axes]
        same_shape(e, out, tuple(expected))
        # On the bools themselves (opset 18+): no dim is empty, where any/all and a
        # bool ReduceMax/Min could differ.
        e.node(op_type, [e.name(args[0]), e.array("axes", numpy.asarray(axes, numpy.int64))],
               [e.name(out)], keepdims=int(keep))
    return translate


def where(e: Emitter, args: list[int]) -> None:
    condition, a, b, out = (e.tensor(v) for v in args[:4])
    _bool(e, args[0])
    if not a.dtype == b.dtype == out.dtype:
        raise NotMapped(f"where of {a.dtype} and {b.dtype} into {out.dtype} promotes")
    same_shape(e, args[3], broadcast(condition, a, b))
    e.node("Where", [e.name(v) for v in args[:3]], [e.name(args[3])])


def to_copy(e: Emitter, args: list[int]) -> None:
    source, out = e.tensor(args[0]), e.tensor(args[-1])
    target = ONNX_TYPES.get(out.dtype)
    if target is None:
        raise NotMapped(f"a cast to {out.dtype}")
    if source.dtype.is_floating_point and (out.dtype not in (*_SIGNED, torch.bool) or
                                           source.dtype not in (torch.float32, torch.float64)):
        raise NotMapped(f"a cast from {source.dtype} to {out.dtype} (NaN and overflow differ)")
    same_shape(e, args[-1], source.shape)
    if source.dtype.is_floating_point and out.dtype == torch.bool:  # x != 0: NaN is true
        zero = e.array("zero", numpy.zeros((), numpy_dtype(source.dtype)))
        e.node("Not", [e.node("Equal", [e.name(args[0]), zero])], [e.name(args[-1])])
        return
    if not source.dtype.is_floating_point:
        e.node("Cast", [e.name(args[0])], [e.name(args[-1])], to=target)
        return
    fits, cast = _fits(e, args[0], out.dtype), e.node("Cast", [e.name(args[0])], to=target)
    unfit = _torch_unfit_result(source.dtype, out.dtype)
    if unfit is None:  # the kernels decide, run by run
        e.floor(e.node("Neg", [e.node("Cast", [e.node("Not", [fits])],
                                      to=ONNX_TYPES[torch.int64])]))
        e.node("Identity", [cast], [e.name(args[-1])])
    else:
        e.node("Where", [fits, cast, e.array("unfit", numpy.asarray(
            unfit, numpy_dtype(out.dtype)))], [e.name(args[-1])])


_SIGNED = (torch.int8, torch.int16, torch.int32, torch.int64)


def _fits(e: Emitter, value: int, dtype: torch.dtype) -> str:
    """Whether each element lies in (min - 1, max + 1) of `dtype`, exactly the floats
    whose truncation toward zero fits, where torch and onnxruntime cast alike (NaN:
    false). A bound a float cannot hold is rounded outwards to the next float, which
    no float lies strictly between: the test stays exact."""
    kind = numpy.dtype(numpy_dtype(e.tensor(value).dtype)).type
    info = torch.iinfo(dtype)
    low, high = kind(info.min - 1), kind(info.max + 1)
    if int(low) > info.min - 1:
        low = numpy.nextafter(low, kind(-numpy.inf))
    if int(high) < info.max + 1:
        high = numpy.nextafter(high, kind(numpy.inf))
    x = e.name(value)
    return e.node("And", [e.node("Greater", [x, e.array("low", numpy.asarray(low))]),
                          e.node("Less", [x, e.array("high", numpy.asarray(high))])])


@functools.cache
def _torch_unfit_result(source: torch.dtype, target: torch.dtype) -> int | None:
    """What torch's cast gives, on this machine, for every float that does not fit the
    integer dtype (NaN, infinities, overflow; undefined in C++, and onnxruntime's Cast
    may differ): one value for all of them in both its one-element and vector paths
    (x86 gives the dtype's minimum for int32 and int64), or None if it varies."""
    info = torch.iinfo(target)
    unfit = [float("nan"), float("inf"), float("-inf"), 2.0 * (info.max + 1),
             -2.0 * (info.max + 1), float(info.max + 1), 1e30, -1e30]
    results: set[int] = set()
    for count in (1, 1027):  # the scalar loop, and the vector loop with a tail
        for value in unfit:
            results.update(torch.full((count,), value, dtype=source).to(target).tolist())
    return results.pop() if len(results) == 1 else None


def index(e: Emitter, args: list[int]) -> None:
    """x[i0, i1, ...] with every index an integer tensor (no None): GatherND over the
    indices broadcast and stacked; at load when all are constants, else in the chain."""
    source, out = e.tensor(args[0]), args[-1]
    indices = e.items(args[1])
    if indices and len(indices) <= source.dim() and indices[-1] is not None and \
            all(i is None for i in indices[:-1]) and len(indices) > 1:
        _index_one_dim(e, args[0], indices[-1], len(indices) - 1, out)
        return
    if not indices or len(indices) > source.dim() or any(i is None for i in indices):
        raise NotMapped("its indices are not all tensors")
    tensors = [e.tensor(i) for i in indices if i is not None]
    if any(t.dtype not in (torch.int32, torch.int64) for t in tensors):
        raise NotMapped("its indices are not integer tensors (a bool mask?)")
    shape = broadcast(*tensors)
    same_shape(e, out, (*shape, *source.shape[len(tensors):]))
    values = [i for i in indices if i is not None]
    try:
        constants = [e.constant(i) for i in values]
    except NotMapped:  # computed by the chain: stacked by nodes, checked by the session
        positions = _stacked_in_chain(e, values, shape)
    else:
        positions = e.array("index", _stacked_at_load(constants, shape, source.shape))
    e.node("GatherND", [e.name(args[0]), positions], [e.name(out)])


def _index_one_dim(e: Emitter, source: int, index: int, dim: int, out: int) -> None:
    """x[:, ..., :, i] (one index tensor, after whole dims): Gather along that dim,
    which wraps a negative index and fails on one out of range as the kernel does
    (a constant out of range is refused: the kernel would raise every run)."""
    tensor, positions = e.tensor(source), e.tensor(index)
    if positions.dtype not in (torch.int32, torch.int64):
        raise NotMapped("its index is not an integer tensor (a bool mask?)")
    same_shape(e, out, (*tensor.shape[:dim], *positions.shape, *tensor.shape[dim + 1:]))
    try:
        constant = e.constant(index)
    except NotMapped:  # computed by the chain: checked by the session
        constant = None
    if constant is not None:
        _check_in_range(constant, tensor.shape[dim], dim)
    e.node("Gather", [e.name(source), e.name(index)], [e.name(out)], axis=dim)


def _check_in_range(indices: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    """Constant `indices` into a dim of `size`, refused if one is out of range (the kernel
    would raise on every run)."""
    if bool(((indices < -size) | (indices >= size)).any()):
        raise NotMapped(f"an index is out of range for dim {dim} of size {size}")
    return indices


def _stacked_at_load(tensors: list[torch.Tensor], shape: tuple[int, ...],
                     sizes: torch.Size) -> numpy.ndarray:
    """Constant indices broadcast, wrapped and stacked (out of range: the kernel raises)."""
    stacked = []
    for dim, t in enumerate(tensors):
        size = sizes[dim]
        wide = _check_in_range(t.to(torch.int64).expand(shape), size, dim)
        stacked.append(torch.where(wide < 0, wide + size, wide))
    return torch.stack(stacked, dim=-1).numpy() if shape else \
        numpy.asarray([int(t) for t in stacked], numpy.int64)


def _stacked_in_chain(e: Emitter, values: list[int], shape: tuple[int, ...]) -> str:
    """Indices broadcast and stacked by nodes. GatherND wraps a negative index and
    fails on one out of range, as the kernel wraps and raises (the run then goes
    kernel by kernel, which raises)."""
    columns = []
    for value in values:
        name = e.name(value)
        if e.tensor(value).dtype != torch.int64:
            name = e.node("Cast", [name], to=ONNX_TYPES[torch.int64])
        if tuple(e.tensor(value).shape) != shape:
            name = e.node("Expand", [name, e.array("shape", numpy.asarray(shape, numpy.int64))])
        columns.append(e.node("Unsqueeze", [name, e.array("axis", numpy.asarray(
            [len(shape)], numpy.int64))]))
    return columns[0] if len(columns) == 1 else e.node("Concat", columns, axis=-1)


def flip(e: Emitter, args: list[int]) -> None:
    """flip over each of `dims` once: a Slice from each one's last element backwards."""
    source, out = e.tensor(args[0]), args[-1]
    rank, dims = source.dim(), e.scalar(args[1])
    if not isinstance(dims, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and -rank <= d < rank for d in dims):
        raise NotMapped(f"dims {dims!r} of a rank-{rank} tensor")
    axes = [d % rank for d in dims]
    if len(set(axes)) != len(axes):
        raise NotMapped(f"dims {dims!r} name a dim twice (the kernel refuses them)")
    if e.tensor(out).dtype != source.dtype:
        raise NotMapped(f"a flip of {source.dtype} into {e.tensor(out).dtype}")
    same_shape(e, out, source.shape)
    if not axes:
        e.node("Identity", [e.name(args[0])], [e.name(out)])
        return
    count = len(axes)
    # With step -1, ONNX clamps the start to the last element and this end to
    # "before the first": the whole dim, backwards, for any size (0 included).
    e.node("Slice", [e.name(args[0]), e.array("starts", numpy.full(count, -1, numpy.int64)),
                     e.array("ends", numpy.full(count, numpy.iinfo(numpy.int64).min)),
                     e.array("axes", numpy.asarray(axes, numpy.int64)),
                     e.array("steps", numpy.full(count, -1, numpy.int64))], [e.name(out)])


ONNX_TYPES: dict[torch.dtype, int] = {
    torch.float32: 1, torch.uint8: 2, torch.int8: 3, torch.int16: 5, torch.int32: 6,
    torch.int64: 7, torch.bool: 9, torch.float16: 10, torch.float64: 11,
}
"""onnx.TensorProto's element types by torch dtype."""

TRANSLATORS: dict[str, Translator] = {
    "aten::embedding.out": embedding,
    "aten::logical_not.out": logical_not,
    "aten::bitwise_not.out": bitwise_not,
    "aten::logical_and.out": _binary_bool("And"),
    "aten::logical_or.out": _binary_bool("Or"),
    "aten::bitwise_and.Tensor_out": _binary_bool("And"),
    "aten::bitwise_or.Tensor_out": _binary_bool("Or"),
    "aten::any.out": _reduce_bool("ReduceMax", 1),
    "aten::any.dims_out": _reduce_bool("ReduceMax", 1),
    "aten::any.all_out": _reduce_bool("ReduceMax", None),
    "aten::all.out": _reduce_bool("ReduceMin", 1),
    "aten::all.dims_out": _reduce_bool("ReduceMin", 1),
    "aten::all.all_out": _reduce_bool("ReduceMin", None),
    "aten::where.self_out": where,
    "aten::_to_copy.out": to_copy,
    "aten::index.Tensor_out": index,
    "aten::flip.out": flip,
}
"""Kernel name (as programs spell it) -> its translator."""
