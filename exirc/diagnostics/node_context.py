"""Where a node of the planned graph sits, for reports: its source line, its
module, and the control flow around it.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.fx import GraphModule, Node

from exirc.ir.source import normal_module_path, source_location
from exirc.plan.ops import cond_out, is_out_form, out_form_subgraphs


class NodeContext:
    """Where nodes sit: the control-flow node around each subgraph."""

    def __init__(self, root: GraphModule) -> None:
        self.root = root
        self.enclosing: dict[torch.fx.Graph, Node] = {}
        self._walk(root)

    def _walk(self, owner: GraphModule) -> None:
        for node in owner.graph.nodes:
            if is_out_form(node):
                for sub in out_form_subgraphs(owner, node):
                    self.enclosing[sub.graph] = node
                    self._walk(sub)

    def outer(self, node: Node) -> Iterator[Node]:
        """The control-flow nodes around `node`, innermost first."""
        while node.graph in self.enclosing:
            node = self.enclosing[node.graph]
            yield node

    def source(self, node: Node) -> str | None:
        # Nodes in subgraphs often carry only traced frames: use the enclosing call's.
        for candidate in (node, *self.outer(node)):
            where = source_location(candidate)
            if where is not None:
                return where
        return None

    def module(self, node: Node) -> str | None:
        """`encoder.layers.1.linear (Linear)`, as the program's module paths name it."""
        for candidate in (node, *self.outer(node)):
            stack = candidate.meta.get("nn_module_stack")
            if stack:
                path, kind = list(stack.values())[-1]
                name = kind.__name__ if isinstance(kind, type) else str(kind).rsplit(".", 1)[-1]
                return f"{normal_module_path(str(path)) or '<root>'} ({name})"
        return None

    def loop(self, node: Node) -> Node | None:
        """The innermost map or while loop around `node`, if any."""
        return next((around for around in self.outer(node) if around.target is not cond_out),
                    None)

    def describe(self, node: Node) -> str:
        where = self.source(node)
        return f"%{node.name}" + (f" at {where}" if where else "")

