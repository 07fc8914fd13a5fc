"""What each TorchScript node kind that is not a torch op does when the graph runs.

Constants, attribute reads, Python lists, tuples and dicts, number
conversions and the like are Python here, run as the interpreter meets
them; prim::If and prim::Loop are `torchscript_control_flow`'s. Every other
node kind is a torch op (`torchscript_ops`), or refused by the interpreter.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from exirc.capture.torchscript_control_flow import run_if, run_loop
from exirc.capture.torchscript_module_state import ModuleState
from exirc.capture.torchscript_ops import SCALAR_OPS, is_static, scalar_tensor

if TYPE_CHECKING:
    from exirc.capture.torchscript_interpreter import Run


def _convert_number(run: Run, node: torch._C.Node) -> list[Any]:
    """aten::Int, Float, Bool and their implicit forms: a tensor's number stays lifted."""
    source = node.input()
    value = run.get(source)
    kind = node.kind().split("::")[1]
    if isinstance(value, torch.Tensor):
        made = source.node()
        if made.kind() == "prim::NumToTensor" and is_static(run.get(made.input())):
            value = run.get(made.input())  # a size wrapped in a tensor: keep it static
        else:
            return [value]  # as_typed makes it 0-d, of the output's dtype
    if not is_static(value):
        return [value]
    converters: dict[str, Callable[[Any], Any]] = {"Int": int, "IntImplicit": int,
                                                   "Float": float, "FloatImplicit": float,
                                                   "Bool": bool}
    convert = converters.get(kind)
    return [convert(value) if convert is not None else value]


def _constant(run: Run, node: torch._C.Node) -> list[Any]:
    return [node.output().toIValue()]


def _get_attr(run: Run, node: torch._C.Node) -> list[Any]:
    owner = run.get(node.input())
    if not isinstance(owner, ModuleState):
        raise run.unsupported(node, f"reads attribute {node.s('name')!r} of an object that is "
                                    "not a module")
    return [run.module_attribute(node, owner)]


def _set_attr(run: Run, node: torch._C.Node) -> list[Any]:
    raise run.unsupported(node, f"assigns the module attribute {node.s('name')!r}; a compiled "
                                "program cannot change its module's state")


def _pairs(items: list[Any]) -> Iterator[tuple[Any, Any]]:
    return zip(items[::2], items[1::2])


def _unpack(run: Run, node: torch._C.Node) -> list[Any]:
    items = list(run.get(node.input()))
    if len(items) != node.outputsSize():
        raise run.error(node, f"unpacks {len(items)} values into {node.outputsSize()} names")
    return items


def _num_to_tensor(run: Run, node: torch._C.Node) -> list[Any]:
    value = run.get(node.input())
    return [value if isinstance(value, torch.Tensor) else scalar_tensor(value, None)]


def _raise(run: Run, node: torch._C.Node) -> list[Any]:
    message = run.get(next(node.inputs()))
    raise run.error(node, f"the TorchScript module raises on the example inputs: {message}",
                    hint="give example inputs the module accepts")


def _nothing(run: Run, node: torch._C.Node) -> list[Any]:
    return [None] * node.outputsSize()


def _dtype(run: Run, node: torch._C.Node) -> list[Any]:
    # TorchScript numbers dtypes as ScalarType ints; prim::Constant dtypes are ints too.
    return [_SCALAR_TYPE_NUMBERS[run.get(node.input()).dtype]]


_SCALAR_TYPE_NUMBERS = {dtype: number for number, dtype in enumerate([
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
    torch.float32, torch.float64, torch.complex32, torch.complex64, torch.complex128,
    torch.bool, torch.qint8, torch.quint8, torch.qint32, torch.bfloat16])}


def _getitem(run: Run, node: torch._C.Node) -> list[Any]:
    container, key = run.inputs(node)
    if isinstance(key, torch.Tensor) and not isinstance(container, torch.Tensor):
        raise run.unsupported(node, "indexes a list with a number computed from tensor data "
                                    "(a data-dependent loop's counter, say)")
    return [container[key]]


def _append(run: Run, node: torch._C.Node) -> list[Any]:
    run.refuse_side_effect_in_body(node)
    container, item = run.inputs(node)
    container.append(item)
    return [container]


def _set_item(run: Run, node: torch._C.Node) -> list[Any]:
    run.refuse_side_effect_in_body(node)
    container, key, item = run.inputs(node)
    container[key] = item
    return [container] if node.outputsSize() else []


def _format(run: Run, node: torch._C.Node) -> list[Any]:
    text, *items = run.inputs(node)
    return [text.format(*items)]


def _python(function: Callable[..., Any]) -> Callable[[Run, torch._C.Node], list[Any]]:
    return lambda run, node: [function(*run.inputs(node))]


# --------------------------------------------------------------------------- the table


# Run.node looks a node up here before trying it as a torch op.
HANDLERS: dict[str, Callable[[Run, torch._C.Node], list[Any]]] = {
    "prim::Constant": _constant,
    "prim::GetAttr": _get_attr,
    "prim::SetAttr": _set_attr,
    "prim::ListConstruct": lambda run, node: [run.inputs(node)],
    "prim::TupleConstruct": lambda run, node: [tuple(run.inputs(node))],
    "prim::DictConstruct": lambda run, node: [dict(_pairs(run.inputs(node)))],
    "prim::ListUnpack": _unpack,
    "prim::TupleUnpack": _unpack,
    "prim::TupleIndex": _python(operator.getitem),
    "prim::unchecked_cast": _python(lambda value: value),
    "prim::NumToTensor": _num_to_tensor,
    "prim::device": _python(lambda tensor: tensor.device),
    "prim::dtype": _dtype,
    "prim::Uninitialized": _nothing,
    "prim::RaiseException": _raise,
    "prim::Print": _nothing,
    "prim::min": _python(SCALAR_OPS["min"]),
    "prim::max": _python(SCALAR_OPS["max"]),
    "prim::If": run_if,
    "prim::Loop": run_loop,
    "aten::Int": _convert_number,
    "aten::IntImplicit": _convert_number,
    "aten::Float": _convert_number,
    "aten::FloatImplicit": _convert_number,
    "aten::Bool": _convert_number,
    "aten::ScalarImplicit": _convert_number,
    # Tensor methods rather than the JIT ops, which would make a symbolic size a constant
    "aten::size": _python(lambda tensor, *dim: tensor.size(*dim) if dim else list(tensor.size())),
    "aten::numel": _python(lambda tensor: tensor.numel()),
    "aten::__getitem__": _getitem,
    "aten::len": _python(len),
    "aten::append": _append,
    "aten::_set_item": _set_item,
    "aten::__is__": _python(operator.is_),
    "aten::__isnot__": _python(operator.is_not),
    "aten::__contains__": _python(lambda container, key: key in container),
    "aten::list": _python(list),
    "aten::format": _format,
    "aten::warn": _nothing,
}
