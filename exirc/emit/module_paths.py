"""The submodule each instruction came from (`serialize.module_paths`).

The emitter knows, per instruction, the graph node it was made for; the
node's `nn_module_stack` meta, which torch.export records and every pass
copies along with the node, names the submodule (`exirc.ir.source.module_path`).
Nodes inside a control-flow subgraph often carry none: they take the module
of the control-flow call around them, as their frames do.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.fx import Graph, GraphModule, Node

from exirc.ir.source import module_path
from exirc.plan.ops import is_out_form, out_form_subgraphs


def instruction_module_paths(nodes: Sequence[Node], root: GraphModule) -> list[str] | None:
    """Each instruction's module path, for the nodes the instructions were made
    for (in `root` or its subgraphs); None when no instruction has one."""
    enclosing = _enclosing_calls(root)
    paths = []
    for node in nodes:
        path = module_path(node)
        around = node
        while not path and around.graph in enclosing:
            around = enclosing[around.graph]
            path = module_path(around)
        paths.append(path)
    return paths if any(paths) else None


def _enclosing_calls(owner: GraphModule, found: dict[Graph, Node] | None = None
                     ) -> dict[Graph, Node]:
    """Each subgraph's control-flow call node, at any depth."""
    found = {} if found is None else found
    for node in owner.graph.nodes:
        if is_out_form(node):
            for sub in out_form_subgraphs(owner, node):
                found[sub.graph] = node
                _enclosing_calls(sub, found)
    return found
