"""A TorchScript graph run node by node, so that torch.export can trace it.

torch's `TS2EPConverter` unrolls a `prim::Loop` whose trip count is a
constant and refuses every other loop. `TorchScriptProgram` runs the
scripted module's inlined graph instead, node by node, and torch.export
traces that run: each node calls the torch op it names (`torchscript_ops`,
which keeps numbers computed from tensor data as 0-d tensors), and prim::If
and prim::Loop become torch.cond and while_loop where their condition
depends on tensor data (`torchscript_control_flow`).

Parameters and buffers live in a mirror of the scripted module's hierarchy
(`ModuleState`), so export lifts them under the same names. Every node kind
without a handler here or a torch op is refused with an
UnsupportedOperatorError naming it and its line in the scripted source;
every failure running a node is a ModelError that names them too.
"""

from __future__ import annotations

import inspect
import operator
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx.traceback as fx_traceback

from exirc.capture.load import first_line
from exirc.capture.torchscript_control_flow import Scope, run_if, run_loop
from exirc.capture.torchscript_ops import (
    SCALAR_OPS,
    as_typed,
    call_op,
    is_static,
    overload,
    safe_to_call,
    scalar_tensor,
)
from exirc.errors import ExircError, ModelError, UnsupportedOperatorError
from exirc.ir.source import SourceFrame

# --------------------------------------------------------------------------- the module


class ModuleState(torch.nn.Module):
    """One scripted module's parameters, buffers and submodules, as export lifts them.

    Other attributes (ints, lists, tensors that are neither) are read from
    the scripted module, which is kept out of the module tree on purpose.
    """

    def __init__(self, script: torch.jit.ScriptModule) -> None:
        super().__init__()
        self._script: dict[str, Any] = {"module": script}  # a dict: not a registered submodule
        for name, tensor in script.named_parameters(recurse=False):
            # (a loaded archive's parameters are plain tensors; this shares their storage)
            self.register_parameter(name, torch.nn.Parameter(tensor, tensor.requires_grad))
        for name, buffer in script.named_buffers(recurse=False):
            self.register_buffer(name, buffer)
        for name, child in script.named_children():
            assert isinstance(child, torch.jit.ScriptModule), child
            self.add_module(name, ModuleState(child))
        self.train(script.training)

    def attribute(self, name: str) -> Any:
        """What `prim::GetAttr[name]` reads from this module."""
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                return table[name]
        if name == "training":
            return self.training
        return getattr(self._script["module"], name)


class TorchScriptProgram(ModuleState):
    """A scripted module whose forward runs its TorchScript graph through torch ops.

    `origin` names the archive in error messages. The forward takes the
    scripted forward's parameter names, so dynamic_shapes may name them.
    """

    def __init__(self, script: torch.jit.ScriptModule, origin: str) -> None:
        super().__init__(script)
        self._graph = script.inlined_graph
        self._origin = origin
        schema = script.forward.schema  # type: ignore[attr-defined]
        names = [argument.name for argument in schema.arguments][1:]

        def forward(*inputs: Any) -> Any:
            return self.run(inputs)

        forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in names])
        self.forward = forward

    def run(self, inputs: Sequence[Any]) -> Any:
        expected = len(list(self._graph.inputs())) - 1
        if len(inputs) != expected:
            raise ModelError(f"{self._origin}: forward takes {expected} inputs, "
                             f"{len(inputs)} were given")
        with fx_traceback.preserve_node_meta():  # FX nodes point at the TorchScript source
            outputs = Run(self, self._origin).scope(self._graph, [self, *inputs])
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


# --------------------------------------------------------------------------- running a graph


