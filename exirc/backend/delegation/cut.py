"""Cutting a partition out of its program, and putting a delegate call in its place."""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING

import torch
from torch.fx import Graph, GraphModule, Node

from exirc.backend.delegation.interface import PartitionGraph
from exirc.backend.delegation.lowered import LoweredDelegate
from exirc.edge.constants import constant_tensor

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def boundary(nodes: list[Node]) -> tuple[list[Node], list[Node]]:
    """The nodes a partition reads from outside it (in first-use order) and the
    ones of its own that something outside reads (in graph order). A size a
    node reads (a view's `sym_size(x, 1)`) that is a dim of one of its own
    tensor inputs is no input: `extract` measures it inside."""
    inside = set(nodes)
    inputs: dict[Node, None] = {}
    outputs: list[Node] = []
    for node in nodes:
        for used in node.all_input_nodes:
            if used not in inside and size_source(node, used) is None:
                inputs.setdefault(used)
        if any(user not in inside for user in node.users):
            outputs.append(node)
    return list(inputs), outputs


def size_source(node: Node, size: Node) -> tuple[Node, int] | None:
    """(tensor, dim): where `node` can read the size `size` from one of its own
    tensor inputs, so a delegate never takes a size (nor a tensor it only
    measures, often of a dtype the backend does not take); None if `size` is
    no size or none of node's inputs has it as a dim."""
    value = size.meta.get("val")
    if size.op != "call_function" or not isinstance(value, torch.SymInt):
        return None
    for tensor in node.all_input_nodes:
        shape = getattr(tensor.meta.get("val"), "shape", ())
        for dim, d in enumerate(shape):
            if isinstance(d, torch.SymInt) and d.node.expr == value.node.expr:
                return tensor, dim
    return None


def extract(program: ExportedProgram, nodes: list[Node]) -> PartitionGraph:
    """The partition `nodes` as a graph of its own (the program is not changed)."""
    inputs, outputs = boundary(nodes)
    graph = Graph()
    env: dict[Node, Node] = {}
    constants: dict[str, torch.Tensor] = {}
    for source in inputs:
        placeholder = graph.placeholder(source.name)
        placeholder.meta.update(source.meta)
        env[source] = placeholder
        value = constant_tensor(program, source)
        if value is not None:
            constants[str(placeholder.target)] = value.detach()
    for node in nodes:
        measured: dict[Node, Node] = {}
        for used in node.all_input_nodes:
            found = size_source(node, used) if used not in env else None
            if found is not None:
                measured[used] = graph.call_function(torch.ops.aten.sym_size.int,
                                                     (env[found[0]], found[1]))
                measured[used].meta["val"] = used.meta["val"]
        env[node] = graph.node_copy(node, functools.partial(_argument, measured, env))
    graph.output(tuple(env[o] for o in outputs))
    return PartitionGraph(GraphModule(torch.nn.Module(), graph), constants)


def _argument(measured: dict[Node, Node], env: dict[Node, Node], node: Node) -> Node:
    return measured[node] if node in measured else env[node]


def replace(program: ExportedProgram, nodes: list[Node], lowered: LoweredDelegate) -> Node:
    """Put one call of `lowered` in place of `nodes`; the call node.

    The call goes where the partition's last node was and the graph is then
    put back in topological order, since a node outside the partition may sit
    between the partition's nodes.
    """
    inputs, outputs = boundary(nodes)
    runtime_inputs = [n for n in inputs if constant_tensor(program, n) is None]
    graph = program.graph_module.graph
    with graph.inserting_after(nodes[-1]):
        call = graph.call_function(lowered, tuple(runtime_inputs))
    call.meta["val"] = tuple(o.meta["val"] for o in outputs)
    for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
        if key in nodes[-1].meta:
            call.meta[key] = nodes[-1].meta[key]
    anchor = call
    inside = set(nodes)
    for i, output in enumerate(outputs):
        with graph.inserting_after(anchor):
            item = graph.call_function(operator.getitem, (call, i))
        item.meta.update(output.meta)
        output.replace_all_uses_with(item, delete_user_cb=lambda user: user not in inside)
        anchor = item
    for node in reversed(nodes):
        graph.erase_node(node)
    _restore_topological_order(graph)
    program.graph_module.recompile()
    return call


def _restore_topological_order(graph: Graph) -> None:
    """Move nodes (in place: node objects stay the same) so every node comes
    after what it reads, keeping the existing order wherever it is valid."""
    placed: set[Node] = set()
    order: list[Node] = []

    def place(node: Node) -> None:
        stack = [(node, False)]
        while stack:
            current, ready = stack.pop()
            if current in placed:
                continue
            if ready:
                placed.add(current)
                order.append(current)
                continue
            stack.append((current, True))
            stack.extend((dep, False) for dep in reversed(current.all_input_nodes)
                         if dep not in placed)

    for node in list(graph.nodes):
        place(node)
    anchor = None
    for node in order:
        if anchor is not None and anchor.next is not node:
            anchor.append(node)
        anchor = node
