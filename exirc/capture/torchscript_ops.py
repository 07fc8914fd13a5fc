"""Calling the op a TorchScript node names, on lifted numbers too.

Under torch.export a TorchScript number computed from tensor data (`int(n)`,
`bool(x.sum() > 0)`, a counter inside a while_loop) must not become a Python
number: that would bake the example input's value into the program. It stays
a 0-d tensor, "lifted": int64 for `int`, float64 for `float` (TorchScript's
is a double), bool for `bool`. A value's TorchScript type says whether a
tensor standing for it is lifted.

An op whose schema wants a number where it gets a lifted one is called
through the sibling overload taking a tensor there (`aten::add.Scalar` ->
`aten::add.Tensor`); scalar arithmetic (`aten::add.int`, `aten::lt.int`)
uses Python's operators, which tensors, Python numbers and symbolic sizes
all implement. Only where no overload takes a tensor is the number read.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

# TorchScript's number types, and the dtype a lifted number of that type has.
_LIFTED_DTYPES: dict[str, torch.dtype | None] = {
    "IntType": torch.int64,
    "FloatType": torch.float64,
    "BoolType": torch.bool,
    "NumberType": None,  # `Scalar`: whatever dtype the tensor has
}

SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)  # sizes under dynamic shapes


def is_static(value: Any) -> bool:
    """A value known now, not at run time: no tensor, no symbolic size."""
    return not isinstance(value, (torch.Tensor, *SYMBOLIC))


# --------------------------------------------------------------------------- lifted numbers


def lifted_dtype(value: torch._C.Value) -> tuple[bool, torch.dtype | None]:
    kind = value.type().kind()
    return kind in _LIFTED_DTYPES, _LIFTED_DTYPES.get(kind)


def as_typed(result: Any, value: torch._C.Value) -> Any:
    """A node's result as its TorchScript type says: lifted numbers 0-d, of their dtype."""
    is_number, dtype = lifted_dtype(value)
    if not is_number:
        return result
    if isinstance(result, torch.Tensor):
        return scalar_tensor(result, dtype)
    if dtype is torch.float64 and isinstance(result, int) and not isinstance(result, bool):
        return float(result)  # e.g. aten::pow.int, a float in TorchScript
    return result


def scalar_tensor(value: Any, dtype: torch.dtype | None) -> torch.Tensor:
    """`value` as a 0-d tensor of `dtype` (None: the tensor's own, or Python's)."""
    if not isinstance(value, torch.Tensor):
        if dtype is None:
            dtype = torch.bool if isinstance(value, (bool, torch.SymBool)) else \
                torch.int64 if isinstance(value, (int, torch.SymInt)) else torch.float64
        return torch.scalar_tensor(value, dtype=dtype)
    if dtype is not None and value.dtype != dtype:
        value = value.to(dtype)
    return value.reshape(()) if value.dim() != 0 else value


# --------------------------------------------------------------------------- ops


def call_op(op: torch._ops.OpOverload, values: list[Any]) -> Any:
    """Python arithmetic for a scalar op, else the op, on a tensor where it takes one."""
    schema = op._schema
    if not _takes_tensors(schema) and op.__name__.split(".")[0] in SCALAR_OPS:
        return SCALAR_OPS[op.__name__.split(".")[0]](*values)
    lifted = {i for i, (value, argument) in enumerate(zip(values, schema.arguments))
              if isinstance(value, torch.Tensor) and "Tensor" not in str(argument.type)}
    if lifted:
        tensor_op = _overload_taking_tensors(op, lifted)
        if tensor_op is not None:
            args, kwargs = _arguments(values, tensor_op._schema)
            return tensor_op(*args, **kwargs)
        # No overload takes a tensor there: the number has to be read, which is
        # only possible where it does not depend on data inside a traced body.
        values = [value.item() if i in lifted else value for i, value in enumerate(values)]
    args, kwargs = _arguments(values, schema)
    return op(*args, **kwargs)


