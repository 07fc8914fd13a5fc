"""A fused chain's ONNX model rewritten as a TFLite model, for LiteRT's XNNPACK.

The ONNX model is exirc's own (`onnx_chain` built it from a checked program),
so this reads no file bytes. Only node kinds whose TFLite form computes the
same thing are taken (`TRANSLATORS`); anything else raises `NotMapped` naming
the node, and the chain stays on onnxruntime.

Layouts: ONNX convolution and pooling are NCHW, TFLite's NHWC. exirc's
chains keep activations NHWC and wrap each such node in a pair of
Transposes, so a Conv reads its input through a pending transpose (see
`tflite_builder`) and writes a tensor read back the same way: the pairs
cancel without an operator. Unary elementwise nodes keep a pending layout.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy

from exirc.runtime.engines.litert.tflite_builder import TfliteBuilder, Value, compose
from exirc.runtime.engines.litert.tflite_selection import SELECTION
from exirc.runtime.engines.litert.tflite_spatial import SPATIAL
from exirc.runtime.engines.onnx_form.builder import NotMapped
from exirc.runtime.engines.onnx_form.graph_index import GraphIndex


@dataclass(frozen=True)
class Converted:
    """A TFLite file, and its inputs and outputs: ONNX names, and the file's shapes
    (a 0-d value is [1] there) and dtypes."""

    data: bytes
    inputs: list[str]
    outputs: list[str]
    input_types: list[tuple[tuple[int, ...], numpy.dtype]]
    output_types: list[tuple[tuple[int, ...], numpy.dtype]]


class Converter:
    """One ONNX graph being written as TFLite: ONNX names to `Value`s."""

    def __init__(self, model: Any, fixed: Mapping[str, numpy.ndarray]) -> None:
        import onnx
        from onnx import shape_inference

        self.onnx = onnx
        inferred = shape_inference.infer_shapes(model, strict_mode=True)
        self.graph = inferred.graph
        self.index = GraphIndex(self.graph, self.graph.node)
        self.fixed = fixed  # graph inputs whose data is known
        self.shapes: dict[str, tuple[int, ...]] = {}
        for info in [*self.graph.input, *self.graph.value_info, *self.graph.output]:
            dims = info.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                self.shapes[info.name] = tuple(d.dim_value for d in dims)
        self.b = TfliteBuilder()
        self.values: dict[str, Value] = {}

    # -- reading ONNX ---------------------------------------------------------
    def known(self, name: str) -> numpy.ndarray | None:
        """`name`'s data if it is fixed: a graph input given as such, or a constant."""
        fixed = self.fixed.get(name)
        return fixed if fixed is not None else self.index.constant(name)

    def shape(self, name: str) -> tuple[int, ...]:
        known = self.known(name)
        if known is not None:
            return tuple(known.shape)
        if name not in self.shapes:
            raise NotMapped(f"value {name} has no static shape")
        return self.shapes[name]

    def value(self, name: str) -> Value:
        """The Value of `name`; a constant is written when first read."""
        if name not in self.values:
            known = self.known(name)
            if known is None:
                raise NotMapped(f"value {name} is read before it is written")
            self.values[name] = Value(self.b.constant(known))
        return self.values[name]

    def tensor(self, name: str) -> int:
        """`name`'s data laid out as ONNX sees it."""
        return self.b.materialize(self.value(name))

    def constant(self, node: Any, index: int) -> numpy.ndarray:
        known = self.known(node.input[index]) if index < len(node.input) else None
        if known is None:
            raise NotMapped(f"{node.op_type} {node.name or node.output[0]}: input {index} "
                            "is not a constant")
        return known

    def attributes(self, node: Any) -> dict[str, Any]:
        return {a.name: self.onnx.helper.get_attribute_value(a) for a in node.attribute}

    # -- the whole graph ------------------------------------------------------
    def convert(self) -> Converted:
        graph = self.graph
        inputs, input_infos = [], [i for i in graph.input if self.known(i.name) is None]
        for info in input_infos:
            # The Python binding reads a 0-d tensor out as a scalar, not a view of its
            # memory: the file's inputs and outputs are at least 1-d (the same bytes).
            tensor = self.b.tensor(_at_least_1d(self.shape(info.name)), self.dtype(info),
                                   name=info.name)
            inputs.append(tensor)
            self.values[info.name] = Value(tensor if self.shape(info.name) else
                                           self.b.reshape(tensor, ()))
        for node in graph.node:
            if node.domain not in ("", "ai.onnx"):
                raise NotMapped(f"{node.op_type} of domain {node.domain}")
            translate = TRANSLATORS.get(node.op_type)
            if translate is None:
                raise NotMapped(f"no TFLite form for ONNX {node.op_type}")
            translate(self, node)
        outputs = []
        for info in graph.output:
            tensor = self.tensor(info.name)
            if self.b.shapes[tensor] != self.shape(info.name):
                raise NotMapped(f"output {info.name}: {self.b.shapes[tensor]}, "
                                f"declared {self.shape(info.name)}")
            outputs.append(tensor if self.b.shapes[tensor] else self.b.reshape(tensor, (1,)))
        if len(set(outputs)) != len(outputs) or set(outputs) & set(inputs):
            raise NotMapped("two outputs, or an output and an input, are one tensor")
        return Converted(self.b.finish(inputs, outputs), [i.name for i in input_infos],
                         [o.name for o in graph.output],
                         [(self.b.shapes[t], self.b.dtypes[t]) for t in inputs],
                         [(self.b.shapes[t], self.b.dtypes[t]) for t in outputs])

    def dtype(self, info: Any) -> numpy.dtype:
        return numpy.dtype(self.onnx.helper.tensor_dtype_to_np_dtype(
            info.type.tensor_type.elem_type))

    def set(self, name: str, value: Value) -> None:
        self.values[name] = value


