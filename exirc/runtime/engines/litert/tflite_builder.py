"""Writing a TFLite flatbuffer: tensors, constant buffers, operators, and
transposes kept pending until a consumer needs their data laid out.

The model objects come from `ai_edge_litert.schema_py_generated` (LiteRT's
own generated bindings, so exirc carries no copy of the schema), imported
only when a builder is made.

Pending transposes: an ONNX value may be recorded as "tensor t read through
permutation p" instead of a TRANSPOSE operator. Composing a pending value
with another Transpose composes the permutations, so the NHWC-to-NCHW-to-NHWC
pairs around each convolution of an exirc chain cost nothing. A consumer that
needs the data itself calls `materialize`, which emits the TRANSPOSE once.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import numpy

from exirc.runtime.engines.onnx_form.builder import NotMapped


def schema() -> Any:
    """LiteRT's generated flatbuffer bindings (ImportError when not installed)."""
    return importlib.import_module("ai_edge_litert.schema_py_generated")


# Operators whose kernels are registered from a version after 1.
_FIRST_VERSION = {"BROADCAST_TO": 2}

_TYPES = {numpy.dtype(numpy.float32): "FLOAT32", numpy.dtype(numpy.int32): "INT32",
          numpy.dtype(numpy.int64): "INT64", numpy.dtype(numpy.bool_): "BOOL"}


@dataclass(frozen=True)
class Value:
    """An ONNX value in TFLite terms: `tensor` read through permutation `perm`
    (ONNX dim d is the tensor's dim perm[d]); `perm` is None when the tensor is
    the value as ONNX lays it out."""

    tensor: int
    perm: tuple[int, ...] | None = None


