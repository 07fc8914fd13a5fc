"""Kernels that only move or fill data, as ONNX nodes in a fused chain (`onnx_chain`).

Programs lowered by ExecuTorch keep between their XNNPACK delegates the
copies its view ops became (view_copy, squeeze/unsqueeze_copy, permute_copy,
slice_copy, select_copy), concatenations and constant fills (the `full` of a
causal mask); each would keep the whole method kernel by kernel. Moving data
is exact, so each translator here only has to agree with the kernel on where
every element goes: the result's shape is what torch's own op gives on a
meta tensor of the source's shape (checked against the planned out), and the
node is built from indices normalised at load (negative ones wrapped, slices
resolved as Python resolves them), never from ONNX's own clamping rules.
Anything else raises `NotMapped`.
"""

from __future__ import annotations

from typing import Any

import numpy
import torch

from exirc.runtime.engines.onnx_form.builder import NotMapped
from exirc.runtime.engines.onnx_form.chain_ops import ONNX_TYPES, Emitter, Translator, same_shape


def meta_result(e: Emitter, op: Any, source: int, *arguments: Any) -> torch.Size:
    """The shape `op` gives on a meta tensor like value `source`, or NotMapped."""
    tensor = e.tensor(source)
    try:
        return op(torch.empty(tensor.shape, dtype=tensor.dtype, device="meta"), *arguments).shape
    except (RuntimeError, TypeError, IndexError, ValueError) as error:
        raise NotMapped(f"{getattr(op, '__name__', op)} refuses its arguments: "
                        f"{str(error).splitlines()[0] if str(error) else type(error).__name__}"
                        ) from None


def _same_dtype(e: Emitter, source: int, out: int) -> None:
    if e.tensor(source).dtype != e.tensor(out).dtype:
        raise NotMapped(f"a copy from {e.tensor(source).dtype} into {e.tensor(out).dtype}")


def _reshaping(op: Any, scalars: int) -> Translator:
    """A view op whose result is the source's elements in order (view, squeeze,
    unsqueeze): a Reshape to torch's result shape. `scalars`: its arguments after
    the source."""

    def translate(e: Emitter, args: list[int]) -> None:
        _same_dtype(e, args[0], args[-1])
        shape = meta_result(e, op, args[0], *(e.scalar(v) for v in args[1:1 + scalars]))
        same_shape(e, args[-1], shape)
        e.node("Reshape", [e.name(args[0]), e.array("shape", numpy.asarray(shape, numpy.int64))],
               [e.name(args[-1])])
    return translate


def clone(e: Emitter, args: list[int]) -> None:
    _same_dtype(e, args[0], args[-1])  # the out's layout is contiguous: `Emitter.tensor`
    same_shape(e, args[-1], e.tensor(args[0]).shape)
    e.node("Identity", [e.name(args[0])], [e.name(args[-1])])


def permute_copy(e: Emitter, args: list[int]) -> None:
    _same_dtype(e, args[0], args[-1])
    dims = e.scalar(args[1])
    same_shape(e, args[-1], meta_result(e, torch.permute, args[0], dims))
    rank = e.tensor(args[0]).dim()
    e.node("Transpose", [e.name(args[0])], [e.name(args[-1])], perm=[d % rank for d in dims])