def _at_least_1d(shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape or (1,)


# -- translators: one ONNX node each ---------------------------------------------

def _transpose(c: Converter, node: Any) -> None:
    perm = tuple(c.attributes(node)["perm"])
    source = c.value(node.input[0])
    c.set(node.output[0], Value(source.tensor, compose(perm, source.perm)))


_UNARY = {"Relu": "RELU", "HardSwish": "HARD_SWISH", "Sigmoid": "LOGISTIC", "Tanh": "TANH",
          "Neg": "NEG", "Exp": "EXP", "Sqrt": "SQRT", "Abs": "ABS", "Log": "LOG",
          "Not": "LOGICAL_NOT", "Identity": None}


def _unary(c: Converter, node: Any) -> None:
    """An elementwise node, applied to the tensor under a pending layout."""
    source = c.value(node.input[0])
    builtin = _UNARY[node.op_type]
    out = source.tensor if builtin is None else c.b.unary(builtin, source.tensor)
    c.set(node.output[0], Value(out, source.perm))


def _leaky_relu(c: Converter, node: Any) -> None:
    source = c.value(node.input[0])
    out = c.b.unary("LEAKY_RELU", source.tensor, "LeakyReluOptions",
                    alpha=float(c.attributes(node).get("alpha", 0.01)))
    c.set(node.output[0], Value(out, source.perm))


def _prelu(c: Converter, node: Any) -> None:
    source = c.tensor(node.input[0])
    out = c.b.like(source)
    c.b.op("PRELU", [source, c.tensor(node.input[1])], [out])
    c.set(node.output[0], Value(out))


def _expand(c: Converter, node: Any) -> None:
    shape = c.shape(node.output[0])
    source = c.tensor(node.input[0])
    out = c.b.like(source, shape)
    c.b.op("BROADCAST_TO", [source, c.b.constant(numpy.array(shape, numpy.int32))], [out],
           "BroadcastToOptions")
    c.set(node.output[0], Value(out))


def _gelu(c: Converter, node: Any) -> None:
    source = c.value(node.input[0])
    approximate = c.attributes(node).get("approximate", b"none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    out = c.b.unary("GELU", source.tensor, "GeluOptions", approximate=approximate == "tanh")
    c.set(node.output[0], Value(out, source.perm))


_CLAMPS = {(0.0, math.inf): "RELU", (0.0, 6.0): "RELU6", (-1.0, 1.0): "RELU_N1_TO_1",
           (0.0, 1.0): "RELU_0_TO_1"}


def _clip(c: Converter, node: Any) -> None:
    source = c.value(node.input[0])
    low = float(c.constant(node, 1)) if len(node.input) > 1 and node.input[1] else -math.inf
    high = float(c.constant(node, 2)) if len(node.input) > 2 and node.input[2] else math.inf
    out = source.tensor
    if (builtin := _CLAMPS.get((low, high))) is not None:
        out = c.b.unary(builtin, out)
    else:
        for bound, builtin in ((low, "MAXIMUM"), (high, "MINIMUM")):
            if math.isfinite(bound):
                result = c.b.like(out)
                c.b.op(builtin, [out, c.b.scalar(bound)], [result])
                out = result
    c.set(node.output[0], Value(out, source.perm))


def _hard_sigmoid(c: Converter, node: Any) -> None:
    """max(0, min(1, alpha x + beta)): the same two roundings, then a clamp."""
    attributes = c.attributes(node)
    source = c.value(node.input[0])
    scaled, shifted = c.b.like(source.tensor), c.b.like(source.tensor)
    alpha = c.b.scalar(attributes.get("alpha", 0.2))
    beta = c.b.scalar(attributes.get("beta", 0.5))
    c.b.op("MUL", [source.tensor, alpha], [scaled], "MulOptions")
    c.b.op("ADD", [scaled, beta], [shifted], "AddOptions")
    c.set(node.output[0], Value(c.b.unary("RELU_0_TO_1", shifted), source.perm))


_BINARY = {"Add": ("ADD", "AddOptions"), "Mul": ("MUL", "MulOptions"),
           "Sub": ("SUB", "SubOptions"), "Div": ("DIV", "DivOptions")}


def _binary(c: Converter, node: Any) -> None:
    builtin, options = _BINARY[node.op_type]
    left, right = (c.value(name) for name in node.input)
    if node.op_type == "Div" and c.b.dtypes[left.tensor].kind != "f":
        # An integer division by zero traps in TFLite's kernel: the process would die.
        raise NotMapped(f"Div {node.output[0]} of integers")
    shape = c.shape(node.output[0])
    scalar = [math.prod(c.shape(n)) == 1 and len(c.shape(n)) <= len(shape) for n in node.input]
    if left.perm is not None and (left.perm == right.perm or scalar[1]) and \
            c.shape(node.input[0]) == shape:
        # Both in one pending layout (or a scalar): compute on the tensors as laid out.
        perm = left.perm
        operands = [left.tensor, right.tensor if right.perm == perm else c.tensor(node.input[1])]
    else:
        perm, operands = None, [c.tensor(n) for n in node.input]
    out_shape = shape if perm is None else c.b.shapes[left.tensor]
    out = c.b.tensor(out_shape, c.b.dtypes[operands[0]])
    c.b.op(builtin, operands, [out], options)
    c.set(node.output[0], Value(out, perm))


def _reshape(c: Converter, node: Any) -> None:
    c.set(node.output[0], Value(c.b.reshape(c.tensor(node.input[0]), c.shape(node.output[0]))))


def _matmul(c: Converter, node: Any) -> None:
    left = c.tensor(node.input[0])
    shape = c.shape(node.output[0])
    out = c.b.tensor(shape)
    weight = c.known(node.input[1])
    if weight is not None and weight.ndim == 2:
        weight = weight.astype(numpy.float32)
        c.b.op("FULLY_CONNECTED", [left, c.b.constant(weight.T.copy()), -1], [out],
               "FullyConnectedOptions", keepNumDims=True)
    else:
        c.b.op("BATCH_MATMUL", [left, c.tensor(node.input[1])], [out], "BatchMatMulOptions")
    c.set(node.output[0], Value(out))


def _concat(c: Converter, node: Any) -> None:
    rank = len(c.shape(node.output[0]))
    axis = c.attributes(node)["axis"] % rank
    out = c.b.tensor(c.shape(node.output[0]))
    c.b.op("CONCATENATION", [c.tensor(n) for n in node.input], [out], "ConcatenationOptions",
           axis=axis)
    c.set(node.output[0], Value(out))


def _softmax(c: Converter, node: Any) -> None:
    rank = len(c.shape(node.input[0]))
    if c.attributes(node).get("axis", -1) % rank != rank - 1:
        raise NotMapped(f"Softmax {node.output[0]}: not over the last dim")
    c.set(node.output[0], Value(c.b.unary("SOFTMAX", c.tensor(node.input[0]),
                                          "SoftmaxOptions", beta=1.0)))


def _layer_norm(c: Converter, node: Any) -> None:
    """LayerNormalization as means, a difference, a square and a reciprocal root:
    two passes over the data, as torch's kernel computes it."""
    attributes = c.attributes(node)
    if any(c.index.reader_count(name) for name in node.output[1:]):
        raise NotMapped(f"LayerNormalization {node.output[0]}: mean or inverse deviation read")
    if attributes.get("stash_type", 1) != 1:
        raise NotMapped(f"LayerNormalization {node.output[0]}: stash type")
    source = c.tensor(node.input[0])
    shape = c.b.shapes[source]
    first = attributes.get("axis", -1) % len(shape)
    axes = c.b.constant(numpy.arange(first, len(shape), dtype=numpy.int32))
    reduced = shape[:first] + (1,) * (len(shape) - first)
    mean, variance, shifted, scale = (c.b.like(source, reduced) for _ in range(4))
    centered, squared = c.b.like(source), c.b.like(source)
    c.b.op("MEAN", [source, axes], [mean], "ReducerOptions", keepDims=True)
    c.b.op("SUB", [source, mean], [centered], "SubOptions")
    c.b.op("MUL", [centered, centered], [squared], "MulOptions")
    c.b.op("MEAN", [squared, axes], [variance], "ReducerOptions", keepDims=True)
    c.b.op("ADD", [variance, c.b.scalar(attributes.get("epsilon", 1e-5))], [shifted],
           "AddOptions")
    c.b.op("RSQRT", [shifted], [scale])
    out = c.b.like(source)
    c.b.op("MUL", [centered, scale], [out], "MulOptions")
    for index, builtin, options in ((1, "MUL", "MulOptions"), (2, "ADD", "AddOptions")):
        if len(node.input) > index and node.input[index]:
            result = c.b.like(source)
            c.b.op(builtin, [out, c.tensor(node.input[index])], [result], options)
            out = result
    c.set(node.output[0], Value(out))


TRANSLATORS: dict[str, Callable[[Converter, Any], None]] = {
    "Transpose": _transpose, **{op: _unary for op in _UNARY}, "Gelu": _gelu, "Clip": _clip,
    "HardSigmoid": _hard_sigmoid, **{op: _binary for op in _BINARY}, **SPATIAL,
    "Reshape": _reshape, "LeakyRelu": _leaky_relu, "PRelu": _prelu, "Expand": _expand,
    "MatMul": _matmul, "Concat": _concat, "Softmax": _softmax,
    "LayerNormalization": _layer_norm, **SELECTION,
}


def to_tflite(model: Any, fixed: Mapping[str, numpy.ndarray] | None = None) -> Converted:
    """`model` (an ONNX ModelProto exirc built) as a TFLite file; `fixed`: graph
    inputs whose data is known, written into the file. NotMapped when a node has
    no TFLite form."""
    return Converter(model, fixed or {}).convert()