def overload(node: torch._C.Node) -> torch._ops.OpOverload | None:
    """The op the node's schema names, if torch.ops has it (TorchScript's own may not)."""
    if node.schema() == "(no schema)":
        return None
    schema = torch._C.parse_schema(node.schema())
    namespace, name = schema.name.split("::")
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
        result: torch._ops.OpOverload = getattr(packet, schema.overload_name or "default")
    except (AttributeError, RuntimeError):
        return None
    return result


def safe_to_call(op: torch._ops.OpOverload, values: list[Any]) -> bool:
    """Whether calling the op here is safe: it is a dispatcher op, or gets no tensor.

    Ops only the TorchScript interpreter knows (prim::tolist, say) read
    tensor data directly, and export's tensors have none: they would crash.
    """
    if op.__name__.split(".")[0] in SCALAR_OPS and not _takes_tensors(op._schema):
        return True
    schema = op._schema
    name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
    try:
        return bool(torch._C._dispatch_has_kernel(name))
    except RuntimeError:  # "operator ... does not exist": TorchScript's own
        leaves = pytree.tree_leaves(values)
        return not any(isinstance(leaf, torch.Tensor) for leaf in leaves)


def _arguments(values: list[Any], schema: torch._C.FunctionSchema
               ) -> tuple[list[Any], dict[str, Any]]:
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for value, argument in zip(values, schema.arguments):
        if argument.kwarg_only:
            kwargs[argument.name] = value
        else:
            args.append(value)
    return args, kwargs


def _takes_tensors(schema: torch._C.FunctionSchema) -> bool:
    return any("Tensor" in str(argument.type) for argument in schema.arguments)


def _overload_taking_tensors(op: torch._ops.OpOverload,
                             positions: set[int]) -> torch._ops.OpOverload | None:
    """The sibling overload with Tensor where `op` takes a number at `positions`."""
    wanted = [str(argument.type) for argument in op._schema.arguments]
    for i in positions:
        wanted[i] = re.sub(r"\b(number|Scalar|int|float|bool|SymInt)\b", "Tensor", wanted[i])
    packet = op.overloadpacket
    for name in packet.overloads():
        candidate: torch._ops.OpOverload = getattr(packet, name)
        types = [str(argument.type) for argument in candidate._schema.arguments]
        if types == wanted:
            return candidate
    return None


def _not(value: Any) -> Any:
    return torch.logical_not(value) if isinstance(value, torch.Tensor) else not value


def _extreme(python: Callable[..., Any], tensors: Callable[..., torch.Tensor]
             ) -> Callable[..., Any]:
    def pick(*values: Any) -> Any:
        if len(values) == 2 and any(isinstance(v, torch.Tensor) for v in values):
            a, b = (torch.as_tensor(v) for v in values)
            return tensors(a, b)
        return python(*values)
    return pick


def _range_length(start: Any, end: Any, step: Any) -> Any:
    """len(range(start, end, step)), for lifted numbers too (step is a Python int)."""
    if not any(isinstance(v, torch.Tensor) for v in (start, end, step)):
        return len(range(start, end, step))
    span = end - start if step > 0 else start - end
    stride = abs(step)
    return torch.clamp((span + stride - 1) // stride, min=0)


# Scalar ops (no tensor in their schema): Python's operators, which tensors
# also implement, so they work on lifted numbers and SymInts alike.
SCALAR_OPS: dict[str, Callable[..., Any]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "floordiv": operator.floordiv, "remainder": operator.mod, "pow": operator.pow,
    "neg": operator.neg, "abs": abs,
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
    "eq": operator.eq, "ne": operator.ne,
    "__and__": operator.and_, "__or__": operator.or_, "__xor__": operator.xor, "__not__": _not,
    "min": _extreme(min, torch.minimum), "max": _extreme(max, torch.maximum),
    "__range_length": _range_length,
    "__derive_index": lambda index, start, step: start + index * step,
}
