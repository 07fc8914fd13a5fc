"""One driver for passes that rewrite a program node by node.

A node-by-node pass is a rule: a function shown each `call_function` node of
the program, in every graph `graph_modules` reaches (the top level first,
then the subgraphs of cond / map / while_loop, depth first), in graph order.
The rule answers (the convention of LLVM's instruction combiner, plus ERASE):

    None          leave the node as it is
    the node      the rule changed it in place (its target, args or kwargs)
    another node  use that value instead: the node's users read it, and the
                  node is erased
    ERASE         erase the node (it must have no users)

`rewrite_nodes` applies the answers, recompiles each graph that changed
(and first drops what became dead there, when asked) and says whether any
did. A rule may add nodes or constants as it goes (those it adds to the
graph being rewritten are not shown to it); it erases nodes only through
its answer.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from torch.fx import GraphModule, Node

from exirc.ir.control_flow import graph_modules


class Erase(enum.Enum):
    ERASE = "erase"


ERASE = Erase.ERASE
"""A rule's answer for a node to drop."""

Answer = Node | Erase | None
Rule = Callable[[Node], Answer]


def rewrite_nodes(root: GraphModule, rule: Rule, *, eliminate_dead_code: bool = False) -> bool:
    """Apply `rule` to every call_function node of `root` and its subgraphs.

    Returns whether any node changed. With `eliminate_dead_code`, a graph
    that changed also loses the nodes left without users (the arguments of
    an erased node, say); graphs the rule left alone are not touched.
    """
    changed = False
    for module in graph_modules(root):
        graph = module.graph
        changed_here = False
        for node in list(graph.nodes):
            if node.op != "call_function":
                continue
            answer = rule(node)
            if answer is None:
                continue
            if answer is ERASE:
                graph.erase_node(node)
            elif answer is not node:
                node.replace_all_uses_with(answer)
                graph.erase_node(node)
            changed_here = True
        if changed_here:
            if eliminate_dead_code:
                graph.eliminate_dead_code()
            module.recompile()
            changed = True
    return changed
