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

from collections.abc import Callable, Iterator
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


def whole_operands(node: Node) -> list[list[Any]]:
    """Per subgraph of `node`, what each placeholder receives as a whole
    value, None for a placeholder that receives part of one (a row of
    `map`'s xs) or a loop state (`while_loop`'s carried values)."""
    if node.target is COND:
        operands = list(node.args[3])  # type: ignore[arg-type]
        return [operands, operands]
    if node.target is MAP:
        xs, args = operand_groups(node)
        return [[None] * len(xs) + args]
    carried, additional = operand_groups(node)
    state = [None] * len(carried) + additional
    return [state, state]


def remove_unused_operands(owner: GraphModule, node: Node) -> bool:
    """Drop operands no subgraph of `node` reads (a weight folded away, say).

    Only whole operands go: cond's operands, map's args, while_loop's
    additional inputs. xs and loop states shape the op itself.
    """
    modules = subgraphs(owner, node)
    position = _EXTRA_OPERANDS_ARG[node.target]
    extra = node.args[position]
    assert isinstance(extra, (list, tuple))
    first = len(placeholders(modules[0])) - len(extra)  # placeholders before the extras
    unused = [i for i in range(len(extra))
              if all(not placeholders(m)[first + i].users for m in modules)]
    if not unused:
        return False
    for module in modules:
        for i in reversed(unused):
            module.graph.erase_node(placeholders(module)[first + i])
        module.recompile()
    args = list(node.args)
    args[position] = type(extra)(v for i, v in enumerate(extra) if i not in unused)
    node.args = tuple(args)
    return True


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
    owner.recompile()  # its code passes the new operand
    return added


class ConstantThreader:
    """Gives any graph of a program a node holding a constant.

    The constant is made once, at the top level, by `make(name, tensor,
    described)` (a new lifted constant), and passed down through each enclosing control-flow
    op as an operand; the subgraph reads it as a placeholder. Asking twice
    with the same `key` in the same graph gives the same node.
    """

    def __init__(self, root: GraphModule,
                 make: Callable[[str, torch.Tensor, str | None], Node]) -> None:
        self.root = root
        self.make = make
        # subgraph -> (its owner, the control-flow node calling it, its position)
        self.parents: dict[int, tuple[GraphModule, Node, int]] = {}
        for module in graph_modules(root):
            for node in module.graph.nodes:
                if is_control_flow(node):
                    for position, sub in enumerate(subgraphs(module, node)):
                        self.parents[id(sub)] = (module, node, position)
        self._made: dict[tuple[int, str], Node] = {}

    def node_in(self, module: GraphModule, key: str, name: str, tensor: torch.Tensor,
                described: str | None = None) -> Node:
        made = self._made.get((id(module), key))
        if made is not None:
            return made
        if module is self.root:
            node = self.make(name, tensor, described)
        else:
            owner, control_flow, position = self.parents[id(module)]
            outer = self.node_in(owner, key, name, tensor, described)
            added = add_operand(owner, control_flow, outer)
            # The op's other subgraphs received it too; they reuse theirs.
            for sibling, placeholder in zip(subgraphs(owner, control_flow), added):
                self._made[(id(sibling), key)] = placeholder
            node = added[position]
        self._made[(id(module), key)] = node
        return node
