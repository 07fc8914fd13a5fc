"""TFLite forms of the ONNX nodes that pick, compare or cast values: embedding
lookups, attention masks, slices and splits (see `onnx_to_tflite`).

Index operands of TFLite operators are int32; the ONNX model's int64
constants are converted after checking that they fit. Out-of-range gather
indices make TFLite's kernel fail the call (it checks every index), so the
run goes kernel by kernel and raises exirc's own error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy

from exirc.runtime.engines.litert.tflite_builder import Value
from exirc.runtime.engines.onnx_form.builder import NotMapped

if TYPE_CHECKING:
    from exirc.runtime.engines.litert.onnx_to_tflite import Converter

_INT32 = numpy.iinfo(numpy.int32)


def int32(array: Any, what: str) -> numpy.ndarray:
    """`array` as int32, or NotMapped if a value does not fit."""
    array = numpy.asarray(array)
    if array.size and (array.min() < _INT32.min or array.max() > _INT32.max):
        raise NotMapped(f"{what} does not fit in int32")
    return array.astype(numpy.int32)


def _gather(c: Converter, node: Any) -> None:
    shape = c.shape(node.input[0])
    axis = c.attributes(node).get("axis", 0) % len(shape)
    fixed = c.known(node.input[1])
    if fixed is not None:
        # ONNX wraps a negative index, TFLite refuses it: constant ones are wrapped here.
        if fixed.size and (fixed.min() < -shape[axis] or fixed.max() >= shape[axis]):
            raise NotMapped(f"Gather {node.output[0]}: a constant index outside the data")
        indices = Value(c.b.constant(int32(fixed % max(shape[axis], 1), "an index")))
    else:
        indices = c.value(node.input[1])
    out = c.b.tensor(c.shape(node.output[0]), c.b.dtypes[c.tensor(node.input[0])])
    c.b.op("GATHER", [c.tensor(node.input[0]), c.b.materialize(indices)], [out],
           "GatherOptions", axis=axis, batchDims=0)
    c.set(node.output[0], Value(out))


def _gather_nd(c: Converter, node: Any) -> None:
    if c.attributes(node).get("batch_dims", 0):
        raise NotMapped(f"GatherND {node.output[0]}: batch_dims")
    data = c.tensor(node.input[0])
    indices = int32(c.constant(node, 1), f"GatherND {node.output[0]}")
    shape = c.shape(node.input[0])
    if (indices < 0).any() or (indices >= numpy.array(shape[:indices.shape[-1]])).any():
        raise NotMapped(f"GatherND {node.output[0]}: indices outside the data")
    out = c.b.tensor(c.shape(node.output[0]), c.b.dtypes[data])
    c.b.op("GATHER_ND", [data, c.b.constant(indices)], [out], "GatherNdOptions")
    c.set(node.output[0], Value(out))


def _cast(c: Converter, node: Any) -> None:
    source = c.tensor(node.input[0])
    target = numpy.dtype(c.onnx.helper.tensor_dtype_to_np_dtype(c.attributes(node)["to"]))
    if target == c.b.dtypes[source]:
        c.set(node.output[0], Value(source))
        return
    if c.b.dtypes[source].kind == "f" and target.kind in "iub":
        # Truncation out of range differs between kernels (the ONNX chain probes torch).
        raise NotMapped(f"Cast {node.output[0]}: float to {target}")
    out = c.b.like(source, dtype=target)
    c.b.op("CAST", [source], [out])
    c.set(node.output[0], Value(out))


_COMPARE_OR_SELECT = {
    "Equal": ("EQUAL", "EqualOptions"), "Greater": ("GREATER", "GreaterOptions"),
    "Less": ("LESS", "LessOptions"), "GreaterOrEqual": ("GREATER_EQUAL", "GreaterEqualOptions"),
    "LessOrEqual": ("LESS_EQUAL", "LessEqualOptions"),
    "And": ("LOGICAL_AND", "LogicalAndOptions"), "Or": ("LOGICAL_OR", "LogicalOrOptions"),
    "Where": ("SELECT_V2", "SelectV2Options"), "Min": ("MINIMUM", "MaximumMinimumOptions"),
    "Max": ("MAXIMUM", "MaximumMinimumOptions")}
_COMPARISONS = ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual")


def _broadcasting(c: Converter, node: Any) -> None:
    """An elementwise node of broadcast operands, on tensors as ONNX lays them out."""
    builtin, options = _COMPARE_OR_SELECT[node.op_type]
    if node.op_type in ("Min", "Max") and len(node.input) != 2:
        raise NotMapped(f"{node.op_type} {node.output[0]} of {len(node.input)} inputs")
    operands = [c.tensor(name) for name in node.input]
    dtype = numpy.bool_ if node.op_type in _COMPARISONS else c.b.dtypes[operands[-1]]
    out = c.b.tensor(c.shape(node.output[0]), dtype)
    c.b.op(builtin, operands, [out], options)
    c.set(node.output[0], Value(out))


# ONNX reduction -> TFLite operator (of bools, if it has one there).
_REDUCTIONS = {"ReduceMean": ("MEAN", None), "ReduceSum": ("SUM", None),
               "ReduceMin": ("REDUCE_MIN", "REDUCE_ALL"),
               "ReduceMax": ("REDUCE_MAX", "REDUCE_ANY")}


def _reduce(c: Converter, node: Any) -> None:
    """A reduction over constant axes (all of them when none are given)."""
    attributes = c.attributes(node)
    source = c.tensor(node.input[0])
    rank = len(c.b.shapes[source])
    if len(node.input) > 1 and node.input[1]:
        axes = sorted({int(a) % rank for a in c.constant(node, 1)})
    elif attributes.get("noop_with_empty_axes", 0):
        raise NotMapped(f"{node.op_type} {node.output[0]}: noop_with_empty_axes")
    else:
        axes = list(range(rank))
    builtin, of_bools = _REDUCTIONS[node.op_type]
    if c.b.dtypes[source] == numpy.bool_:
        if of_bools is None:
            raise NotMapped(f"{node.op_type} {node.output[0]} of bools")
        builtin = of_bools
    out = c.b.like(source, c.shape(node.output[0]))
    c.b.op(builtin, [source, c.b.constant(numpy.array(axes, numpy.int32))], [out],
           "ReducerOptions", keepDims=bool(attributes.get("keepdims", 1)))
    c.set(node.output[0], Value(out))


def _slice(c: Converter, node: Any) -> None:
    """A Slice of constant bounds and positive steps (ONNX clamps its bounds)."""
    shape = c.shape(node.input[0])
    starts, ends = c.constant(node, 1), c.constant(node, 2)
    axes = c.constant(node, 3) if len(node.input) > 3 and node.input[3] else range(len(starts))
    steps = c.constant(node, 4) if len(node.input) > 4 and node.input[4] else [1] * len(starts)
    begin, end, stride = [0] * len(shape), list(shape), [1] * len(shape)
    for start, stop, axis, step in zip(starts, ends, axes, steps):
        axis, size = int(axis) % len(shape), shape[int(axis) % len(shape)]
        if step <= 0:
            raise NotMapped(f"Slice {node.output[0]}: step {step}")
        begin[axis] = int(min(max(start + size if start < 0 else start, 0), size))
        end[axis] = int(min(max(stop + size if stop < 0 else stop, 0), size))
        stride[axis] = int(step)
    out_shape = c.shape(node.output[0])
    out = c.b.like(c.tensor(node.input[0]), out_shape)
    if all(s == 1 for s in stride):
        c.b.op("SLICE", [c.tensor(node.input[0]), c.b.constant(int32(begin, "a bound")),
                         c.b.constant(int32(out_shape, "a size"))], [out], "SliceOptions")
    else:
        c.b.op("STRIDED_SLICE", [c.tensor(node.input[0]), c.b.constant(int32(begin, "a bound")),
                                 c.b.constant(int32(end, "a bound")),
                                 c.b.constant(int32(stride, "a step"))], [out],
               "StridedSliceOptions")
    c.set(node.output[0], Value(out))


def _split(c: Converter, node: Any) -> None:
    shape = c.shape(node.input[0])
    axis = c.attributes(node).get("axis", 0) % len(shape)
    sizes = [c.shape(name)[axis] for name in node.output]
    if sum(sizes) != shape[axis]:
        raise NotMapped(f"Split {node.output[0]}: parts of {sizes} of {shape[axis]}")
    source = c.tensor(node.input[0])
    outs = [c.b.like(source, c.shape(name)) for name in node.output]
    c.b.op("SPLIT_V", [source, c.b.constant(int32(sizes, "a size")),
                       c.b.constant(numpy.array(axis, numpy.int32))], outs, "SplitVOptions",
           numSplits=len(outs))
    for name, out in zip(node.output, outs):
        c.set(name, Value(out))


SELECTION: dict[str, Callable[[Converter, Any], None]] = {
    "Gather": _gather, "GatherND": _gather_nd, "Cast": _cast,
    **{op: _broadcasting for op in _COMPARE_OR_SELECT}, **{op: _reduce for op in _REDUCTIONS},
    "Slice": _slice, "Split": _split,
}
