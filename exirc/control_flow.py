"""Control flow in EXIR graphs: higher-order ops and the subgraphs they call.

torch.export keeps `torch.cond`, `map` and `while_loop` as one node each
whose branches or bodies are submodules, read by `get_attr` nodes:

    cond(pred, true_graph, false_graph, operands)
    map_impl(body_graph, xs, args)          body(x_slice..., args...)
    while_loop(cond_graph, body_graph, carried, additional)
                                            cond/body(carried..., additional...)

Every subgraph takes its operands as placeholders, in that order. Passes
that work node by node use `graph_modules` to reach every graph; a pass
that gives a subgraph a new input (a constant, say) threads it through the
op with `add_operand`, so subgraphs never read their parent's values
directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.fx import GraphModule, Node

higher_order = torch.ops.higher_order

COND = higher_order.cond
MAP = higher_order.map_impl
WHILE_LOOP = higher_order.while_loop
CONTROL_FLOW_OPS = (COND, MAP, WHILE_LOOP)

# Argument positions of each op's subgraphs, and of the operand list that
# new trailing placeholders are threaded through.
_SUBGRAPH_ARGS = {COND: (1, 2), MAP: (0,), WHILE_LOOP: (0, 1)}
_EXTRA_OPERANDS_ARG = {COND: 3, MAP: 2, WHILE_LOOP: 3}


def is_control_flow(node: Node) -> bool:
    return node.op == "call_function" and node.target in CONTROL_FLOW_OPS


def subgraphs(owner: GraphModule, node: Node) -> list[GraphModule]:
    """The submodules a control-flow node calls, in argument order."""
    modules = []
    for position in _SUBGRAPH_ARGS[node.target]:
        attr = node.args[position]
        assert isinstance(attr, Node) and attr.op == "get_attr", attr
        module = getattr(owner, str(attr.target))
        assert isinstance(module, GraphModule)
        modules.append(module)
    return modules


def graph_modules(root: GraphModule) -> Iterator[GraphModule]:
    """`root` and, depth first, every subgraph of its control-flow nodes."""
    yield root
    for node in root.graph.nodes:
        if is_control_flow(node):
            for module in subgraphs(root, node):
                yield from graph_modules(module)


def all_nodes(root: GraphModule) -> Iterator[Node]:
    """Every node of `root` and of its subgraphs."""
    for module in graph_modules(root):
        yield from module.graph.nodes


def placeholders(module: GraphModule) -> list[Node]:
    return [n for n in module.graph.nodes if n.op == "placeholder"]


def output_values(module: GraphModule) -> list[Any]:
    """What a subgraph returns, flattened to one list."""
    (results,) = module.graph.output_node().args
    return list(results) if isinstance(results, (list, tuple)) else [results]


def operand_groups(node: Node) -> tuple[list[Any], ...]:
    """The operand lists a control-flow node passes to its subgraphs.

    cond: (operands,); map: (xs, args); while_loop: (carried, additional).
    """
    if node.target is COND:
        return (list(node.args[3]),)  # type: ignore[arg-type]
    if node.target is MAP:
        return list(node.args[1]), list(node.args[2])  # type: ignore[arg-type]
    return list(node.args[2]), list(node.args[3])  # type: ignore[arg-type]


def unused_placeholder_name(graph: torch.fx.Graph, name: str) -> str:
    """`name`, or `name_1`, ...: a placeholder's target is its argument name in
    the generated code, so two alike would not compile (FX renames nodes, not
    targets)."""
    taken = {str(n.target) for n in graph.nodes if n.op == "placeholder"}
    taken |= {n.name for n in graph.nodes}
    candidate, suffix = name, 0
    while candidate in taken:
        suffix += 1
        candidate = f"{name}_{suffix}"
    return candidate


def add_operand(owner: GraphModule, node: Node, value: Node) -> list[Node]:
    """Pass `value` (a node of `owner`) into every subgraph of `node`.

    Appends it to the op's trailing operand list and a placeholder to each
    subgraph; returns the new placeholders, one per subgraph.
    """
    position = _EXTRA_OPERANDS_ARG[node.target]
    args = list(node.args)
    extra = args[position]
    assert isinstance(extra, (list, tuple))
    args[position] = type(extra)([*extra, value])
    node.args = tuple(args)
    added = []
    for module in subgraphs(owner, node):
        graph = module.graph
        existing = placeholders(module)
        where = graph.inserting_after(existing[-1]) if existing else \
            graph.inserting_before(next(iter(graph.nodes)))
        with where:
            placeholder = graph.placeholder(unused_placeholder_name(graph, f"{value.name}_in"))
        placeholder.meta.update({k: v for k, v in value.meta.items()
                                 if k in ("val", "tensor_meta")})
        module.recompile()
        added.append(placeholder)
    return added
