"""Graph values -> program values (`EValue`s), one table per method.

Tensors become `Tensor` values (constants point at constant data, planned
tensors at their arena offset); literal arguments become `Int`, `Double`,
`Bool`, ... values, created once per use as the runtime expects; symbolic
sizes become `Int` values that size instructions write at run time.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from exirc.errors import InternalError, ModelError
from exirc.serialize import program as P

_SCALAR_TYPES = {
    torch.uint8: P.ScalarType.BYTE, torch.int8: P.ScalarType.CHAR,
    torch.int16: P.ScalarType.SHORT, torch.int32: P.ScalarType.INT,
    torch.int64: P.ScalarType.LONG, torch.float16: P.ScalarType.HALF,
    torch.float32: P.ScalarType.FLOAT, torch.float64: P.ScalarType.DOUBLE,
    torch.bool: P.ScalarType.BOOL, torch.bfloat16: P.ScalarType.BFLOAT16,
    torch.uint16: P.ScalarType.UINT16, torch.uint32: P.ScalarType.UINT32,
    torch.uint64: P.ScalarType.UINT64,
}

# c10 enumerations as the runtime reads them from Int values.
_MEMORY_FORMATS = {torch.contiguous_format: 0, torch.preserve_format: 1,
                   torch.channels_last: 2, torch.channels_last_3d: 3}
_LAYOUTS = {torch.strided: 0}


def scalar_type(dtype: torch.dtype) -> P.ScalarType:
    try:
        return _SCALAR_TYPES[dtype]
    except KeyError:
        raise ModelError(f"tensors of dtype {dtype} cannot be stored in a program",
                         hint="cast to a supported dtype in the model") from None


def upper_bound(size: Any) -> int:
    """A concrete size, or the upper bound of a symbolic one."""
    if isinstance(size, int):
        return size
    node = size.node
    bound = node.shape_env.bound_sympy(node.expr).upper
    if not bound.is_finite:
        raise ModelError(f"size {node.expr} has no upper bound, so memory cannot be planned",
                         hint='give the dim a maximum: torch.export.Dim("batch", max=64)')
    return int(bound)


class ValueTable:
    """The `values` of one execution plan, built as nodes are emitted."""

    def __init__(self) -> None:
        self.values: list[P.EValue] = []
        # Value index -> its dims, symbolic ones as sympy expressions.
        self.symbolic_dims: dict[int, list[Any]] = {}
        # Node -> value index (or indices, for multi-output nodes).
        self.of_node: dict[Node, Any] = {}

    def add(self, value: P.EValue) -> int:
        self.values.append(value)
        return len(self.values) - 1

    def tensor(self, fake: torch.Tensor, *, data_buffer_idx: int = 0,
               allocation: P.AllocationDetails | None = None) -> int:
        sizes = [upper_bound(s) for s in fake.shape]
        static = all(isinstance(s, int) for s in fake.shape)
        if not static:
            self.symbolic_dims[len(self.values)] = [
                s if isinstance(s, int) else s.node.expr for s in fake.shape]
        return self.add(P.Tensor(
            scalar_type=scalar_type(fake.dtype),
            sizes=sizes,
            dim_order=list(range(len(sizes))),
            data_buffer_idx=data_buffer_idx,
            allocation_info=allocation,
            shape_dynamism=P.TensorShapeDynamism.STATIC if static
            else P.TensorShapeDynamism.DYNAMIC_BOUND,
        ))

    def node_value(self, node: Node) -> Any:
        try:
            return self.of_node[node]
        except KeyError:
            raise InternalError(f"value of node {node.name} used before it was emitted") from None

    def argument(self, value: Any, type_name: str) -> int:
        """The value index of one kernel argument of schema type `type_name`."""
        if isinstance(value, Node):
            index = self.node_value(value)
            if isinstance(index, int):
                return index
            raise InternalError(f"node {value.name} has several outputs; use getitem")
        if value is None:
            return self.add(P.Null())
        if isinstance(value, (list, tuple)):
            return self._list(list(value), type_name)
        return self.add(self._literal(value, type_name))

    def _literal(self, value: Any, type_name: str) -> P.EValue:
        if isinstance(value, (bool, int, float, str)):
            return scalar_value(value)
        if isinstance(value, torch.dtype):
            return P.Int(int(scalar_type(value)))
        if isinstance(value, torch.memory_format):
            return P.Int(_MEMORY_FORMATS[value])
        if isinstance(value, torch.layout):
            return P.Int(_LAYOUTS[value])
        if isinstance(value, torch.device):
            return P.Null()  # the runtime has one device; the argument is ignored
        raise InternalError(f"cannot emit a {type(value).__name__} argument ({type_name})")

    def _list(self, items: list[Any], type_name: str) -> int:
        if "Tensor" in type_name:
            indices = [self.argument(item, "Tensor") for item in items]
            if "Optional" in type_name:
                return self.add(P.OptionalTensorList(indices))
            return self.add(P.TensorList(indices))
        if "float" in type_name:
            return self.add(P.DoubleList([float(x) for x in items]))
        if "bool" in type_name:
            return self.add(P.BoolList([bool(x) for x in items]))
        # int[] / SymInt[]: each item is boxed in its own Int value, so a
        # symbolic size can be written at run time.
        return self.add(P.IntList([self.argument(item, "int") for item in items]))


def scalar_value(value: bool | int | float | str) -> P.EValue:
    """A Python scalar as the program's value of its type (a bool is not an Int)."""
    if isinstance(value, bool):
        return P.Bool(value)
    if isinstance(value, int):
        return P.Int(value)
    if isinstance(value, float):
        return P.Double(value)
    return P.String(value)
