"""A TorchScript graph run node by node, so that torch.export can trace it.

torch's `TS2EPConverter` unrolls a `prim::Loop` whose trip count is a
constant and refuses every other loop. `TorchScriptProgram` runs the
scripted module's inlined graph instead, node by node, and torch.export
traces that run: each node calls the torch op it names (`torchscript_ops`,
which keeps numbers computed from tensor data as 0-d tensors), Python-level
nodes run as `torchscript_nodes` says, and prim::If and prim::Loop become
torch.cond and while_loop where their condition depends on tensor data
(`torchscript_control_flow`).

Parameters and buffers live in a mirror of the scripted module's hierarchy
(`torchscript_module_state`), so export lifts them under the same names.
Every node kind without a handler or a torch op is refused with an
UnsupportedOperatorError naming it and its line in the scripted source
(`torchscript_source`); every failure running a node is a ModelError that
names them too.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx.traceback as fx_traceback

from exirc.capture.messages import first_line
from exirc.capture.torchscript_control_flow import Scope
from exirc.capture.torchscript_module_state import ModuleState
from exirc.capture.torchscript_nodes import HANDLERS
from exirc.capture.torchscript_ops import as_typed, call_op, overload, safe_to_call
from exirc.capture.torchscript_source import at_line, stack_trace
from exirc.errors import ExircError, ModelError, UnsupportedOperatorError


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
        handler = HANDLERS.get(kind)
        enclosing = fx_traceback.get_current_meta().get("stack_trace")
        fx_traceback.set_stack_trace(stack_trace(node))  # (when export preserves node meta)
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
                             f"{type(error).__name__}: {_summary(error)}{at_line(node)}",
                             hint=_hint(kind)) from error
        finally:
            fx_traceback.set_stack_trace([enclosing] if enclosing else [])
        outputs = list(node.outputs())
        if len(results) != len(outputs):  # a handler's bug, not the model's
            raise AssertionError(f"{kind} gave {len(results)} values for {len(outputs)} outputs")
        for value, result in zip(outputs, results):
            self.values[value.unique()] = as_typed(result, value)

    def error(self, node: torch._C.Node, message: str, hint: str | None = None) -> ModelError:
        return ModelError(f"{self.origin}: {message}{at_line(node)}", hint=hint)

    def unsupported(self, node: torch._C.Node, why: str) -> UnsupportedOperatorError:
        return UnsupportedOperatorError(
            f"{self.origin}: TorchScript {node.kind()} {why}{at_line(node)}",
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
