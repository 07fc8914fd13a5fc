"""Computing each value once: nodes that repeat a computation become one.

Model code recomputes what it computed already: transformers' LLaMA makes
the cache positions (`arange(n) + start`) in the model and again in every
attention layer, and a size turned into a tensor is made once per reader.
Each copy is a kernel call outside any delegate and a planned buffer; in a
decoder's step, where every call counts, they are a measurable share.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch.fx import GraphModule, Node

from exirc.ir.control_flow import all_nodes, graph_modules, is_control_flow, subgraphs
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram

# Q/DQ chains are one per reader on purpose (pt2e's convert writes them so):
# XNNPACK's partitioner and `quant_fusion` match DQ -> op -> Q per operator and
# refuse a dequantize that feeds two.
_PER_READER_NAMESPACES = frozenset({"quantized_decomposed", "torchao"})
# A reshape is cheap (a static one free: `alias_views` makes it share its
# input's memory), and pattern matchers read one per reader: the ONNX engine
# finds a bidirectional RNN layer's input projections through each direction's
# own reshape of the layer below.
_FREE_VIEWS = frozenset({"view_copy"})
# A fresh uninitialized tensor is a buffer someone fills, each its own.
_UNDEFINED_CONTENTS = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                                 "new_empty_strided"})
# Each call of these makes a size symbol of its own (`u0`, `u1`) that later
# nodes' shapes name; merging calls would leave those names undefined.
_FRESH_SIZES = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)


@dataclass(frozen=True)
class CommonSubexpressions(Pass):
    """Edge -> Edge: a pure call whose operator and arguments equal an earlier
    one's is replaced by that earlier one, in the method and in each subgraph
    of its control flow.

    Pure: an operator overload that writes none of its arguments, is not
    random, has no side effect, does not make an uninitialized tensor or a
    data-dependent size, and is no Q/DQ op or reshape (those stay one per
    reader); or a `getitem` of a merged result. A call reading a value that
    some operator writes in place, or a view of one, stays as it is: the
    same arguments may hold other values before and after the write; so
    does a call whose own result is written in place. A call the graph
    returns (itself or an element of its result) stays, so two outputs never
    become one value.
    """

    name: ClassVar[str] = "common_subexpressions"

    def run(self, program: ExportedProgram) -> PassResult:
        changed = False
        for module in list(graph_modules(program.graph_module)):
            if merge_common_subexpressions(module):
                module.recompile()
                changed = True
        return PassResult(program, changed)


def merge_common_subexpressions(module: GraphModule) -> bool:
    """Merge repeated pure calls of `module`'s graph (not its subgraphs'); whether any was."""
    graph = module.graph
    touched = _touched_by_writes(module)
    seen: dict[Hashable, Node] = {}
    changed = False
    for node in list(graph.nodes):
        if not _pure(node) or _returned(node) or node in touched or \
                any(arg in touched for arg in node.all_input_nodes):
            continue
        key = _key(node)
        if key is None:
            continue
        earlier = seen.setdefault(key, node)
        if earlier is not node:
            node.replace_all_uses_with(earlier)
            graph.erase_node(node)
            changed = True
    return changed


def _touched_by_writes(module: GraphModule) -> set[Node]:
    """The nodes whose memory some call writes: what it passes as an argument
    its schema writes, what control flow passes to a subgraph that writes, and
    every node sharing memory with one of those (views, in-place results)."""
    roots = _alias_roots(module.graph.nodes)
    written: set[Node] = set()
    for node in module.graph.nodes:
        if is_control_flow(node):
            if any(_writes(n) for sub in subgraphs(module, node) for n in all_nodes(sub)):
                written |= {roots[arg] for arg in node.all_input_nodes}
            continue
        schema = _schema(node)
        if schema is None or not schema.is_mutable:
            continue
        for argument, value in zip(schema.arguments, _arguments(node, schema)):
            if argument.alias_info is not None and argument.alias_info.is_write:
                written |= {roots[n] for n in _nodes_in(value)}
    return {node for node in module.graph.nodes if roots[node] in written}


def _alias_roots(nodes: Iterable[Node]) -> dict[Node, Node]:
    """Each node -> one node of its alias class: a result its schema declares
    as aliasing an argument (a view, an in-place op's result) is in that
    argument's class, and an element of a result in the result's."""
    parent: dict[Node, Node] = {}

    def root(node: Node) -> Node:
        while parent[node] is not node:
            node = parent[node]
        return node

    for node in nodes:
        parent[node] = node
        schema = _schema(node)
        if node.target is operator.getitem and isinstance(node.args[0], Node):
            parent[node] = root(node.args[0])
        elif schema is not None:
            sets = {name for ret in schema.returns if ret.alias_info is not None
                    for name in ret.alias_info.before_set}
            for argument, value in zip(schema.arguments, _arguments(node, schema)):
                if argument.alias_info is not None and sets & argument.alias_info.before_set:
                    for aliased in _nodes_in(value):
                        parent[root(aliased)] = root(node)
    return {node: root(node) for node in parent}


def _writes(node: Node) -> bool:
    schema = _schema(node)
    return schema is not None and schema.is_mutable


def _schema(node: Node) -> torch.FunctionSchema | None:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    return node.target._schema


def _arguments(node: Node, schema: torch.FunctionSchema) -> list[Any]:
    """Every argument of the call in schema order, defaults filled in, so a
    call passing a value by keyword, by position or by default is one call."""
    values = []
    for position, argument in enumerate(schema.arguments):
        if argument.name in node.kwargs:
            values.append(node.kwargs[argument.name])
        elif position < len(node.args) and not argument.kwarg_only:
            values.append(node.args[position])
        else:
            values.append(argument.default_value if argument.has_default_value() else None)
    return values


def _nodes_in(value: Any) -> list[Node]:
    if isinstance(value, Node):
        return [value]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in _nodes_in(v)]
    return []


def _pure(node: Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    schema = _schema(node)
    if schema is None or schema.is_mutable or not schema.returns or node.is_impure():
        return False
    target = node.target
    assert isinstance(target, torch._ops.OpOverload)
    if target.namespace in _PER_READER_NAMESPACES or \
            target.overloadpacket.__name__ in _UNDEFINED_CONTENTS | _FREE_VIEWS:
        return False
    return not any(tag in target.tags for tag in (torch.Tag.nondeterministic_seeded,
                                                  *_FRESH_SIZES))


def _returned(node: Node) -> bool:
    """Whether the graph returns `node`'s result or an element of it."""
    return any(user.op == "output" or (user.target is operator.getitem and _returned(user))
               for user in node.users)


def _key(node: Node) -> Hashable | None:
    """What identifies the call's result: its operator and its arguments (None
    if an argument cannot be compared)."""
    schema = _schema(node)
    arguments = node.args if schema is None else _arguments(node, schema)
    try:
        key = (node.target, _frozen(tuple(arguments)), _frozen(
            tuple(sorted(node.kwargs.items())) if schema is None else ()))
        hash(key)
    except TypeError:
        return None
    return key


def _frozen(value: Any) -> Any:
    """`value` with lists as tuples, tagged by type (1 and 1.0 and True stay
    apart), floats by their bits (0.0 and -0.0 too)."""
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, (list, tuple)):
        return ("sequence", tuple(_frozen(v) for v in value))
    if isinstance(value, Node):
        return ("node", value)
    return (type(value).__name__, value)
