"""The ATen dialect verifier: what torch.export promises, checked.

A program in the ATen dialect (seeds/000 and 002: the EXIR contract) obeys
these rules; each error names the rule it found broken:

  opcode        nodes are placeholder, call_function, get_attr or output
  placeholders  all placeholders come before every other node
  output        exactly one output node, and it is the last node
  op            a call_function target is an ATen OpOverload, a higher-order
                operator (cond, map, ...), operator.getitem, a SymInt
                operation (operator.* / math.* / torch.sym_* whose value is a
                symbolic or Python scalar, not a tensor), or a custom op
                registered with a Meta or fake kernel
  val           every placeholder and call_function node has meta["val"] (but an op
                that returns nothing, e.g. an assertion in a loaded .pt2)
                (get_attr nodes name submodules and carry none)
  get_attr      a get_attr reads a submodule (a higher-order op's branch) or a
                lifted constant, never a parameter or buffer
  lifted        the placeholders are the graph signature's inputs, in order,
                and every parameter and buffer it names has its tensor

Submodule graphs of higher-order ops are checked with the same rules,
except `lifted`, which concerns the top-level signature only.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.export.graph_signature import InputKind

from exirc.errors import DialectError
from exirc.ir.source import source_location

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.fx import Node

_OPCODES = ("placeholder", "call_function", "get_attr", "output")

# Python-level operations torch.export records on SymInts / SymFloats / SymBools.
_SYMBOLIC_OPS: frozenset[Any] = frozenset({
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
    operator.mod, operator.pow, operator.neg, operator.pos, operator.abs,
    operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge,
    operator.and_, operator.or_, operator.xor, operator.not_,
    math.ceil, math.floor, math.trunc,
    torch.sym_int, torch.sym_float, torch.sym_ite, torch.sym_max, torch.sym_min,
    torch.sym_not, torch.sym_sqrt, torch.sym_sum,
})

_SCALARS = (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)

# Lines of IR shown on each side of the faulty node.
_WINDOW = 2
_LINE_LIMIT = 160


def verify_aten(program: ExportedProgram) -> None:
    """Raise `DialectError` at the first rule `program` breaks; return if none."""
    graph_module = program.graph_module
    for prefix, module in _graphs(graph_module):
        _verify_graph(module, prefix, program)
    _verify_lifted(program)


def _graphs(module: torch.fx.GraphModule, prefix: str = "") -> Iterator[
        tuple[str, torch.fx.GraphModule]]:
    """The graph of `module` and, depth first, those its get_attr nodes name."""
    yield prefix, module
    for node in module.graph.nodes:
        if node.op != "get_attr":
            continue
        attribute = _attribute(module, str(node.target))
        if isinstance(attribute, torch.fx.GraphModule):
            yield from _graphs(attribute, f"{prefix}{node.target}.")


def _verify_graph(module: torch.fx.GraphModule, prefix: str, program: ExportedProgram) -> None:
    nodes = list(module.graph.nodes)
    if not nodes:
        raise DialectError(f"ATen dialect: graph {prefix or '<top>'} has no nodes (rule 'output')",
                           hint="a graph ends with one output node")
    seen_other = False
    for index, node in enumerate(nodes):
        fail = _Failure(node, nodes, prefix)
        if node.op not in _OPCODES:
            raise fail("opcode", f"{node.op} nodes are not part of the ATen dialect "
                       f"(only {', '.join(_OPCODES)})",
                       "re-export the model with torch.export instead of building the graph "
                       "by hand")
        if node.op == "placeholder":
            if seen_other:
                raise fail("placeholders", "placeholder comes after other nodes; all "
                           "placeholders must come first",
                           "move the placeholder to the start of the graph")
        else:
            seen_other = True
        if node.op == "output" and index != len(nodes) - 1:
            raise fail("output", f"output node is followed by {len(nodes) - 1 - index} "
                       "more node(s); the graph has exactly one output node, last",
                       "a graph returns once: collect all results in its one output node")
        if node.op == "call_function":
            problem = _op_problem(node)
            if problem is not None:
                raise fail("op", problem, "the ATen dialect admits ATen ops, higher-order "
                           "ops and custom ops with a fake kernel (torch.library.register_fake)")
        if node.op in ("placeholder", "call_function") and "val" not in node.meta \
                and not _returns_nothing(node):
            raise fail("val", 'node has no meta["val"] (its FakeTensor or SymInt value)',
                       "create graphs with torch.export, or run a pass that propagates "
                       "meta['val'] after editing them")
        if node.op == "get_attr":
            problem = _get_attr_problem(module, node, program)
            if problem is not None:
                raise fail("get_attr", problem, "parameters and buffers are graph inputs "
                           "(placeholders listed in the graph signature); re-export the model")
    if nodes[-1].op != "output":
        raise _Failure(nodes[-1], nodes, prefix)(
            "output", "the graph does not end with an output node",
            "a graph ends with exactly one output node")


def _op_problem(node: torch.fx.Node) -> str | None:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        if target.namespace == "aten":
            return None
        if _has_fake_kernel(target):
            return None
        return (f"custom op {target} has no Meta or fake kernel, so its output "
                "shapes are unknown to the compiler")
    if isinstance(target, torch._ops.OpOverloadPacket):
        return (f"target {target} is an overload packet, not an operator; name one "
                f"overload, e.g. {target}.default")
    if isinstance(target, torch._ops.HigherOrderOperator) or target is operator.getitem:
        return None
    if target in _SYMBOLIC_OPS:
        value = node.meta.get("val")
        if "val" not in node.meta or isinstance(value, _SCALARS):
            return None  # (a missing value is the `val` rule's to report)
        return (f"{_callable_name(target)} is allowed on SymInts only, but its value is "
                f"{type(value).__name__}; tensor arithmetic must be an ATen op")
    return "calls a Python callable, not an ATen, higher-order or registered custom operator"


def _has_fake_kernel(op: torch._ops.OpOverload) -> bool:
    # torch.library.register_fake and custom_op register their fake function as
    # the Meta kernel; a composite op decomposes, so fake tensors run it too, and a
    # CompositeExplicitAutograd kernel serves every backend, Meta included.
    keys = (torch._C.DispatchKey.Meta, torch._C.DispatchKey.CompositeImplicitAutograd,
            torch._C.DispatchKey.CompositeExplicitAutograd)
    return any(op.has_kernel_for_dispatch_key(key) for key in keys)


def _get_attr_problem(module: torch.fx.GraphModule, node: torch.fx.Node,
                      program: ExportedProgram) -> str | None:
    target = str(node.target)
    attribute = _attribute(module, target)
    if attribute is None:
        return f"get_attr reads {target!r}, which the graph module does not have"
    if isinstance(attribute, torch.nn.Module):
        return None
    kind = _state_kind(module, target, program)
    if kind is not None:
        return (f"get_attr reads {kind} {target!r}; parameters and buffers must be lifted "
                "to placeholders as the graph signature says")
    if target in program.constants or isinstance(attribute, (torch.Tensor, torch.ScriptObject)):
        return None  # a constant, as torch.export leaves some of them
    return f"get_attr reads {target!r}, a {type(attribute).__name__}, not a submodule or constant"


def _state_kind(module: torch.nn.Module, target: str, program: ExportedProgram) -> str | None:
    """"parameter" or "buffer" if `target` names one (in the module or the signature)."""
    signature = program.graph_signature
    if target in dict(module.named_parameters()) or target in signature.parameters:
        return "parameter"
    if target in dict(module.named_buffers()) or target in signature.buffers:
        return "buffer"
    return None


def _verify_lifted(program: ExportedProgram) -> None:
    nodes = list(program.graph_module.graph.nodes)
    placeholders = [node for node in nodes if node.op == "placeholder"]
    specs = program.graph_signature.input_specs
    by_name = {node.name: node for node in placeholders}
    for position, spec in enumerate(specs):
        name = getattr(spec.arg, "name", None)
        what = _spec_label(spec.kind, spec.target)
        if name not in by_name:
            node = placeholders[position] if position < len(placeholders) else nodes[-1]
            raise _Failure(node, nodes, "")(
                "lifted", f"the graph signature's input {position} ({what}) is placeholder "
                f"%{name}, which the graph does not have",
                "every parameter, buffer and input is a placeholder; re-export the model")
        node = by_name[name]
        if placeholders.index(node) != position:
            raise _Failure(node, nodes, "")(
                "lifted", f"placeholder is input {placeholders.index(node)} of the graph but "
                f"input {position} ({what}) of the graph signature",
                "placeholders follow the signature's order: parameters, buffers, constants, "
                "then user inputs")
        missing = _missing_state(program, spec.kind, spec.target, spec.persistent)
        if missing:
            raise _Failure(node, nodes, "")(
                "lifted", f"{what} has no tensor in the program's {missing}",
                "the program lost a weight; re-export or re-save it")
    if len(placeholders) > len(specs):
        extra = placeholders[len(specs)]
        raise _Failure(extra, nodes, "")(
            "lifted", f"placeholder is not in the graph signature, which lists {len(specs)} "
            "input(s)", "every placeholder is an input of the graph signature")


def _spec_label(kind: InputKind, target: str | None) -> str:
    label = kind.name.lower().replace("_", " ")
    return f"{label} {target!r}" if target is not None else label


def _missing_state(program: ExportedProgram, kind: InputKind, target: str | None,
                   persistent: bool | None) -> str | None:
    if target is None:
        return None
    if kind == InputKind.PARAMETER or (kind == InputKind.BUFFER and persistent is not False):
        return None if target in program.state_dict else "state_dict"
    if kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
        return None if target in program.constants else "constants"
    return None


def _attribute(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def _callable_name(target: Any) -> str:
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if name is None:
        return repr(target)
    return f"{module}.{name}" if module and module != "builtins" else name


class _Failure:
    """Builds the error for one node: rule, what is wrong, where, and the IR around it."""

    def __init__(self, node: torch.fx.Node, nodes: list[torch.fx.Node], prefix: str) -> None:
        self.node = node
        self.nodes = nodes
        self.prefix = prefix

    def __call__(self, rule: str, detail: str, hint: str) -> DialectError:
        node = self.node
        target = node.target if node.op != "call_function" else _target_name(node.target)
        lines = [f"ATen dialect, rule '{rule}': node %{self.prefix}{node.name} "
                 f"({node.op} {target}): {detail}"]
        where = source_location(node)
        if where:
            lines.append(f"  at {where}")
        lines.append("  in graph:")
        lines.extend(self._window())
        return DialectError("\n".join(lines), hint=hint)

    def _window(self) -> list[str]:
        at = self.nodes.index(self.node)
        shown = self.nodes[max(0, at - _WINDOW): at + _WINDOW + 1]
        lines = []
        for node in shown:
            text = node.format_node() or f"%{node.name} = {node.op}[target={node.target}]"
            if len(text) > _LINE_LIMIT:
                text = text[: _LINE_LIMIT - 3] + "..."
            marker = "  > " if node is self.node else "    "
            lines.append(f"  {marker}{text}")
        return lines


def _target_name(target: Any) -> str:
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket,
                           torch._ops.HigherOrderOperator)):
        return str(target)
    return _callable_name(target)


def _returns_nothing(node: Node) -> bool:
    """Whether `node` calls an op whose schema returns nothing (an assertion):
    its value is None, which a deserialized .pt2 does not record."""
    schema = getattr(node.target, "_schema", None)
    return schema is not None and not schema.returns