def slice_copy(e: Emitter, args: list[int]) -> None:
    """source[start:end:step] along `dim` (step >= 1, as torch requires)."""
    _same_dtype(e, args[0], args[-1])
    source = e.tensor(args[0])
    dim, start, end, step = (e.scalar(v) for v in args[1:5])
    rank = source.dim()
    if not all(isinstance(v, int) or v is None for v in (start, end)) or \
            not isinstance(dim, int) or not isinstance(step, int) or step < 1 or \
            not -rank <= dim < rank:
        raise NotMapped(f"a slice [{start}:{end}:{step}] of dim {dim}")
    axis = dim % rank
    first, stop, _ = slice(start, end, step).indices(source.shape[axis])
    count = max(0, -(-(stop - first) // step))
    same_shape(e, args[-1], (*source.shape[:axis], count, *source.shape[axis + 1:]))
    e.node("Slice", [e.name(args[0]), e.array("starts", numpy.asarray([first], numpy.int64)),
                     e.array("ends", numpy.asarray([first + count * step], numpy.int64)),
                     e.array("axes", numpy.asarray([axis], numpy.int64)),
                     e.array("steps", numpy.asarray([step], numpy.int64))], [e.name(args[-1])])


def select_copy(e: Emitter, args: list[int]) -> None:
    _same_dtype(e, args[0], args[-1])
    source = e.tensor(args[0])
    dim, index = e.scalar(args[1]), e.scalar(args[2])
    rank = source.dim()
    if not isinstance(dim, int) or not isinstance(index, int) or not -rank <= dim < rank:
        raise NotMapped(f"a select of index {index!r} in dim {dim!r}")
    size = source.shape[dim % rank]
    if not -size <= index < size:
        raise NotMapped(f"index {index} is out of range for a dim of {size} (the kernel raises)")
    same_shape(e, args[-1], meta_result(e, torch.select, args[0], dim, index))
    e.node("Gather", [e.name(args[0]), e.array("index", numpy.asarray(index % size,
                                                                     numpy.int64))],
           [e.name(args[-1])], axis=dim % rank)


def cat(e: Emitter, args: list[int]) -> None:
    items = e.items(args[0])
    dim, out = e.scalar(args[1]), e.tensor(args[-1])
    if not items or any(i is None for i in items) or not isinstance(dim, int):
        raise NotMapped("not a list of tensors along a dim")
    parts = [e.tensor(i) for i in items if i is not None]
    if any(t.dtype != out.dtype or t.dim() != out.dim() for t in parts) or out.dim() == 0:
        raise NotMapped("its tensors differ in dtype or rank (torch promotes or skips them)")
    same_shape(e, args[-1], _meta_result_of_cat(parts, dim))
    e.node("Concat", [_operand(e, i) for i in items if i is not None], [e.name(args[-1])],
           axis=dim % out.dim())


def repeat(e: Emitter, args: list[int]) -> None:
    """`repeat.out(x, repeats)`: Tile, of x with the leading 1s torch gives it when
    `repeats` is longer than its rank."""
    _same_dtype(e, args[0], args[-1])
    source, repeats = e.tensor(args[0]), e.scalar(args[1])
    if not isinstance(repeats, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in repeats):
        raise NotMapped(f"repeats {repeats!r}")
    same_shape(e, args[-1], meta_result(e, torch.Tensor.repeat, args[0], repeats))
    name = e.name(args[0])
    if len(repeats) > source.dim():
        padded = [1] * (len(repeats) - source.dim()) + list(source.shape)
        name = e.node("Reshape", [name, e.array("shape", numpy.asarray(padded, numpy.int64))])
    e.node("Tile", [name, e.array("repeats", numpy.asarray(repeats, numpy.int64))],
           [e.name(args[-1])])


def _operand(e: Emitter, value: int) -> str:
    """A list item's name: a constant's data as an initializer, else the value's."""
    try:
        return e.array("constant", e.constant(value).numpy())
    except NotMapped:
        return e.name(value)


def _meta_result_of_cat(parts: list[torch.Tensor], dim: int) -> torch.Size:
    try:
        return torch.cat([torch.empty(t.shape, dtype=t.dtype, device="meta") for t in parts],
                         dim).shape
    except (RuntimeError, IndexError) as error:
        raise NotMapped(f"cat refuses its tensors: {str(error).splitlines()[0]}") from None


def scalar_tensor(e: Emitter, args: list[int]) -> None:
    """`scalar_tensor.out(value)`: a 0-d fill."""
    _fill(e, [], e.scalar(args[0]), args[-1])


def full(e: Emitter, args: list[int]) -> None:
    """`full.out(size, value)`."""
    _fill(e, e.scalar(args[0]), e.scalar(args[1]), args[-1])


def full_like(e: Emitter, args: list[int]) -> None:
    """`full_like.out(self, value, memory_format?)`: a fill of the source's shape."""
    _fill(e, list(e.tensor(args[0]).shape), e.scalar(args[1]), args[-1])


def _fill(e: Emitter, size: Any, value: Any, out_value: int) -> None:
    """A constant fill, computed by torch at load."""
    out = e.tensor(out_value)
    if out.dtype not in ONNX_TYPES or not isinstance(size, list) or \
            not isinstance(value, (bool, int, float)):
        raise NotMapped(f"a fill of {value!r} into {out.dtype}")
    try:
        values = torch.full(size, value, dtype=out.dtype)
    except (RuntimeError, TypeError, OverflowError):
        raise NotMapped(f"torch refuses to fill {out.dtype} with {value!r}") from None
    same_shape(e, out_value, values.shape)
    e.node("Identity", [e.array("full", values.numpy())], [e.name(out_value)])


MOVES: dict[str, Translator] = {
    "aten::view_copy.out": _reshaping(torch.reshape, 1),
    "aten::_unsafe_view.out": _reshaping(torch.reshape, 1),
    "aten::squeeze_copy.out": _reshaping(torch.squeeze, 0),
    "aten::squeeze_copy.dim_out": _reshaping(torch.squeeze, 1),
    "aten::squeeze_copy.dims_out": _reshaping(torch.squeeze, 1),
    "aten::unsqueeze_copy.out": _reshaping(torch.unsqueeze, 1),
    "aten::clone.out": clone,
    "aten::alias_copy.out": clone,
    "aten::permute_copy.out": permute_copy,
    "aten::slice_copy.Tensor_out": slice_copy,
    "aten::select_copy.int_out": select_copy,
    "aten::cat.out": cat,
    "aten::repeat.out": repeat,
    "aten::full.out": full,
    "aten::full_like.out": full_like,
    "aten::scalar_tensor.out": scalar_tensor,
}