class Run:
    """One run of a graph: the values of its TorchScript values, by unique id.

    A cond branch or while_loop body runs in a child: torch traces it
    rather than runs it, and it may read outer tensors only through the
    op's operands (`torchscript_control_flow.Capture`), which the child
    has in their place.
    """

    def __init__(self, root: ModuleState, origin: str, values: dict[int, Any] | None = None,
                 pinned: frozenset[int] = frozenset(), depth: int = 0) -> None:
        self.root = root
        self.origin = origin
        self.values: dict[int, Any] = values if values is not None else {}
        self.pinned = pinned  # module attributes given as operands: not read again
        self.depth = depth  # how many traced bodies this run is inside

    def child(self, bindings: dict[int, Any]) -> Run:
        return Run(self.root, self.origin, {**self.values, **bindings},
                   self.pinned | bindings.keys(), self.depth + 1)

    def get(self, value: torch._C.Value) -> Any:
        return self.values[value.unique()]

    def inputs(self, node: torch._C.Node) -> list[Any]:
        return [self.get(value) for value in node.inputs()]

    def module_attribute(self, node: torch._C.Node, owner: Any) -> Any:
        """What prim::GetAttr `node` reads from `owner`; None if `owner` is no module."""
        if node.output().unique() in self.pinned:  # a parameter a traced body has as operand
            return self.get(node.output())
        return owner.attribute(node.s("name")) if isinstance(owner, ModuleState) else None

    def scope(self, scope: Scope, inputs: Sequence[Any]) -> list[Any]:
        """Bind `inputs`, run every node, return the scope's outputs."""
        for value, given in zip(scope.inputs(), inputs):
            self.values[value.unique()] = as_typed(given, value)
        for node in scope.nodes():
            self.node(node)
        return [self.get(value) for value in scope.outputs()]

    def node(self, node: torch._C.Node) -> None:
        kind = node.kind()
        handler = _HANDLERS.get(kind)
        enclosing = fx_traceback.get_current_meta().get("stack_trace")
        fx_traceback.set_stack_trace(_stack_trace(node))  # (when export preserves node meta)
        try:
            op = overload(node) if handler is None else None
            if handler is not None:
                results = handler(self, node)
            elif op is not None and safe_to_call(op, values := self.inputs(node)):
                results = [call_op(op, values)]
            else:
                raise self.unsupported(node, "has no torch op exirc can call")
        except Exception as error:
            ours = exirc_error_in(error)
            if ours is not None:
                raise ours from ours.__cause__  # not torch's wrapper around it
            raise ModelError(f"{self.origin}: running TorchScript {kind} failed: "
                             f"{type(error).__name__}: {_summary(error)}{_at(node)}",
                             hint=_hint(kind)) from error
        finally:
            fx_traceback.set_stack_trace([enclosing] if enclosing else [])
        outputs = list(node.outputs())
        if len(results) != len(outputs):  # a handler's bug, not the model's
            raise AssertionError(f"{kind} gave {len(results)} values for {len(outputs)} outputs")
        for value, result in zip(outputs, results):
            self.values[value.unique()] = as_typed(result, value)

    def error(self, node: torch._C.Node, message: str, hint: str | None = None) -> ModelError:
        return ModelError(f"{self.origin}: {message}{_at(node)}", hint=hint)

    def unsupported(self, node: torch._C.Node, why: str) -> UnsupportedOperatorError:
        return UnsupportedOperatorError(
            f"{self.origin}: TorchScript {node.kind()} {why}{_at(node)}",
            hint="export the original nn.Module from a model.py instead of its TorchScript "
                 "archive, or rewrite that line")

    def refuse_side_effect_in_body(self, node: torch._C.Node) -> None:
        """A traced body runs for every branch and once per trace, not once per iteration."""
        if self.depth:
            raise self.unsupported(node, "mutates a Python list or dict inside a branch or loop "
                                         "that depends on tensor data")


def exirc_error_in(error: BaseException) -> ExircError | None:
    """Our own error, possibly wrapped by torch while it traced a cond or while_loop body."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, ExircError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _summary(error: BaseException) -> str:
    """The error's first line, and the next when the first only announces it ("...found:")."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {first_line(Exception(lines[1]))}"
    return first_line(error)


def _hint(kind: str) -> str:
    if kind == "prim::Loop":
        return ("a loop whose trip count depends on tensor data becomes a while_loop: the "
                "tensors it carries from one iteration to the next must keep their shape and "
                "dtype, and it may carry only tensors and numbers")
    if kind == "prim::If":
        return ("a branch on tensor data becomes torch.cond: both branches must give tensors "
                "of the same shape and dtype")
    return "check that the TorchScript module runs on the example inputs"


# --------------------------------------------------------------------------- node handlers


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


_HANDLERS: dict[str, Callable[[Run, torch._C.Node], list[Any]]] = {
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


# --------------------------------------------------------------------------- locations


_FILE_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def _at(node: torch._C.Node) -> str:
    """`\n  at model.py:12: code`, the line ending a message, if the source is known."""
    frame = _source(node)
    return f"\n  at {frame}" if frame is not None else ""


def _stack_trace(node: torch._C.Node) -> list[str]:
    """The node's source line as a Python stack trace, which export puts on its FX nodes."""
    frame = _source(node)
    if frame is None:
        return []
    return [f'  File "{frame.file}", line {frame.line}, in forward\n    {frame.code or ""}\n']


def _source(node: torch._C.Node) -> SourceFrame | None:
    """Where the node is in the scripted source.

    Some nodes have no source range (constants, prim::tolist): then the
    line of the first node using its result, else of its enclosing node.
    """
    users = [use.user for value in node.outputs() for use in value.uses()]
    for candidate in [node, *users[:1]]:
        frame = _frame(str(candidate.sourceRange()))
        if frame is not None:
            return frame
    current: torch._C.Node | None = node
    while current is not None:
        frame = _frame(str(current.sourceRange()))
        if frame is not None:
            return frame
        block = current.owningBlock()
        current = block.owningNode() if block is not None else None
    return None


def _frame(source_range: str) -> SourceFrame | None:
    """The first `File "...", line N` of a source range, with its highlighted code line."""
    match = _FILE_LINE.search(source_range)
    if match is None:
        return None
    lines = source_range[match.end():].splitlines()[1:]
    code = None
    for previous, line in zip(lines, lines[1:]):
        if line.strip() and set(line.strip().split(" <---")[0]) <= {"~"}:
            code = previous.strip()
            break
    return SourceFrame(match["file"], int(match["line"]), code)