class TfliteBuilder:
    """One subgraph under construction; `finish` returns the file's bytes."""

    def __init__(self) -> None:
        self.S = schema()
        self.tensors: list[Any] = []
        self.shapes: list[tuple[int, ...]] = []
        self.dtypes: list[numpy.dtype] = []
        self.buffers: list[Any] = [self.S.BufferT()]  # buffer 0: "no data", by convention
        self.operators: list[Any] = []
        self.codes: dict[int, int] = {}  # builtin operator -> index in the opcode table
        self._transposed: dict[tuple[int, tuple[int, ...]], int] = {}

    # -- tensors --------------------------------------------------------------
    def tensor(self, shape: tuple[int, ...], dtype: Any = numpy.float32, name: str = "",
               data: numpy.ndarray | None = None) -> int:
        """A new tensor (a constant when `data` is given); its index."""
        dtype = numpy.dtype(dtype)
        if dtype not in _TYPES:
            raise NotMapped(f"TFLite tensors of {dtype} are not written")
        t = self.S.TensorT()
        t.shape = [int(d) for d in shape]
        t.type = getattr(self.S.TensorType, _TYPES[dtype])
        t.name = name or f"t{len(self.tensors)}"
        if data is not None:
            array = numpy.array(data, dtype=dtype, order="C")  # (ascontiguousarray makes 0-d 1-d)
            if array.shape != tuple(shape):
                raise NotMapped(f"constant of shape {array.shape}, declared {tuple(shape)}")
            buffer = self.S.BufferT()
            buffer.data = numpy.frombuffer(array.tobytes(), dtype=numpy.uint8)
            self.buffers.append(buffer)
            t.buffer = len(self.buffers) - 1
        self.tensors.append(t)
        self.shapes.append(tuple(int(d) for d in shape))
        self.dtypes.append(dtype)
        return len(self.tensors) - 1

    def constant(self, array: numpy.ndarray, dtype: Any = None) -> int:
        array = numpy.asarray(array, dtype=dtype)
        return self.tensor(array.shape, array.dtype, data=array)

    def scalar(self, value: float) -> int:
        """A 0-d float32 constant."""
        return self.constant(numpy.array(value, numpy.float32))

    def like(self, tensor: int, shape: tuple[int, ...] | None = None,
             dtype: Any = None) -> int:
        """A new activation tensor of `tensor`'s dtype (and shape, unless given)."""
        return self.tensor(self.shapes[tensor] if shape is None else shape,
                           self.dtypes[tensor] if dtype is None else dtype)

    # -- operators ------------------------------------------------------------
    def op(self, builtin: str, inputs: list[int], outputs: list[int],
           options: str | None = None, **fields: Any) -> None:
        """Append builtin operator `builtin` (a BuiltinOperator name) with its
        `options` table (a BuiltinOptions name) filled from `fields`."""
        S = self.S
        code = getattr(S.BuiltinOperator, builtin)
        if code not in self.codes:
            self.codes[code] = len(self.codes)
        operator = S.OperatorT()
        operator.opcodeIndex = self.codes[code]
        operator.inputs, operator.outputs = list(inputs), list(outputs)
        if options is not None:
            table = getattr(S, f"{options}T")()
            for key, value in fields.items():
                if not hasattr(table, key):
                    raise AttributeError(f"{options} has no field {key}")
                setattr(table, key, value)
            operator.builtinOptionsType = getattr(S.BuiltinOptions, options)
            operator.builtinOptions = table
        self.operators.append(operator)

    def reshape(self, tensor: int, shape: tuple[int, ...]) -> int:
        """`tensor`'s elements in `shape` (a RESHAPE of a constant shape)."""
        out = self.like(tensor, shape)
        self.op("RESHAPE", [tensor, self.constant(numpy.array(shape, numpy.int32))], [out],
                "ReshapeOptions", newShape=list(shape))
        return out

    def unary(self, builtin: str, tensor: int, options: str | None = None,
              **fields: Any) -> int:
        out = self.like(tensor)
        self.op(builtin, [tensor], [out], options, **fields)
        return out

    # -- layouts --------------------------------------------------------------
    def materialize(self, value: Value) -> int:
        """`value` as a tensor laid out as ONNX sees it (a TRANSPOSE, once, if pending)."""
        if value.perm is None:
            return value.tensor
        key = (value.tensor, value.perm)
        if key not in self._transposed:
            shape = tuple(self.shapes[value.tensor][p] for p in value.perm)
            out = self.like(value.tensor, shape)
            perm = self.constant(numpy.array(value.perm, numpy.int32))
            self.op("TRANSPOSE", [value.tensor, perm], [out], "TransposeOptions")
            self._transposed[key] = out
        return self._transposed[key]

    def shape_of(self, value: Value) -> tuple[int, ...]:
        shape = self.shapes[value.tensor]
        return shape if value.perm is None else tuple(shape[p] for p in value.perm)

    # -- the file -------------------------------------------------------------
    def finish(self, inputs: list[int], outputs: list[int]) -> bytes:
        import flatbuffers

        S = self.S
        subgraph = S.SubGraphT()
        subgraph.tensors, subgraph.operators = self.tensors, self.operators
        subgraph.inputs, subgraph.outputs = list(inputs), list(outputs)
        subgraph.name = "exirc_chain"
        model = S.ModelT()
        model.version = 3
        model.description = "exirc"
        model.subgraphs, model.buffers = [subgraph], self.buffers
        model.operatorCodes = []
        versions = {getattr(S.BuiltinOperator, name): v for name, v in _FIRST_VERSION.items()}
        for code in sorted(self.codes, key=self.codes.__getitem__):
            entry = S.OperatorCodeT()
            entry.builtinCode, entry.version = code, versions.get(code, 1)
            # Readers before the 8-bit code ran out look at the deprecated field;
            # 127 says "see builtinCode".
            entry.deprecatedBuiltinCode = min(code, 127)
            model.operatorCodes.append(entry)
        builder = flatbuffers.Builder(1024)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())


def compose(outer: tuple[int, ...], inner: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The permutation of reading through `inner`, then Transpose(perm=outer);
    None when that is the identity."""
    combined = tuple(outer[d] if inner is None else inner[outer[d]] for d in range(len(outer)))
    return None if combined == tuple(range(len(combined))) else combined
