"""Cutting a partition out of its program, and putting a delegate call in its place."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

import torch
from torch.fx import Graph, GraphModule, Node

from exirc.backend.delegation.interface import PartitionGraph, nodes_in_order
from exirc.backend.delegation.lowered import LoweredDelegate
from exirc.edge.constants import constant_tensor

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def boundary(nodes: list[Node]) -> tuple[list[Node], list[Node]]:
    """The nodes a partition reads from outside it (in first-use order) and the
    ones of its own that something outside reads (in graph order). A size it
    reads (a view's `sym_size(x, 1)`) is no input: `sizes_read` are copied in
    and the tensors they measure are read instead."""
    inside = set(nodes)
    inputs: dict[Node, None] = {}
    outputs: list[Node] = []
    sizes = set(sizes_read(nodes))
    for node in [*nodes, *sizes]:
        for used in node.all_input_nodes:
            if used not in inside and used not in sizes:
                inputs.setdefault(used)
        if node in inside and any(user not in inside for user in node.users):
            outputs.append(node)
    return list(inputs), outputs


def _is_size(node: Node) -> bool:
    return node.op == "call_function" and isinstance(node.meta.get("val"), (torch.SymInt, int))


def sizes_read(nodes: list[Node]) -> list[Node]:
    """The size computations outside the partition that its nodes read, in
    graph order: recomputed inside from the tensors they measure, so a
    delegate takes tensors only."""
    inside, found = set(nodes), set()
    stack = [u for n in nodes for u in n.all_input_nodes if u not in inside and _is_size(u)]
    while stack:
        node = stack.pop()
        if node not in found:
            found.add(node)
            stack.extend(u for u in node.all_input_nodes if _is_size(u))
    return nodes_in_order(found)


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
    for node in [*sizes_read(nodes), *nodes]:
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[o] for o in outputs))
    return PartitionGraph(GraphModule(torch.nn.Module(), graph), constants)


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
